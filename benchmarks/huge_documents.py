"""Reading huge but legal documents: lowering a sweep and validating its points, timed and weighed.

The workload, built from ``documents/v2/layer_pos_sweep.causalab.json`` (a ``layers`` range times
a ``pos`` axis named on a read and a write, six header expectations with point selectors):

- ``1000 x 2000``: 10 layers x 100 positions = 1,000 points, and 2,000 header expectations,
  alternating a point-name list (``["layers=3,pos=-7"]``), an axis selector (``{"pos": -7}``),
  two axes (``{"layers": 3, "pos": [-7, -8]}``) and no selector (every point);
- ``10000 points``: 100 layers x 100 positions, the limit a document may lower to (its six
  expectations);
- ``5000 points``: 50 layers x 100 positions;
- ``10000x2000`` (only when named in ``--cases``): 10,000 points and 2,000 expectations at once.

Each case runs in a fresh process (so its peak memory is its own): the document is built as a
dict, then ``causalab_mini.read(dict, path=...)`` — lower and validate, expectations included,
no model — is timed (``--rounds`` times, the median printed: ``median s`` the wall time,
``CPU s`` the process's CPU time, steadier than the wall's on a machine other jobs share).
``peak RSS`` is the process's ``ru_maxrss`` after the reads; ``import RSS`` the same before the
first (after reading the six-point source document once: the interpreter, pydantic, the package
and the built document), so their difference is what reading costs. Nothing here is asserted:
``tests/test_huge_documents.py`` holds the scaling (counts of the expensive calls), not the time.

Measured on 2 cores shared with a test run (wall s / CPU s / peak RSS), before and after reading
stopped deep-copying and revalidating the whole document per point:

    1000x2000     213   / 153   / 4,117 MiB    ->  0.48 / 0.43 /  54 MiB
    10000          14.7 /  11.1 /   377 MiB    ->  2.2  / 2.0  / 119 MiB
    5000            6.6 /   5.3 /   205 MiB    ->  0.97 / 0.86 /  77 MiB
    10000x2000      (not run before)           ->  3.1  / 2.7  / 168 MiB

    python benchmarks/huge_documents.py                 # every case, one round each
    python benchmarks/huge_documents.py --cases 10000   # one case
    python benchmarks/huge_documents.py --profile 1000x2000   # cProfile of one read, top 25
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "documents" / "v2" / "layer_pos_sweep.causalab.json"

# name: (layers, positions, extra expectations)
CASES = {
    "1000x2000": (10, 100, 2000),
    "10000": (100, 100, 0),
    "5000": (50, 100, 0),
    "10000x2000": (100, 100, 2000),  # both limits at once: not in the default run (minutes before)
}
DEFAULT = ("1000x2000", "10000", "5000")


def build(layers: int, positions: int, expectations: int) -> dict:
    """The sweep document at ``layers`` x ``positions`` points; with ``expectations``, its header
    holds that many (replacing the six it ships with), every one of them legal."""
    doc = json.loads(SOURCE.read_text())
    doc["sites"]["target"]["layers"] = [{"sweep": {"range": [0, layers]}}]
    pos = list(range(-1, -positions - 1, -1))
    iv = doc["interventions"]["patching"]
    iv["reads"]["v_cf"]["pos"] = {"sweep": pos, "as": "pos"}
    iv["writes"]["patch"]["pos"] = {"sweep": copy.deepcopy(pos), "as": "pos"}
    if expectations:
        exps = []
        for i in range(expectations):
            layer, p = i % layers, pos[i % positions]
            metric = ("iia", "logit_diff")[i % 2]
            shape = i % 4
            if shape == 0:
                exp = {"result": metric, "mean": {">=": -1.0}, "points": [f"layers={layer},pos={p}"]}
            elif shape == 1:
                exp = {"result": metric, "max": {"<=": 1e6}, "points": {"pos": p}}
            elif shape == 2:
                exp = {"result": metric, "all": {"between": [-1e6, 1e6]},
                       "points": {"layers": layer, "pos": [p, pos[(i + 1) % positions]]}}
            else:
                exp = {"result": metric, "eligible": {">": 0}}
            exps.append(exp)
        doc["header"]["expect"] = exps
    return doc


def _rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(case: str, rounds: int) -> None:
    """One case in this process: print a JSON line of its timings and memory."""
    import causalab_mini as cm

    layers, positions, expectations = CASES[case]
    doc = build(layers, positions, expectations)
    cm.read(SOURCE)  # imports what reading needs (pydantic, the models) before the baseline
    imported = _rss_mib()
    times, cpu, npoints = [], [], 0
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        read = cm.read(doc, path=SOURCE)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        npoints = len(read.points)
        del read
    times.sort()
    cpu.sort()
    print(json.dumps({"case": case, "points": npoints, "expectations": len(doc["header"]["expect"]),
                      "median_s": times[len(times) // 2], "cpu_s": cpu[len(cpu) // 2],
                      "import_mib": imported, "peak_mib": _rss_mib()}))


def profile(case: str, top: int) -> None:
    import cProfile
    import pstats

    import causalab_mini as cm

    doc = build(*CASES[case])
    cm.read(SOURCE)  # imports outside the profile
    prof = cProfile.Profile(time.process_time)  # CPU time: steadier than the wall on a shared machine
    prof.enable()
    cm.read(doc, path=SOURCE)
    prof.disable()
    stats = pstats.Stats(prof).strip_dirs().sort_stats("cumulative")
    stats.print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(DEFAULT), help=f"comma-separated, of {list(CASES)}")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per case before it is given up")
    parser.add_argument("--profile", metavar="CASE", help="cProfile one read of CASE instead")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.rounds)
    if args.profile:
        return profile(args.profile, args.top)
    rows = []
    for case in args.cases.split(","):
        cmd = [sys.executable, __file__, "--child", case, "--rounds", str(args.rounds)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        except subprocess.TimeoutExpired:
            rows.append({"case": case, "note": f"over {args.timeout:.0f} s"})
            continue
        if done.returncode:
            rows.append({"case": case, "note": done.stderr.strip().splitlines()[-1][:60]})
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{'case':<11} {'points':>7} {'expects':>8} {'median s':>9} {'CPU s':>7} {'import RSS':>11} "
          f"{'peak RSS':>9}")
    for r in rows:
        if "note" in r:
            print(f"{r['case']:<11} {r['note']}")
            continue
        print(f"{r['case']:<11} {r['points']:>7} {r['expectations']:>8} {r['median_s']:>9.2f} {r['cpu_s']:>7.2f} "
              f"{r['import_mib']:>7.0f} MiB {r['peak_mib']:>5.0f} MiB")


if __name__ == "__main__":
    main()

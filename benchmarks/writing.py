"""Writing a run's folder at scale: a run with ``out=`` against the same run kept in memory.

The workload: ``sweep.py``'s scale documents on its small model (a random Llama, 12 layers x 32
wide; 10 layers x 2 positions x the ``t`` of a ``lerp`` write: 100, 1,000 and 10,000 points over
32 rows, each point saving ``logit_diff.json`` and ``iia.json`` beside its ``document.json``), run
shared on the hooks engine from one load, in one child process warmed up both ways on a 2-point
sweep (a first write's imports are not the steady state). Per size and round, one after the other:

- no out: ``cm.run(doc, loaded=..., data=...)``, the results in memory only;
- first: the same call with ``out=`` a folder that does not exist yet, a first run that writes.

While the first run runs, the functions only a run with ``out=`` calls are wrapped in place (the
run reaches them as module attributes) and timed: ``checks``, the folder checked against the
plan's files before the first forward (``api._check_targets``); ``made``, the files' bytes (per
point ``running.assemble._saved``: its executed plan looked up, its saves made; then
``outputs.write.manifest``: the document files and run.json); ``commit``
(``outputs.write.commit``: staging, the mark, moving into place, the one barrier, run.json last).

How to read the table: ``no out s`` and ``first s`` are median wall seconds of one whole run (sizes
up to 1,000 points run ``--rounds`` times, larger ones once: each is minutes); ``first / no out``
is what the folder costs as a multiple of the run; ``checks s``, ``made s`` and ``commit s`` are the
first run's seconds in those functions, ``barrier s`` the part of ``commit`` spent waiting for the
disk to take the bytes (``files.barrier``: what it costs is the disk's, and whatever else is writing
to it, more than this code's; ``less barrier`` is ``write %`` without it), and ``write %`` their sum as a percent of its wall time (the
rest of ``first - no out`` is noise between two runs, or writing work outside them); ``files`` and
``MiB`` are what the folder holds; the ``ms/point`` columns divide ``no out``, ``first`` and
``commit`` by the points: flat down a column means that cost grows no faster than the sweep.

The goals printed under the table are the project's, held up against the figures and never
asserted: writing at most 10% of a 1,000-point run's wall time; a first run at most 1.2x a run
without an out folder; cost per point flat from 100 to 10,000 points. Asserted: the run with
``out=`` has the values of the run without, and its folder read back (``cm.open``) has them too.

    python benchmarks/writing.py                  # 100, 1,000, 10,000 points (about 15 minutes on 2 idle cores)
    python benchmarks/writing.py --points 100,1000
"""
from __future__ import annotations

import argparse
import functools
import gc
import importlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from children import Child, protocol, say

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script from anywhere: the checkout's package

POINTS = (100, 1000, 10000)
ROUNDED_UP_TO = 1000  # sizes up to this many points take seconds to a minute: the median of --rounds
# What only a run with out= does, by column (write % is their sum): module attributes the run looks
# up at call time (api.run calls _check_targets, assemble.py calls _saved, writer.manifest and
# writer.commit), so wrapping them in place times every call. A run that stops calling one of them
# through its module fails the measurement loudly (Timer.take) instead of reporting zero.
# Inside commit: the one barrier, where the run waits for the disk to take its bytes (how long
# depends on the disk and on what else is writing to it, not on this code).
BARRIER = {"barrier": (("causalab_mini.outputs.write", "barrier"),)}
TIMED = {"checks": (("causalab_mini.api", "_check_targets"),),
         "made": (("causalab_mini.running.assemble", "_saved"), ("causalab_mini.outputs.write", "manifest")),
         "commit": (("causalab_mini.outputs.write", "commit"),)}
GOAL_WRITE_PERCENT = 10.0  # at 1,000 points
GOAL_FIRST_RATIO = 1.2
TOLERANCE = 1e-6  # the same calls in one process: the values written are the values computed


# --- the child: one load, every size -------------------------------------------------------------

class Timer:
    """Seconds spent in, and calls of, module-level functions wrapped in place."""

    def __init__(self, targets):
        self.targets, self.seconds, self.calls = targets, 0.0, 0
        for module_name, name in targets:
            module = importlib.import_module(module_name)
            setattr(module, name, self._timed(getattr(module, name)))

    def _timed(self, inner):
        @functools.wraps(inner)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
        return timed

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def take(self) -> float:
        """The seconds since the last take; a run that wrote without calling any of the targets
        means they are no longer where the run finds them."""
        if self.calls == 0:
            names = ", ".join(f"{m}.{n}" for m, n in self.targets)
            raise AssertionError(f"a run with out= called none of {names}: update TIMED in {__file__}")
        seconds = self.seconds
        self.reset()
        return seconds


def values(ran) -> dict:
    """Every point's logit_diff and iia rows, by point name."""
    return {(p.name, name): [r["value"] for r in p.result(name).rows]
            for p in ran.points for name in ("logit_diff", "iia")}


def assert_same(a: dict, b: dict, what: str) -> None:
    if a.keys() != b.keys():
        raise AssertionError(f"{what}: different points or results")
    for key in a:
        for x, y in zip(a[key], b[key], strict=True):
            if (x is None) != (y is None) or x is not None and abs(x - y) > TOLERANCE:
                raise AssertionError(f"{what}: {key} differs ({x} vs {y})")


def folder_size(out: Path) -> tuple[int, int]:
    """(files, bytes) under ``out``."""
    files = total = 0
    for root, _, names in os.walk(out):
        for name in names:
            files += 1
            total += os.path.getsize(os.path.join(root, name))
    return files, total


def timed_run(cm, doc: Path, **kwargs):
    gc.collect()  # the previous run's garbage is not this run's time
    start = time.perf_counter()
    ran = cm.run(doc, **kwargs)
    return ran, time.perf_counter() - start


def one_round(cm, doc: Path, run_kwargs: dict, timers: dict, scratch: Path) -> dict:
    """A run without an out folder, then a first run into a fresh one; checked, measured, removed."""
    ran, no_out = timed_run(cm, doc, **run_kwargs)
    kept = values(ran)
    del ran
    out = Path(tempfile.mkdtemp(prefix="first-", dir=scratch)) / "out"
    for timer in timers.values():
        timer.reset()  # nothing of the run without out= is counted
    ran, first = timed_run(cm, doc, out=out, **run_kwargs)
    result = {"no_out": no_out, "first": first, **{name: timer.take() for name, timer in timers.items()}}
    assert_same(kept, values(ran), f"{doc.name}: the run with out= against the run without")
    del ran
    assert_same(kept, values(cm.open(out)), f"{doc.name}: the folder read back against the run")
    result["files"], result["bytes"] = folder_size(out)
    # Kept until the whole section ends (the parent removes its temporary folder): on a filesystem
    # mounted with online discard (ext4 -o discard, as some virtual disks are) removing a folder
    # trims its blocks in the journal's next commits, and the next run's file creations wait
    # behind them — measured here, a 1,000-point folder's commit took 3.0 s right after removing
    # the previous ones and 0.43 s without.
    return result


def child(directory: Path, threads: int, sizes: list, rounds: int) -> None:
    answers = protocol()
    import torch

    import causalab_mini as cm

    torch.set_num_threads(threads)
    timers = {name: Timer(targets) for name, targets in {**TIMED, **BARRIER}.items()}
    run_kwargs = {"loaded": cm.load(directory / "sweep.causalab.json", engine="hooks",
                                    models=[directory / "models"]),
                  "data": [directory / "data"]}
    scratch = Path(tempfile.mkdtemp(prefix="writing-", dir=directory))
    one_round(cm, directory / "warmup.causalab.json", run_kwargs, timers, scratch)  # the warm-up
    say(answers, ready=True)
    for points in sizes:
        doc = directory / f"scale{points}.causalab.json"
        n = rounds if points <= ROUNDED_UP_TO else 1
        say(answers, points=points, rounds=[one_round(cm, doc, run_kwargs, timers, scratch)
                                             for _ in range(n)])


# --- the parent: the table and the goals -----------------------------------------------------------

def summary(answer: dict) -> dict:
    """Medians over the rounds; the folder's size is the same every round."""
    rounds = answer["rounds"]
    row = {k: statistics.median(r[k] for r in rounds) for k in ("no_out", "first", *TIMED, *BARRIER)}
    row.update(points=answer["points"], rounds=len(rounds), files=rounds[-1]["files"], bytes=rounds[-1]["bytes"])
    row["write_percent"] = 100 * sum(row[k] for k in TIMED) / row["first"]
    return row


HEADER = (f"  {'points':>7}{'rounds':>7}{'no out s':>10}{'first s':>9}{'first/no out':>14}{'checks s':>10}{'made s':>8}"
          f"{'commit s':>10}{'barrier s':>11}{'write %':>9}{'less barrier':>14}{'files':>8}{'MiB':>7}   ms/point:{'no out':>8}{'first':>8}{'commit':>8}")


def line(r: dict) -> str:
    per = 1000 / r["points"]
    return (f"  {r['points']:>7,}{r['rounds']:>7}{r['no_out']:>10.2f}{r['first']:>9.2f}"
            f"{r['first'] / r['no_out']:>14.3f}{r['checks']:>10.2f}{r['made']:>8.2f}{r['commit']:>10.2f}"
            f"{r['barrier']:>11.2f}{r['write_percent']:>9.1f}{r['write_percent'] - 100 * r['barrier'] / r['first']:>14.1f}"
            f"{r['files']:>8,}{r['bytes'] / 2 ** 20:>7.1f}   {'':>9}{r['no_out'] * per:>8.2f}"
            f"{r['first'] * per:>8.2f}{r['commit'] * per:>8.3f}")


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def goals(rows: list) -> list[str]:
    """The project's goals beside what this run measured; never asserted."""
    by_points = {r["points"]: r for r in rows}
    at_1000 = by_points.get(1000)
    said = [f"writing (checks + made + commit) <= {GOAL_WRITE_PERCENT:.0f}% of a 1,000-point run's wall time: " + (
        f"{at_1000['write_percent']:.1f}% ({verdict(at_1000['write_percent'] <= GOAL_WRITE_PERCENT)})"
        if at_1000 else "not measured (no 1,000-point run)")]
    ratios = {p: r["first"] / r["no_out"] for p, r in by_points.items()}
    said.append(f"a first run <= {GOAL_FIRST_RATIO}x a run without an out folder: "
                + ", ".join(f"{ratio:.3f}x at {p:,}" for p, ratio in ratios.items())
                + f" ({verdict(max(ratios.values()) <= GOAL_FIRST_RATIO)})")
    if len(rows) > 1:
        low, high = rows[0], rows[-1]
        flat = [f"{label} {1000 * low[k] / low['points']:.3g} -> {1000 * high[k] / high['points']:.3g} ms/point "
                f"(x{(high[k] / high['points']) / (low[k] / low['points']):.2f})"
                for label, k in (("no out", "no_out"), ("first", "first"), ("commit", "commit"))]
        said.append(f"cost per point flat from {low['points']:,} to {high['points']:,} points: " + "; ".join(flat))
    return said


def report_writing(directory: Path, threads: int, sizes: list, rounds: int = 3) -> None:
    """The section: one child over every size, a line per size as it finishes, then the goals."""
    print(f"\nwriting a run's folder, small model: scale documents run shared on hooks from one load, "
          f"without out= and as a first run into a fresh folder; {threads} torch thread(s); sizes up to "
          f"{ROUNDED_UP_TO:,} points: median of {rounds} round(s), others once")
    print(HEADER, flush=True)
    run = Child(HERE / "writing.py", ["--child", "--dir", directory, "--threads", threads,
                                      "--points", ",".join(map(str, sizes)), "--rounds", rounds],
                directory / "writing.log")
    run.answer()  # loaded and warmed up
    rows = []
    for _ in sizes:
        rows.append(summary(run.answer()))
        print(line(rows[-1]), flush=True)
    run.close()
    print("  checks: api._check_targets; made: running.assemble._saved, outputs.write.manifest; commit: "
          "outputs.write.commit; write %: their sum, of the first run; barrier: the part of commit spent waiting "
          "for the disk (files.barrier), and write % without it")
    print("  goals (the project's; not asserted):")
    for said in goals(rows):
        print(f"    {said}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default=",".join(map(str, POINTS)),
                        help="comma-separated sizes, of 100, 500, 1000, 10000 (default 100,1000,10000)")
    parser.add_argument("--rounds", type=int, default=3,
                        help=f"rounds per size up to {ROUNDED_UP_TO:,} points (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    sizes = [int(p) for p in opts.points.split(",")]
    if opts.child:
        child(Path(opts.dir), opts.threads, sizes, opts.rounds)
        return 0
    from workload import build  # the model, the data and the scale documents

    with tempfile.TemporaryDirectory(prefix="writing-bench-") as tmp:
        build(Path(tmp), "small")
        report_writing(Path(tmp), opts.threads, sizes, opts.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

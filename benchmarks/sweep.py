"""A patching sweep's cost, shared forwards against hand-written loops, side by side in one run.

The workload: a 24-point residual interchange sweep (12 layers x positions -4 and -1;
``block_output`` read on the counterfactual prompt at the swept layer and position, swapped
into the base prompt at the same place; ``logit_diff`` and ``iia`` scored at the last position)
over 32 rows, on two random Llamas built from a config (nothing is shipped or downloaded):

- small: 12 layers x 32 wide, where the per-call overhead (Python, hooks, the engine's walk)
  is most of a forward;
- mid: 12 layers x 768 wide (about 85M parameters, counted and printed), where the
  arithmetic is.

The variants, each in its own process (so its peak memory is its own), warmed up on a
2-point slice of the sweep, then taking turns for ``--rounds`` rounds (``--mid-rounds`` on
the mid model, one by default: a round there is a few minutes of arithmetic on 2 cores):

- minimal loop: per point, one unpatched counterfactual forward reading the activation with a
  ``register_forward_hook``, then one patched forward: 2P forwards, the loop people write;
- floor: one counterfactual forward with a hook on every layer the sweep reads, then one
  patched forward per point: P + 1 forwards, the least this sweep can cost;
- nnsight floor, when nnsight imports: the same P + 1 loop written directly with nnsight
  (``nnsight.LanguageModel(model, dispatch=False)``): one trace of the counterfactual prompts saving
  every (layer, position) the sweep reads, then one trace per point writing the saved value into the
  layer's output and saving the logits' last position — what nnsight itself costs over raw torch;
- pyvene, when it imports: one ``IntervenableModel`` with a ``VanillaIntervention`` per point
  on the same model (it runs the source forward on every call: 2P);
- the hooks and the nnterp engine, each plain (``cm.run(doc, share=False)``: 2P forwards),
  shared (``share=True``, the default: the counterfactual forward the points run alike runs
  once, P + 1) and shared + at_once (``at_once=8``: eight points' patched passes stacked into
  one call of 8 x 32 rows, 1 + P/8 calls);
- the pytest plugin running the document as items (``--causalab-engine=hooks``), a fresh
  pytest process per round as a user runs it, timed by a hook of this module's own from the
  end of collection to the end of the session (the model's load, every item and the plugin's
  writes of each point's folder, scratch under pytest's temporary directory as without
  ``--causalab-out``; interpreter start and collection not), and again from the end of the
  model's load (``pytest_causalab_model_loaded``) — the plugin's own cost beside the engine's;
  then pytest itself, a fresh process running as many empty items (what pytest's running and
  reporting of that many items costs, which no plugin removes).

The hand-written variants get their prompts tokenized once, before timing (from the compiled
plan: the same ids, mask and position ids the engines feed the model); the engines read and
compile the document inside every timed run, as a user's ``cm.run`` does.

How to read the table: ``median s`` is the median wall time of one whole sweep; ``x minimal``
and ``x floor`` divide it by the minimal loop's and the floor's, and ``x nnsight``, on the nnterp
engine's rows (nnterp runs its forwards as nnsight traces), by the nnsight floor's; ``forwards`` counts the
transformers model's calls in one sweep (a forward pre-hook on the model, or a wrapper on its
``forward`` where the variant hides the model or clears its hooks, as pyvene does); ``peak
RSS`` is the process's ``ru_maxrss`` after its last round; ``x floor, each round`` is the lowest
and highest of each round's time over the floor's in that round (on a shared machine the ratio
moves by as much as the differences between the variants: read a ratio with its spread); ``best x
best`` divides the variant's fastest round by the floor's (as ``timeit`` advises: what other work on
the machine adds is never negative, so the fastest round is the closest to the code's own cost).
Below each table, the largest
per-row ``logit_diff`` difference of every variant against the minimal loop and of each
engine's shared run against its plain run: these are asserted (within 1e-4), times never are.

Then the sweep's size: a 100-, 500- and 1,000-point sweep on the small model (10 layers x 2
positions x the ``t`` of a ``lerp`` write), compiled weightless (``cm.compile``: config and
tokenizer only) and run shared on the hooks engine; flat per-point columns mean nothing in
compiling, sharing or walking grows faster than the number of points.

Then, on the small model, the sections of their own modules (each runs alone too, and its
docstring says how to read its table): ``writing.py``, what a run's out folder costs at 100,
1,000 and 10,000 points against the same run without one; ``startup.py``, each engine through
``causalab-mini run`` as a whole process, and its time to the first forward beyond importing
torch and transformers; ``lens.py``, the patching sweep against TransformerLens on a random
GPT-2, where TransformerLens imports (a line saying it is not installed otherwise).

Where torch sees a GPU, every size's table is printed again on it, beside the CPU's
(``--devices cpu,cuda``; ``scripts/accelerator_check.sh`` runs the mid size that way).

PyTorch runs single-threaded by default (``--threads``): on a machine whose cores other jobs
share, several threads wait on each other and the figures become the scheduler's.

    python benchmarks/sweep.py                  # everything (about 30 minutes on 2 idle cores)
    python benchmarks/sweep.py --quick          # one round a table, the 100-point scale and writing runs only
    python benchmarks/sweep.py --sizes small    # skip the mid model
    python benchmarks/sweep.py --sizes small --sections writing,startup --writing-points 1000
    python benchmarks/sweep.py --profile --sizes mid   # cProfile of one shared hooks sweep
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sweep_loops import floor_sweep, minimal_sweep, nnsight_floor_sweep, prepared, pyvene_sweep
from workload import LAYERS, POSITIONS, ROWS, SIZES, Counter, build, max_difference

ENGINES = ("hooks-plain", "hooks-shared", "hooks-at_once", "nnterp-plain", "nnterp-shared", "nnterp-at_once")
# The device every variant of one table runs on: set by the parent for its children (and the pytest
# round), so the variants of a table share it. cpu always; cuda too when torch sees a GPU.
DEVICE = os.environ.get("SWEEP_BENCH_DEVICE", "cpu")
AT_ONCE = 8  # points per stacked call in the at_once mode: 24 points in 3 calls, 256 rows each
HAND = ("minimal", "floor", "nnsight", "pyvene")
OPTIONAL = {"nnsight": "nnsight", "pyvene": "pyvene"}  # a hand variant -> the module it needs
TOLERANCE = 1e-4  # per-row logit_diff; the variants make the same float32 calls
# The scale table's sizes (of workload.SCALE_POINTS); 10,000 points is the writing section's
# (writing.py), whose run without an out folder is this table's run at that size.
SCALE_RUN = (100, 500, 1000)
SECTIONS = ("engines", "scale", "writing", "startup", "lens")


# --- one variant in its own process -------------------------------------------------------------

def hand_variant(name: str, directory: Path):
    """(sweep(doc) -> values, counter) for a hand-written variant; None if the module it needs
    (pyvene, nnsight) does not import."""
    if name in OPTIONAL:
        try:
            importlib.import_module(OPTIONAL[name])
        except Exception as err:  # noqa: BLE001 - any failure to import is "not available here"
            return None, f"{type(err).__name__}: {err}"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory / "models" / "model", device_map=DEVICE)
    model.eval().requires_grad_(False)
    counter = Counter(model, wrap=name == "pyvene")
    loop = {"minimal": minimal_sweep, "floor": floor_sweep, "nnsight": nnsight_floor_sweep,
            "pyvene": pyvene_sweep}[name]
    runs = model
    if name == "nnsight":  # the same model, wrapped as it is (its calls still counted by the pre-hook)
        import nnsight

        runs = nnsight.LanguageModel(model, tokenizer=AutoTokenizer.from_pretrained(directory / "models" / "model"),
                                     dispatch=False)
    # Tokenized once, before any timing: a hand-written loop's inputs are ready before its loop.
    plans = {doc: prepared(directory, doc, DEVICE) for doc in documents(directory)}

    def sweep(doc: Path) -> dict:
        return loop(runs, plans[doc])
    return (sweep, counter), None


def documents(directory: Path) -> tuple[Path, Path]:
    """(the warm-up, the sweep)."""
    return directory / "warmup.causalab.json", directory / "sweep.causalab.json"


def engine_variant(name: str, directory: Path):
    """(sweep(doc) -> values, counter) for an engine: plain, shared, or shared + at_once."""
    import causalab_mini as cm

    engine, mode = name.split("-")
    loaded = cm.load(directory / "sweep.causalab.json", engine=engine, models=[directory / "models"],
                     device_map=DEVICE)
    counter = Counter(loaded.model if engine == "hooks" else loaded.model._model)
    at_once = AT_ONCE if mode == "at_once" else 1

    def sweep(doc: Path) -> dict:
        ran = cm.run(doc, loaded=loaded, data=[directory / "data"], share=mode != "plain", at_once=at_once)
        return {p.name: [r["value"] for r in p.result("logit_diff").rows] for p in ran.points}
    return (sweep, counter), None


def variant(name: str, directory: Path, threads: int) -> None:
    """Load, warm up, then one timed sweep per "go" line from the parent; JSON lines back."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the protocol
    import torch

    torch.set_num_threads(threads)
    made, why = (hand_variant if name in HAND else engine_variant)(name, directory)
    if made is None:
        print(json.dumps({"skip": why}), file=proto)
        return
    sweep, counter = made
    warmup, doc = documents(directory)
    # Warm-up: first-call costs (allocator, nnsight parsing sources) are not the steady state.
    sweep(warmup)
    counter.take()
    print(json.dumps({"ready": True}), file=proto)
    for _ in sys.stdin:  # one "go" per round, so the variants take turns
        start = time.perf_counter()
        values = sweep(doc)
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "forwards": counter.take(), "values": values,
                          "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), file=proto)


# --- the pytest plugin variant ------------------------------------------------------------------
# Loaded into the pytest process with ``-p sweep`` (this file on PYTHONPATH): these hooks time the
# session from the end of collection to its end, and count the model's calls by wrapping the
# Llama class's forward (the plugin's engines are not reachable from outside).

_CLOCK: dict = {}


def pytest_configure(config) -> None:
    if "SWEEP_BENCH_REPORT" not in os.environ:
        return
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(int(os.environ.get("SWEEP_BENCH_THREADS", "1")))
    inner = LlamaForCausalLM.forward
    _CLOCK["forwards"] = 0

    def counted(self, *args, **kwargs):
        _CLOCK["forwards"] += 1
        return inner(self, *args, **kwargs)
    LlamaForCausalLM.forward = counted


def pytest_collection_finish(session) -> None:
    _CLOCK["start"] = time.perf_counter()


def pytest_causalab_model_loaded(key, engine, config) -> None:
    _CLOCK["loaded"] = time.perf_counter()


def pytest_sessionfinish(session, exitstatus) -> None:
    if "SWEEP_BENCH_REPORT" not in os.environ or "start" not in _CLOCK:
        return
    end = time.perf_counter()
    Path(os.environ["SWEEP_BENCH_REPORT"]).write_text(json.dumps({
        "seconds": end - _CLOCK["start"], "forwards": _CLOCK["forwards"],
        "after_load": end - _CLOCK.get("loaded", _CLOCK["start"]),
        "exitstatus": int(exitstatus), "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


# pytest's own cost of a session of this many items, with nothing in them: the part of the plugin's
# time no plugin can remove (collection is not timed; running, reporting and the summary are).
EMPTY_ITEMS = f"""
import pytest

@pytest.mark.parametrize("point", range({LAYERS * len(POSITIONS)}))
def test_point(point):
    assert point >= 0
"""


def run_pytest(directory: Path, threads: int, k: int, args: list) -> dict:
    """One fresh pytest process in ``directory``, timed by this module's hooks; its report."""
    report = directory / f"pytest{k}.json"
    report.unlink(missing_ok=True)
    env = {**os.environ, "SWEEP_BENCH_REPORT": str(report), "SWEEP_BENCH_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]),
           # Compiled modules cached (nothing written into the checkout), whatever the environment
           # says: the modules a session imports after the model's load are not compiled in its time.
           "PYTHONPYCACHEPREFIX": str(directory / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("CI", None)  # a local run: the temporary document has no committed baseline to hold it to
    cmd = [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "-p", "sweep", "-q"]
    done = subprocess.run(cmd, cwd=directory, env=env, capture_output=True, text=True)
    if not report.exists() or done.returncode != 0:
        raise RuntimeError(f"pytest variant failed (rc {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(report.read_text())


def plugin_round(directory: Path, threads: int, k: int) -> dict:
    """One fresh pytest process over the sweep document as a user runs it (no --causalab-out: each
    point's folder is scratch under pytest's temporary directory); its values read back from there."""
    scratch = directory / f"pytest-tmp{k}"
    result = run_pytest(directory, threads, k, [
        "sweep.causalab.json", "--causalab-engine=hooks", f"--causalab-models={directory / 'models'}",
        f"--causalab-data={directory / 'data'}", f"--causalab-device-map={DEVICE}", f"--basetemp={scratch}"])
    result["values"] = {Path(f).parent.name: [r["value"] for r in json.loads(Path(f).read_text())]
                        for f in glob.glob(str(scratch / "**" / "logit_diff.json"), recursive=True)}
    if len(result["values"]) != LAYERS * len(POSITIONS):
        raise RuntimeError(f"the plugin wrote {len(result['values'])} point folders under {scratch}")
    return result


def empty_items_round(directory: Path, threads: int, k: int) -> dict:
    """pytest itself: a fresh process running as many empty items as the sweep has points."""
    (directory / "test_empty_items.py").write_text(EMPTY_ITEMS)
    return run_pytest(directory, threads, k, ["test_empty_items.py", f"--basetemp={directory / f'empty-tmp{k}'}"])


# --- the parent: build, take turns, print ---------------------------------------------------------

def start(name: str, directory: Path, threads: int, logs: dict):
    logs[name] = open(directory / f"{name}.log", "w")
    return subprocess.Popen([sys.executable, __file__, "--variant", name, "--dir", str(directory),
                             "--threads", str(threads)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logs[name], text=True)


def answer(proc, name: str, directory: Path) -> dict:
    line = proc.stdout.readline()
    if not line:
        log = (directory / f"{name}.log").read_text()
        raise RuntimeError(f"variant {name} ended without answering; its stderr:\n{log[-4000:]}")
    return json.loads(line)


def measure(directory: Path, names: list, rounds: int, threads: int) -> tuple[dict, dict]:
    """Every variant's rounds: (name -> list of round results, name -> why it was skipped)."""
    logs: dict = {}
    procs = {n: start(n, directory, threads, logs) for n in names}
    skipped = {}
    for n in names:  # every variant loaded and warmed up before any round is timed
        first = answer(procs[n], n, directory)
        if "skip" in first:
            skipped[n] = first["skip"]
            procs.pop(n).wait()
    # The pytest processes' first session, untimed: it compiles every module they import (into the
    # cache run_pytest points them at), as an installed package's are.
    plugin_round(directory, threads, -1)
    empty_items_round(directory, threads, -1)
    results: dict = {n: [] for n in [*procs, "pytest"]}
    for k in range(rounds):
        for n, proc in procs.items():  # one at a time: the variants never compete for the cores
            proc.stdin.write("go\n")
            proc.stdin.flush()
            results[n].append(answer(proc, n, directory))
        plugin = plugin_round(directory, threads, k)
        results["pytest"].append(plugin)
        results.setdefault("pytest-items", []).append({**plugin, "seconds": plugin["after_load"]})
        results.setdefault("pytest-empty", []).append(empty_items_round(directory, threads, k))
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    for log in logs.values():
        log.close()
    return results, skipped


LABELS = {"minimal": "minimal loop (2P)", "floor": "floor (P+1)", "nnsight": "nnsight floor (P+1)",
          "pyvene": "pyvene",
          "hooks-plain": "hooks, plain", "hooks-shared": "hooks, shared",
          "hooks-at_once": f"hooks, at_once={AT_ONCE}", "nnterp-plain": "nnterp, plain",
          "nnterp-shared": "nnterp, shared", "nnterp-at_once": f"nnterp, at_once={AT_ONCE}",
          "pytest": "pytest plugin (hooks)", "pytest-items": "  after the model load",
          "pytest-empty": "  pytest itself"}


def report(size: str, params: int, results: dict, skipped: dict, rounds: int, threads: int) -> None:
    width, _, mlp = SIZES[size]
    print(f"\n{size}: random Llama, {LAYERS} layers x {width} wide (MLP {mlp}), {params / 1e6:.2f}M parameters; "
          f"{LAYERS * len(POSITIONS)} points x {ROWS} rows; on {DEVICE}; {threads} torch thread(s); "
          f"median of {rounds} round(s)")
    print(f"  {'variant':<24}{'median s':>10}{'x minimal':>11}{'x floor':>9}{'x nnsight':>11}{'forwards':>10}"
          f"{'peak RSS MiB':>14}{'x floor, each round':>22}{'best x best':>13}")
    medians = {n: statistics.median(r["seconds"] for r in rs) for n, rs in results.items()}
    bests = {n: min(r["seconds"] for r in rs) for n, rs in results.items()}
    for n in LABELS:
        if n in skipped or n not in results:
            why = skipped.get(n, "")
            text = (f"not installed (pip install {OPTIONAL[n]} to compare)" if n in OPTIONAL and "No module" in why
                    else f"skipped: {why}")
            print(f"  {LABELS[n]:<24}{text}")
            continue
        last = results[n][-1]
        # The nnterp engine runs its forwards as nnsight traces: its rows read against the nnsight floor too.
        against = (f"{medians[n] / medians['nnsight']:>11.2f}" if n.startswith("nnterp") and "nnsight" in medians
                   else f"{'':>11}")
        # Each round's time over the floor's in the same round: the spread says how far the machine
        # moved the ratios, which no median hides.
        by_round = [r["seconds"] / f["seconds"] for r, f in zip(results[n], results["floor"])]
        spread = f"{min(by_round):.2f}-{max(by_round):.2f}" if len(by_round) > 1 else ""
        print(f"  {LABELS[n]:<24}{medians[n]:>10.3f}{medians[n] / medians['minimal']:>11.2f}"
              f"{medians[n] / medians['floor']:>9.2f}{against}{last['forwards']:>10}{last['peak_mib']:>14.0f}"
              f"{spread:>22}{bests[n] / bests['floor']:>13.2f}")
    print("  pytest: a fresh process per round, timed from the end of collection to the end of the session "
          "(model load, every item, the plugin's writes of each point's scratch folder); 'after the model load': "
          f"the same session from the end of the load; 'pytest itself': {LAYERS * len(POSITIONS)} empty items, "
          "what pytest costs with no plugin work (x floor: its share of the plugin's)")
    values = {n: rs[-1]["values"] for n, rs in results.items() if "values" in rs[-1]}
    pairs = [(f"{e}: shared vs plain", f"{e}-shared", f"{e}-plain") for e in ("hooks", "nnterp")]
    pairs += [(f"{e}: at_once vs shared", f"{e}-at_once", f"{e}-shared") for e in ("hooks", "nnterp")]
    pairs += [(f"{LABELS[n]} vs minimal loop", n, "minimal") for n in LABELS
              if n in values and n not in ("minimal", "pytest-items", "pytest-empty")]
    print("  max |logit_diff difference| per row:")
    for label, a, b in pairs:
        diff = max_difference(values[a], values[b])
        print(f"    {label:<40}{diff:.3g}")
        assert diff <= TOLERANCE, f"{size}: {label} differ by {diff}"


# --- the sweep's size -----------------------------------------------------------------------------

def scale(directory: Path, threads: int, sizes: list) -> None:
    """In its own process: compile (weightless) and run (hooks, shared) each scale document."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import torch

    import causalab_mini as cm

    torch.set_num_threads(threads)
    models, data = [directory / "models"], [directory / "data"]
    loaded = cm.load(directory / "sweep.causalab.json", engine="hooks", models=models)
    counter = Counter(loaded.model)
    cm.run(directory / "warmup.causalab.json", loaded=loaded, data=data)
    counter.take()
    for points in sizes:
        doc = directory / f"scale{points}.causalab.json"
        start_ = time.perf_counter()
        plan = cm.compile(doc, engine="hooks", models=models, data=data)
        compiled = time.perf_counter() - start_
        start_ = time.perf_counter()
        ran = cm.run(doc, loaded=loaded, data=data)
        seconds = time.perf_counter() - start_
        assert len(ran.points) == points == sum(1 for s in plan.steps if "=" in s)
        print(json.dumps({"points": points, "compile": compiled, "run": seconds, "forwards": counter.take(),
                          "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), file=proto)


def report_scale(directory: Path, threads: int, sizes: list) -> None:
    print("\nsweep size, small model: 10 layers x 2 positions x t of a lerp write; compile weightless "
          "(cm.compile), run shared on hooks (cm.run, its compile included)")
    print(f"  {'points':>7}{'compile s':>11}{'ms/point':>10}{'run s':>9}{'ms/point':>10}{'forwards':>10}"
          f"{'peak RSS MiB':>14}")
    with open(directory / "scale.log", "w") as log:
        proc = subprocess.Popen([sys.executable, __file__, "--variant", "scale", "--dir", str(directory),
                                 "--threads", str(threads), "--scale", ",".join(map(str, sizes))],
                                stdout=subprocess.PIPE, stderr=log, text=True)
        for _ in sizes:
            r = answer(proc, "scale", directory)
            p = r["points"]
            print(f"  {p:>7}{r['compile']:>11.2f}{1000 * r['compile'] / p:>10.2f}{r['run']:>9.2f}"
                  f"{1000 * r['run'] / p:>10.2f}{r['forwards']:>10}{r['peak_mib']:>14.0f}", flush=True)
        proc.wait()


# --- a profile of the shared hooks run --------------------------------------------------------------

def profile(directory: Path, threads: int) -> None:
    """One shared hooks sweep under cProfile (after the warm-up): where its time goes."""
    import cProfile
    import pstats

    import torch

    torch.set_num_threads(threads)
    (sweep, _), _ = engine_variant("hooks-shared", directory)
    sweep(directory / "warmup.causalab.json")
    prof = cProfile.Profile()
    prof.enable()
    sweep(directory / "sweep.causalab.json")
    prof.disable()
    stats = pstats.Stats(prof, stream=sys.stdout)
    print(f"\nprofile: one shared hooks sweep on {directory.name}, by own time")
    stats.sort_stats("tottime").print_stats(15)
    print("profile: by cumulative time")
    stats.sort_stats("cumulative").print_stats(25)


def main(argv=None) -> int:
    global DEVICE  # the parent sets it per table; its children read SWEEP_BENCH_DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds on the small model (default 3)")
    parser.add_argument("--mid-rounds", type=int, default=1,
                        help="timed rounds on the mid model (default 1: each takes minutes on 2 cores)")
    parser.add_argument("--quick", action="store_true", help="one round per table, the 100-point scale and "
                        "writing runs only")
    parser.add_argument("--sizes", default="small,mid", help="comma-separated: small, mid")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, of {', '.join(SECTIONS)} (default: all); every section but "
                        "engines runs on the small model, so only when --sizes names it")
    parser.add_argument("--writing-points", default="100,1000,10000",
                        help="the writing section's sizes (default 100,1000,10000; --quick: 100)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument("--devices", help="comma-separated: cpu, cuda, cuda:1 (default: cpu, and cuda when "
                        "torch sees a GPU: each size's table on each, side by side)")
    parser.add_argument("--profile", action="store_true", help="only: cProfile one shared hooks sweep per size")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--scale", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    unknown = set(opts.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}; of {', '.join(SECTIONS)}")
    if opts.variant == "scale":
        scale(Path(opts.dir), opts.threads, [int(p) for p in opts.scale.split(",")])
        return 0
    if opts.variant:
        variant(opts.variant, Path(opts.dir), opts.threads)
        return 0
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        if opts.profile:
            for size in opts.sizes.split(","):
                build(Path(tmp) / size, size)
                profile(Path(tmp) / size, opts.threads)
            return 0
        print(f"load average before: {load()} (other work on the cores makes every figure slower and noisier)")
        names = ["minimal", "floor", *[n for n in OPTIONAL if importlib.util.find_spec(OPTIONAL[n])], *ENGINES]
        devices = opts.devices.split(",") if opts.devices else ["cpu", *(["cuda"] if cuda_visible() else [])]
        sizes, sections = opts.sizes.split(","), opts.sections.split(",")
        for size in sizes if "engines" in sections else []:
            directory = Path(tmp) / size
            params = build(directory, size)
            rounds = 1 if opts.quick else (opts.mid_rounds if size == "mid" else opts.rounds)
            for device in devices:  # each device's table in full, one after the other
                DEVICE = os.environ["SWEEP_BENCH_DEVICE"] = device  # this process and its children
                results, skipped = measure(directory, names, rounds, opts.threads)
                for n in OPTIONAL:
                    if n not in names:
                        skipped[n] = f"No module named {OPTIONAL[n]!r}"
                report(size, params, results, skipped, rounds, opts.threads)
            DEVICE = os.environ["SWEEP_BENCH_DEVICE"] = "cpu"  # the sections after these tables: CPU
        if "small" in sizes:
            small_model_sections(Path(tmp) / "small", sections, opts)
        print(f"\nload average after: {load()}")
    return 0


def small_model_sections(directory: Path, sections: list, opts) -> None:
    """The sections after the engine tables, each on the small model and printing its own table:
    the sweep's size here, the rest in modules of their own (writing.py, startup.py, lens.py)."""
    from lens import report_lens
    from startup import report_startup
    from writing import report_writing

    if not directory.exists():  # the engine tables were skipped
        build(directory, "small")
    rounds = 1 if opts.quick else opts.rounds
    if "scale" in sections:
        report_scale(directory, opts.threads, [100] if opts.quick else list(SCALE_RUN))
    if "writing" in sections:
        points = [100] if opts.quick else [int(p) for p in opts.writing_points.split(",")]
        report_writing(directory, opts.threads, points, rounds)
    if "startup" in sections:
        report_startup(directory, opts.threads, rounds)
    if "lens" in sections:
        report_lens(directory / "lens", opts.threads, rounds)


def cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" (1, 5, 15 min) on {os.cpu_count()} cores"


if __name__ == "__main__":
    sys.exit(main())

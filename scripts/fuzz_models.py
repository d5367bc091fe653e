"""Fuzz model directories: N mutated copies of tiny-llama held to the pre-load checks, and loaded.

    .venv/bin/python scripts/fuzz_models.py [-n 1000] [--load K] [--seed S] [--deadline SECONDS]

Each directory is drawn by ``tests/fuzzing_models.py``'s ``mutated_model`` (config fields, the
safetensors header's length, bytes, dtypes, shapes and offsets, tensors renamed, dropped, added and
reshaped, files cut, missing or not regular; see that module) and written to a fresh folder. The
pre-load checks (``loading.weights_digest``, ``checkpoint.check_config``, ``check_weight_files``,
the config read, ``check_fits``) must pass or refuse it with a ``CausalabError``; up to ``--load``
of those that pass (all, by default) are then loaded on the hooks engine, and every parameter held
to the weight file's tensor of its name, bit for bit. Each stage runs under a deadline (SIGALRM).

Prints the counts — typed refusals, passed, untyped exceptions, hangs; at load, loaded whole,
refused typed, untyped (a parameter that disagrees with the file is one) — and up to three
examples of each kind of untyped exception. Exits 1 when any example raised untyped or hung.
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# transformers warns about many a mutated config ("bos_token_id must be ... within the vocabulary"):
# the counts are this script's report.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from fuzzing_models import Hang, ModelCase, deadline, loaded_whole, mutated_model, preflight  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="mutated directories to check (default 1000)")
    parser.add_argument("--load", type=int, default=-1, help="load at most this many of those that pass "
                        "(default: every one; 0: none)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds one stage of one example may take")
    args = parser.parse_args(argv)

    counts = collections.Counter()
    untyped: dict[tuple, list] = collections.defaultdict(list)
    refusals = collections.Counter()
    slowest = [0.0, None]
    root = Path(tempfile.mkdtemp(prefix="fuzz-models-"))
    warnings.simplefilter("ignore")

    def untyped_case(stage, err, case):
        counts[f"{stage}: untyped"] += 1
        where = traceback.extract_tb(err.__traceback__)[-1]
        first = (str(err).strip().splitlines() or [""])[0][:200]
        untyped[(stage, type(err).__name__, f"{Path(where.filename).name}:{where.lineno}")].append((case, first))

    @seed(args.seed)
    @settings(max_examples=args.n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=mutated_model())
    def one(case):
        here = Path(tempfile.mkdtemp(dir=root))
        try:
            folder = case.materialize(here)
            counts["examples"] += 1
            started = time.monotonic()
            try:
                with deadline(args.deadline):
                    refused = preflight(folder)
            except Hang:
                counts["pre-load: hang"] += 1
                untyped[("pre-load", "Hang", "")].append((case, f"past {args.deadline} s"))
                return
            except Exception as err:  # noqa: BLE001 - what this script counts
                untyped_case("pre-load", err, case)
                return
            finally:
                took = time.monotonic() - started
                if took > slowest[0]:
                    slowest[:] = [took, case]
            if refused is not None:
                counts["pre-load: refused typed"] += 1
                refusals[type(refused).__name__] += 1
                return
            counts["pre-load: passed"] += 1
            if 0 <= args.load <= counts["load: tried"]:
                return
            counts["load: tried"] += 1
            try:
                with deadline(args.deadline):
                    outcome = loaded_whole(folder)
            except Hang:
                counts["load: hang"] += 1
                untyped[("load", "Hang", "")].append((case, f"past {args.deadline} s"))
                return
            except Exception as err:  # noqa: BLE001 - AssertionError: a parameter not the file's
                untyped_case("load", err, case)
                return
            counts["load: refused typed" if isinstance(outcome, Exception) else "load: loaded whole"] += 1
        finally:
            shutil.rmtree(here, ignore_errors=True)

    # The unchanged directory first, unmeasured: the imports a process's first load makes are no example's time.
    warm = ModelCase().materialize(root / "warm")
    assert preflight(warm) is None and not isinstance(loaded_whole(warm), Exception)
    began = time.monotonic()
    try:
        one()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{counts['examples']} mutated model directories in {time.monotonic() - began:.0f} s "
          f"(slowest pre-load {slowest[0]:.2f} s: {slowest[1]!r})")
    for name in ["pre-load: refused typed", "pre-load: passed", "pre-load: untyped", "pre-load: hang",
                 "load: tried", "load: loaded whole", "load: refused typed", "load: untyped", "load: hang"]:
        print(f"  {name:26} {counts[name]}")
    print("  refusals by type: " + ", ".join(f"{k} {v}" for k, v in refusals.most_common()))
    for (stage, kind, where), cases in sorted(untyped.items(), key=lambda kv: -len(kv[1])):
        print(f"\n{stage}: {kind} at {where}: {len(cases)}")
        for case, message in cases[:3]:
            print(f"  {case!r}\n    {message}")
    bad = sum(counts[k] for k in ["pre-load: untyped", "pre-load: hang", "load: untyped", "load: hang"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

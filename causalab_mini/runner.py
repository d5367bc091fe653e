"""Load, compile, execute, write: what ``causalab-mini run`` and the pytest plugin both do.

One function per stage, so a caller that already holds a loaded engine (the
plugin's session cache) reuses it and skips the load.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from . import documents
from .errors import EngineError

ENGINES = ("nnterp", "hooks", "ndif")  # every engine name; ndif is nnterp run remotely
LOCAL_ENGINES = ("nnterp", "hooks")


def engine_class(name: str):
    if name in ("nnterp", "ndif"):
        from .engine.nnterp import NNterpEngine
        return NNterpEngine
    if name == "hooks":
        from .engine.hooks import HooksEngine
        return HooksEngine
    raise EngineError("engine", f"unknown engine {name!r}", f"use one of: {', '.join(ENGINES)}")


# run.json records the engine's class (provenance.record); this is the name it was asked by.
_CLASS_NAMES = {"NNterpEngine": "nnterp", "HooksEngine": "hooks"}


def engine_name(class_name: Optional[str], *, remote: bool = False) -> str:
    """The engine name of a run record's engine class (``NNterpEngine`` run remotely: ``ndif``)."""
    name = _CLASS_NAMES.get(class_name or "", class_name or "unknown")
    return "ndif" if remote and name == "nnterp" else name


def load_engine(raw: dict, *, engine: str = "nnterp", document: Optional[Path] = None, models=None,
                device_map: str = "cpu", trust_remote_code: bool = False, valid=None):
    """The engine for a document's model (a sweep may not change the model: the first point names it).

    Loaded with attention probabilities (eager attention) only when some point taps them.
    ``valid``: the document's points, when the caller has them (``documents.points(raw)``).
    """
    points = documents.points(raw) if valid is None else valid
    return engine_class(engine).load(points[0].spec.model, document=document, models=models,
                                     device_map=device_map, trust_remote_code=trust_remote_code,
                                     attention_probs=uses_attention_probs(points))


def uses_attention_probs(points) -> bool:
    """Whether any point's site is an attention pattern, which must be chosen at load."""
    return any(site.component == "attention_probs" for p in points for site in p.spec.sites.values())


def execute(raw: dict, engine, *, document: Optional[Path] = None, data=None,
            batch_size: Optional[int] = None, remote=False):
    """Compile against the loaded engine and walk the plan; returns the filled plan."""
    plan = documents.compile_plan(raw, document=document, data=data, facts=engine)
    return engine.execute(plan, remote=remote, batch_size=batch_size)


def _bar(name: str, done: int, total: int) -> None:
    width = 24
    filled = width * done // total
    end = "\n" if done == total else ""
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name}\033[K", end=end,
          file=sys.stderr, flush=True)


def run_cli(args) -> int:
    from contextlib import nullcontext

    from .engine import steps
    from .plan.write import check_out, check_targets, planned_files, write

    document = Path(args.document)
    # Everything that can refuse the run without a model does so before the load and the compute.
    check_out(Path(args.out))
    if args.batch_size is not None and args.batch_size < 1:
        raise EngineError("--batch-size", f"{args.batch_size} is not a number of rows",
                          "give a positive number, or leave it out for the whole batch")
    raw = documents.read(document)
    # --engine ndif is the nnterp engine with the session sent to NDIF: the only difference
    # between running here and there is the session's `remote` flag.
    remote = args.engine == "ndif"
    engine = load_engine(raw, engine=args.engine, document=document, models=args.models,
                         device_map=args.device_map, trust_remote_code=args.trust_remote_code)
    progress = nullcontext() if args.quiet or not sys.stderr.isatty() else steps.reporting(_bar)
    plan = documents.compile_plan(raw, document=document, data=args.data, facts=engine)
    # A save whose file is a folder on disk (or under a file) is refused now, not after the compute.
    check_targets(Path(args.out), planned_files(plan))
    with progress:
        plan = engine.execute(plan, remote=remote, batch_size=args.batch_size)
    for path in write(plan, Path(args.out), plan.provenance):
        print(path)
    sys.stdout.flush()
    from .plan.show_tokens import notes
    for line in notes(plan):
        print(line, file=sys.stderr)
    return 0

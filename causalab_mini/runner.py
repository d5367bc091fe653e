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

ENGINES = ("nnterp", "hooks", "ndif")


def engine_class(name: str):
    if name in ("nnterp", "ndif"):
        from .engine.nnterp import NNterpEngine
        return NNterpEngine
    if name == "hooks":
        from .engine.hooks import HooksEngine
        return HooksEngine
    raise EngineError("--engine", f"unknown engine {name!r}", f"use one of: {', '.join(ENGINES)}")


def load_engine(raw: dict, *, engine: str = "nnterp", document: Optional[Path] = None, models=None,
                device_map: str = "cpu", trust_remote_code: bool = False):
    """The engine for a document's model (a sweep may not change the model: the first point names it)."""
    spec = documents.points(raw)[0].spec
    return engine_class(engine).load(spec.model, document=document, models=models,
                                     device_map=device_map, trust_remote_code=trust_remote_code)


def execute(raw: dict, engine, *, document: Optional[Path] = None, data=None,
            batch_size: Optional[int] = None, remote=False):
    """Compile against the loaded engine and walk the plan; returns the filled plan."""
    plan = documents.compile_plan(raw, document=document, data=data, facts=engine)
    return engine.execute(plan, remote=remote, batch_size=batch_size)


def run_cli(args) -> int:
    from .plan.write import write

    document = Path(args.document)
    raw = documents.read(document)
    engine = load_engine(raw, engine=args.engine, document=document, models=args.models,
                         device_map=args.device_map, trust_remote_code=args.trust_remote_code)
    plan = execute(raw, engine, document=document, data=args.data, batch_size=args.batch_size)
    for path in write(plan, Path(args.out), plan.provenance):
        print(path)
    sys.stdout.flush()
    return 0

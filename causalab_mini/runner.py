"""Engines by name, and the load and execute stages the public API (``api.py``) composes.

One function per stage, so a caller that already holds a loaded engine reuses it
and skips the load.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from . import documents
from .errors import EngineError

ENGINES = ("nnterp", "hooks", "ndif")  # every engine name; ndif is nnterp on a weightless shell, run remotely
LOCAL_ENGINES = ("nnterp", "hooks")


def engine_class(name: str):
    if name == "nnterp":
        from .engine.nnterp import NNterpEngine
        return NNterpEngine
    if name == "ndif":
        from .engine.ndif import NDIFEngine
        return NDIFEngine
    if name == "hooks":
        from .engine.hooks import HooksEngine
        return HooksEngine
    raise EngineError("engine", f"unknown engine {name!r}", f"use one of: {', '.join(ENGINES)}")


# run.json records the engine's class (provenance.record); this is the name it was asked by.
_CLASS_NAMES = {"NNterpEngine": "nnterp", "HooksEngine": "hooks", "NDIFEngine": "ndif"}


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


def execute(raw: dict, loaded, *, document: Optional[Path] = None, data=None,
            batch_size: Optional[int] = None, remote=False):
    """Compile against a loaded engine and walk the plan; returns the filled plan tree (what
    ``causalab_mini.run`` wraps as a Run)."""
    plan = documents.compile_plan(raw, document=document, data=data, facts=loaded)
    return loaded.execute(plan, remote=remote, batch_size=batch_size)

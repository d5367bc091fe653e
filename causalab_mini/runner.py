"""The load and execute stages the public API (``api.py``) composes; engines by name are
``engine/registry.py``'s.

One function per stage, so a caller that already holds a loaded engine reuses it
and skips the load.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from . import documents
from .engine import registry

# Re-exported from the registry (engine/registry.py), for callers that import them from here.
ENGINES = registry.ENGINES  # every engine name; ndif is nnterp on a weightless shell, run remotely
LOCAL_ENGINES = registry.LOCAL_ENGINES
engine_class = registry.engine_class
engine_name = registry.engine_name


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

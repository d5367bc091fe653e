"""What a heatmap's ticks say: a sweep coordinate, and for a position axis the token it lands on.

A position axis is an axis whose sweep wrappers sit in a read's or a write's ``pos`` (a bare
index like ``-1``, or a position object, or a field of one). Its tick is the coordinate followed
by the token every row lands on, ``-1 ' is'``, when every row of every point at that coordinate
lands on the same text (where each row landed is ``landed``'s to find). Where rows land on
different tokens — or where the run does not say — the tick names the position alone: the bare
coordinate, or for an anchored position its cut and scope, ``-1 entity``, which is true on every
row whatever token each one reached.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..document.sweep import axes
from ..shapes import Where
from .choose import coordinate
from .landed import Landing


@dataclass(frozen=True)
class PositionOp:
    """A read or write whose position an axis moves: ``interventions.<intervention>.<kind>.<name>.pos``."""

    intervention: str
    kind: str  # "reads" | "writes"
    name: str


def tick_labels(run, axis: str, values: list) -> list[str]:
    """One label per value of ``axis`` (as ``Run.grid`` lists them): coordinates, with tokens where known."""
    ops = position_ops(root_document(run), axis)
    if not ops:
        return [coordinate(v) for v in values]
    run = planned(run)
    landing = Landing(run)  # one per figure: tokenizer and character maps are shared by every tick
    return [_position_label(landing, [p for p in run.points if p.coords[axis] == v], ops, v) for v in values]


def planned(run):
    """A run read back from disk with its plan compiled again — weightless: config, tokenizer and
    data, found as a run finds them from its folder's document.json (``CAUSALAB_MODELS`` and
    ``CAUSALAB_DATA``, or the nearest ``documents/`` above it) — so a fixed position's token is
    found as it is for a run in memory. The run as it is where they cannot be found."""
    from dataclasses import replace

    from ..errors import CausalabError

    if run.plan is not None or run.out is None or not (Path(run.out) / "document.json").is_file():
        return run
    document = Path(run.out) / "document.json"
    try:
        from .. import api

        plan = api.compile(document, engine="hooks")
    except (CausalabError, OSError, ValueError):
        return run
    swept = any(p.name in plan.steps for p in run.points)
    points = [replace(p, plan=plan.steps[p.name] if swept else plan, document=document) for p in run.points]
    return replace(run, points=points, plan=plan, document=document)


def _position_label(landing, points: list, ops: tuple[PositionOp, ...], value) -> str:
    """``-1 ' is'`` when every row of every point at this coordinate lands on one token, else the position."""
    named = spelled(value)
    seen: set[str] = set()
    for point in points:
        for op in ops:
            tokens = landing.tokens(point, op)
            if tokens is None:
                return named  # the run does not say where this op landed: claim no token
            seen.update(tokens)
    return f"{named} {next(iter(seen))}" if len(seen) == 1 else named


def spelled(value) -> str:
    """A position coordinate, short: ``-1``; an object as its cut and scope, ``-1 entity``."""
    if not isinstance(value, dict):
        return coordinate(value)
    try:
        where = Where.from_json(value)
    except (ValueError, TypeError):
        return coordinate(value)  # a field of a position object, not a whole one
    return " ".join(_where_words(where))


def _where_words(where) -> list[str]:
    words = ["generated"] if where.frame == "generated" else []
    if where.index is not None:
        words.append(str(where.index))
    elif where.span is not None:
        words.append(f"[{where.span[0]}:{where.span[1]}]")  # a slice of the run, as Python writes one
    elif where.last is not None:
        words.append(f"last {where.last}")
    else:
        words.append("all")
    if where.scope is not None:
        # The segment first: a variable is searched inside it ("user[1] entity").
        words += [name for name in (where.scope.segment, where.scope.variable) if name is not None]
    return words


# --- which ops an axis moves ---------------------------------------------------------------

def root_document(run) -> Optional[dict]:
    """The whole document, sweep wrappers and all: the plan's (in memory), or the run folder's copy."""
    if run.plan is not None:
        return run.plan.document
    for where in (run.out / "document.json" if run.out else None, run.document):
        if where is not None and Path(where).is_file():
            return json.loads(Path(where).read_text(encoding="utf-8"))
    return None


def position_ops(raw: Optional[dict], axis: str) -> tuple[PositionOp, ...]:
    """The reads and writes whose ``pos`` holds a wrapper of ``axis`` (none: not a position axis)."""
    if not isinstance(raw, dict):
        return ()
    moved = next((a.paths for a in axes(raw) if a.name == axis), ())
    found = []
    for intervention, body in (raw.get("interventions") or {}).items():
        for kind in ("reads", "writes"):
            for name in (body.get(kind) or {}):
                where = f"interventions.{intervention}.{kind}.{name}.pos"
                if any(path == where or path.startswith(where + ".") for path in moved):
                    found.append(PositionOp(intervention, kind, name))
    return tuple(found)

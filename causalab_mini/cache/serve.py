"""The cache's side of a run: the store a run may use, what a point's entry must hold to be
served, and the names of the points a run was served.

A run through the cache is the one run path (``running/execution.py``): the document compiled
once, each point keyed on that compile, the points with a valid entry taken from it, the others
computed (sharing forwards among themselves) and stored, and the ``Run`` and its folder
assembled as if every point had been computed (``running/assemble.py``) — byte-identical,
run.json included: its fields are the run record, which is a key part, so a point is served only
to a run that records the same. A served point computed nothing here, so its seconds in the
timing are null; which points were served is told by ``served(run)`` (and the CLI's "cached:"
line), in no file.
"""
from __future__ import annotations

from typing import Optional

from ..errors import PlanError
from ..outputs import write as writer
from ..outputs.results import Run
from ..plan.plan import Plan
from .key import CacheError
from .store import Entry, Store


def open_store(directory, *, engine: str) -> Store:
    """The cache folder, refused (with ``engine``, the run's engine name) before the model loads."""
    from .. import engines

    if engine in engines.ENGINES and engines.record(engine).remote:
        raise CacheError("cache", "a remote run's served dtype is chosen by the server, after the run, "
                         "so its results cannot be keyed before it", "run locally, or without a cache")
    return Store(directory)


def served(run: Run) -> list[str]:
    """The names of the points ``run`` took from the cache, in the document's order; [] for a run
    made without one. ``run(..., cache=DIR)`` sets them as ``run.cached``; a ``Run`` made from it
    (``select``) or opened from disk has none."""
    return list(getattr(run, "cached", ()))


def matches(entry: Entry, point: Plan) -> bool:
    """Whether an entry holds exactly the files the compiled point saves (its document.json aside)."""
    return list(entry.files) == [rel for rel, _ in writer.layout(point) if rel != "document.json"]


def saved(point: Plan) -> dict[str, bytes]:
    """An executed point's saved files, relative to its folder, as the writer makes them."""
    return {rel: make() for rel, make in writer.layout(point) if rel != "document.json"}


def compiled_points(doc, loaded, *, data=None) -> list[tuple[str, Plan]]:
    """``(name, point)`` for every point of a read document (``cm.read``), compiled once and
    unshared against ``loaded`` — what a point is keyed on (a point borrowing a shared forward
    does not hold its rows; a point run alone borrows nothing). An unswept document's one point
    goes by the document's name."""
    from ..plan.compile import compile_plan

    plan = compile_plan(doc.raw, document=doc.path, data=data, facts=loaded, valid=list(doc.points), share=False)
    return [(doc.name, plan) if p.name is None else (p.name, plan.steps[p.name]) for p in doc.points]


def point_parts(point: Plan, model: dict, record: dict) -> dict:
    """A compiled point's key parts (``key.parts``), its inputs digested."""
    from . import key as keying

    return keying.parts(point, keying.inputs_digest(point), model, record)


def lookup(store: Store, point: Plan, model: dict, record: dict) -> Optional[Entry]:
    """The entry ``store`` holds for a compiled point, valid for this run; None: a miss."""
    from . import key as keying

    parts = point_parts(point, model, record)
    entry = store.get(keying.digest(parts), parts)
    return entry if entry is not None and matches(entry, point) else None


def _foreseen(loaded, batch_size, at_once) -> tuple[dict, dict]:
    from ..engine import provenance
    from . import key as keying

    return keying.model_parts(loaded), provenance.record(loaded, False, batch_size, at_once)


def keys(doc, loaded, *, batch_size: Optional[int] = None, data=None, at_once: int = 1) -> dict[str, str]:
    """``{point name: key}`` of a read document (``cm.read``), as ``run(doc, loaded=loaded,
    batch_size=..., cache=...)`` looks its points up."""
    from . import key as keying

    model, record = _foreseen(loaded, batch_size, at_once)
    return {name: keying.digest(point_parts(point, model, record))
            for name, point in compiled_points(doc, loaded, data=data)}


def hits(store: Store, doc, loaded, *, batch_size: Optional[int] = None, data=None, at_once: int = 1) -> list[str]:
    """The points of a read document whose entries ``store`` holds, valid, for this run: what
    ``run(..., cache=)`` would serve rather than compute."""
    model, record = _foreseen(loaded, batch_size, at_once)
    return [name for name, point in compiled_points(doc, loaded, data=data)
            if lookup(store, point, model, record) is not None]


def remember(store: Store, doc, loaded, ran: Run, *, data=None) -> bool:
    """Store the one point of ``ran``, a run of ``doc`` (a point alone, ``doc.point(name)``)
    computed without the cache, as ``run(..., cache=)`` stores it. False when there was nothing
    storable (a metric with no eligible row)."""
    (_, point), = compiled_points(doc, loaded, data=data)
    return put(store, point, ran.plan, loaded, dict(ran.plan.provenance))


def put(store: Store, compiled: Plan, executed: Plan, loaded, record: dict) -> bool:
    """Store an executed point under its compiled self's key, with the record its walk made.
    False when there was nothing storable (a metric with no eligible row, a NaN in a save)."""
    from ..outputs.results import scored_in_plan
    from . import key as keying
    from .store import storable

    try:
        files = saved(executed)
    except PlanError:
        return False
    scored = scored_in_plan(executed)
    if not storable(scored):
        return False
    parts = point_parts(compiled, keying.model_parts(loaded), record)
    return store.put(keying.digest(parts), parts, Entry(tuple(scored), files))

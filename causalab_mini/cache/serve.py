"""A run through the cache: serve the points whose key has an entry, compute only the others.

The whole document is compiled (every refusal before any compute), each point keyed, and the
points with no valid entry compiled again on their own (``Document`` with those points: they
still share forwards among themselves) and run. The ``Run`` is then assembled in the
document's point order, and ``out`` written as one run — every point's folder, document.json
and run.json — through the writer's commit protocol, byte-identical to a run that computed
everything. run.json is identical too: its fields are the run record, which is a key part, so
a point is served only to a run that records the same.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import PlanError
from ..plan import write as writer
from ..plan.plan import Plan
from ..plan.share import SHARED
from ..results import Point, Run, scored_in_plan
from . import key as keying
from .key import CacheError
from .store import Entry, Store, storable


def open_store(directory, *, engine: str) -> Store:
    """The cache folder, refused (with ``engine``, the run's engine name) before the model loads."""
    if engine == "ndif":
        raise CacheError("cache", "a remote run's served dtype is chosen by the server, after the run, "
                         "so its results cannot be keyed before it", "run locally, or without a cache")
    return Store(directory)


def served(run: Run) -> list[str]:
    """The names of the points ``run`` took from the cache, in the document's order; [] for a run
    made without one. ``run(..., cache=DIR)`` sets them as ``run.cached``; a ``Run`` made from it
    (``select``) or opened from disk has none."""
    return list(getattr(run, "cached", ()))


@dataclass(frozen=True)
class _Keyed:
    """A sweep point of the document: its name in the Run, its place, and its key's parts but the record."""

    name: str
    valid: object  # documents.ValidPoint
    plan: Plan  # the point in the compiled (unrun) plan: its files' names, its document.json
    prefix: str  # its folder in the run's folder: "layers=0,pos=-4/", or "" unswept
    inputs: str

    def parts(self, model: dict, record: dict) -> dict:
        return keying.parts(self.plan, self.inputs, model, record)


def _swept(doc) -> bool:
    return not (len(doc.points) == 1 and doc.points[0].name is None)


def _compiled(doc, points, loaded, *, data, share: bool) -> Plan:
    """``api.compile`` of the document restricted to ``points`` (this package is below the API)."""
    from ..documents import compile_plan

    return compile_plan(doc.raw, document=doc.path, data=data, facts=loaded, valid=list(points), share=share)


def _keyed(doc, loaded, plan: Plan, *, data) -> list[_Keyed]:
    swept = _swept(doc)
    # Keys come from the plan compiled unshared: a point borrowing a shared forward does not
    # hold its rows, and a point run alone borrows nothing.
    unshared = (_compiled(doc, doc.points, loaded, data=data, share=False) if swept and SHARED in plan.steps
                else plan)
    out = []
    for p in doc.points:
        name = p.name if swept else doc.name
        full, alone = (plan.steps[p.name], unshared.steps[p.name]) if swept else (plan, plan)
        out.append(_Keyed(name, p, full, f"{p.name}/" if swept else "", keying.inputs_digest(alone)))
    return out


def keys(doc, loaded, *, batch_size: Optional[int] = None, data=None, at_once: int = 1) -> dict[str, str]:
    """``{point name: key}`` of a read document (``cm.read``), as ``run(doc, loaded=loaded,
    batch_size=..., cache=...)`` looks its points up."""
    from ..engine import provenance

    model = keying.model_parts(loaded)
    record = provenance.record(loaded, False, batch_size, at_once)
    plan = _compiled(doc, doc.points, loaded, data=data, share=True)
    return {k.name: keying.digest(k.parts(model, record)) for k in _keyed(doc, loaded, plan, data=data)}


def hits(store: Store, doc, loaded, *, batch_size: Optional[int] = None, data=None, at_once: int = 1) -> list[str]:
    """The points of a read document whose entries ``store`` holds, valid, for this run: what
    ``run(..., cache=)`` would serve rather than compute."""
    from ..engine import provenance

    model = keying.model_parts(loaded)
    record = provenance.record(loaded, False, batch_size, at_once)
    plan = _compiled(doc, doc.points, loaded, data=data, share=True)
    found = []
    for k in _keyed(doc, loaded, plan, data=data):
        parts = k.parts(model, record)
        entry = store.get(keying.digest(parts), parts)
        if entry is not None and list(entry.files) == _save_names(k.plan):
            found.append(k.name)
    return found


def remember(store: Store, doc, loaded, ran: Run, *, data=None) -> bool:
    """Store the one point of ``ran``, a run of ``doc`` (a point alone, ``doc.point(name)``)
    computed without the cache — by ``run_points``, say — as ``run(..., cache=)`` stores it.
    False when there was nothing storable (a metric with no eligible row)."""
    plan = ran.plan
    # Keyed on the point compiled alone: the run's own plan may borrow from a forward it shared.
    (k,) = _keyed(doc, loaded, _compiled(doc, doc.points, loaded, data=data, share=False), data=data)
    try:
        files = _saved(plan)
    except PlanError:
        return False
    scored = scored_in_plan(plan)
    if not storable(scored):
        return False
    parts = k.parts(keying.model_parts(loaded), dict(plan.provenance))
    return store.put(keying.digest(parts), parts, Entry(tuple(scored), files))


def _save_names(point: Plan) -> list[str]:
    """The files a point saves, relative to its folder (its document.json aside)."""
    return [rel for rel, _ in writer.layout(point) if rel != "document.json"]


def _saved(point: Plan) -> dict[str, bytes]:
    """An executed point's saved files, relative to its folder, as the writer makes them."""
    return {rel: make() for rel, make in writer.layout(point) if rel != "document.json"}


def run_cached(store: Store, doc, loaded, plan: Plan, *, engine: str, out: Optional[Path],
               batch_size: Optional[int], data, share: bool, at_once: int = 1, clock=None) -> Run:
    """``api.run``'s walk and write, through ``store`` (see the module's docstring)."""
    from ..engine import provenance
    from ..timing import KEY as TIMING, Clock

    clock = clock or Clock()
    model = keying.model_parts(loaded)
    keyed = _keyed(doc, loaded, plan, data=data)
    record = provenance.record(loaded, False, batch_size, at_once)  # what execute will record (it replaces it)
    hits: dict[str, Entry] = {}
    for k in keyed:
        parts = k.parts(model, record)
        entry = store.get(keying.digest(parts), parts)
        if entry is not None and list(entry.files) == _save_names(k.plan):
            hits[k.name] = entry
    needed = [k for k in keyed if k.name not in hits]
    executed, made = None, {}
    if needed:
        sub = plan if not hits else _compiled(doc, [k.valid for k in needed], loaded, data=data, share=share)
        with clock.walk({k.valid.name: k.name for k in needed if k.prefix}):
            executed = loaded.execute(sub, remote=False, batch_size=batch_size, at_once=at_once)
        record = dict(executed.provenance)  # stored under what the run recorded, not what was foreseen
        for k in needed:
            point = executed.steps[k.valid.name] if k.prefix else executed
            try:
                made[k.name] = _saved(point)
            except PlanError:
                if out is not None:
                    raise  # as the writer refuses it (a NaN in a saved metric)
                continue  # nothing to store; the run in memory is still whole
            scored = scored_in_plan(point)
            if storable(scored):
                parts = k.parts(model, record)
                store.put(keying.digest(parts), parts, Entry(tuple(scored), made[k.name]))
    # A served point computed nothing here, so its seconds in the timing are null; nothing else in
    # run.json tells it from a computed point (the record is a key part, the same either way).
    # Which points were served is told by served(run) (and the CLI's "cached:" line), in no file.
    run_record = {**record, "document": doc.name,
                  TIMING: clock.record({k.valid.name: k.name for k in keyed if k.prefix})}
    points = []
    for k in keyed:
        folder = (out / k.prefix if k.prefix else out) if out is not None else None
        if k.name in hits:
            entry = hits[k.name]
            points.append(Point(doc.path, k.name, dict(k.valid.coords), engine, list(entry.scored),
                                k.plan.produced_by, None, folder, entry.tensors()))
        else:
            point = executed.steps[k.valid.name] if k.prefix else executed
            points.append(Point.from_plan(doc.path, k.name, k.valid.coords, engine, point, folder))
    ran = Run(doc.path, engine, points, out, run_record, plan=executed)
    ran.cached = [k.name for k in keyed if k.name in hits]  # read with served(run)
    if out is not None:
        saved = {k.name: hits[k.name].files if k.name in hits else made[k.name] for k in keyed}
        ran.files = writer.commit(out, _run_files(plan, keyed, saved, run_record))
    return ran


def _run_files(plan: Plan, keyed: list[_Keyed], saved: dict, run_record: dict) -> dict[str, bytes]:
    """Every file of the run, in the writer's order: each point's saved files (served or made),
    the document.json files made from the compiled plan, run.json listing them (as ``manifest``)."""
    files = {}
    for k in keyed:
        files.update((k.prefix + rel, data) for rel, data in saved[k.name].items())
    for rel, make in writer.layout(plan):
        if rel not in files:  # a document.json: made from the plan, not from results
            files[rel] = make()
    files[writer.RUN] = writer.json_bytes({**run_record, "files": sorted(files)})
    return {rel: files[rel] for rel in writer.planned_files(plan)}

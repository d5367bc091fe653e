"""What an ``Execution`` computed, as ``Run`` objects and the files a run folder holds.

Two shapes, one way of making each part:

* ``document_run``: one document's points as one ``Run`` and one folder (``cm.run``, the CLI) —
  a point's folder under it when the document is swept, run.json recording every point;
* ``point_run``: one point as its own run, exactly what running ``doc.point(name)`` alone gives
  (``cm.run_points``, ``cm.run_together``, the pytest plugin), in a folder of its own.

A point is either computed (its plan walked) or served by the cache (its stored rows and
files); either way its files are the same bytes, and a folder is committed whole
(``outputs/write.commit``).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from ..outputs import write as writer
from ..outputs.results import Point, Run
from ..plan.plan import Plan
from ..timing import KEY as TIMING
from .execution import Execution, Slot


def document_run(execution: Execution, out: Optional[Path] = None, *, durable: bool = True) -> Run:
    """The execution's one document, every selected point, as one Run (and one folder at ``out``;
    ``durable``: ``outputs.write.commit``'s)."""
    execution.compute()
    (doc, _), = execution.docs
    slots = execution.shown()
    for s in slots:
        if s.error is not None:
            raise s.error
    swept = not execution.flat
    timing = execution.clock.record({s.key: s.name for s in slots} if swept else None)
    # The record names the run's point, so open() calls an unswept run's one point what run() did.
    record = {**execution.record(), "document": doc.name, **_extensions(s.valid.spec for s in slots),
              **_attribution(execution), TIMING: timing}
    points = []
    for s in slots:
        folder = (out / s.name if swept else out) if out is not None else None
        points.append(_point(execution, s, doc.path, s.name if swept else doc.name, s.valid.coords, folder))
    ran = Run(doc.path, execution.engine, points, out, record, plan=execution.walked)
    if execution.store is not None:
        ran.cached = [p.name for p, s in zip(points, slots) if s.entry is not None]  # read with served(run)
    if out is not None:
        layout = slots[0].compiled if not swept else Plan(
            name="<root>", steps={s.name: s.compiled for s in slots}, document=doc.raw, produced_by=None)
        saved = {(f"{s.name}/" if swept else ""): _saved(execution, s) for s in slots}
        ran.files = writer.commit(out, writer.manifest(layout, record, saved), durable=durable)
    return ran


def point_run(execution: Execution, key: str, folder: Optional[Path] = None, *, durable: bool = True) -> Run:
    """One point as its own run: equal to running ``doc.point(name)`` alone, its files byte for
    byte in ``folder`` (``durable``: ``outputs.write.commit``'s); computes the point's group if it
    has not run."""
    slot = execution.slots[key]
    if slot.entry is None:
        execution.executed(key)  # refuses as its compile or its group's walk did
    single = slot.doc if slot.name is None else slot.doc.point(slot.name)
    record = {**execution.record(), "document": single.name, **_extensions(p.spec for p in single.points),
              **_attribution(execution), TIMING: execution.clock.point_record(key) if not execution.flat else execution.clock.record()}
    point = _point(execution, slot, single.path, single.name, (), folder, alone=True)
    ran = Run(single.path, execution.engine, [point], folder, record, plan=point.plan)
    if execution.store is not None:
        ran.cached = [point.name] if slot.entry is not None else []
    if folder is not None:
        layout = replace(slot.compiled, name="<root>", coords=())
        ran.files = writer.commit(folder, writer.manifest(layout, record, {"": _saved(execution, slot)}),
                                  durable=durable)
    return ran


def _extensions(specs) -> dict:
    """run.json's ``extensions``: each extension whose kinds the run's points used (distribution,
    version, source digest), or nothing when none did (a run of built-ins records what it did)."""
    from ..extensions import used

    found = {}
    for spec in specs:
        found.update((e["distribution"], e) for e in used(spec))
    return {"extensions": [found[k] for k in sorted(found)]} if found else {}


def _attribution(execution: Execution) -> dict:
    """run.json's ``attribution``: each attribution pass's verification (the points run exactly, the
    figures), or nothing when the run estimated nothing."""
    return {"attribution": dict(execution.attribution)} if execution.attribution else {}


def _point(execution: Execution, slot: Slot, path, name: str, coords, folder, *, alone: bool = False) -> Point:
    if slot.entry is not None:
        return Point(path, name, dict(coords), execution.engine, list(slot.entry.scored), slot.compiled.produced_by,
                     None, folder, slot.entry.tensors())
    plan = execution.executed(slot.key)
    if alone and not execution.flat:
        # The point's sub-plan as the root plan of its point run alone: the same steps and results.
        plan = replace(plan, name="<root>", coords=(), provenance=execution.record())
    return Point.from_plan(path, name, coords, execution.engine, plan, folder)


def _saved(execution: Execution, slot: Slot) -> dict[str, bytes]:
    from ..cache.serve import saved

    return slot.entry.files if slot.entry is not None else saved(execution.executed(slot.key))

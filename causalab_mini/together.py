"""Points run together, each handed back exactly as running it alone gives it.

A test session runs a document's points as separate items, each expecting the point's own
``Run`` and its own folder — exactly what running ``doc.point(name)`` alone gives. Run alone,
though, every point also runs the forwards it shares with the others (the counterfactual pass
of a patching sweep), and documents on one model often read the same clean prompts too.
``run_points`` (some points of one document) and ``run_together`` (points of several documents
on one loaded model) compile the chosen points together, so those forwards run once
(``plan/share.py``: a forward with the same model, rows and reads is the same computation
whichever document asked for it), then hand each point back as its own run: the same ``Run``,
the same files, byte for byte, as the point run alone.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

from . import api
from .errors import PlanError
from .results import Run
from .timing import KEY as TIMING, Clock

OutFor = Union[None, str, Path, Callable[[str], Optional[Path]]]
# run_together's folders: (document, point name or None for an unswept document) -> folder or None
OutOf = Optional[Callable[[object, Optional[str]], Optional[Path]]]


def run_points(document, names: Optional[Iterable[str]] = None, *, engine: str = "nnterp", loaded=None,
               out: OutFor = None, batch_size: Optional[int] = None, models=None, data=None,
               device_map: str = "cpu", trust_remote_code: bool = False, share: bool = True,
               at_once: int = 1) -> dict[str, Run]:
    """``{name: Run}`` for the points ``names`` (default: all) of ``document``, in the document's
    order, each equal to ``run(read(document).point(name), ...)``. ``out``: a folder (each point
    written to ``out/<name>``) or ``name -> folder or None``. ``at_once``: points whose forwards
    are stacked into one model call (each point's run.json then records it). The rest as ``run``'s. Everything that
    can refuse does so before the first forward; a failure of one point fails the call (run the
    points one by one to tell them apart)."""
    from .plan.write import check_out

    doc = api.read(document)
    if len(doc.points) == 1 and doc.points[0].name is None:
        raise PlanError("run_points", f"{doc.name} is not swept: it has one point",
                        "run it with causalab_mini.run")
    api.check_run_options(batch_size, at_once)
    clock = Clock()
    if loaded is None:  # an unknown point and an unusable folder are refused before the model loads
        for p in _chosen(doc, names):
            folder = _out_of(out, p.name)
            if folder is not None:
                check_out(folder)
        with clock.measure("load"):
            loaded = api.load(doc, engine=engine, models=models, device_map=device_map,
                              trust_remote_code=trust_remote_code)
    (runs,) = run_together([(doc, names)], loaded=loaded, out=lambda _doc, name: _out_of(out, name),
                           batch_size=batch_size, data=data, share=share, at_once=at_once, clock=clock)
    return runs


def run_together(selections, *, loaded, out: OutOf = None, batch_size: Optional[int] = None, data=None,
                 share: bool = True, at_once: int = 1, clock: Optional[Clock] = None) -> list[dict]:
    """Points of several documents on one loaded model, computed in one walk.

    ``selections``: ``[(document, names)]`` — a document (path, dict or ``Document``) and the
    names of its points to run (None: all of them; an unswept document's one point is named
    None). Returns, in the same order, ``{name: Run}`` per document, each run equal to running
    that point alone (``run(doc.point(name))``, or ``run(doc)`` unswept), its files byte for byte
    when ``out(document, name)`` gives it a folder. A forward that points of different documents
    run identically — the same model on the same token ids, unwritten — runs once for all of
    them. Every document is run on ``loaded``, as ``run(loaded=...)`` runs it: group documents by
    the model they name. Everything that can refuse does so before the first forward. ``clock``:
    where the caller measured the load (each point's run.json records its timing)."""
    from .plan.plan import Plan
    from .plan.share import share as share_forwards
    from .plan.write import check_out, check_targets, planned_files, write

    api.check_run_options(batch_size, at_once)
    engine = loaded.name
    chosen = [(doc, _chosen(doc, names)) for doc, names in ((api.read(d), n) for d, n in selections)]
    outs = {(i, p.name): out(doc, p.name) if out is not None else None
            for i, (doc, points) in enumerate(chosen) for p in points}
    for folder in filter(None, outs.values()):
        check_out(folder)
    clock = clock or Clock()
    children: dict = {}
    for i, (doc, points) in enumerate(chosen):
        with clock.measure("compile"):
            plan = api.compile(api.Document(doc.raw, doc.path, points), loaded=loaded, data=data, share=False)
        for p in points:
            # A point is keyed by its document's place in the call: two documents may share names.
            children[_key(i, p.name)] = plan if p.name is None else plan.steps[p.name]
    root = Plan(name="<root>", steps=children, document=None, produced_by=None)
    for (i, name), folder in outs.items():
        if folder is not None:
            check_targets(folder, planned_files(_alone(root, _key(i, name))))
    with clock.walk(children):
        plan = loaded.execute(share_forwards(root) if share else root, batch_size=batch_size, at_once=at_once)
    runs: list[dict] = []
    for i, (doc, points) in enumerate(chosen):
        mine = {}
        for p in points:
            single = doc if p.name is None else doc.point(p.name)
            alone, folder = _alone(plan, _key(i, p.name)), outs[(i, p.name)]
            # As run() records the point alone, with this point's own seconds.
            record = {**plan.provenance, "document": single.name, TIMING: clock.point_record(_key(i, p.name))}
            ran = api.run_of(single, engine, alone, folder, record)
            if folder is not None:
                ran.files = write(alone, folder, record)
            mine[p.name] = ran
        runs.append(mine)
    return runs


def _chosen(doc, names) -> tuple:
    """The document's points named in ``names`` (None: all), in the document's order."""
    known = [p.name for p in doc.points]
    wanted = set(known if names is None else names)
    for name in wanted - set(known):
        shown = known if known != [None] else "none: it is not swept (name its point None)"
        raise PlanError(f"point {name!r}", f"not in {doc.name}", f"points: {shown}")
    return tuple(p for p in doc.points if p.name in wanted)


def _key(index: int, name: Optional[str]) -> str:
    return f"{index}:{'' if name is None else name}"


def _alone(plan, key: str):
    """A point's sub-plan as the root plan of its point run alone: the same steps and results."""
    return replace(plan.steps[key], name="<root>", coords=(), provenance=plan.provenance)


def _out_of(out: OutFor, name: str) -> Optional[Path]:
    if out is None:
        return None
    if callable(out):
        found = out(name)
        return Path(found) if found is not None else None
    return Path(out) / name

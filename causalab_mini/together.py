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
from .outputs.results import Run
from .running.execution import chosen
from .running.options import RunOptions
from .timing import Clock

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
    from .outputs.write import check_out

    doc = api.read(document)
    if len(doc.points) == 1 and doc.points[0].name is None:
        raise PlanError("run_points", f"{doc.name} is not swept: it has one point",
                        "run it with causalab_mini.run")
    RunOptions(batch_size=batch_size, at_once=at_once).check()
    clock = Clock()
    if loaded is None:  # an unknown point and an unusable folder are refused before the model loads
        for p in chosen(doc, names):
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
    from .outputs.write import check_out, check_targets, planned_files
    from .running.assemble import point_run
    from .running.execution import Execution

    options = RunOptions(batch_size=batch_size, at_once=at_once, share=share, data=data)
    options.check()
    selections = [(api.read(d), names) for d, names in selections]
    for doc, names in selections:
        chosen(doc, names)  # an unknown point refused before any folder is looked at
    execution = Execution(loaded, selections, options, clock=clock)
    folders = {s.key: out(s.doc, s.name) if out is not None else None for s in execution.shown()}
    for folder in filter(None, folders.values()):
        check_out(folder)
    for key, folder in folders.items():
        if folder is not None:
            check_targets(folder, planned_files(replace(execution.slots[key].compiled, name="<root>", coords=())))
    execution.compute()
    runs: list[dict] = [{} for _ in selections]
    for s in execution.shown():
        runs[s.index][s.name] = point_run(execution, s.key, folders[s.key])
    return runs


def _out_of(out: OutFor, name: str) -> Optional[Path]:
    if out is None:
        return None
    if callable(out):
        found = out(name)
        return Path(found) if found is not None else None
    return Path(out) / name

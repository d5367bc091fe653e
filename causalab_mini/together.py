"""Several points of a swept document, each as ``run(doc.point(name))`` gives it, computed in one walk.

A test session runs a document's points as separate items, each expecting the point's own
``Run`` and its own folder — exactly what running ``doc.point(name)`` alone gives. Run alone,
though, every point also runs the forwards it shares with the others (the counterfactual pass
of a patching sweep). ``run_points`` compiles the chosen points together, so those forwards run
once (``plan/share.py``), then hands each point back as its own run: the same ``Run``, the same
files, byte for byte, as the point run alone.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

from . import api
from .errors import PlanError
from .results import Run

OutFor = Union[None, str, Path, Callable[[str], Optional[Path]]]


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
    from .plan.write import check_out, check_targets, planned_files, write

    doc = api.read(document)
    if len(doc.points) == 1 and doc.points[0].name is None:
        raise PlanError("run_points", f"{doc.name} is not swept: it has one point",
                        "run it with causalab_mini.run")
    known = [p.name for p in doc.points]
    wanted = set(known if names is None else names)
    for name in wanted - set(known):
        raise PlanError(f"point {name!r}", f"not in {doc.name}", f"points: {known}")
    chosen = tuple(p for p in doc.points if p.name in wanted)
    api.check_run_options(batch_size, at_once)
    outs = {p.name: _out_of(out, p.name) for p in chosen}
    for folder in filter(None, outs.values()):
        check_out(folder)
    if loaded is None:
        loaded = api.load(doc, engine=engine, models=models, device_map=device_map,
                          trust_remote_code=trust_remote_code)
    engine = loaded.name
    plan = api.compile(api.Document(doc.raw, doc.path, chosen), loaded=loaded, data=data, share=share)
    for name, folder in outs.items():
        if folder is not None:
            check_targets(folder, planned_files(_alone(plan, name)))
    plan = loaded.execute(plan, remote=engine == "ndif", batch_size=batch_size, at_once=at_once)
    runs = {}
    for p in chosen:
        single, root, folder = doc.point(p.name), _alone(plan, p.name), outs[p.name]
        record = {**plan.provenance, "document": single.name}  # as run() records the point alone
        ran = api.run_of(single, engine, root, folder, record)
        if folder is not None:
            ran.files = write(root, folder, record)
        runs[p.name] = ran
    return runs


def _alone(plan, name: str):
    """A point's sub-plan as the root plan of its point run alone: the same steps and results."""
    return replace(plan.steps[name], name="<root>", coords=(), provenance=plan.provenance)


def _out_of(out: OutFor, name: str) -> Optional[Path]:
    if out is None:
        return None
    if callable(out):
        found = out(name)
        return Path(found) if found is not None else None
    return Path(out) / name

"""The Python front door: ``read`` → ``compile`` / ``load`` → ``run`` → ``open``.

::

    import causalab_mini as cm

    doc = cm.read("documents/v2/layer_pos_sweep.causalab.json")   # validated, no model
    plan = cm.compile(doc)                                          # weightless: config + tokenizer
    run = cm.run(doc, engine="hooks", out="runs/layer_pos")         # load, compute, write
    run.grid("iia", "layers", "pos").values
    cm.open("runs/layer_pos").point(layers=1, pos=-1).result("iia").mean()

A document is read, lowered into its sweep points and validated once; every
later stage takes the ``Document`` and reuses those points. ``engine`` is always
an engine's name; a loaded engine (``load``) is passed as ``loaded``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Union

from . import formats
from .document import read as front
from .document.expect import Expectation
from . import engines
from .errors import EngineError, PlanError
from .outputs import run_files
from .names import point_name, stem
from .outputs.results import Point, Run, Scored, Result
from .plan import compile as compiler
from .timing import Clock

PathLike = Union[str, Path]


@dataclass(frozen=True)
class Document:
    """A document read and validated: its JSON, where it came from, and its sweep points
    (``name``, ``spec``, ``document``, ``coords``; one point named None when unswept).
    A swept point's ``document`` shares what its sweep does not change with ``raw`` and the
    other points: read it, or ``copy.deepcopy`` it to edit it."""

    raw: dict
    path: Optional[Path]
    points: tuple
    title: Optional[str] = None  # a sweep point's name, for one point taken as a document

    @property
    def name(self) -> str:
        """The document's stem (``patching`` for ``patching.causalab.json``), or the point's name
        for ``doc.point(name)``: what an unswept run calls its one point."""
        return self.title or (stem(self.path) if self.path else "<document>")

    @property
    def point_names(self) -> list[str]:
        return [point_name(self.path or Path(self.name), p.name) for p in self.points]

    @property
    def model(self):
        """The model reference every point runs on (key, revision, dtype, modules)."""
        return self.points[0].spec.model

    @property
    def shape(self) -> str:
        """``"protocol"`` (data + method) or ``"plan-shaped"`` (sites, interventions, steps)."""
        return front.shape(self.raw)

    @property
    def attention_probs(self) -> bool:
        """Whether some point taps the attention pattern, which is chosen when the model loads."""
        return uses_attention_probs(self.points)

    @property
    def attention_seam(self) -> bool:
        """Whether some point taps inside attention, which the hooks engine reaches through the
        attention function the model is served with (chosen when it loads)."""
        return uses_attention_seam(self.points)

    def point(self, name: str) -> "Document":
        """One sweep point as a document of its own — already validated, its expectations the ones
        that apply there — to run a single point (``run(doc.point("pos=-1"))``)."""
        for p in self.points:
            if p.name == name:
                return Document(p.document, self.path, (replace(p, name=None, coords=()),), title=name)
        raise PlanError(f"point {name!r}", f"not in {self.name}", f"points: {self.point_names}")

    def __repr__(self) -> str:
        return f"<Document {self.name}: {len(self.points)} point(s)>"


def read(source: Union[PathLike, dict, Document], *, path: Optional[PathLike] = None) -> Document:
    """A document from a ``*.causalab.json`` file (or an already parsed dict, with ``path`` saying
    where relative dataset and artifact paths start), lowered and validated — expectations
    included. Refuses with a typed error naming the field; loads no model."""
    if isinstance(source, Document):
        return source
    if isinstance(source, dict):
        raw, where = copy.deepcopy(source), (Path(path).resolve() if path else None)
    else:
        raw = front.read(Path(source))  # a refusal names the file as the user wrote it, not its link's target
        where = Path(source).resolve()
    return Document(raw, where, tuple(front.points(raw)))


def points(document: Union[PathLike, dict, Document]) -> tuple:
    """The document's sweep points, validated (``read(document).points``)."""
    return read(document).points


def compile(document: Union[PathLike, dict, Document], *, engine: str = "nnterp", loaded=None, models=None,
            data=None, trust_remote_code: bool = False, share: bool = True):
    """The plan tree, compiled for ``engine`` against the model's config and tokenizer (never its
    weights) — or against ``loaded``, an engine from ``load``, which answers for its model. Every
    refusal that needs the model or the data happens here, before any compute. ``share``: a
    forward several sweep points run identically runs once, ahead of them (a ``shared`` step);
    False gives every point its own (the same numbers, more forwards)."""
    doc = read(document)
    if loaded is None:
        engines.engine_class(engine)  # an unknown name is refused before the model is looked up
    return compiler.compile_plan(doc.raw, document=doc.path, models=models, data=data, engine=engine,
                                 facts=loaded, trust_remote_code=trust_remote_code, valid=list(doc.points),
                                 share=share)


def expectation(raw: dict, *, where: str = "expect") -> Expectation:
    """An expectation from its JSON form (``{"result": "iia", "mean": {">": 0.8}}``); a malformed one
    is a DocumentError naming the field under ``where``."""
    from pydantic import ValidationError

    from .document.errors import document_error

    try:
        return Expectation.model_validate(raw)
    except ValidationError as err:
        raise document_error(err, where, raw) from None


def family_layout(model_type: Optional[str], modules=None):
    """Where a transformers ``model_type`` keeps each component (a document's ``model.modules``
    first): the table ``causalab-mini vocab`` prints; an empty layout for a family not in it."""
    from .layouts import UNKNOWN, layout_for

    return layout_for(model_type or "", modules) or UNKNOWN


def resolve_model(document: Union[PathLike, dict, Document], *, models=None, hash_weights: bool = True):
    """Where the document's model is and its revision (a local checkpoint's weights digest, checked
    against the document's pin), without loading it: ``(key, source, revision, local)``.
    ``hash_weights=False``: no weight file is read; the revision is the document's (an ndif shell's)."""
    from .model import loading

    doc = read(document)
    return loading.resolve(doc.model.key, doc.model.revision, document=doc.path, roots=models,
                           hash_weights=hash_weights)


def load(document: Union[PathLike, dict, Document], *, engine: str = "nnterp", models=None,
         device_map: str = "cpu", trust_remote_code: bool = False, request: Optional[str] = None):
    """The named engine with the document's model loaded (frozen), to pass to ``run(loaded=...)``
    for every document on that model. ``request``, for a remote engine (``ndif``): what its requests
    carry — ``"kernel"`` (the default: a stock server runs it) or ``"package"`` (the walk by
    reference, for a server with this causalab-mini installed)."""
    doc = read(document)
    remote = engines.record(engine).remote if engine in engines.ENGINES else False
    kinds = engines.REQUESTS
    if request is not None and (not remote or request not in kinds):
        raise EngineError("request", f"request={request!r} " + (f"is not one of {', '.join(kinds)}" if remote else
                          f"is for a remote engine, and {engine} runs here"),
                          f"give one of {', '.join(kinds)} with engine=\"ndif\"" if not remote else
                          f"give one of {', '.join(kinds)}")
    # A sweep may not change the model, so the first point names it; eager attention (which rounds
    # differently) is asked for only when some point taps the attention pattern.
    loaded = engines.engine_class(engine).load(doc.model, document=doc.path, models=models, device_map=device_map,
                                               trust_remote_code=trust_remote_code,
                                               attention_probs=uses_attention_probs(doc.points),
                                               attention_seam=uses_attention_seam(doc.points))
    if request is not None:
        loaded.request = request
    return loaded


def uses_attention_seam(points) -> bool:
    """Whether any point taps inside attention (q, k, v, the scores, the pattern): the hooks engine
    then serves the model with the attention function that reaches them, chosen when it loads."""
    from .components import INTERIORS

    return any(site.component in INTERIORS for p in points for site in p.spec.sites.values())


def uses_attention_probs(points) -> bool:
    """Whether any point's site is an attention pattern, which must be chosen when the model loads."""
    return any(site.component == "attention_probs" for p in points for site in p.spec.sites.values())


def check_run_options(batch_size: Optional[int], at_once: int) -> None:
    """Refuse a batch size or an at_once that is not a positive integer, before anything loads."""
    from .engine.steps import check_options

    check_options(batch_size, at_once)


def run(document: Union[PathLike, dict, Document], *, engine: str = "nnterp", loaded=None, out=None,
        batch_size: Optional[int] = None, models=None, data=None, device_map: str = "cpu",
        trust_remote_code: bool = False, share: bool = True, cache=None, at_once: int = 1,
        reads=None, plugins=None, request: Optional[str] = None, durable: bool = True) -> Run:
    """Run every point of the document and return them as a ``Run``.

    ``loaded``: an engine from ``load`` (its model reused; ``engine`` is then its name).
    ``out``: a directory to commit the run into, laid out as ``causalab-mini run`` lays it out
    (``open(out)`` reads it back). Everything that can refuse the run does so before the load
    (the document, ``out``, ``batch_size``) or before the first forward (the compile).
    ``share``: as ``compile``'s (a P-point patching sweep runs P + 1 forwards, not 2P).
    ``cache``: a folder (made if missing) of results by key (``causalab_mini.cache``): a point
    whose key has an entry there is served from it without a forward, the others are computed
    and stored; the Run, and ``out``, are what computing every point gives. ``cache.served(run)``
    names the points served. A folder that cannot be used is refused before the load.
    ``at_once``: up to this many points' passes stacked into one model call, within the batch
    size (``engine/at_once.py``); recorded in run.json when above 1.
    ``reads``: read names (or ``"all"``) whose activations each point keeps in memory —
    ``point.value(name)``, a CPU tensor as read: rows in the dataset's order, then the read's
    positions, then its width. Nothing on disk changes (a step's ``outputs`` and ``saves`` put a
    read in a file); a name no pass reads is refused before the load.
    ``plugins``: extension modules (dotted names or modules) to load first, beside the installed
    ones (``causalab_mini.extensions``); a document using their kinds names them.
    ``request``: for ``engine="ndif"``, what its request carries (``load``'s); a loaded shell's is its own
    (``shell.request``).
    ``durable``: ``out``'s files reach the disk before its run.json does (one barrier); False for a
    scratch folder, where a machine's crash may lose files a kill cannot."""
    from .outputs.write import check_out
    from .running.assemble import document_run
    from .running.execution import Execution
    from .running.options import RunOptions

    if plugins:
        from . import extensions

        extensions.use(plugins)
    doc = read(document)
    options = RunOptions(batch_size=batch_size, at_once=at_once, share=share, device_map=device_map,
                         trust_remote_code=trust_remote_code, models=models, data=data, cache=cache, reads=reads)
    options.check()
    if reads is not None:
        _check_reads(doc, reads)
    if out is not None:
        out = Path(out)
        check_out(out)
    if cache is not None:
        from .cache import open_store

        open_store(cache, engine=engine if loaded is None else loaded.name)  # refused before the load
    clock = Clock()
    if loaded is None:
        with clock.measure("load"):
            loaded = load(doc, engine=engine, models=models, device_map=device_map,
                          trust_remote_code=trust_remote_code, request=request)
    execution = Execution(loaded, [(doc, None)], options, clock=clock)
    if out is not None:
        _check_targets(out, execution)
    # "ndif" is the nnterp engine on a weightless shell, whose session goes to NDIF: where a run
    # happens is the engine's to say, not a second code path here.
    return document_run(execution, out, durable=durable)


def _check_targets(out: Path, execution) -> None:
    """Refuse, before the first forward, a file of the run whose place in ``out`` cannot take it."""
    from .outputs.write import check_targets, planned_files
    from .plan.plan import Plan

    slots = execution.shown()
    if execution.flat:
        layout = slots[0].compiled
    else:
        layout = Plan(name="<root>", steps={s.name: s.compiled for s in slots}, document=None, produced_by=None)
    check_targets(out, planned_files(layout))


def _check_reads(doc: Document, reads) -> None:
    """Refuse, before the load, a kept read the document declares nowhere."""
    from .plan.keep import ALL

    if reads == ALL:
        return
    names = [reads] if isinstance(reads, str) else list(reads)
    declared = sorted({n for p in doc.points for iv in p.spec.interventions.values() for n in iv.reads})
    for name in names:
        if name not in declared:
            raise PlanError("reads", f"{name!r} is not a read of {doc.name}",
                            f"name reads the document declares: {declared}, or reads=\"all\"")


def open(directory: PathLike) -> Run:  # noqa: A001 - the verb of the API, as run is
    """A finished run directory (written by ``run(out=...)``, ``causalab-mini run`` or the pytest
    plugin's ``--causalab-out``) read back as a ``Run``: the metrics its document saves as
    ``.json`` and the tensors it saves as ``.safetensors``, without a model or a rerun.
    A folder whose write did not finish is refused, never read as a result."""
    from .outputs.write import RUN, state

    directory = Path(directory)
    found = state(directory)
    if found != "complete":
        problem = ("the run written here did not finish (interrupted or out of space)" if found == "incomplete"
                   else f"no {RUN}: not a run directory")
        raise PlanError(str(directory), problem, "open the folder a run wrote (the one holding run.json), "
                        "or run the document again")
    # run.json first, with every file it lists present, so a damaged folder is refused naming
    # the file before any of it is read as a result (outputs/run_files.py says why).
    record = run_files.record(directory)
    doc = read(run_files.json_object(directory / "document.json", directory), path=directory / "document.json")
    engine = engines.engine_name(record.get("engine"), remote=bool(record.get("remote")))
    swept = not (len(doc.points) == 1 and doc.points[0].name is None)
    pts = []
    for p in doc.points:
        folder = directory / p.name if swept else directory
        name = p.name if swept else record.get("document") or directory.resolve().name
        if swept:  # checked, not used here: plot and report read each point's own document.json
            run_files.json_object(folder / "document.json", directory)
        pts.append(_opened_point(folder, name, p, engine, directory))
    return Run(None, engine, pts, directory, record)


def _opened_point(folder: Path, name: str, valid, engine: str, directory: Path) -> Point:
    """One point's saves as its run wrote them, each checked as it is read (``directory``: the
    run's folder, which the refusal of a damaged file tells the user to run into again)."""
    scored, tensors = [], {}
    for step_name, step in valid.spec.steps.items():
        for save in getattr(step, "saves", ()):
            form = formats.format_of(save.file_path)
            value = form.read(folder / save.file_path, directory)
            if form.holds == formats.ROWS:
                scored.append(Scored(step_name, save.value, Result(save.value, value), save.file_path))
            else:
                tensors[save.file_path] = value
    return Point(None, name, dict(valid.coords), engine, scored, valid.spec.produced_by, None, folder, tensors)

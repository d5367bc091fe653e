"""One pytest session's state: settings, loaded models, documents, and the points' one walk.

State, not scheduling: which points run together, in what order and what they share is the
library's (``causalab_mini.Execution``); the session holds what it is given and asks for one
point per item. A document is read once per process — at collection, which reads and validates
only, so ``pytest --collect-only`` imports no torch — and kept. A model is loaded once per
(resolved model, revision, dtype, engine, device map) — plus whether attention probabilities
were asked for, which changes how it loads, and the module names a document gives
(``model.modules``), which change what it taps. The selected points on one model make one
``Execution``: each item asks it for its own point, which computes that point's group (the
forwards the points share run with the first that borrows them), so an item's duration is its
own work, ``-v`` reports points as they finish, and ``-x`` stops between them. A failure at
any stage is cached too, so every item that needs it reports the same refusal without trying
again.
"""
from __future__ import annotations

import copy
import fnmatch
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import pytest

import causalab_mini
from causalab_mini import LOCAL_ENGINES, Point, Run
from causalab_mini.names import point_name, stem

from . import devices

# Every engine (ndif: a weightless shell of each model, every point sent to NDIF, its key from
# NDIF_API_KEY in the environment, never from an option or an ini file), and both local ones.
ENGINES = (*causalab_mini.ENGINES, "both")
UPDATES = ("failing", "all")
BASELINE_MODES = ("rows", "aggregates")
# What a CI variable may say and still mean "not CI" (case-insensitive, spaces ignored); anything
# else non-empty ("true", "1", "yes", "woodpecker") makes a run strict.
CI_OFF = ("", "0", "false", "no", "off")


def ci_is_set(value: Optional[str]) -> bool:
    """Whether the ``CI`` environment variable asks for strict baselines: set, and not a "no"."""
    return value is not None and value.strip().lower() not in CI_OFF


def session_of(config) -> "Session":
    return config.stash[SESSION]


@dataclass(frozen=True)
class Settings:
    engine: str  # nnterp | hooks | ndif | both
    models: tuple[str, ...]
    data: tuple[str, ...]
    device_map: str
    batch_size: Optional[int]
    out: Optional[Path]
    update: Optional[str]  # None | failing | all
    strict: bool  # a missing baseline fails (also when CI is set)
    rtol: Optional[float]  # None: the point's dtype's default (checks.default_tolerance)
    atol: Optional[float]
    baselines: str  # folder beside each document
    summary: bool
    baseline_mode: str = "rows"  # rows | aggregates: how a document's baseline stores its results
    aggregates: tuple[str, ...] = ()  # globs of documents stored as aggregates whatever the mode
    report: Optional[Path] = None  # the folder an HTML report of the session is written to
    at_once: int = 1  # a document's points stacked into one model call (engine/at_once.py)
    cache: Optional[Path] = None  # a result cache folder: points whose results it holds are not computed

    def mode_for(self, document: Path, root: Path) -> str:
        """The baseline mode of one document: ``aggregates`` when a ``causalab_baseline_aggregates``
        glob matches its path relative to ``root`` (or its file name), else ``baseline_mode``."""
        if self.aggregates:
            path = Path(document)
            try:
                rel = path.resolve().relative_to(Path(root).resolve()).as_posix()
            except ValueError:
                rel = path.as_posix()
            if any(fnmatch.fnmatchcase(rel, g) or fnmatch.fnmatchcase(path.name, g) for g in self.aggregates):
                return "aggregates"
        return self.baseline_mode

    @property
    def engines(self) -> tuple[str, ...]:
        """The engines each point runs on; the first is the one baselines are checked and written from."""
        return LOCAL_ENGINES if self.engine == "both" else (self.engine,)


def _option(config, name: str):
    """CLI first, then ini: pytest-asyncio's pattern, so a repository pins defaults in its ini."""
    value = config.getoption(name, None)
    return value if value not in (None, [], "") else config.getini(name)


def _paths(config, name: str) -> tuple[str, ...]:
    cli = config.getoption(name, None)
    if cli:  # relative to where pytest was invoked, made absolute for xdist workers
        base = config.invocation_params.dir
        return tuple(str((base / p).resolve()) for p in cli)
    return tuple(str(p) for p in config.getini(name))  # type "paths": relative to the ini file


def _number(config, name: str, kind, minimum=None):
    raw = _option(config, name)
    if raw in (None, ""):
        return None
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise pytest.UsageError(f"--{name.replace('_', '-')}: {raw!r} is not {what}") from None
    if minimum is not None and value < minimum:
        raise pytest.UsageError(f"--{name.replace('_', '-')}: {raw!r} is below {minimum}")
    return value


def _choice(config, name: str, choices, default, *, ini: bool = True, cli: bool = True, hint: str = ""):
    if not cli:
        value = config.getini(name) or default
    else:
        value = (_option(config, name) if ini else config.getoption(name, None)) or default
    if value is not None and value not in choices:
        where = (f"--{name.replace('_', '-')}" + (f" (ini {name})" if ini else "")) if cli else f"ini {name}"
        raise pytest.UsageError(f"{where}: {value!r} is not one of {', '.join(choices)}{hint}")
    return value


# A bare --causalab-update-baselines takes the next word as its value when it is not an option.
UPDATE_HINT = (" (--causalab-update-baselines alone means failing; followed by a path it takes the "
               "path as its value: write it after the paths, or as --causalab-update-baselines=failing)")


def _update_hint(config) -> str:
    """The hint when --causalab-update-baselines took a path that exists as its value."""
    value = config.getoption("causalab_update_baselines", None)
    if value in (None, *UPDATES):
        return ""
    try:
        taken = (Path(config.invocation_params.dir) / str(value).split("::")[0]).exists()
    except (OSError, ValueError):
        taken = False
    return UPDATE_HINT if taken else ""


def _flag(config, name: str) -> bool:
    cli = config.getoption(name, None)
    return bool(cli) if cli else bool(config.getini(name))


def _folder(config, name: str) -> Optional[Path]:
    """A folder option: from the command line relative to where pytest was invoked, from the ini
    relative to the ini file; absolute either way, for xdist workers."""
    cli = config.getoption(name, None)
    if cli:
        return (Path(config.invocation_params.dir) / cli).resolve()
    ini = config.getini(name)
    if not ini:
        return None
    base = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
    return (base / ini).resolve()


def read_settings(config) -> Settings:
    out = _option(config, "causalab_out")
    report = _option(config, "causalab_report")
    report = Path(report).resolve() if report else None
    if report is not None and report.exists() and not report.is_dir():
        raise pytest.UsageError(f"--causalab-report: {report} is a file; give a folder (the page is its index.html)")
    if not out and report is not None:
        out = report / "runs"  # the report links each point's files: keep them beside it, not in a tmp dir
    rtol = _number(config, "causalab_rtol", float, 0.0)
    atol = _number(config, "causalab_atol", float, 0.0)
    return Settings(
        engine=_choice(config, "causalab_engine", ENGINES, "nnterp"),
        models=_paths(config, "causalab_models"),
        data=_paths(config, "causalab_data"),
        device_map=_option(config, "causalab_device_map") or "cpu",
        batch_size=_number(config, "causalab_batch_size", int, 1),
        out=Path(out).resolve() if out else None,
        report=report,
        at_once=_number(config, "causalab_at_once", int, 1) or 1,
        cache=_folder(config, "causalab_cache"),
        # Command line only: rewriting baselines is a decision for one run, not a setting.
        update=_choice(config, "causalab_update_baselines", UPDATES, None, ini=False, hint=_update_hint(config)),
        strict=_flag(config, "causalab_strict") or ci_is_set(os.environ.get("CI")),
        rtol=rtol,  # None: the default of each point's dtype (causalab_mini.checks.default_tolerance)
        atol=atol,
        baselines=_option(config, "causalab_baselines") or "baselines",
        summary=_flag(config, "causalab_summary"),
        # Ini only: how a committed baseline file is stored is the repository's decision, not one run's.
        baseline_mode=_choice(config, "causalab_baseline_mode", BASELINE_MODES, "rows", cli=False),
        aggregates=tuple(g for line in config.getini("causalab_baseline_aggregates") for g in line.split()),
    )


@dataclass
class PendingPoint:
    """A point about to run, as ``pytest_causalab_modify_point`` sees it: change ``document`` or
    ``batch_size`` in place. A changed document is compiled on its own (so its ``produced_by``
    changes with it, and a stored baseline says the experiment changed)."""

    path: Path
    name: str
    coords: tuple
    engine: str
    document: dict
    batch_size: Optional[int]


@dataclass
class _Failed:
    error: BaseException


class Session:
    """Caches for one pytest process (each xdist worker has its own)."""

    def __init__(self, config, settings: Settings):
        self.config = config
        self.settings = settings
        self.loads = 0  # models loaded in this process; the plugin's tests count them
        self._models: dict[tuple, Any] = {}
        self._documents: dict[Path, Any] = {}
        # (document path, engine) -> its model key: resolving hashes the weights' files, and a
        # document is read once per session, so its key is resolved once too.
        self._keys: dict[tuple, tuple] = {}
        self._extension_versions: dict[tuple, dict] = {}  # (path, point, engine) -> {distribution: version}
        self._points: dict[tuple, Any] = {}
        self._experiments: dict[tuple, dict] = {}  # (path, point, engine) -> the canonical experiment run
        self._tmp: Optional[Path] = None
        # The points this process is to run, per document (pytest_collection_modifyitems says),
        # and the one walk of each model's points: model key -> Execution (None: each runs alone).
        self._selected: dict[Path, list] = {}
        self._executions: dict[tuple, Any] = {}
        self._asked: dict[tuple, PendingPoint] = {}  # what pytest_causalab_modify_point made of each point
        self._served: set = set()  # (path, point, engine) whose results the cache gave
        self._device_map: Optional[str] = None  # resolved from settings.device_map when first needed

    def select(self, items) -> None:
        """The session's point items, in run order: the points to run, per document, which make each
        model's one walk (``Execution``) — its points' shared forwards run once, within a document
        and across the model's documents."""
        self._selected = {}
        for item in items:
            valid = getattr(item, "valid", None)
            if valid is not None:  # an unswept document's one point is named None
                self._selected.setdefault(Path(item.path).resolve(), []).append(valid.name)

    # --- documents, models, plans ---------------------------------------------------------

    def document(self, path) -> causalab_mini.Document:
        path = Path(path).resolve()
        if path not in self._documents:
            try:
                self._documents[path] = causalab_mini.read(path)
            except Exception as err:  # noqa: BLE001 — cached and re-raised to every asker
                self._documents[path] = _Failed(err)
        return _unwrap(self._documents[path])

    def model_key(self, doc: causalab_mini.Document, engine: str) -> tuple:
        if (doc.path, engine) not in self._keys:
            self._keys[(doc.path, engine)] = self._model_key(doc, engine)
        return self._keys[(doc.path, engine)]

    def _model_key(self, doc: causalab_mini.Document, engine: str) -> tuple:
        ref = doc.model
        # A remote engine's shell has the server's weights: the key is read from the document, no file hashed.
        resolved = causalab_mini.resolve_model(doc, models=list(self.settings.models),
                                               hash_weights=engine in causalab_mini.LOCAL_ENGINES)
        # The module names a document gives (model.modules) decide which modules the engine taps.
        modules = tuple(sorted(ref.modules.model_dump().items())) if ref.modules else None
        return (resolved.source, resolved.revision, ref.dtype, engine, self.device_map,
                doc.attention_probs, doc.attention_seam, modules)

    @property
    def device_map(self) -> str:
        """The device map this process loads with: under xdist, this worker's own device
        (``devices.resolve``); asked of torch once, when the first model loads."""
        if self._device_map is None:
            worker = getattr(self.config, "workerinput", {}).get("workerid")
            spec = self.settings.device_map
            visible = devices.visible_accelerators() if spec == "auto" else []
            self._device_map = devices.resolve(spec, worker, visible)
        return self._device_map

    def engine(self, doc: causalab_mini.Document, engine: str):
        key = self.model_key(doc, engine)
        if key not in self._models:
            try:
                loaded = causalab_mini.load(doc, engine=engine, models=list(self.settings.models),
                                            device_map=self.device_map)
                self._models[key] = loaded
                self.loads += 1
                self.config.hook.pytest_causalab_model_loaded(key=key, engine=loaded, config=self.config)
            except Exception as err:  # noqa: BLE001
                self._models[key] = _Failed(err)
        return _unwrap(self._models[key])

    # --- points ---------------------------------------------------------------------------

    def point(self, path, name: Optional[str], engine: str) -> Point:
        """One point run on one engine: the point's own document, compiled and run, nothing else."""
        doc = self.document(path)
        shown = point_name(doc.path, name)
        key = (doc.path, shown, engine)
        if key not in self._points:
            try:
                self._points[key] = self._run_point(doc, name, shown, engine)
            except Exception as err:  # noqa: BLE001
                self._points[key] = _Failed(err)
        return _unwrap(self._points[key])

    def _pending(self, doc: causalab_mini.Document, name: Optional[str], shown: str, engine: str) -> PendingPoint:
        """The point as ``pytest_causalab_modify_point`` leaves it (asked once per point and engine)."""
        key = (doc.path, shown, engine)
        if key not in self._asked:
            valid = next((p for p in doc.points if p.name == name), None)
            if valid is None:
                raise KeyError(f"{doc.path.name} has no point {shown!r}; points: {doc.point_names}")
            hook = self.config.hook.pytest_causalab_modify_point
            # With no implementation nothing can change the point: its document is not copied.
            modifiable = bool(hook.get_hookimpls())
            pending = PendingPoint(doc.path, shown, valid.coords, engine,
                                   copy.deepcopy(valid.document) if modifiable else valid.document,
                                   self.settings.batch_size)
            if modifiable:
                hook(point=pending, config=self.config)
            self._asked[key] = pending
        return self._asked[key]

    def _unchanged(self, doc, name: str, engine: str) -> bool:
        """Whether no hook changed the point: it may then run together with its document's others."""
        pending = self._pending(doc, name, point_name(doc.path, name), engine)
        valid = next(p for p in doc.points if p.name == name)
        return pending.document == valid.document and pending.batch_size == self.settings.batch_size

    def _execution(self, doc: causalab_mini.Document, engine: str):
        """The one walk of every selected point on ``doc``'s model (its key: the same checkpoint,
        revision, dtype and load) — of this document and the model's others — made when the
        first of them is asked for, computing nothing until each is; None when the point runs
        alone (on an xdist worker that may not get the others)."""
        if not self._may_share():
            return None
        key = self.model_key(doc, engine)
        if key not in self._executions:
            group = self._group(doc, engine, key)
            try:
                self._executions[key] = causalab_mini.Execution(
                    self.engine(doc, engine), [(self.document(path), names) for path, names in group.items()],
                    causalab_mini.RunOptions(batch_size=self.settings.batch_size, at_once=self.settings.at_once,
                                             data=list(self.settings.data), cache=self.settings.cache),
                    tolerant=True)
            except Exception:  # noqa: BLE001 — what cannot start together runs (and fails) point by point
                self._executions[key] = None
        return self._executions[key]

    def _group(self, doc: causalab_mini.Document, engine: str, key: tuple) -> dict:
        """{path: point names} of the selected points on the model ``key`` names, this document
        first; those a hook changed are left out (each runs alone)."""
        group: dict = {}
        for path in sorted(self._selected, key=lambda p: p != doc.path):
            try:
                other = self.document(path)
                if self.model_key(other, engine) != key:
                    continue
                names = [n for n in self._selected[path] if self._unchanged(other, n, engine)]
            except Exception:  # noqa: BLE001 — a document that cannot be read runs (and fails) alone
                continue
            if names:
                group[path] = names
        return group

    def served(self, path, name: Optional[str], engine: str) -> bool:
        """Whether the point's results came from the cache (nothing computed) in this session."""
        doc = self.document(path)
        return (doc.path, point_name(doc.path, name), engine) in self._served

    def _may_share(self) -> bool:
        """Not on an xdist worker that may be given only some of a document's points (``-n`` without
        ``--dist loadgroup``, where this plugin sends a model's documents to one worker whole)."""
        if not hasattr(self.config, "workerinput"):
            return True
        return bool(getattr(self.config.option, "loadgroup", False))  # xdist sets it on a loadgroup worker

    def _run_point(self, doc: causalab_mini.Document, name: Optional[str], shown: str, engine: str) -> Point:
        pending = self._pending(doc, name, shown, engine)
        valid = next(p for p in doc.points if p.name == name)
        loaded = self.engine(doc, engine)
        if pending.document != valid.document:
            # Changed by a hook: validated as a document of its own (its produced_by changes with it).
            single = causalab_mini.read(pending.document, path=doc.path)
        else:
            single = doc.point(name) if name is not None else doc
        execution = self._execution(doc, engine) if pending.document == valid.document else None
        slot = execution.key_of(doc.path, name) if execution is not None else None
        # Under pytest's temporary directory (no --causalab-out) a point's folder is scratch, which
        # pytest removes a few sessions on: committed whole, but not flushed to the disk.
        durable = self.settings.out is not None
        if slot is not None:
            ran = causalab_mini.point_run(execution, slot, self._out(doc.path, engine, shown), durable=durable)
        else:
            ran = causalab_mini.run(single, loaded=loaded, data=list(self.settings.data),
                                    out=self._out(doc.path, engine, shown), batch_size=pending.batch_size,
                                    cache=self.settings.cache, at_once=self.settings.at_once, durable=durable)
        if causalab_mini.cache.served(ran):
            self._served.add((doc.path, shown, engine))
        # What produced_by digests (the point's document without its header, defaults written out):
        # a baseline stores it so a changed experiment can say which fields changed.
        self._experiments[(doc.path, shown, engine)] = single.points[0].spec.canonical()
        self._extension_versions[(doc.path, shown, engine)] = {
            e["distribution"]: e["version"] for e in (ran.record or {}).get("extensions", [])}
        return replace(ran.point(), document=doc.path, name=shown, coords=dict(valid.coords), engine=engine)

    def extension_versions(self, path, name: Optional[str], engine: str) -> dict:
        """{distribution: version} of the extensions whose kinds the point used in this session."""
        doc = self.document(path)
        return self._extension_versions.get((doc.path, point_name(doc.path, name), engine), {})

    def experiment(self, path, name: Optional[str], engine: str) -> Optional[dict]:
        """The canonical experiment a point ran (``Spec.canonical()``: no header, defaults written
        out), a hook's changes included; None when it has not run in this session."""
        doc = self.document(path)
        return self._experiments.get((doc.path, point_name(doc.path, name), engine))

    def run(self, path, engine: Optional[str] = None) -> Run:
        """Every point of a document on one engine (default: the session's first), from the cache."""
        path = self.resolve(path)
        engine = engine or self.settings.engines[0]
        doc = self.document(path)
        return Run(doc.path, engine, [self.point(path, p.name, engine) for p in doc.points])

    def resolve(self, path) -> Path:
        """A document path as written in a test: absolute, relative to the rootdir, or to the cwd."""
        path = Path(path)
        if path.is_absolute():
            return path
        root = self.config.rootpath / path
        return root if root.exists() else path.resolve()

    def _out(self, path: Path, engine: str, point: str) -> Path:
        base = self.settings.out
        if base is None:
            if self._tmp is None:
                factory = getattr(self.config, "_tmp_path_factory", None)
                if factory is not None:
                    self._tmp = factory.mktemp("causalab", numbered=True)
                else:  # pragma: no cover - tmpdir plugin disabled
                    import tempfile
                    self._tmp = Path(tempfile.mkdtemp(prefix="causalab-"))
            base = self._tmp
        try:
            rel = path.relative_to(self.config.rootpath)
        except ValueError:
            rel = Path(path.name)
        return base / rel.parent / stem(path) / engine / point


def _unwrap(value):
    if isinstance(value, _Failed):
        raise value.error
    return value


SESSION = pytest.StashKey[Session]()

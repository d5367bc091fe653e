"""Extensions: a researcher's own metric kinds, mechanisms and featurizer kinds, through pluggy.

An extension is a module with hook implementations (``hookimpl``) of the specs below. It is found
two ways: installed, as an entry point in the ``causalab_mini`` group of its distribution's
metadata::

    [project.entry-points.causalab_mini]
    my_metrics = "my_metrics.plugin"

or named by the user (``cm.run(..., plugins=["my_metrics.plugin"])``, ``--causalab-plugins``, the
CLI's ``--plugin``). Every kind, theirs and the project's own (registered when their modules
import, so ``vocab`` and validation need no plugin machinery), enters its registry through the same
call (``metric_kinds.register_metric``, ``vocab.register_mechanism``,
``vocab.register_featurizer_kind``), is listed by ``causalab-mini vocab`` with where it came from
(``origin``), and is scored by the same code on both engines — a kind sees torch tensors, never an
engine.

A document that uses an extension's kind names its distribution (``"extensions": [...]``); a
run records each one it used — distribution, version, a digest of its source — in ``run.json``
(``used``). An extension that cannot be loaded (it does not import, or returns something that is
not a kind) is kept as a failure, and refused by name when a document names it or asks for a kind
it would have provided — never a traceback from inside a walk.
"""
from __future__ import annotations

import hashlib
import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Iterable, Optional, Union

import pluggy

from . import metric_kinds, vocab
from .errors import DocumentError, ExtensionError

PROJECT = "causalab_mini"  # the pluggy project and the entry-point group
BUILT_IN = metric_kinds.BUILT_IN

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Specs:
    """What an extension may provide. Each hook returns a list of records."""

    @hookspec
    def causalab_mini_metric_kinds(self) -> list:
        """``metric_kinds.MetricKind`` records (``compute`` set): scored like the built-ins."""

    @hookspec
    def causalab_mini_mechanisms(self) -> list:
        """``vocab.Mechanism`` records with ``apply`` set and ``params`` a pydantic model class."""

    @hookspec
    def causalab_mini_featurizer_kinds(self) -> list:
        """``vocab.FeaturizerKind`` records with ``make`` set (not trainable; see
        ``vocab.register_featurizer_kind``)."""


@dataclass
class Extension:
    """One loaded plugin: where it came from and what it registered (or why it could not)."""
    name: str  # the distribution's name (installed), or the module's (named by the user)
    version: Optional[str]
    module: str
    digest: Optional[str] = None  # sha256 over the module's source files
    metric_kinds: list = field(default_factory=list)
    mechanisms: list = field(default_factory=list)
    featurizer_kinds: list = field(default_factory=list)
    error: Optional[str] = None  # why it is not usable

    def record(self) -> dict:
        """What ``run.json`` says of it."""
        return {"distribution": self.name, "version": self.version, "module": self.module,
                "source_sha256": self.digest}


_STATE: dict = {"manager": None, "extensions": {}, "discovered": False}


def manager() -> pluggy.PluginManager:
    if _STATE["manager"] is None:
        pm = pluggy.PluginManager(PROJECT)
        pm.add_hookspecs(Specs)  # registering an extension checks its hooks against these
        _STATE["manager"] = pm
    return _STATE["manager"]


def extensions() -> dict[str, Extension]:
    """The extensions this process has loaded (discovering the installed ones first), by name."""
    discover()
    return dict(_STATE["extensions"])


def discover() -> None:
    """Load every installed extension (entry points of the ``causalab_mini`` group), once per process.
    A broken one is kept as a failure, not raised: it is refused when a document asks for it."""
    if _STATE["discovered"]:
        return
    _STATE["discovered"] = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=PROJECT):
        dist = getattr(ep, "dist", None)
        name = dist.name if dist is not None else ep.name
        version = dist.version if dist is not None else None
        try:
            plugin = ep.load()
        except Exception as err:  # noqa: BLE001 — any failure to import is the extension's
            _STATE["extensions"][name] = Extension(name, version, ep.value,
                                                   error=f"does not import: {type(err).__name__}: {err}")
            continue
        _add(plugin, name, version, ep.value)


def use(plugins: Iterable[Union[str, ModuleType]]) -> list[Extension]:
    """Load the modules a user names (dotted names or module objects); a failure is raised at once,
    by name — the user asked for this one."""
    discover()
    loaded = []
    for plugin in plugins:
        label = plugin if isinstance(plugin, str) else plugin.__name__
        known = next((e for e in _STATE["extensions"].values() if e.module == label), None)
        if known is not None:
            loaded.append(_usable(known))
            continue
        if isinstance(plugin, str):
            try:
                plugin = importlib.import_module(plugin)
            except Exception as err:  # noqa: BLE001
                raise ExtensionError(f"plugins.{label}", f"does not import: {type(err).__name__}: {err}",
                                     "check the module's name, and that its folder is on sys.path "
                                     "(or install its distribution)") from None
        name, version = _distribution_of(plugin.__name__) or (label, None)
        if name in _STATE["extensions"]:  # its distribution is installed and already loaded
            loaded.append(_usable(_STATE["extensions"][name]))
            continue
        loaded.append(_usable(_add(plugin, name, version, label)))
    return loaded


def _distribution_of(module: str) -> Optional[tuple[str, str]]:
    """(distribution, version) of the installed distribution that holds ``module``, if one does: a
    module named by the user is then recorded, and named by documents, as its distribution."""
    from importlib.metadata import packages_distributions, version

    dists = packages_distributions().get(module.split(".")[0], [])
    return (dists[0], version(dists[0])) if len(dists) == 1 else None


def _usable(ext: Extension) -> Extension:
    if ext.error is not None:
        raise ExtensionError(f"extensions.{ext.name}", f"extension {ext.name!r} ({ext.module}) {ext.error}",
                             _fix(ext))
    return ext


def _fix(ext: Extension) -> str:
    return (f"fix or reinstall {ext.name}" + (f" (installed: {ext.version})" if ext.version else "")
            + ", or remove it from the document's extensions")


def _add(plugin, name: str, version: Optional[str], module: str) -> Extension:
    """Register ``plugin``'s kinds; any failure leaves the registries as they were."""
    ext = Extension(name, version, module, digest=_digest(plugin))
    _STATE["extensions"][name] = ext
    pm = manager()
    try:
        pm.register(plugin, name=f"{name}:{module}")
    except Exception as err:  # noqa: BLE001 — a wrong hook name or signature
        ext.error = f"is not a causalab_mini plugin: {err}"
        return ext
    # pluggy keeps a hook it does not know pending, silently: a misspelt hook would load nothing.
    unknown = sorted(n for n in dir(plugin) if n.startswith("causalab_mini_") and not hasattr(Specs, n))
    if unknown:
        pm.unregister(plugin)
        ext.error = (f"is not a causalab_mini plugin: unknown hook(s) {unknown}; the hooks are "
                     f"{sorted(n for n in vars(Specs) if n.startswith('causalab_mini_'))}")
        return ext
    try:
        kinds = _records(plugin, "causalab_mini_metric_kinds", metric_kinds.MetricKind, name)
        mechanisms = _records(plugin, "causalab_mini_mechanisms", vocab.Mechanism, name)
        featurizers = _records(plugin, "causalab_mini_featurizer_kinds", vocab.FeaturizerKind, name)
        for kind in kinds:
            _check_compute(kind)
        done = []  # (unregister, name): undone if a later record is refused
        try:
            for kind in kinds:
                done.append((metric_kinds.unregister_metric, metric_kinds.register_metric(kind).name))
            for mech in mechanisms:
                done.append((vocab.unregister_mechanism, vocab.register_mechanism(mech).name))
            for feat in featurizers:
                done.append((vocab.unregister_featurizer_kind, vocab.register_featurizer_kind(feat).name))
        except Exception:
            for undo, registered in done:
                undo(registered)
            raise
    except Exception as err:  # noqa: BLE001
        pm.unregister(plugin)
        ext.error = f"registers what cannot be used: {err}"
        return ext
    ext.metric_kinds = [k.name for k in kinds]
    ext.mechanisms = [m.name for m in mechanisms]
    ext.featurizer_kinds = [f.name for f in featurizers]
    return ext


def _records(plugin, hook: str, kind: type, origin: str) -> list:
    """The records one plugin returns from ``hook``, each stamped with its origin."""
    impl = getattr(plugin, hook, None)
    if impl is None:
        return []
    got = impl()
    if got is None:
        return []
    out = []
    for record in got:
        if not isinstance(record, kind):
            raise ValueError(f"{hook} returned {type(record).__name__}, not {kind.__name__}")
        out.append(_stamped(record, origin))
    return out


def _stamped(record, origin: str):
    from dataclasses import replace

    return replace(record, origin=origin)


def _check_compute(kind: metric_kinds.MetricKind) -> None:
    """A metric's compute takes the logits, one id tensor per column, and its reads and
    parameters by keyword: a signature that cannot is refused when the extension loads."""
    import inspect

    try:
        sig = inspect.signature(kind.compute)
    except (TypeError, ValueError):
        return  # a builtin or C function: held to its contract when it scores
    named = {**{r: None for r in kind.reads},
             **({p: None for p in kind.params.model_fields} if kind.params else {})}
    try:
        sig.bind(None, *([None] * len(kind.columns)), **named)
    except TypeError as err:
        spelled = ", ".join(["logits", *kind.columns] + ([f"*, {', '.join(named)}"] if named else []))
        raise ValueError(f"metric kind {kind.name!r}: compute{sig} cannot be called as compute({spelled}): {err}")


def _digest(plugin) -> Optional[str]:
    """sha256 over the plugin's source — every .py of its top-level package when it is in one — so a
    run can say which code scored it."""
    name = getattr(plugin, "__name__", None) or getattr(plugin, "__module__", "") or ""
    top = sys.modules.get(name.split(".")[0]) if name else None
    path = getattr(top, "__file__", None) or getattr(plugin, "__file__", None)
    if path is None:
        return None
    path = Path(path)
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(path.parent)).encode("utf-8") + b"\0")
        h.update(f.read_bytes())
    return "sha256:" + h.hexdigest()


# --- what a document uses ------------------------------------------------------------------

def origin_of(kind: str, what: str) -> Optional[str]:
    """The distribution that registered metric kind or mechanism ``kind`` (None: built-in or unknown)."""
    table = {"metric": metric_kinds.METRICS, "mechanism": vocab.MECHANISMS, "featurizer": vocab.FEATURIZERS}[what]
    record = table.get(kind)
    return None if record is None or record.origin == BUILT_IN else record.origin


def check_named(names: Iterable[str], path: str = "extensions") -> list[Extension]:
    """The extensions a document names, each loaded and usable, or a refusal that says which
    and how to get it."""
    discover()
    out = []
    for i, name in enumerate(names):
        ext = _STATE["extensions"].get(name) or next(
            (e for e in _STATE["extensions"].values() if e.module == name), None)
        if ext is None:
            have = sorted(_STATE["extensions"]) or ["none installed"]
            raise DocumentError(f"{path}[{i}]", f"the document uses extension {name!r}, which is not "
                                f"installed (extensions here: {', '.join(have)})",
                                f"pip install {name} (or name its module with --causalab-plugins / "
                                "cm.run(plugins=[...]))")
        if ext.error is not None:
            raise DocumentError(f"{path}[{i}]", f"extension {name!r} ({ext.module}) {ext.error}", _fix(ext))
        out.append(ext)
    return out


def used(spec) -> list[dict]:
    """The extensions whose kinds the validated document ``spec`` uses: run.json's record of each."""
    names = set()
    for iv in spec.interventions.values():
        names |= {origin_of(m.kind, "metric") for m in iv.metrics.values()}
        names |= {origin_of(w.mechanism, "mechanism") for w in iv.writes.values()}
    names |= {origin_of(f.kind, "featurizer") for f in spec.featurizers.values()}
    names.discard(None)
    exts = _STATE["extensions"]
    return [exts[n].record() if n in exts else {"distribution": n, "version": None, "module": None,
                                                  "source_sha256": None} for n in sorted(names)]

"""The closed vocabularies a document draws from.

Components, mechanisms, featurizer kinds, metric kinds, reductions and position
forms. Everything here is plain data, importable without torch, so ``vocab``,
``validate`` and pytest collection stay fast. ``COLUMNS`` is read both by the
document validator and by the scorer, so a front end cannot disagree with the
engine about which data column is which operand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

# The components are one record each (what it is, where it is read, its width rule), kept in
# components.py, which the compiler and the engines read too; re-exported here as vocabulary.
from .components import BEFORE_LAYERS, COMPONENTS, VOCAB_WIDE, Component  # noqa: F401
from . import engines
from .suggest import HintedValueError, did_you_mean


@dataclass(frozen=True)
class Mechanism:
    """A mechanism's record: what a document may say of it, and — for one an extension
    registers — the function itself. The built-ins' functions are ``ops/mechanisms.REGISTRY``
    (this module imports without torch)."""
    name: str
    operand: bool  # takes an operand (a read, a ref or a number)
    # name -> (type, default or REQUIRED); or a pydantic model class (metric_kinds.Params), which
    # is how an extension declares its parameters.
    params: Any
    needs_f0: bool = False  # measures against the address's pre-write value
    doc: str = ""
    # (f, operand, params, f0) -> f', as ops/mechanisms.py's; None for a built-in (found there).
    apply: Optional[Callable] = field(default=None, repr=False, compare=False)
    origin: str = "causalab-mini"  # the project, or the distribution of the extension that registered it

    @property
    def schema(self) -> Optional[type]:
        """The pydantic model its parameters are checked by, or None (a built-in's table)."""
        return self.params if isinstance(self.params, type) else None


REQUIRED = object()
MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (
    Mechanism("swap", True, {}, doc="replace the feature value with the operand"),
    Mechanism("add_scaled", True, {"scale": (float, 1.0)}, doc="x + scale * operand"),
    Mechanism("lerp", True, {"t": (float, REQUIRED)}, doc="(1 - t) * x + t * operand; t=1 is swap, t=0 nothing"),
    Mechanism("clamp", False, {"min": (float, None), "max": (float, None)},
              doc="clip the feature value into [min, max] (at least one bound)"),
    Mechanism("gaussian", False, {"std": (float, REQUIRED), "seed": (int, 0)},
              doc="x + std * noise, noise drawn on the CPU generator from seed"),
    Mechanism("renormalize", False, {}, needs_f0=True,
              doc="rescale to the norm the address had before this pass's writes"),
)}


def register_mechanism(mechanism: Mechanism) -> Mechanism:
    """Add an extension's mechanism to the vocabulary; a name already taken is refused."""
    if not mechanism.name or not mechanism.name.isidentifier():
        raise ValueError(f"a mechanism's name is an identifier, got {mechanism.name!r}")
    if mechanism.name in MECHANISMS:
        raise ValueError(f"mechanism {mechanism.name!r} is already registered "
                         f"(by {MECHANISMS[mechanism.name].origin})")
    if not callable(mechanism.apply):
        raise ValueError(f"{mechanism.name}: apply must be a function (f, operand, params, f0) -> f'")
    if mechanism.schema is None and not isinstance(mechanism.params, dict):
        raise ValueError(f"{mechanism.name}: params must be a pydantic model class (metric_kinds.Params)")
    MECHANISMS[mechanism.name] = mechanism
    return mechanism


def unregister_mechanism(name: str) -> Mechanism:
    """Take an extension's mechanism out (a test's cleanup, a failed load undone)."""
    return _unregister(MECHANISMS, name, "mechanism", "apply")


def _unregister(table: dict, name: str, what: str, own: str):
    """Remove an extension's record from ``table``: one whose ``own`` function is set; the
    built-ins (without one) stay."""
    if getattr(table.get(name), own, None) is None:
        raise KeyError(f"{what} {name!r} is not an extension's")
    return table.pop(name)


@dataclass(frozen=True)
class FeaturizerKind:
    """What the document side needs to know of a featurizer kind; ops/featurizers.py builds it.

    tests/test_featurizer_kinds.py holds this record to the classes: a kind recorded
    trainable has parameters an optimizer can move, and a kind recorded as always loaded
    cannot be built without a bundle.
    """
    name: str
    trainable: bool  # has parameters a fit step trains (listed in its params, given to AdamW)
    loads: str  # file_path: "always" (built only from a bundle), "optional" (fresh, or fitted) or "never"
    params: tuple[str, ...]  # the document fields it takes besides kind and site
    needs_without_file: tuple[str, ...]  # the fields it needs when not loaded: a subspace's rank k
    space: str  # its features: "k" (a basis's directions, a dictionary's latents) or "units" (the site's)
    tensor: Optional[str]  # the bundle tensor whose first axis is the site's width (its shape says d, k)
    # A bundle of one tensor under another name is read as this kind's: what `reduce: "pca"` saves.
    lone_tensor: bool = False
    mask: bool = False  # a mask over units: `<name>.mask` is an objective term, and a fit may anneal it
    declared: bool = True  # False for identity: what a read or write without a featurizer key uses
    doc: str = ""
    # An extension's kind: make(d, k, tensors) -> a featurizer (featurize(x) -> (f, err),
    # inverse(f, err, x) -> x'); None for a built-in (ops/featurizers.build makes those).
    make: Optional[Callable] = field(default=None, repr=False, compare=False)
    origin: str = "causalab-mini"


_F = FeaturizerKind
FEATURIZERS: dict[str, FeaturizerKind] = {f.name: f for f in (
    _F("identity", False, "never", (), (), "units", None, declared=False,
       doc="no featurizer key: the features are the activation (activation patching)"),
    _F("subspace", True, "optional", ("k", "seed", "file_path"), ("k",), "k", "weight",
       doc="DAS's rotation: an orthonormal (d, k) basis, Cayley-parametrized, drawn from seed"),
    _F("gate", True, "optional", ("start", "file_path"), (), "units", "theta", mask=True,
       doc="DBM's mask over the site's units: soft while a fit trains it, hard otherwise"),
    _F("pca", False, "always", ("file_path", "k"), (), "k", "Q", lone_tensor=True,
       doc="a stored orthonormal basis (what reduce: \"pca\" publishes): the control for DAS"),
    _F("sae", False, "always", ("file_path", "k"), (), "k", "W_enc",
       doc="a sparse autoencoder, ReLU, SAELens tensor names; keeps its error term"),
    _F("linear", False, "always", ("file_path", "k"), (), "k", "W_enc",
       doc="a linear dictionary (an SAE without the ReLU), SAELens tensor names"),
)}
# What a document's featurizer "kind" may say (identity is what omitting the key means): the
# built-ins; an extension's kinds join FEATURIZERS (register_featurizer_kind).
FEATURIZER_KINDS = tuple(sorted(n for n, f in FEATURIZERS.items() if f.declared))


def register_featurizer_kind(kind: FeaturizerKind) -> FeaturizerKind:
    """Add an extension's featurizer kind. It is not trainable (a fit trains the built-ins' own
    parameters), and it is built from a bundle (``loads="always"``: its tensors, ``tensor`` the one
    whose first axis is the site's width) or from nothing (``"never"``: over the site's units)."""
    if not kind.name or not kind.name.isidentifier() or kind.name in FEATURIZERS:
        raise ValueError(f"featurizer kind {kind.name!r} is not a new identifier")
    if not callable(kind.make):
        raise ValueError(f"{kind.name}: make must be a function (d, k, tensors) -> featurizer")
    if kind.trainable or kind.mask or not kind.declared:
        raise ValueError(f"{kind.name}: an extension's featurizer kind is declared and not trainable")
    if kind.loads == "always" and (kind.tensor is None or kind.params != ("file_path", "k")):
        raise ValueError(f"{kind.name}: a kind built from a bundle names its tensor and takes params "
                         "('file_path', 'k')")
    if kind.loads == "never" and (kind.params or kind.space != "units"):
        raise ValueError(f"{kind.name}: a kind built from nothing takes no params, over the site's units")
    if kind.loads not in ("always", "never"):
        raise ValueError(f"{kind.name}: loads is 'always' or 'never', got {kind.loads!r}")
    FEATURIZERS[kind.name] = kind
    return kind


def unregister_featurizer_kind(name: str) -> FeaturizerKind:
    """Take an extension's featurizer kind out (a test's cleanup, a failed load undone)."""
    return _unregister(FEATURIZERS, name, "featurizer kind", "make")


TRAINABLE_KINDS = tuple(sorted(n for n, f in FEATURIZERS.items() if f.declared and f.trainable))


# The metric kinds are a registry: each record holds its vocabulary facts and its scorer
# together (metric_kinds.py), and this module re-exports that one table.
from .metric_kinds import COLUMNS, METRICS, MetricKind, validated_params  # noqa: E402,F401
TOKEN_FORMS = ("space_prefixed",)

REDUCTIONS = ("mean", "pca")
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}

POSITION_FORMS = (
    "exactly one cut: index=int, span=tuple[int, int], last=int, all=bool",
    "scope: variable=str, segment=Literal['system', 'user', 'assistant', 'role[k]', 'eos']",
    "frame: Literal['prompt', 'generated']; a bare integer is {\"index\": i}; -1 is the last token",
)


def render() -> str:
    """The text ``causalab-mini vocab`` prints."""
    lines = ["components:"]
    for c in COMPONENTS.values():
        sel = f"[{c.selector}]" if c.selector else "-"
        reach = ", ".join(engines_reaching(c))
        lines.append(f"  {c.name:<18} {c.kind:<9} {sel:<8} width={c.width:<25} engines={reach:<14} {c.where}")
    lines.append("mechanisms:       " + ", ".join(sorted(MECHANISMS)))
    for m in sorted(MECHANISMS.values(), key=lambda m: m.name):
        params = ", ".join(f"{k}" + ("" if p["required"] else f"={p['default']}")
                           for k, p in _params_json(m).items())
        origin = "" if m.apply is None else f"  [{m.origin}]"
        lines.append(f"  {m.name:<12} operand={'yes' if m.operand else 'no ':<3}  params=({params})  {m.doc}{origin}")
    declared = sorted(n for n, f in FEATURIZERS.items() if f.declared)
    lines.append("featurizer kinds: " + ", ".join(declared) + " (plus 'identity', never declared)")
    for f in FEATURIZERS.values():
        params = f"({', '.join(f.params)})"
        origin = "" if f.make is None else f"  [{f.origin}]"
        lines.append(f"  {f.name:<9} trainable={'yes' if f.trainable else 'no ':<3}  file_path={f.loads:<8}  "
                     f"params={params:<22} {f.doc}{origin}")
    lines.append("metric kinds:     " + ", ".join(_metric_signature(m) for _, m in sorted(METRICS.items())))
    lines.append("                  * no gradient: scored exactly, never estimated by attribution")
    for m in sorted((m for m in METRICS.values() if m.origin != "causalab-mini"), key=lambda m: m.name):
        lines.append(f"  {_metric_signature(m)}  [{m.origin}]  {m.doc.splitlines()[0] if m.doc else ''}")
    lines.append("reductions:       " + ", ".join(REDUCTIONS))
    lines.append("position forms:   " + POSITION_FORMS[0])
    lines.extend("                  " + f for f in POSITION_FORMS[1:])
    lines.append("model families:   " + ", ".join(sorted(_families())) + " (any other: name its "
                 "modules in model.modules)")
    return "\n".join(lines)


def _metric_signature(m) -> str:
    """``top_k(expected; k)*``: its columns and reads, then its parameters; a ``*`` where it has no
    gradient (attribution cannot estimate it)."""
    slots = ", ".join((*m.columns, *m.reads))
    params = "; " + ", ".join(m.params.model_fields) if m.params is not None else ""
    return f"{m.name}({slots}{params})" + ("" if m.differentiable else "*")


def engines_reaching(component: Component) -> tuple[str, ...]:
    """The local engines (engine/engines.py) that can tap ``component`` (on a family whose layout
    places it): a module boundary is every engine's; inside attention, an engine tracing through
    nnsight reaches it there, and one that does not through the attention function transformers
    calls (engine/attention.py) — every local engine, on the families whose attention calls it."""
    return tuple(engines.LOCAL_ENGINES)


def _families():
    """The model types with a verified layout (layouts.py: standard library only, like this)."""
    from .layouts import FAMILIES

    return FAMILIES


def as_json() -> dict:
    return {
        "components": {
            c.name: {"kind": c.kind, "selector": c.selector, "layered": c.layered, "width": c.width,
                     "engines": list(engines_reaching(c)), "where": c.where}
            for c in COMPONENTS.values()
        },
        "mechanisms": {
            m.name: {"operand": m.operand, "origin": m.origin,
                     "params": _params_json(m)}
            for m in MECHANISMS.values()
        },
        "featurizer_kinds": {
            f.name: {"declared": f.declared, "trainable": f.trainable, "file_path": f.loads,
                     "params": list(f.params), "needs_without_file": list(f.needs_without_file), "space": f.space,
                     "tensor": f.tensor, "doc": f.doc}
            for f in FEATURIZERS.values()
        },
        "metric_kinds": {k: {"columns": list(m.columns), "reads": list(m.reads), "unit": m.unit,
                             "params": list(m.params.model_fields) if m.params else [],
                             "estimand_version": m.estimand_version, "origin": m.origin}
                         for k, m in METRICS.items()},
        "reductions": list(REDUCTIONS),
        "position_forms": list(POSITION_FORMS),
        "model_families": sorted(_families()),
    }


def _params_json(m: Mechanism) -> dict:
    if m.schema is not None:
        return {k: {"type": str(f.annotation), "required": f.is_required(),
                    "default": None if f.is_required() else f.default}
                for k, f in m.schema.model_fields.items()}
    return {k: {"type": t.__name__, "required": d is REQUIRED, "default": None if d is REQUIRED else d}
            for k, (t, d) in m.params.items()}


def _coerce(name: str, key: str, typ: type, value):
    """One parameter value, checked against its declared type; ints are accepted as floats."""
    if isinstance(value, bool):  # bool is an int subclass; True is not a scale
        raise ValueError(f"{name}: parameter {key!r} must be {typ.__name__}, got bool {value!r}")
    if typ is float:
        if not isinstance(value, (int, float)):
            raise ValueError(f"{name}: parameter {key!r} must be a number, got {type(value).__name__} {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{name}: parameter {key!r} must be finite, got {value!r}")
        return value
    if typ is int:
        if not isinstance(value, int):
            raise ValueError(f"{name}: parameter {key!r} must be an integer, got {type(value).__name__} {value!r}")
        return value
    if not isinstance(value, typ):
        raise ValueError(f"{name}: parameter {key!r} must be {typ.__name__}, got {type(value).__name__} {value!r}")
    return value


def check_params(name: str, params: Optional[dict]) -> dict:
    """``params`` for mechanism ``name``, checked by name and with defaults filled in.

    Raises ``ValueError`` naming the mechanism and the parameter; the compiler
    wraps it with the document path.
    """
    if name not in MECHANISMS:
        raise HintedValueError(f"unknown mechanism {name!r}; one of {', '.join(sorted(MECHANISMS))}",
                               did_you_mean(name, MECHANISMS))
    if MECHANISMS[name].schema is not None:
        return validated_params(name, MECHANISMS[name].schema, params)
    spec = MECHANISMS[name].params
    params = dict(params or {})
    unknown = sorted(set(params) - set(spec))
    if unknown:
        allowed = ", ".join(spec) if spec else "none"
        free = [k for k in spec if k not in params]
        raise HintedValueError(f"{name}: unknown parameter{'s' if len(unknown) > 1 else ''} "
                               f"{', '.join(map(repr, unknown))}; {name} takes {allowed}",
                               " ".join(filter(None, (did_you_mean(k, free) for k in unknown))))
    out: dict = {}
    for key, (typ, default) in spec.items():
        if key not in params or (params[key] is None and default is REQUIRED):
            if default is REQUIRED:
                raise ValueError(f"{name}: parameter {key!r} is required")
            out[key] = default
        elif params[key] is None and default is None:
            out[key] = None  # an explicit null for an optional bound (clamp's min/max)
        else:
            out[key] = _coerce(name, key, typ, params[key])
    # Rules no single parameter can check.
    if name == "clamp":
        lo, hi = out["min"], out["max"]
        if lo is None and hi is None:
            raise ValueError("clamp: needs at least one bound, 'min' or 'max'")
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"clamp: 'min' ({lo}) is greater than 'max' ({hi})")
    if name == "gaussian":
        if out["std"] <= 0:
            raise ValueError(f"gaussian: 'std' must be > 0, got {out['std']}")
        if not 0 <= out["seed"] < 2**63:
            raise ValueError(f"gaussian: 'seed' must be in [0, 2**63), got {out['seed']}")
    return out

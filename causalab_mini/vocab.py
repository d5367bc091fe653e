"""The closed vocabularies a document draws from.

Components, mechanisms, featurizer kinds, metric kinds, reductions and position
forms. Everything here is plain data, importable without torch, so ``vocab``,
``validate`` and pytest collection stay fast. ``COLUMNS`` is read both by the
document validator and by the scorer, so a front end cannot disagree with the
engine about which data column is which operand.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Component:
    name: str
    kind: str  # "module": a module's output/input; "interior": inside a module's forward; "output": the model's return
    selector: Optional[str]  # "units", "heads" or None
    layered: bool
    order: int  # forward order inside a layer (or among the non-layered ones)
    width: str  # how the width is derived, for humans
    hooks: bool  # reachable at a module boundary, so the hooks engine can tap it
    where: str  # what it is, for humans
    residual: bool = False  # d_model-wide residual-stream value (a `view: "logits"` may project it)


_C = Component
COMPONENTS: dict[str, Component] = {c.name: c for c in (
    _C("embeddings", "module", "units", False, 0, "d_model", True, "token embedding output", True),
    _C("block_input", "module", "units", True, 0, "d_model", True, "residual entering layer l", True),
    _C("attention_query", "interior", "heads", True, 1, "len(heads)*head_dim", False,
       "per-head query after projection (rotary applied where the family does)"),
    _C("attention_key", "interior", "heads", True, 2, "len(heads)*head_dim", False,
       "per-head key after projection (rotary applied where the family does)"),
    _C("attention_value", "interior", "heads", True, 3, "len(heads)*head_dim", False,
       "per-head value after projection"),
    _C("attention_probs", "interior", "heads", True, 4, "keys of the padded batch", False,
       "attention pattern (needs eager attention)"),
    _C("attention_z", "interior", "heads", True, 5, "len(heads)*head_dim", True,
       "per-head result: the input of the output projection"),
    _C("attention_output", "module", "units", True, 6, "d_model", True,
       "attention module output, before the residual add", True),
    _C("mlp_input", "module", "units", True, 7, "d_model", True, "MLP module input", True),
    _C("mlp_hidden", "interior", "units", True, 8, "d_mlp", True,
       "MLP neurons: the input of the down projection"),
    _C("mlp_output", "module", "units", True, 9, "d_model", True, "MLP module output", True),
    _C("block_output", "module", "units", True, 10, "d_model", True, "residual leaving layer l", True),
    _C("ln_final", "module", "units", False, 0, "d_model", True, "final norm output"),
    _C("lm_head", "module", None, False, 1, "vocab", True, "unembedding output"),
    _C("logits", "output", None, False, 2, "vocab", True,
       "the model's returned logits (after softcapping, e.g. Gemma-2)"),
)}

# Components with no layer that run before the first layer; the rest run after the last.
BEFORE_LAYERS = frozenset({"embeddings"})
VOCAB_WIDE = frozenset({"lm_head", "logits"})


@dataclass(frozen=True)
class Mechanism:
    name: str
    operand: bool  # takes an operand (a read, a ref or a number)
    params: dict  # name -> (type, default or REQUIRED)
    needs_f0: bool = False  # measures against the address's pre-write value
    doc: str = ""


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

FEATURIZER_KINDS = ("gate", "linear", "pca", "sae", "subspace")


@dataclass(frozen=True)
class MetricKind:
    name: str
    columns: tuple[str, ...]  # the operand fields, in the order compute takes them
    unit: str
    differentiable: bool

    @property
    def estimand_version(self) -> str:
        return f"{self.name}/v1"


# COLUMNS: which data columns a metric kind names, in the order the scorer takes them.
METRICS: dict[str, MetricKind] = {m.name: m for m in (
    MetricKind("match", ("expected",), "fraction", False),
    MetricKind("logit_diff", ("a", "b"), "logit", True),
    MetricKind("cross_entropy", ("target",), "nats", True),
    MetricKind("token_logit", ("token",), "logit", True),
    MetricKind("token_prob", ("token",), "probability", True),
)}
COLUMNS: dict[str, tuple[str, ...]] = {k: m.columns for k, m in METRICS.items()}
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
        engines = "nnterp, hooks" if c.hooks else "nnterp"
        lines.append(f"  {c.name:<18} {c.kind:<9} {sel:<8} width={c.width:<25} engines={engines:<14} {c.where}")
    lines.append("mechanisms:       " + ", ".join(sorted(MECHANISMS)))
    for m in sorted(MECHANISMS.values(), key=lambda m: m.name):
        params = ", ".join(
            f"{k}" + ("" if d is REQUIRED else f"={d}") for k, (_, d) in m.params.items()
        )
        lines.append(f"  {m.name:<12} operand={'yes' if m.operand else 'no ':<3}  params=({params})  {m.doc}")
    lines.append("featurizer kinds: " + ", ".join(FEATURIZER_KINDS) + " (plus 'identity', never declared)")
    lines.append("metric kinds:     " + ", ".join(f"{k}({', '.join(m.columns)})" for k, m in sorted(METRICS.items())))
    lines.append("reductions:       " + ", ".join(REDUCTIONS))
    lines.append("position forms:   " + POSITION_FORMS[0])
    lines.extend("                  " + f for f in POSITION_FORMS[1:])
    return "\n".join(lines)


def as_json() -> dict:
    return {
        "components": {
            c.name: {"kind": c.kind, "selector": c.selector, "layered": c.layered, "width": c.width,
                     "engines": ["nnterp", "hooks"] if c.hooks else ["nnterp"], "where": c.where}
            for c in COMPONENTS.values()
        },
        "mechanisms": {
            m.name: {"operand": m.operand,
                     "params": {k: {"type": t.__name__, "required": d is REQUIRED,
                                    "default": None if d is REQUIRED else d}
                                for k, (t, d) in m.params.items()}}
            for m in MECHANISMS.values()
        },
        "featurizer_kinds": list(FEATURIZER_KINDS),
        "metric_kinds": {k: {"columns": list(m.columns), "unit": m.unit,
                             "estimand_version": m.estimand_version} for k, m in METRICS.items()},
        "reductions": list(REDUCTIONS),
        "position_forms": list(POSITION_FORMS),
    }


def check_params(mechanism: str, params: dict) -> dict:
    """A mechanism's parameters checked by name, returned with defaults filled.

    Raises ValueError with the fix in the message; the caller adds the document path.
    Lives here (not in ops) so validating a document never imports torch.
    """
    mech = MECHANISMS[mechanism]
    unknown = sorted(set(params) - set(mech.params))
    if unknown:
        takes = ", ".join(mech.params) or "no parameters"
        raise ValueError(f"{mechanism} takes {takes}; unknown parameter(s) {unknown}")
    out = {}
    for name, (kind, default) in mech.params.items():
        value = params.get(name, default)
        if value is REQUIRED:
            raise ValueError(f"{mechanism} needs the parameter {name!r}")
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{mechanism}.{name} is a number, not {value!r}")
            if kind is int and float(value) != int(value):
                raise ValueError(f"{mechanism}.{name} is an integer, not {value!r}")
            value = kind(value)
        out[name] = value
    if mechanism == "clamp":
        if out["min"] is None and out["max"] is None:
            raise ValueError("clamp needs at least one bound: \"min\" or \"max\"")
        if out["min"] is not None and out["max"] is not None and out["min"] > out["max"]:
            raise ValueError(f"clamp min {out['min']} is above max {out['max']}")
    if mechanism == "gaussian" and out["std"] <= 0:
        raise ValueError(f"gaussian std must be positive, not {out['std']}")
    return out

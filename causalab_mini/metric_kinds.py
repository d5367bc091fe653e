"""The metric kinds: one record per kind, holding both what a document may say about it and how it is scored.

A ``MetricKind`` carries the vocabulary facts (the data columns a metric names, the other
reads it compares its own with, its parameters' schema, its unit, whether it has a gradient,
its estimand version) and ``compute``, the function that turns a row's logits and answer ids
into one number. ``METRICS`` is the registry itself: ``vocab.METRICS`` is this same dict, so the
validator, the compiler, ``causalab-mini vocab`` and the scorer all read one table and cannot
drift apart. An extension registers its kinds here through the same call the built-ins use
(``extensions.py``); ``origin`` says whose a kind is.

Adding a kind is one function and one registration, both here::

    @metric("token_rank", columns=("token",), unit="rank", differentiable=False)
    def token_rank(logits, token):
        ...

``compute(logits, *ids, **named)``: ``logits`` (n, vocab) float32 at the metric's own read,
one (n,) long id tensor per column in ``columns`` order, and by keyword each read of ``reads``
((n, vocab) float32, the same rows) and each parameter of ``params`` (validated, defaults
filled). It returns (n,) float32 — or ``(values, defined)`` with ``defined`` an (n,) bool
tensor, where a row whose value is undefined (a normalised effect's zero denominator) is taken
out of the scored rows with the reason ``excludes``, never given a NaN.

The slots a document may fill are fixed (``COLUMN_SLOTS``, ``READ_SLOTS``) so a metric's JSON
stays a closed, checkable object; a kind names the ones it takes.

This module must import without torch (``vocab``, ``validate`` and compiling a plan
run without it), so ``compute`` functions only call methods of the tensors they are
handed and never import torch themselves.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .suggest import HintedValueError, did_you_mean

if TYPE_CHECKING:  # annotations only: importing torch here would make vocab need it
    from torch import Tensor

# (logits (n, vocab) float32, one (n,) long id tensor per column, **reads and params) -> (n,) float32
Compute = Callable[..., Any]

# The data-column fields a metric's JSON may carry (each names a column of the rows), and the
# read fields (each names another read of the intervention, scored at the same rows).
COLUMN_SLOTS = ("expected", "a", "b", "target", "token")
READ_SLOTS = ("reference", "base", "counterfactual")

BUILT_IN = "causalab-mini"  # the origin of the project's own kinds

# The kinds a whole answer can be scored by ("score": "sequence"), and what each then measures,
# from the answer's teacher-forced token log-probabilities (ops/metrics.score_sequence):
# cross_entropy −Σ log p; token_prob exp(Σ log p), the answer's probability; logit_diff
# Σ log p(a) − Σ log p(b), a log-probability difference; match, every forced token the argmax.
# Per token ("per_token": "mean"): the same with the mean in place of the sum.
SEQUENCE_KINDS = ("cross_entropy", "token_prob", "logit_diff", "match")
SEQUENCE_UNITS = {"cross_entropy": "nats", "token_prob": "probability", "logit_diff": "nats", "match": "fraction"}


class Params(BaseModel):
    """The base of a kind's parameter schema: strict, closed, frozen (a parameter is part of the
    experiment, digested into produced_by with its default written out)."""
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


@dataclass(frozen=True)
class MetricKind:
    name: str
    columns: tuple[str, ...]  # the operand fields, in the order compute takes them
    unit: str
    differentiable: bool
    # 2: rows whose compared answers share their scored token are excluded (answers_share_token)
    # — logit_diff's a and b, a match and the answer its document contrasts it with.
    version: int = 1
    # Left out of repr and equality: the record's identity is its declared facts.
    compute: Compute = field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    doc: str = ""
    reads: tuple[str, ...] = ()  # other reads compute takes by keyword (READ_SLOTS)
    params: Optional[type] = None  # a Params subclass: the parameters compute takes by keyword
    excludes: str = ""  # the reason given to rows compute marks undefined (it may return a mask)
    origin: str = BUILT_IN  # who registered it: the project, or an extension's distribution

    @property
    def estimand_version(self) -> str:
        return f"{self.name}/v{self.version}"


# The registry. Its keys are the metric kinds a document may name.
METRICS: dict[str, MetricKind] = {}


def register_metric(kind: MetricKind) -> MetricKind:
    """Add ``kind`` to the registry; a name already taken is refused rather than silently replaced."""
    if not kind.name or not kind.name.isidentifier():
        raise ValueError(f"a metric kind's name is an identifier, got {kind.name!r}")
    if kind.name in METRICS:
        raise ValueError(f"metric kind {kind.name!r} is already registered")
    if len(set(kind.columns)) != len(kind.columns) or set(kind.columns) - set(COLUMN_SLOTS):
        raise ValueError(f"{kind.name}: columns must be distinct names of {list(COLUMN_SLOTS)}, "
                         f"got {kind.columns!r}")
    if len(set(kind.reads)) != len(kind.reads) or set(kind.reads) - set(READ_SLOTS):
        raise ValueError(f"{kind.name}: reads must be distinct names of {list(READ_SLOTS)}, got {kind.reads!r}")
    if not kind.columns and not kind.reads:
        raise ValueError(f"{kind.name}: a metric names a data column or another read to compare with")
    if kind.params is not None and not (isinstance(kind.params, type) and issubclass(kind.params, BaseModel)):
        raise ValueError(f"{kind.name}: params must be a pydantic model class (metric_kinds.Params), "
                         f"got {kind.params!r}")
    if not callable(kind.compute):
        raise ValueError(f"{kind.name}: compute must be a function (logits, *ids, **named) -> values")
    METRICS[kind.name] = kind
    return kind


def unregister_metric(name: str) -> MetricKind:
    """Take kind ``name`` out of the registry and return its record (a test's cleanup, a plugin unloading)."""
    if name not in METRICS:
        raise KeyError(f"metric kind {name!r} is not registered")
    return METRICS.pop(name)


def metric(name: str, *, columns: tuple[str, ...] = (), unit: str, differentiable: bool,
           version: int = 1, reads: tuple[str, ...] = (), params: Optional[type] = None,
           excludes: str = "", origin: str = BUILT_IN, registry: Optional[dict] = None
           ) -> Callable[[Compute], Compute]:
    """Decorator: kind ``name``'s record with the function it wraps as compute (its docstring is
    the kind's doc), registered in ``METRICS`` — or, with ``registry``, put in that dict instead
    (an extension collecting its kinds to hand over)."""
    def register(compute: Compute) -> Compute:
        kind = MetricKind(name, tuple(columns), unit, differentiable, version, compute=compute,
                          doc=(compute.__doc__ or "").strip(), reads=tuple(reads), params=params,
                          excludes=excludes, origin=origin)
        if registry is None:
            register_metric(kind)
        else:
            registry[kind.name] = kind
        return compute
    return register


def check_params(kind: MetricKind, params: Optional[dict]) -> dict:
    """``params`` validated by the kind's schema, defaults filled; a kind without one takes none."""
    if kind.params is None:
        if params:
            raise HintedValueError(f"{kind.name} takes no params", f"remove {sorted(params)}")
        return {}
    return validated_params(kind.name, kind.params, params)


def validated_params(owner: str, schema: type, params: Optional[dict]) -> dict:
    """``params`` by a pydantic schema (a metric kind's or a mechanism's), defaults filled; a refusal
    names the parameter and leads with the name a misspelling likely meant."""
    from pydantic import ValidationError

    try:
        return schema.model_validate(dict(params or {})).model_dump()
    except ValidationError as err:
        # An unknown name first: it is the cause when a required one is reported missing.
        first = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
        where = ".".join(str(p) for p in first["loc"])
        fields = list(schema.model_fields)
        raise HintedValueError(f"{owner}: params{'.' + where if where else ''}: {first['msg']}",
                               did_you_mean(where, fields) if first["type"] == "extra_forbidden"
                               else f"{owner} takes the params {fields}") from None


class _Columns(Mapping):
    """kind -> columns, read live from the registry, so a kind registered later is seen here too."""

    def __getitem__(self, kind: str) -> tuple[str, ...]:
        return METRICS[kind].columns

    def __iter__(self) -> Iterator[str]:
        return iter(METRICS)

    def __len__(self) -> int:
        return len(METRICS)

    def __repr__(self) -> str:
        return repr(dict(self))


# Which data columns a metric kind names, in the order the scorer takes them.
COLUMNS: Mapping[str, tuple[str, ...]] = _Columns()


# --------------------------------------------------------------------------- the built-in kinds
# Each gets float32 logits (n, vocab) and one (n,) long id tensor per column, and returns (n,) float32.

def _kernel():
    # The arithmetic is the kernel's (kernel.py: what a stock NDIF server scores with); imported when
    # a kind first scores, since this module imports without torch.
    from . import kernel

    return kernel


@metric("match", columns=("expected",), unit="fraction", differentiable=False, version=2)
def match(logits: "Tensor", expected: "Tensor") -> "Tensor":
    """1.0 where argmax(logits) == expected, else 0.0."""
    return _kernel().match(logits, expected)


@metric("logit_diff", columns=("a", "b"), unit="logit", differentiable=True, version=2)
def logit_diff(logits: "Tensor", a: "Tensor", b: "Tensor") -> "Tensor":
    """logit[a] − logit[b]."""
    return _kernel().logit_diff(logits, a, b)


@metric("cross_entropy", columns=("target",), unit="nats", differentiable=True)
def cross_entropy(logits: "Tensor", target: "Tensor") -> "Tensor":
    """−log_softmax(logits)[target]."""
    return _kernel().cross_entropy(logits, target)


@metric("token_logit", columns=("token",), unit="logit", differentiable=True)
def token_logit(logits: "Tensor", token: "Tensor") -> "Tensor":
    """logit[token]."""
    return _kernel().token_logit(logits, token)


@metric("token_prob", columns=("token",), unit="probability", differentiable=True)
def token_prob(logits: "Tensor", token: "Tensor") -> "Tensor":
    """softmax(logits)[token]."""
    return _kernel().token_prob(logits, token)


@metric("prob_diff", columns=("a", "b"), unit="probability", differentiable=True)
def prob_diff(logits: "Tensor", a: "Tensor", b: "Tensor") -> "Tensor":
    """softmax(logits)[a] − softmax(logits)[b]."""
    return _kernel().prob_diff(logits, a, b)


@metric("token_rank", columns=("token",), unit="rank", differentiable=False)
def token_rank(logits: "Tensor", token: "Tensor") -> "Tensor":
    """1 + the number of tokens with a strictly higher logit than token's: 1 is the top token; a
    tie takes the best rank it shares."""
    return _kernel().token_rank(logits, token)


class TopK(Params):
    k: int = Field(ge=1, description="how many of the most likely tokens count as a hit")


@metric("top_k", columns=("expected",), unit="fraction", differentiable=False, params=TopK)
def top_k(logits: "Tensor", expected: "Tensor", *, k: int) -> "Tensor":
    """1.0 where expected is among the k most likely tokens (fewer than k tokens have a strictly
    higher logit), else 0.0; top_k with k=1 is match, ties counted in expected's favour."""
    return _kernel().top_k(logits, expected, k)


@metric("kl_div", reads=("reference",), unit="nats", differentiable=True)
def kl_div(logits: "Tensor", *, reference: "Tensor") -> "Tensor":
    """KL(reference ‖ this read) = Σ p_ref · (log p_ref − log p), in nats: how far this read's
    next-token distribution has moved from the reference read's (ACDC's faithfulness measure,
    with the clean run as the reference)."""
    return _kernel().kl_div(logits, reference)


class Normalized(Params):
    measure: Literal["logit_diff", "prob_diff"] = Field(
        "logit_diff", description="what is compared across the three reads: logit[a] − logit[b], "
        "or the same difference of probabilities")
    min_denominator: float = Field(1e-4, gt=0, description="rows where |counterfactual − base| is "
                                   "below this are excluded (effect_denominator_near_zero)")


@metric("normalized_effect", columns=("a", "b"), reads=("base", "counterfactual"), unit="fraction of effect",
        differentiable=True, params=Normalized, excludes="effect_denominator_near_zero")
def normalized_effect(logits: "Tensor", a: "Tensor", b: "Tensor", *, base: "Tensor", counterfactual: "Tensor",
                      measure: str, min_denominator: float):
    """(m(this read) − m(base)) / (m(counterfactual) − m(base)), m the measure (logit[a] − logit[b]
    by default): 0 where this read behaves like the base run, 1 where like the counterfactual —
    the "fraction of the effect recovered" a patching plot shows. Rows where the denominator is
    below min_denominator in absolute value are excluded, not divided."""
    return _kernel().normalized_effect(logits, a, b, base, counterfactual, measure, min_denominator)

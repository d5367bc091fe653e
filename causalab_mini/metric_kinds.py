"""The metric kinds: one record per kind, holding both what a document may say about it and how it is scored.

A ``MetricKind`` carries the vocabulary facts (the columns a metric names, its unit,
whether it has a gradient, its estimand version) and ``compute``, the function that
turns a row's logits and answer ids into one number. ``METRICS`` is the registry
itself: ``vocab.METRICS`` is this same dict, so the validator, the compiler, ``causalab-mini
vocab`` and the scorer all read one table and cannot drift apart.

Adding a kind is one function and one registration, both here::

    @metric("token_rank", columns=("token",), unit="rank", differentiable=False)
    def token_rank(logits, token):
        ...

This module must import without torch (``vocab``, ``validate`` and compiling a plan
run without it), so ``compute`` functions only call methods of the tensors they are
handed and never import torch themselves.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # annotations only: importing torch here would make vocab need it
    from torch import Tensor

# (logits (n, vocab) float32, one (n,) long id tensor per column) -> (n,) float32
Compute = Callable[..., "Tensor"]


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
    if not kind.columns or len(set(kind.columns)) != len(kind.columns):
        raise ValueError(f"{kind.name}: columns must be one or more distinct names, got {kind.columns!r}")
    if not callable(kind.compute):
        raise ValueError(f"{kind.name}: compute must be a function (logits, *ids) -> values")
    METRICS[kind.name] = kind
    return kind


def unregister_metric(name: str) -> MetricKind:
    """Take kind ``name`` out of the registry and return its record (a test's cleanup, a plugin unloading)."""
    if name not in METRICS:
        raise KeyError(f"metric kind {name!r} is not registered")
    return METRICS.pop(name)


def metric(name: str, *, columns: tuple[str, ...], unit: str, differentiable: bool,
           version: int = 1) -> Callable[[Compute], Compute]:
    """Decorator: register the function it wraps as kind ``name``'s compute; its docstring is the kind's doc."""
    def register(compute: Compute) -> Compute:
        register_metric(MetricKind(name, tuple(columns), unit, differentiable, version,
                                   compute=compute, doc=(compute.__doc__ or "").strip()))
        return compute
    return register


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

def _pick(values: "Tensor", ids: "Tensor") -> "Tensor":
    return values.gather(-1, ids[:, None]).squeeze(-1)


@metric("match", columns=("expected",), unit="fraction", differentiable=False, version=2)
def match(logits: "Tensor", expected: "Tensor") -> "Tensor":
    """1.0 where argmax(logits) == expected, else 0.0."""
    return (logits.argmax(dim=-1) == expected).float()


@metric("logit_diff", columns=("a", "b"), unit="logit", differentiable=True, version=2)
def logit_diff(logits: "Tensor", a: "Tensor", b: "Tensor") -> "Tensor":
    """logit[a] − logit[b]."""
    return _pick(logits, a) - _pick(logits, b)


@metric("cross_entropy", columns=("target",), unit="nats", differentiable=True)
def cross_entropy(logits: "Tensor", target: "Tensor") -> "Tensor":
    """−log_softmax(logits)[target]."""
    return -_pick(logits.log_softmax(dim=-1), target)


@metric("token_logit", columns=("token",), unit="logit", differentiable=True)
def token_logit(logits: "Tensor", token: "Tensor") -> "Tensor":
    """logit[token]."""
    return _pick(logits, token)


@metric("token_prob", columns=("token",), unit="probability", differentiable=True)
def token_prob(logits: "Tensor", token: "Tensor") -> "Tensor":
    """softmax(logits)[token]."""
    return _pick(logits.softmax(dim=-1), token)

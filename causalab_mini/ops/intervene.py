"""Gather, scatter, and the write seam.

This module knows nothing of layers, models, documents or plans: positions
arrive as integers and activations as tensors. Everything both engines do to an
activation below their forward is here, and at its heart it is one line:

    write = inverse(do(featurize(x)), err, x)

Shapes. A ``Window`` is one tuple of absolute indices into the padded sequence
per row. Whether the value keeps its rectangle — ``(rows, w, width)`` — or comes
back flat — ``(total, width)``, every row's positions in row order — is the
caller's ``ragged`` flag, decided once by the compiler from the position spec
and never here from the tensor: a slice of a ragged pass's rows can happen to
be rectangular, and it must still come back flat.
"""
from __future__ import annotations

import contextlib
import numbers
from typing import Iterator, Optional, Union

import torch
from torch import Tensor

from .. import kernel, vocab
from ..errors import EngineError
from . import featurizers as _feat
from .featurizers import Featurizer, Identity  # noqa: F401  (re-exported for callers)
from ..vocab import check_params
from .mechanisms import REGISTRY

# What to do about a refusal the compiler makes first, so that a document should not reach it.
_SEE_PLAN = ("check the document's sites, widths and operands with `causalab-mini explain DOC`; a document that compiles should never reach this check, so if it does, report it with the document")

Window = tuple[tuple[int, ...], ...]
Operand = Union[Tensor, float, int, None]


@contextlib.contextmanager
def exact() -> Iterator[None]:
    """Autocast off, for featurizer arithmetic.

    A server may wrap a whole request in ``torch.autocast`` (NDIF does); inside
    it a matmul of two fp32 tensors comes back in the autocast dtype while a
    subtraction stays fp32, so half of a Cayley solve would be downcast. A
    featurizer's dtype is fp32, and this is where that is kept.
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast(device_type="cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast(device_type="cuda", enabled=False))
        yield


# --------------------------------------------------------------------------- gather / scatter


def _index(act: Tensor, window: Window, ragged: bool, features: Optional[tuple[int, ...]],
           path: str) -> tuple[tuple[Tensor, ...], tuple[int, ...]]:
    """Advanced-indexing tensors for ``act[idx]``, and the shape that indexing yields.

    Every check here is on Python integers, before any tensor is indexed: an
    index out of range on CUDA is a device-side assert that poisons the context,
    not an exception.
    """
    if act.dim() != 3:
        raise EngineError(path, f"expected an activation of shape (rows, seq, width), got {tuple(act.shape)}", _SEE_PLAN)
    rows, seq, width = act.shape
    if len(window) != rows:
        raise EngineError(path, f"the window has {len(window)} rows and the activation {rows} "
                                f"(shape {tuple(act.shape)})", _SEE_PLAN)
    for r, positions in enumerate(window):
        for p in positions:
            if not 0 <= p < seq:
                raise EngineError(path, f"row {r}: position {p} is outside the padded sequence of {seq} tokens",
                                  "positions are absolute, non-negative indices into the padded sequence")
    if features is not None:
        features = tuple(features)
        bad = [c for c in features if not 0 <= c < width]
        if bad:
            raise EngineError(path, f"feature indices {bad} are outside the width {width}", _SEE_PLAN)
    if not ragged:
        widths = {len(ps) for ps in window}
        if len(widths) > 1:
            raise EngineError(path, f"ragged=False but the rows' windows have widths {sorted(widths)}",
                              "a pass whose rows can differ in width is gathered with ragged=True")
    # The indexing itself is the kernel's (kernel.py), which a stock server runs for a remote tap.
    idx = kernel.index_for(act, window, ragged, features)
    lead = (sum(len(ps) for ps in window),) if ragged else (rows, len(window[0]) if window else 0)
    return idx, lead + ((width,) if features is None else (len(features),))


def gather(act: Tensor, window: Window, *, ragged: bool, features: Optional[tuple[int, ...]] = None,
           path: str = "") -> Tensor:
    """The activation at ``window``, narrowed to the columns ``features`` of the last axis.

    ``act`` is ``(rows, seq, width)``. Rectangular: ``(rows, w, width)``. Ragged:
    ``(total, width)``, rows in order; a row with an empty window contributes
    nothing. With ``features`` the last axis is ``len(features)`` wide.
    """
    idx, _ = _index(act, window, ragged, features, path)
    return act[idx]


def scatter(act: Tensor, window: Window, value: Tensor, *, ragged: bool,
            features: Optional[tuple[int, ...]] = None, path: str = "") -> Tensor:
    """A copy of ``act`` with ``value`` written at ``window`` (and ``features``): gather's inverse.

    Never in place on ``act``: the clone is what keeps autograd working, both to
    ``value`` and to the untouched part of ``act``. ``value`` must have exactly
    the shape ``gather`` would return, and is cast to ``act``'s dtype.
    """
    idx, shape = _index(act, window, ragged, features, path)
    if tuple(value.shape) != shape:
        raise EngineError(path, f"the written value has shape {tuple(value.shape)} and the window "
                                f"{'(ragged) ' if ragged else ''}gathers {shape}", _SEE_PLAN)
    if features is not None and len(set(features)) != len(features):
        raise EngineError(path, f"features {tuple(features)} repeat an index, so the write is ambiguous", _SEE_PLAN)
    for r, positions in enumerate(window):
        if len(set(positions)) != len(positions):
            raise EngineError(path, f"row {r}: window {positions} repeats a position, so the write is ambiguous", _SEE_PLAN)
    out = act.clone()
    out[idx] = value.to(device=act.device, dtype=act.dtype)
    return out


# --------------------------------------------------------------------------- the write seam


def _operand(operand: Operand, f: Tensor, features: Optional[tuple[int, ...]], path: str) -> Optional[Tensor]:
    """The operand as a float32 tensor that broadcasts against the (cut) feature value.

    A number broadcasts. A tensor is already in the featurizer's space: full
    width is cut by ``features`` like f, ``len(features)`` wide is used as it is,
    and then it must either match f's shape or be one vector — ``(k,)`` or
    ``(1, k)`` — that applies at every position.
    """
    if operand is None:
        return None
    if isinstance(operand, numbers.Real) and not isinstance(operand, bool):
        return torch.tensor(float(operand), dtype=torch.float32, device=f.device)
    if not isinstance(operand, Tensor):
        raise EngineError(path, f"an operand is a tensor or a number, got {type(operand).__name__}", _SEE_PLAN)
    op = operand.to(device=f.device, dtype=torch.float32)
    if op.dim() == 0:
        return op
    full = f.shape[-1]
    k = full if features is None else len(features)
    if features is not None and op.shape[-1] == full:
        # Full width is checked first: an operand read through the same featurizer
        # is full width, and when k == full the two readings only differ if the
        # features are a permutation.
        op = _feat.select_features(op, features)
    elif op.shape[-1] != k:
        raise EngineError(path, f"the operand has shape {tuple(operand.shape)} and the write's feature value "
                                f"{_shape_of(f, features)}" + ("" if features is None else
                                f" (features {tuple(features)} of a space {full} wide)"), _SEE_PLAN)
    target = f.shape[:-1] + (k,)
    if tuple(op.shape) == tuple(target):
        return op
    if op.dim() <= len(target) and all(n == 1 for n in op.shape[:-1]):
        return op  # one vector (a mean, say) for every position
    raise EngineError(path, f"the operand has shape {tuple(operand.shape)} and the write's feature value "
                            f"{tuple(target)}",
                      "an operand is one vector, (width,) or (1, width), or exactly as many positions as the write")


def _shape_of(f: Tensor, features: Optional[tuple[int, ...]]) -> tuple[int, ...]:
    return tuple(f.shape) if features is None else tuple(f.shape[:-1]) + (len(features),)


def _held(spec, path: str):
    """An extension's mechanism held to the contract the walk relies on: f' of f's shape and dtype,
    no NaN where f had none; its failure named with its distribution, not a traceback from the walk."""
    whose = f"mechanism {spec.name!r} (registered by {spec.origin})"
    fix = f"fix or upgrade {spec.origin}, or write with another mechanism"

    def do(f: Tensor, op, params: dict, f0) -> Tensor:
        try:
            new = spec.apply(f, op, params, f0)
        except Exception as err:  # noqa: BLE001 — the extension's own failure
            raise EngineError(path, f"{whose} raised {type(err).__name__}: {err}", fix) from None
        if not isinstance(new, Tensor) or new.shape != f.shape or new.dtype != f.dtype:
            got = f"{new.dtype} {tuple(new.shape)}" if isinstance(new, Tensor) else type(new).__name__
            raise EngineError(path, f"{whose} returned {got} for a feature value of {f.dtype} "
                              f"{tuple(f.shape)}", fix)
        if bool(new.isnan().any()) and not bool(f.isnan().any()):
            raise EngineError(path, f"{whose} returned NaN", fix)
        return new
    return do


def apply_write(x: Tensor, *, featurizer: Featurizer, mechanism: str, params: Optional[dict],
                operand: Operand, f0: Optional[Tensor] = None,
                features: Optional[tuple[int, ...]] = None, path: str = "") -> Tensor:
    """``inverse(do(featurize(x)), err, x)``: the new value of the gathered activation ``x``.

    ``x`` is the gather at the write's window, already narrowed to the site's
    units/heads. ``operand`` is in the featurizer's space (a read of the same pass
    or a published value), a number, or None for a mechanism without one.
    ``features`` narrows the feature vector: the mechanism sees and changes only
    those coordinates, and the rest of f passes through. ``f0`` is the address's
    pre-write value gathered the same way, for a mechanism that measures against
    it (renormalize); it is featurized and cut like x. Arithmetic in float32
    inside ``exact()``; the result comes back in x's dtype and shape.
    """
    if mechanism not in vocab.MECHANISMS:
        raise EngineError(path, f"unknown mechanism {mechanism!r}; one of {', '.join(sorted(vocab.MECHANISMS))}",
                          _SEE_PLAN)
    try:
        params = check_params(mechanism, params)
    except ValueError as e:
        raise EngineError(path, str(e), _SEE_PLAN) from None
    spec = vocab.MECHANISMS[mechanism]
    if spec.operand and operand is None:
        raise EngineError(path, f"{mechanism} takes an operand and none was given", _SEE_PLAN)
    if not spec.operand and operand is not None:
        raise EngineError(path, f"{mechanism} takes no operand, got one", _SEE_PLAN)
    if spec.needs_f0:
        if f0 is None:
            raise EngineError(path, f"{mechanism} measures against the pre-write value f0, and none was given", _SEE_PLAN)
        if f0.shape != x.shape:
            raise EngineError(path, f"f0 has shape {tuple(f0.shape)} and x {tuple(x.shape)}",
                              "f0 is gathered at the write's own window and units")
    if features is not None:
        features = tuple(features)
    select = getattr(featurizer, "select_features", _feat.select_features)
    merge = getattr(featurizer, "merge_features", _feat.merge_features)

    def operand_against(f: Tensor) -> Optional[Tensor]:
        # Once f's width is known: the features checked against it, then the operand laid out.
        if features is not None:
            bad = [c for c in features if not 0 <= c < f.shape[-1]]
            if bad or len(set(features)) != len(features):
                raise EngineError(path, f"features {features} are not distinct indices into a feature space "
                                        f"{f.shape[-1]} wide", _SEE_PLAN)
        return _operand(operand, f, features, path)

    do = REGISTRY[mechanism] if spec.apply is None else _held(spec, path)
    with exact():
        # The seam's order of operations is the kernel's (kernel.write): the mechanism sees only
        # the selected coordinates, and the rest of f passes through.
        f0_32 = f0.to(device=x.device, dtype=torch.float32) if spec.needs_f0 else None
        out = kernel.write(x.to(torch.float32), featurizer.featurize, featurizer.inverse, do, operand_against,
                           params, f0_32, features, select, merge)
    if out.shape != x.shape:
        raise EngineError(path, f"the featurizer's inverse returned shape {tuple(out.shape)} for x of "
                                f"shape {tuple(x.shape)}", _SEE_PLAN)
    return out.to(x.dtype)

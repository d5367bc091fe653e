"""Strategies for what a write does and what it acts on: ``(name, params)`` pairs that
``vocab.check_params`` accepts (``mechanisms``), and float32 torch tensors —
bounded activations, orthonormal bases, SAELens-named SAE weights. torch is imported
when a tensor is drawn, never when this module is imported.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from causalab_mini import vocab


# --------------------------------------------------------------------------- mechanisms


def _floats(lo: float, hi: float, **kw) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False, **kw)


def _number(lo: float, hi: float) -> st.SearchStrategy:
    # An int is a valid float parameter (check_params coerces it); a document may write 2.
    return _floats(lo, hi) | st.integers(math.ceil(lo), math.floor(hi))


def _optional(key: str, values: st.SearchStrategy) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional={key: values})


@st.composite
def _clamp(draw) -> dict:
    which = draw(st.sampled_from(("min", "max", "both")))
    if which == "both":
        lo, hi = sorted((draw(_number(-10, 10)), draw(_number(-10, 10))))
        return {"min": lo, "max": hi}
    return {which: draw(_number(-10, 10))}


_PARAMS = {
    "swap": st.just({}),
    "add_scaled": _optional("scale", _number(-8, 8)),
    "lerp": st.fixed_dictionaries({"t": st.sampled_from((0.0, 1.0, 0, 1)) | _floats(0, 1)}),
    "clamp": _clamp(),
    "gaussian": st.fixed_dictionaries({"std": _floats(1e-3, 4) | st.integers(1, 4)},
                                      optional={"seed": st.integers(0, 2**63 - 1)}),
    "renormalize": st.just({}),
}


def mechanisms(names: Optional[Sequence[str]] = None) -> st.SearchStrategy[tuple[str, dict]]:
    """``(name, params)`` for the mechanisms of ``vocab.MECHANISMS`` (or ``names`` of them).

    Every drawn pair passes ``vocab.check_params``; defaults are sometimes written
    and sometimes omitted, numbers are sometimes ints, and no value is None, so a
    pair is also a valid ``"mechanism"``/``"params"`` of a document's write.
    Whether the mechanism takes an operand is ``vocab.MECHANISMS[name].operand``;
    whether it measures against the pre-write value is ``.needs_f0``. Values are
    bounded (|scale| <= 8, 0 <= t <= 1, std <= 4) so a write stays finite.
    """
    names = tuple(vocab.MECHANISMS) if names is None else tuple(names)
    unknown = sorted(set(names) - set(vocab.MECHANISMS))
    if not names or unknown:
        raise InvalidArgument(f"names={names!r}: draw from {sorted(vocab.MECHANISMS)}")
    missing = sorted(set(names) - set(_PARAMS))
    if missing:  # the vocabulary grew and these strategies did not
        raise InvalidArgument(f"no parameter strategy for mechanism(s) {missing}")
    return st.one_of([st.tuples(st.just(n), _PARAMS[n]) for n in names])


# --------------------------------------------------------------------------- tensors


def _float32_values(n: int, bound: float) -> st.SearchStrategy[list]:
    return st.lists(_floats(-bound, bound, width=32), min_size=n, max_size=n)


@st.composite
def _activations(draw, shape: tuple, bound: float, seeded_above: int):
    import torch

    n = math.prod(shape)
    if n <= seeded_above:
        return torch.tensor(draw(_float32_values(n, bound)), dtype=torch.float32).reshape(shape)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    scale = draw(_floats(1e-3, bound))
    return (torch.rand(shape, generator=g, dtype=torch.float32) * 2 - 1) * scale


def activations(shape: Sequence[int], *, bound: float = 10.0, seeded_above: int = 256):
    """float32 torch tensors of ``shape`` with finite values in ``[-bound, bound]``.

    Up to ``seeded_above`` elements every value is drawn by hypothesis (and
    shrinks); a larger tensor is drawn from a seeded generator at a drawn scale.
    """
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise InvalidArgument(f"shape={shape!r} has a negative size")
    return _activations(shape, float(bound), int(seeded_above))


@st.composite
def _basis(draw, d: int, k: int, seeded_above: int):
    import torch

    if d * k <= seeded_above:
        m = torch.tensor(draw(_float32_values(d * k, 1.0)), dtype=torch.float64).reshape(d, k)
    else:
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
        m = torch.randn(d, k, generator=g, dtype=torch.float64)
    s = torch.linalg.svdvals(m)
    if s[-1] <= 1e-3 * max(float(s[0]), 1.0):
        # A degenerate draw (all zeros is hypothesis's favourite) is lifted by c·E, E the
        # first k columns of I: with c = 2‖M‖ + 1 the top k×k block has singular values
        # >= ‖M‖ + 1, so the columns are independent and the condition number is <= 3.
        m = m + (2 * float(s[0]) + 1) * torch.eye(d, k, dtype=torch.float64)
    q, r = torch.linalg.qr(m)
    signs = torch.sign(torch.diagonal(r))
    q = q * torch.where(signs == 0, torch.ones_like(signs), signs)
    return q.to(torch.float32).contiguous()


def orthonormal_bases(d: int, k: int, *, seeded_above: int = 256):
    """``(d, k)`` float32 torch tensors Q with orthonormal columns (QᵀQ = I to float32 precision).

    Q is the QR factor (signs fixed so R's diagonal is positive) of a drawn
    matrix, computed in float64: entries drawn by hypothesis up to
    ``seeded_above`` of them, else from a seeded generator. A rank-deficient
    draw is lifted by a multiple of the identity's first k columns rather than
    rejected, so no example is wasted. This is the parameter a ``subspace`` or
    ``pca`` featurizer holds: featurize is Qᵀx, inverse Qf + (x − QQᵀx).
    """
    if not (isinstance(d, int) and isinstance(k, int) and 1 <= k <= d):
        raise InvalidArgument(f"orthonormal_bases needs 1 <= k <= d, got d={d!r}, k={k!r}")
    return _basis(d, k, seeded_above)


@st.composite
def _sae(draw, d: int, k: int, tied: Optional[bool], unit_norm_decoder: bool):
    import torch

    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    enc_scale = draw(_floats(0.1, 2.0)) / math.sqrt(d)
    w_enc = torch.randn(d, k, generator=g) * enc_scale
    zero_biases = draw(st.booleans())
    b_enc = torch.zeros(k) if zero_biases else torch.randn(k, generator=g) * 0.1
    b_dec = torch.zeros(d) if zero_biases else torch.randn(d, generator=g) * 0.1
    out = {"W_enc": w_enc.contiguous(), "b_enc": b_enc, "b_dec": b_dec}
    is_tied = draw(st.booleans()) if tied is None else tied
    if not is_tied:
        w_dec = torch.randn(k, d, generator=g)
        if unit_norm_decoder:
            w_dec = w_dec / w_dec.norm(dim=1, keepdim=True).clamp_min(1e-6)
        else:
            w_dec = w_dec / math.sqrt(k)
        out["W_dec"] = w_dec.contiguous()
    return {name: t.to(torch.float32) for name, t in out.items()}


def sae_weights(d: int, k: int, *, tied: Optional[bool] = False, unit_norm_decoder: bool = True):
    """A dict of SAELens-named float32 tensors for a ``d``-wide site and ``k`` latents.

    ``W_enc`` ``(d, k)``, ``b_enc`` ``(k,)``, ``b_dec`` ``(d,)`` and, unless tied,
    ``W_dec`` ``(k, d)`` — a missing ``W_dec`` means tied weights, ``W_encᵀ``, as
    the ``sae`` featurizer reads a bundle. ``tied=None`` draws whether. Values come
    from a seeded generator at a drawn encoder scale; biases are zero on about half
    the draws; decoder rows are unit-norm when ``unit_norm_decoder`` (SAELens's
    convention). The encoding is ``act((x − b_dec) W_enc + b_enc)``.
    """
    if not (isinstance(d, int) and isinstance(k, int) and d >= 1 and k >= 1):
        raise InvalidArgument(f"sae_weights needs d >= 1 and k >= 1, got d={d!r}, k={k!r}")
    if tied not in (True, False, None):
        raise InvalidArgument(f"tied={tied!r} is True, False or None (drawn)")
    return _sae(d, k, tied, unit_norm_decoder)

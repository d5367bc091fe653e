"""The six mechanisms: what a write does to a feature value.

Each is a plain function ``(f, operand, params, f0) -> f'`` over float32
tensors in the featurizer's space. ``operand`` is a tensor that broadcasts
against ``f`` (``apply_write`` has already resolved numbers and cut widths) or
None for a mechanism that takes none; ``f0`` is the address's pre-write value
in the same space, or None for a mechanism that does not measure against it.
``params`` has passed ``check_params`` (defaults filled in).

The registry's keys are exactly ``vocab.MECHANISMS``'s built-ins, so the vocabulary a
document is validated against and the code that runs cannot drift apart; a mechanism an
extension registers carries its function on its record.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from .. import vocab

Mechanism = Callable[[Tensor, Optional[Tensor], dict, Optional[Tensor]], Tensor]


def _as_tensor(operand, f: Tensor) -> Tensor:
    # Called directly (tests, a hand-written plan) a mechanism may get a number.
    return torch.as_tensor(operand, dtype=f.dtype, device=f.device)


def swap(f: Tensor, operand, params: dict, f0: Optional[Tensor] = None) -> Tensor:
    """The operand replaces f. ``expand`` + ``clone`` copies bits, so a swap of f with itself is exact."""
    return _as_tensor(operand, f).expand(f.shape).clone()


def add_scaled(f: Tensor, operand, params: dict, f0: Optional[Tensor] = None) -> Tensor:
    return f + params.get("scale", 1.0) * _as_tensor(operand, f)


def lerp(f: Tensor, operand, params: dict, f0: Optional[Tensor] = None) -> Tensor:
    """(1 − t)·f + t·operand, computed by ``torch.lerp``.

    ``torch.lerp`` evaluates ``f + t·(op − f)`` for t < ½ and ``op − (op − f)·(1 − t)``
    otherwise, so every t in between stays between the two. The ends are returned as
    they are rather than computed: the added zero term would turn −0.0 into +0.0, and
    "t = 1 is a swap, t = 0 is nothing" is meant to the bit.
    """
    t = float(params["t"])
    op = _as_tensor(operand, f).expand(f.shape)
    if t == 0.0:
        return f.clone()
    if t == 1.0:
        return op.clone()
    return torch.lerp(f, op, t)


def clamp(f: Tensor, operand, params: dict, f0: Optional[Tensor] = None) -> Tensor:
    return torch.clamp(f, min=params.get("min"), max=params.get("max"))


def gaussian(f: Tensor, operand, params: dict, f0: Optional[Tensor] = None) -> Tensor:
    """f + std·noise, the noise drawn on a CPU generator and then moved.

    Drawing on the CPU is what makes one seed one noise tensor on every device:
    CUDA's generator would give a different tensor for the same seed.
    """
    g = torch.Generator(device="cpu").manual_seed(int(params.get("seed", 0)))
    noise = torch.randn(tuple(f.shape), generator=g, dtype=torch.float32)
    return f + float(params["std"]) * noise.to(device=f.device, dtype=f.dtype)


def renormalize(f: Tensor, operand, params: dict, f0: Optional[Tensor] = None) -> Tensor:
    """Rescale each position's vector to the L2 norm f0 had there: f·‖f0‖/‖f‖.

    A zero vector has no direction to rescale along and is returned as it is; the
    guard is on the denominator, not a ``where`` around the quotient, so no NaN
    reaches the backward either. The direction is found on f divided by its largest
    coordinate, then scaled: for a vector as short as the smallest normal float,
    ‖f0‖/‖f‖ overflows to inf and the squares inside ‖f‖ underflow to 0.
    """
    if f0 is None:
        raise ValueError("renormalize measures against the pre-write value f0, and none was given")
    peak = f.abs().amax(dim=-1, keepdim=True)
    unit = f / torch.where(peak > 0, peak, torch.ones_like(peak))  # coordinates in [-1, 1]
    norm = torch.linalg.vector_norm(unit, dim=-1, keepdim=True)
    target = torch.linalg.vector_norm(f0.to(f.dtype), dim=-1, keepdim=True)
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))
    return (unit / safe) * target


REGISTRY: dict[str, Mechanism] = {
    "swap": swap,
    "add_scaled": add_scaled,
    "lerp": lerp,
    "clamp": clamp,
    "gaussian": gaussian,
    "renormalize": renormalize,
}
# The built-ins' functions; an extension's mechanism carries its own (vocab.Mechanism.apply).
assert set(REGISTRY) == {n for n, m in vocab.MECHANISMS.items() if m.apply is None}, \
    "mechanism registry and vocab.MECHANISMS disagree"



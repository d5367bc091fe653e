"""The six mechanisms: what a write does to a feature value.

Each is a plain function ``(f, operand, params, f0) -> f'`` over float32
tensors in the featurizer's space. ``operand`` is a tensor that broadcasts
against ``f`` (``apply_write`` has already resolved numbers and cut widths) or
None for a mechanism that takes none; ``f0`` is the address's pre-write value
in the same space, or None for a mechanism that does not measure against it.
``params`` has passed ``check_params`` (defaults filled in).

The registry's keys are exactly ``vocab.MECHANISMS``'s, so the vocabulary a
document is validated against and the code that runs cannot drift apart.
"""
from __future__ import annotations

import math
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
    otherwise, so t = 0 returns f and t = 1 returns the operand to the bit — the
    naive formula would not — and every t in between stays between the two.
    """
    op = _as_tensor(operand, f).expand(f.shape)
    return torch.lerp(f, op, float(params["t"]))


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
    reaches the backward either.
    """
    if f0 is None:
        raise ValueError("renormalize measures against the pre-write value f0, and none was given")
    norm = torch.linalg.vector_norm(f, dim=-1, keepdim=True)
    target = torch.linalg.vector_norm(f0.to(f.dtype), dim=-1, keepdim=True)
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))
    return f * (target / safe)


REGISTRY: dict[str, Mechanism] = {
    "swap": swap,
    "add_scaled": add_scaled,
    "lerp": lerp,
    "clamp": clamp,
    "gaussian": gaussian,
    "renormalize": renormalize,
}
assert set(REGISTRY) == set(vocab.MECHANISMS), "mechanism registry and vocab.MECHANISMS disagree"


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
    if name not in vocab.MECHANISMS:
        raise ValueError(f"unknown mechanism {name!r}; one of {', '.join(sorted(vocab.MECHANISMS))}")
    spec = vocab.MECHANISMS[name].params
    params = dict(params or {})
    unknown = sorted(set(params) - set(spec))
    if unknown:
        allowed = ", ".join(spec) if spec else "none"
        raise ValueError(f"{name}: unknown parameter{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))}; {name} takes {allowed}")
    out: dict = {}
    for key, (typ, default) in spec.items():
        if key not in params or (params[key] is None and default is vocab.REQUIRED):
            if default is vocab.REQUIRED:
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

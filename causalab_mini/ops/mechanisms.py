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

from torch import Tensor

from .. import kernel, vocab

Mechanism = Callable[[Tensor, Optional[Tensor], dict, Optional[Tensor]], Tensor]


# The functions are the kernel's (kernel.py): the code a stock server runs for a remote write is
# this code, so a remote write and a local one cannot drift apart.
swap = kernel.swap
add_scaled = kernel.add_scaled
lerp = kernel.lerp
clamp = kernel.clamp
gaussian = kernel.gaussian
renormalize = kernel.renormalize


REGISTRY: dict[str, Mechanism] = {
    "swap": swap,
    "add_scaled": add_scaled,
    "lerp": lerp,
    "clamp": clamp,
    "gaussian": gaussian,
    "renormalize": renormalize,
}
# The built-ins' functions; an extension's mechanism carries its own (vocab.Mechanism.apply).
assert set(REGISTRY) == {n for n, m in vocab.MECHANISMS.items() if m.apply is None} == set(kernel.MECHANISMS), \
    "mechanism registry, vocab.MECHANISMS and the kernel's disagree"



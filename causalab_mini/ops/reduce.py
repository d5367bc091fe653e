"""Reductions an observe step may publish a read as: ``mean`` and ``pca``.

Both reshape to ``(-1, d)`` first, so they are always over every vector the read
produced — every row, every position — whether the read was rectangular or flat.
Both return float32: a published value is an operand in a featurizer's space,
and that space is fp32.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import kernel


def _vectors(value: Tensor) -> Tensor:
    if value.dim() == 0:
        raise ValueError("a reduction needs vectors, got a scalar")
    return value.reshape(-1, value.shape[-1])


def mean(value: Tensor) -> Tensor:
    """The mean of every vector in ``value`` (any leading shape): ``(d,)``."""
    if _vectors(value).shape[0] == 0:
        raise ValueError("the mean of no vectors is undefined: the read produced none")
    # The kernel's (kernel.py): a mean published from a read of a request to a stock server is
    # taken there by the same function.
    return kernel.vectors_mean(value)


def pca(value: Tensor, k: int) -> Tensor:
    """The top ``k`` principal directions of every vector in ``value``, as the columns of a ``(d, k)`` basis.

    Centred, then the right singular vectors of the ``(n, d)`` matrix. The SVD
    runs in float64 so that the rank test is not fp32 noise. Each column's sign
    is fixed (its largest-magnitude entry positive), so the same vectors give the
    same basis on any device.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    x = _vectors(value)
    n, d = x.shape
    if k > d:
        raise ValueError(f"rank {k} is more than the {d} dimensions of the vectors")
    # Centring removes one degree of freedom: n vectors span at most n - 1 directions.
    if n < k + 1:
        raise ValueError(f"too few vectors for rank {k}: got {n}")
    # The rank test's precision is the data's, not the SVD's: fp32 vectors that
    # span k directions exactly still carry fp32 rounding in every other one.
    # (Half-precision data is judged at fp32's: its own eps would zero real directions.)
    eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    x = x.to(torch.float64)
    x = x - x.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    # numpy/torch matrix_rank's tolerance: a singular value below it is zero.
    tol = s.max() * max(n, d) * eps
    rank = int((s > tol).sum())
    if rank < k:
        raise ValueError(f"too few independent vectors for rank {k}: got {n} vectors spanning {rank} "
                         f"direction{'s' if rank != 1 else ''} once centred")
    basis = vh[:k].T  # (d, k)
    pivot = basis.abs().argmax(dim=0)
    signs = torch.sign(basis[pivot, torch.arange(k, device=basis.device)])
    return (basis * signs).to(torch.float32).contiguous()

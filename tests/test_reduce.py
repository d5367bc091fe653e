"""mean and pca over every vector of a read."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from causalab_mini.ops.reduce import mean, pca


def test_mean_over_every_vector():
    value = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 12.0]]])  # (rows, w, d)
    assert torch.equal(mean(value), torch.tensor([(1 + 3 + 5 + 7) / 4, (2 + 4 + 6 + 12) / 4]))
    flat = value.reshape(4, 2)
    assert torch.equal(mean(flat), torch.tensor([4.0, 6.0]))
    assert mean(value.to(torch.bfloat16)).dtype == torch.float32


def test_mean_of_nothing_is_refused():
    with pytest.raises(ValueError, match="no vectors"):
        mean(torch.zeros(0, 3))


def planted(n=40, d=6, k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))
    coeffs = torch.randn(n, k, generator=g, dtype=torch.float64) * torch.tensor([5.0, 2.0][:k], dtype=torch.float64)
    offset = torch.randn(d, generator=g, dtype=torch.float64)  # pca centres, so an offset must not matter
    return (coeffs @ basis.T + offset).to(torch.float32), basis


def test_pca_recovers_a_planted_subspace():
    x, basis = planted()
    q = pca(x.view(4, 10, 6), 2)  # any leading shape: (rows, w, d)
    assert q.shape == (6, 2) and q.dtype == torch.float32
    # Same subspace: equal projectors.
    p_true = basis @ basis.T
    p_found = q.double() @ q.double().T
    torch.testing.assert_close(p_found, p_true, atol=1e-5, rtol=0)
    # Orthonormal columns.
    torch.testing.assert_close(q.T @ q, torch.eye(2), atol=1e-5, rtol=0)


def test_pca_first_direction_is_the_largest():
    # Points along (1, 0, 0) spread far more than along (0, 1, 0).
    x = torch.tensor([[-10.0, 1.0, 0.0], [10.0, -1.0, 0.0], [-10.0, -1.0, 0.0], [10.0, 1.0, 0.0]])
    q = pca(x, 2)
    torch.testing.assert_close(q, torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))


def test_pca_refusals():
    with pytest.raises(ValueError, match="too few vectors for rank 4: got 4"):
        pca(torch.randn(4, 8), 4)
    x, _ = planted(k=2)
    with pytest.raises(ValueError, match="too few independent vectors for rank 3"):
        pca(x, 3)
    with pytest.raises(ValueError, match="more than the 6 dimensions"):
        pca(x, 7)
    with pytest.raises(ValueError, match="positive integer"):
        pca(x, 0)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4))
def test_pca_basis_is_orthonormal_and_deterministic(seed, k):
    x = torch.randn(20, 5, generator=torch.Generator().manual_seed(seed))
    q = pca(x, k)
    torch.testing.assert_close(q.T @ q, torch.eye(k), atol=1e-5, rtol=0)
    assert torch.equal(pca(x.clone(), k), q)

"""The six mechanisms as plain functions, and their parameter checks."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from causalab_mini import vocab
from causalab_mini.ops import mechanisms as m

F = torch.tensor([[3.0, -4.0, 0.0], [1.0, 2.0, 2.0]])
OP = torch.tensor([[1.0, 1.0, 1.0], [-2.0, 0.5, 4.0]])


def test_registry_is_the_vocabulary():
    assert set(m.REGISTRY) == set(vocab.MECHANISMS)


def test_swap():
    assert torch.equal(m.swap(F, OP, {}, None), OP)
    assert torch.equal(m.swap(F, torch.tensor([7.0, 8.0, 9.0]), {}, None),
                       torch.tensor([[7.0, 8.0, 9.0], [7.0, 8.0, 9.0]]))
    assert torch.equal(m.swap(F, 0.0, {}, None), torch.zeros(2, 3))


def test_add_scaled():
    expected = torch.tensor([[3 - 2.0, -4 - 2.0, 0 - 2.0], [1 + 4.0, 2 - 1.0, 2 - 8.0]])
    assert torch.equal(m.add_scaled(F, OP, {"scale": -2.0}, None), expected)


def test_lerp():
    expected = torch.tensor([[0.5 * 3 + 0.5 * 1, 0.5 * -4 + 0.5 * 1, 0.5],
                             [0.5 * 1 - 0.5 * 2, 0.5 * 2 + 0.5 * 0.5, 0.5 * 2 + 0.5 * 4]])
    assert torch.equal(m.lerp(F, OP, {"t": 0.5}, None), expected)
    assert torch.equal(m.lerp(F, OP, {"t": 0.0}, None), F)
    assert torch.equal(m.lerp(F, OP, {"t": 1.0}, None), OP)


def test_clamp():
    assert torch.equal(m.clamp(F, None, {"min": -1.0, "max": 2.5}, None),
                       torch.tensor([[2.5, -1.0, 0.0], [1.0, 2.0, 2.0]]))
    assert torch.equal(m.clamp(F, None, {"min": 1.5, "max": None}, None),
                       torch.tensor([[3.0, 1.5, 1.5], [1.5, 2.0, 2.0]]))


def test_gaussian_one_seed_one_tensor():
    g = torch.Generator(device="cpu").manual_seed(123)
    noise = torch.randn((2, 3), generator=g)
    out = m.gaussian(F, None, {"std": 2.0, "seed": 123}, None)
    assert torch.equal(out, F + 2.0 * noise)
    # Independent of the global RNG state.
    torch.manual_seed(999)
    assert torch.equal(m.gaussian(F, None, {"std": 2.0, "seed": 123}, None), out)


def test_renormalize():
    f0 = torch.tensor([[0.0, 0.0, 1.0], [6.0, 0.0, 8.0]])  # norms 1 and 10
    out = m.renormalize(F, None, {}, f0)
    # F's norms are 5 and 3.
    expected = torch.tensor([[3 / 5, -4 / 5, 0.0], [10 / 3, 20 / 3, 20 / 3]])
    torch.testing.assert_close(out, expected)


def test_renormalize_takes_a_vector_as_short_as_the_smallest_normal_float_to_f0s_norm():
    # The ratio 4 / 1.18e-38 is past float32's largest number, and tiny² underflows; the direction is not.
    tiny = torch.finfo(torch.float32).tiny
    out = m.renormalize(torch.tensor([[tiny], [0.0]]), None, {}, torch.tensor([[-4.0], [4.0]]))
    assert torch.equal(out, torch.tensor([[4.0], [0.0]]))  # f's direction at f0's norm; zero stays zero
    out = m.renormalize(torch.tensor([[0.0, -3 * tiny, 4 * tiny]]), None, {}, torch.tensor([[0.0, 10.0, 0.0]]))
    torch.testing.assert_close(out, torch.tensor([[0.0, -6.0, 8.0]]))


def test_renormalize_gradient_at_a_zero_vector_is_finite():
    f = torch.zeros(1, 3, requires_grad=True)
    m.renormalize(f, None, {}, torch.ones(1, 3)).sum().backward()
    assert torch.isfinite(f.grad).all()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-100, 100, width=32), min_size=3, max_size=3),
       st.lists(st.floats(-100, 100, width=32), min_size=3, max_size=3))
def test_renormalize_norm_property(a, b):
    f, f0 = torch.tensor([a]), torch.tensor([b])
    out = m.renormalize(f, None, {}, f0)
    nf = math.sqrt(sum(x * x for x in a))
    n0 = math.sqrt(sum(x * x for x in b))
    got = math.sqrt(sum(float(x) ** 2 for x in out[0]))
    if nf == 0:
        assert torch.equal(out, f)
    elif nf > 1e-6:
        assert got == pytest.approx(n0, rel=1e-5, abs=1e-5)


# --------------------------------------------------------------------------- check_params


def test_defaults_are_filled():
    assert vocab.check_params("swap", None) == {}
    assert vocab.check_params("add_scaled", {}) == {"scale": 1.0}
    assert vocab.check_params("gaussian", {"std": 1}) == {"std": 1.0, "seed": 0}
    assert vocab.check_params("clamp", {"min": 0}) == {"min": 0.0, "max": None}
    assert vocab.check_params("lerp", {"t": 1}) == {"t": 1.0}
    assert isinstance(vocab.check_params("lerp", {"t": 1})["t"], float)


@pytest.mark.parametrize("name, params, message", [
    ("zap", {}, "unknown mechanism 'zap'"),
    ("swap", {"scale": 1.0}, "swap: unknown parameter 'scale'; swap takes none"),
    ("add_scaled", {"scal": 1.0}, "add_scaled: unknown parameter 'scal'; add_scaled takes scale"),
    ("lerp", {}, "lerp: parameter 't' is required"),
    ("lerp", {"t": None}, "lerp: parameter 't' is required"),
    ("gaussian", {"seed": 1}, "gaussian: parameter 'std' is required"),
    ("lerp", {"t": "0.5"}, "lerp: parameter 't' must be a number, got str '0.5'"),
    ("add_scaled", {"scale": True}, "add_scaled: parameter 'scale' must be float, got bool True"),
    ("add_scaled", {"scale": float("nan")}, "add_scaled: parameter 'scale' must be finite"),
    ("gaussian", {"std": 1.0, "seed": 1.5}, "gaussian: parameter 'seed' must be an integer, got float 1.5"),
    ("gaussian", {"std": 0.0}, "gaussian: 'std' must be > 0, got 0.0"),
    ("gaussian", {"std": -1.0}, "gaussian: 'std' must be > 0, got -1.0"),
    ("gaussian", {"std": 1.0, "seed": -3}, "gaussian: 'seed' must be in [0, 2**63)"),
    ("clamp", {}, "clamp: needs at least one bound, 'min' or 'max'"),
    ("clamp", {"min": None, "max": None}, "clamp: needs at least one bound"),
    ("clamp", {"min": 2.0, "max": 1.0}, "clamp: 'min' (2.0) is greater than 'max' (1.0)"),
])
def test_refusals(name, params, message):
    with pytest.raises(ValueError) as info:
        vocab.check_params(name, params)
    assert message in str(info.value)

"""gather / scatter / apply_write: against tensors built by hand."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from causalab_mini.errors import EngineError
from causalab_mini.ops.featurizers import IDENTITY, Featurizer, Identity
from causalab_mini.ops.intervene import apply_write, exact, gather, scatter


def act_3x5x4() -> torch.Tensor:
    # act[r, p, c] = 100 r + 10 p + c: every element says where it came from.
    r = torch.arange(3).view(3, 1, 1)
    p = torch.arange(5).view(1, 5, 1)
    c = torch.arange(4).view(1, 1, 4)
    return (100 * r + 10 * p + c).to(torch.float32)


# --------------------------------------------------------------------------- gather


def test_gather_rectangular():
    out = gather(act_3x5x4(), ((4,), (0,), (2,)), ragged=False)
    expected = torch.tensor([[[40., 41, 42, 43]], [[100, 101, 102, 103]], [[220, 221, 222, 223]]])
    assert out.shape == (3, 1, 4)
    assert torch.equal(out, expected)


def test_gather_rectangular_wide_window_with_features():
    out = gather(act_3x5x4(), ((1, 3), (0, 4), (2, 2)), ragged=False, features=(3, 0))
    expected = torch.tensor([
        [[13., 10], [33, 30]],
        [[103, 100], [143, 140]],
        [[223, 220], [223, 220]],
    ])
    assert torch.equal(out, expected)


def test_gather_ragged_with_an_empty_row():
    out = gather(act_3x5x4(), ((0, 1), (), (4,)), ragged=True)
    expected = torch.tensor([[0., 1, 2, 3], [10, 11, 12, 13], [240, 241, 242, 243]])
    assert out.shape == (3, 4)
    assert torch.equal(out, expected)


def test_gather_ragged_with_features():
    out = gather(act_3x5x4(), ((2,), (1, 3), ()), ragged=True, features=(1,))
    assert torch.equal(out, torch.tensor([[21.], [111], [131]]))


def test_ragged_is_the_callers_word_not_the_tensors():
    # Uniform windows asked for flat come back flat.
    out = gather(act_3x5x4(), ((1,), (1,), (1,)), ragged=True)
    assert out.shape == (3, 4)
    assert torch.equal(out, torch.tensor([[10., 11, 12, 13], [110, 111, 112, 113], [210, 211, 212, 213]]))


def test_gather_refusals():
    act = act_3x5x4()
    with pytest.raises(EngineError, match=r"widths \[1, 2\]"):
        gather(act, ((1,), (1, 2), (0,)), ragged=False)
    with pytest.raises(EngineError, match="outside the padded sequence of 5"):
        gather(act, ((5,), (1,), (0,)), ragged=False)
    with pytest.raises(EngineError, match="outside the padded sequence"):
        gather(act, ((-1,), (1,), (0,)), ragged=False)
    with pytest.raises(EngineError, match="2 rows and the activation 3"):
        gather(act, ((1,), (1,)), ragged=False)
    with pytest.raises(EngineError, match=r"feature indices \[4\]"):
        gather(act, ((1,), (1,), (1,)), ragged=False, features=(4,))


# --------------------------------------------------------------------------- scatter


def test_scatter_rectangular_and_input_unchanged():
    act = act_3x5x4()
    before = act.clone()
    value = -torch.ones(3, 1, 4)
    out = scatter(act, ((4,), (0,), (2,)), value, ragged=False)
    expected = before.clone()
    expected[0, 4] = -1
    expected[1, 0] = -1
    expected[2, 2] = -1
    assert torch.equal(out, expected)
    assert torch.equal(act, before)  # cloned, not written in place


def test_scatter_ragged_with_features_and_empty_row():
    act = act_3x5x4()
    value = torch.tensor([[-1., -2], [-3, -4], [-5, -6]])
    out = scatter(act, ((0, 3), (), (1,)), value, ragged=True, features=(2, 0))
    expected = act.clone()
    expected[0, 0, 2], expected[0, 0, 0] = -1, -2
    expected[0, 3, 2], expected[0, 3, 0] = -3, -4
    expected[2, 1, 2], expected[2, 1, 0] = -5, -6
    assert torch.equal(out, expected)


def test_scatter_gradients_reach_the_value_and_the_untouched_rest():
    act = act_3x5x4().requires_grad_(True)
    value = torch.zeros(3, 1, 4, requires_grad=True)
    weights = torch.arange(60, dtype=torch.float32).view(3, 5, 4)
    out = scatter(act, ((1,), (2,), (3,)), value, ragged=False)
    (out * weights).sum().backward()
    # d/dvalue: the weights at the written places.
    assert torch.equal(value.grad, torch.stack([weights[0, 1], weights[1, 2], weights[2, 3]])[:, None, :])
    # d/dact: the weights everywhere except the overwritten places.
    expected = weights.clone()
    expected[0, 1] = expected[1, 2] = expected[2, 3] = 0
    assert torch.equal(act.grad, expected)


def test_scatter_refusals():
    act = act_3x5x4()
    with pytest.raises(EngineError, match=r"shape \(3, 4\) and the window gathers \(3, 1, 4\)"):
        scatter(act, ((1,), (1,), (1,)), torch.zeros(3, 4), ragged=False)
    with pytest.raises(EngineError, match="repeats a position"):
        scatter(act, ((1, 1), (0, 2), (0, 2)), torch.zeros(3, 2, 4), ragged=False)


def test_scatter_casts_to_the_activation_dtype():
    act = act_3x5x4().to(torch.bfloat16)
    out = scatter(act, ((0,), (0,), (0,)), torch.full((3, 1, 4), 0.5, dtype=torch.float64), ragged=False)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out[:, 0], torch.full((3, 4), 0.5, dtype=torch.bfloat16))


windows = st.integers(1, 4).flatmap(lambda rows: st.tuples(
    st.just(rows),
    st.lists(st.lists(st.integers(0, 5), max_size=6, unique=True).map(tuple), min_size=rows, max_size=rows)
    .map(tuple)))


@settings(max_examples=60, deadline=None)
@given(windows, st.booleans())
def test_scatter_of_gather_is_identity_and_gather_of_scatter_is_the_value(rw, with_features):
    rows, window = rw
    act = torch.randn(rows, 6, 3)
    features = (2, 0) if with_features else None
    g = gather(act, window, ragged=True, features=features)
    assert torch.equal(scatter(act, window, g, ragged=True, features=features), act)
    v = torch.randn(g.shape)
    assert torch.equal(gather(scatter(act, window, v, ragged=True, features=features), window,
                              ragged=True, features=features), v)


# --------------------------------------------------------------------------- apply_write


def x_2x3x4() -> torch.Tensor:
    return torch.tensor([
        [[1.5, -2.0, 0.25, 3.0], [0.1, 0.2, 0.3, 0.4], [7.0, -1.0, 2.0, 0.5]],
        [[-0.3, 0.6, 1.1, -4.0], [2.2, 2.4, -2.6, 0.0], [1.0, 1.0, 1.0, 1.0]],
    ])


def v_2x3x4() -> torch.Tensor:
    return torch.tensor([
        [[0.5, 0.5, -0.5, 2.0], [9.0, 8.0, 7.0, 6.0], [-1.0, 0.0, 1.0, 0.0]],
        [[3.0, -3.0, 0.75, 1.25], [0.0, 0.0, 0.0, 1.0], [4.0, 3.0, 2.0, 1.0]],
    ])


def write(x, mechanism, operand=None, **kw):
    params = kw.pop("params", None)
    return apply_write(x, featurizer=IDENTITY, mechanism=mechanism, params=params, operand=operand, **kw)


def test_identity_is_a_featurizer():
    assert isinstance(Identity(), Featurizer)
    x = x_2x3x4()
    f, err = IDENTITY.featurize(x)
    assert f is x and err is None
    assert IDENTITY.inverse(f, err, x) is f


def test_identity_swap_of_the_same_value_is_bit_exact():
    x = x_2x3x4()
    assert torch.equal(write(x, "swap", x.clone()), x)
    xb = x.to(torch.bfloat16)
    out = write(xb, "swap", xb.clone())
    assert out.dtype == torch.bfloat16 and torch.equal(out, xb)


def test_swap_replaces_and_does_not_touch_x():
    x, v = x_2x3x4(), v_2x3x4()
    before = x.clone()
    assert torch.equal(write(x, "swap", v), v)
    assert torch.equal(x, before)


def test_swap_number_is_a_constant_everywhere():
    assert torch.equal(write(x_2x3x4(), "swap", 0.0), torch.zeros(2, 3, 4))


def test_lerp_ends_are_exact():
    x, v = x_2x3x4(), v_2x3x4()
    assert torch.equal(write(x, "lerp", v, params={"t": 1.0}), write(x, "swap", v))
    assert torch.equal(write(x, "lerp", v, params={"t": 1.0}), v)
    assert torch.equal(write(x, "lerp", v, params={"t": 0.0}), x)


def test_lerp_half_by_hand():
    x, v = x_2x3x4(), v_2x3x4()
    torch.testing.assert_close(write(x, "lerp", v, params={"t": 0.25}), 0.75 * x + 0.25 * v)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=8, max_size=8),
       st.lists(st.floats(-1e4, 1e4, width=32), min_size=8, max_size=8),
       st.floats(0.0, 1.0))
def test_lerp_stays_between_its_ends(a, b, t):
    x = torch.tensor(a).view(2, 1, 4)
    v = torch.tensor(b).view(2, 1, 4)
    out = write(x, "lerp", v, params={"t": t})
    assert torch.all(out >= torch.minimum(x, v))
    assert torch.all(out <= torch.maximum(x, v))


def test_add_scaled_by_hand():
    x, v = x_2x3x4(), v_2x3x4()
    expected = torch.tensor([[[x[r, p, c].item() + 2.5 * v[r, p, c].item() for c in range(4)]
                              for p in range(3)] for r in range(2)])
    torch.testing.assert_close(write(x, "add_scaled", v, params={"scale": 2.5}), expected)
    # The default scale is 1.
    torch.testing.assert_close(write(x, "add_scaled", v), x + v)


def test_clamp():
    x = x_2x3x4()
    out = write(x, "clamp", params={"min": -1.0, "max": 1.0})
    expected = torch.tensor([
        [[1.0, -1.0, 0.25, 1.0], [0.1, 0.2, 0.3, 0.4], [1.0, -1.0, 1.0, 0.5]],
        [[-0.3, 0.6, 1.0, -1.0], [1.0, 1.0, -1.0, 0.0], [1.0, 1.0, 1.0, 1.0]],
    ])
    assert torch.equal(out, expected)
    only_max = write(x, "clamp", params={"max": 0.0})
    assert torch.equal(only_max, torch.where(x > 0, torch.zeros_like(x), x))


def test_gaussian_is_a_cpu_generator_draw():
    x = x_2x3x4()
    g = torch.Generator(device="cpu")
    g.manual_seed(7)
    noise = torch.randn((2, 3, 4), generator=g)
    out = write(x, "gaussian", params={"std": 0.5, "seed": 7})
    torch.testing.assert_close(out, x + 0.5 * noise, rtol=0, atol=0)
    assert torch.equal(write(x, "gaussian", params={"std": 0.5, "seed": 7}), out)
    assert not torch.equal(write(x, "gaussian", params={"std": 0.5, "seed": 8}), out)


def test_renormalize_restores_f0_norms():
    f0 = x_2x3x4()
    steered = f0 + 4.0 * torch.tensor([1.0, -2.0, 0.5, 3.0])
    out = write(steered, "renormalize", f0=f0)
    for r in range(2):
        for p in range(3):
            want = sum(float(e) ** 2 for e in f0[r, p]) ** 0.5
            got = sum(float(e) ** 2 for e in out[r, p]) ** 0.5
            assert got == pytest.approx(want, rel=1e-6)
            # Same direction as the steered vector.
            cos = torch.nn.functional.cosine_similarity(out[r, p], steered[r, p], dim=0)
            assert cos.item() == pytest.approx(1.0, abs=1e-6)


def test_renormalize_leaves_a_zero_vector_alone_and_needs_f0():
    x = torch.zeros(1, 1, 3)
    assert torch.equal(write(x, "renormalize", f0=torch.ones(1, 1, 3)), x)
    with pytest.raises(EngineError, match="f0"):
        write(x, "renormalize")


def test_features_swap_changes_only_those_columns():
    x, v = x_2x3x4(), v_2x3x4()
    out = write(x, "swap", v, features=(0, 2))
    expected = x.clone()
    expected[..., 0] = v[..., 0]
    expected[..., 2] = v[..., 2]
    assert torch.equal(out, expected)


def test_features_operand_already_narrow_and_number():
    x = x_2x3x4()
    narrow = torch.tensor([[[10.0, 20.0]]]).expand(2, 3, 2)
    out = write(x, "swap", narrow, features=(3, 1))
    expected = x.clone()
    expected[..., 3] = 10.0
    expected[..., 1] = 20.0
    assert torch.equal(out, expected)
    zeroed = write(x, "swap", 0.0, features=(1,))
    expected = x.clone()
    expected[..., 1] = 0.0
    assert torch.equal(zeroed, expected)


def test_features_renormalize_uses_the_selected_coordinates():
    f0 = torch.tensor([[[3.0, 100.0, 4.0]]])      # selected (0, 2): norm 5
    x = torch.tensor([[[6.0, -7.0, 8.0]]])        # selected norm 10
    out = write(x, "renormalize", f0=f0, features=(0, 2))
    assert torch.allclose(out, torch.tensor([[[3.0, -7.0, 4.0]]]))


def test_operand_broadcasting():
    x = x_2x3x4()
    mean = torch.tensor([1.0, 2.0, 3.0, 4.0])
    expected = torch.tensor([[[float(x[r, p, c]) + [1, 2, 3, 4][c] for c in range(4)]
                              for p in range(3)] for r in range(2)])
    torch.testing.assert_close(write(x, "add_scaled", mean), expected)
    torch.testing.assert_close(write(x, "add_scaled", mean[None, :]), expected)
    flat = x.reshape(6, 4)  # a ragged write's value is flat
    torch.testing.assert_close(write(flat, "add_scaled", mean), expected.reshape(6, 4))


def test_operand_shape_mismatch_names_the_shapes():
    x = x_2x3x4()
    with pytest.raises(EngineError, match=r"\(2, 1, 4\).*\(2, 3, 4\)"):
        write(x, "swap", torch.zeros(2, 1, 4))
    with pytest.raises(EngineError, match=r"\(5,\).*\(2, 3, 4\)"):
        write(x, "swap", torch.zeros(5))
    with pytest.raises(EngineError, match=r"\(3,\).*features \(0, 1\) of a space 4 wide"):
        write(x, "swap", torch.zeros(3), features=(0, 1))


def test_operand_presence_and_params_are_checked():
    x = x_2x3x4()
    with pytest.raises(EngineError, match="takes an operand"):
        write(x, "swap")
    with pytest.raises(EngineError, match="takes no operand"):
        write(x, "clamp", 1.0, params={"min": 0.0})
    with pytest.raises(EngineError, match="'t' is required"):
        write(x, "lerp", x)
    with pytest.raises(EngineError, match="unknown mechanism"):
        write(x, "ablate", x)


def test_write_returns_the_input_dtype_and_computes_in_fp32():
    x = torch.tensor([[[1.0, 2.0]]], dtype=torch.bfloat16)
    # 1 + 2**-9 is not representable in bf16; the sum is taken in fp32 then rounded once.
    out = write(x, "add_scaled", torch.tensor([2.0 ** -9, 0.0]), params={"scale": 1.0})
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, torch.tensor([[[1.0 + 2.0 ** -9, 2.0]]]).to(torch.bfloat16))


def test_gradients_flow_through_a_write():
    x = x_2x3x4()
    v = v_2x3x4().requires_grad_(True)
    out = write(x, "lerp", v, params={"t": 0.25}, features=(1,))
    out.sum().backward()
    expected = torch.zeros(2, 3, 4)
    expected[..., 1] = 0.25
    assert torch.equal(v.grad, expected)


def test_exact_disables_autocast():
    a = torch.randn(4, 4)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
        with exact():
            assert (a @ a).dtype == torch.float32
            assert not torch.is_autocast_enabled("cpu")


class Doubling:
    """A toy featurizer with an error term: f = 2x, err = 1, inverse = f/2 + err - 1."""

    def featurize(self, x):
        return 2 * x, torch.ones_like(x)

    def inverse(self, f, err, x):
        return f / 2 + err - 1


def test_a_featurizer_is_used_on_both_sides_of_the_mechanism():
    x = x_2x3x4()
    # swap in feature space: the operand 8.0 is a feature value, so the activation becomes 4.0.
    out = apply_write(x, featurizer=Doubling(), mechanism="swap", params={}, operand=8.0)
    assert torch.equal(out, torch.full((2, 3, 4), 4.0))
    # renormalize measures f0 in feature space: the same space as f.
    out = apply_write(3 * x, featurizer=Doubling(), mechanism="renormalize", params={}, operand=None, f0=x)
    torch.testing.assert_close(out, x)

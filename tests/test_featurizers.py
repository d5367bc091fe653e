"""Featurizers and fitting: the algebra by hand, a planted problem, and real fits on tiny-llama.

Every property is checked against an independent computation — a d × d
definition, a hand-written projection or decoder, a plain torch training loop —
so a featurizer that agrees only with itself fails. The engine-backed tests
share one fit per engine (module-scoped fixtures): das.causalab.json with its
epochs cut to 2.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import causalab_mini as cm
from causalab_mini.engine import fit as fit_mod
from causalab_mini.model import loading
from causalab_mini.engine import steps as steps_mod
from causalab_mini.errors import CompileError
from causalab_mini.ops import featurizers as feat
from causalab_mini.ops.featurizers import Dictionary, Gate, Subspace, cayley, cayley_direct
from causalab_mini.ops.intervene import apply_write
from causalab_mini.outputs.write import write
from causalab_mini.plan import compile as compiler
from causalab_mini.plan.featurizer_files import header as read_header
from paths import ARTIFACTS, DATA, MODELS, V2

ROT = ARTIFACTS / "rot.safetensors"

PROPS = settings(max_examples=40, deadline=None)
SWAPS = settings(max_examples=30, deadline=None)
# Single-threaded (conftest.py's one_thread): many small ops, ten times slower on two busy threads.
pytestmark = pytest.mark.usefixtures("one_thread")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The float32 bit pattern: equality here tells −0.0 from 0.0."""
    return t.detach().contiguous().view(torch.int32)


def randn(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@st.composite
def subspace_weights(draw, max_d: int = 64, max_scale: float = 3.0):
    """A (d, k) parameter: randn from a drawn seed, scaled by s/√d with s in [0, max_scale].

    s is about each column's norm: s = 1 is the unfitted draw, and the fitted
    documents/artifacts/rot.safetensors has columns of norm 1.2-1.6. In float32 the
    Woodbury form's departure from orthonormality grows like s² (≈1e-6 at s = 1,
    ≈3e-6 at s = 3, ≈2e-5 at s = 10), so a 1e-5 tolerance holds up to s of a few.
    """
    d = draw(st.integers(2, max_d))
    k = draw(st.integers(1, d))
    s = draw(st.floats(0.0, max_scale))
    seed = draw(st.integers(0, 2**31 - 1))
    return randn(d, k, seed=seed) * (s / math.sqrt(d))


# =========================================================================== subspace: the basis


@PROPS
@given(subspace_weights())
def test_cayley_is_orthonormal_and_woodbury_is_the_definition(w):
    d, k = w.shape
    q = cayley(w)
    assert q.shape == (d, k) and q.dtype == torch.float32
    torch.testing.assert_close(q.T @ q, torch.eye(k), atol=1e-5, rtol=0)
    torch.testing.assert_close(q, cayley_direct(w), atol=1e-5, rtol=0)


def test_cayley_of_zero_is_the_first_k_columns_of_the_identity():
    assert torch.equal(cayley(torch.zeros(7, 3)), torch.eye(7, 3))
    assert torch.equal(cayley_direct(torch.zeros(7, 3)), torch.eye(7, 3))


def test_unfitted_subspace_is_its_seeds_draw_scaled_by_root_d():
    d, k = 24, 5
    a, b, c = Subspace(d, k, seed=3), Subspace(d, k, seed=3), Subspace(d, k, seed=4)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.basis(), b.basis())
    assert not torch.equal(a.weight, c.weight)
    assert (a.basis() - c.basis()).abs().max() > 1e-2
    by_hand = torch.randn(d, k, generator=torch.Generator().manual_seed(3)) / math.sqrt(d)
    assert torch.equal(a.weight.detach(), by_hand)
    assert isinstance(a.weight, torch.nn.Parameter) and a.parameters() == [a.weight]
    assert torch.equal(feat.build("subspace", d, k, seed=3).weight, a.weight)
    # Loaded: the bundle's tensor, not the seed's.
    w = randn(d, k, seed=9)
    assert torch.equal(feat.build("subspace", d, k, seed=3, tensors={"weight": w}).weight.detach(), w)


def test_the_basis_is_recomputed_on_every_access():
    sub = Subspace(10, 3, seed=0)
    q0 = sub.basis().detach().clone()
    with torch.no_grad():
        sub.weight.add_(0.1)
    assert not torch.equal(sub.basis().detach(), q0)
    torch.testing.assert_close(sub.basis(), cayley(sub.weight.detach()), atol=0, rtol=0)


# =========================================================================== subspace: the write


@SWAPS
# s <= 2: a write's error is |f' - f| times Q's float32 departure from orthonormality,
# which reaches ~1.2e-5 at s = 3 for coordinates of a few units.
@given(subspace_weights(max_d=32, max_scale=2.0), st.integers(1, 5), st.data())
def test_a_subspace_swap_sets_the_k_coordinates_and_leaves_the_complement(w, rows, data):
    d, k = w.shape
    sub = Subspace(d, k, weight=w)
    seed = data.draw(st.integers(0, 2**31 - 1))
    x, op = randn(rows, d, seed=seed), randn(rows, k, seed=seed + 1)
    # The checks in float64, so the 1e-5 is the write's error and not the check's own rounding.
    q = sub.basis().detach().double()
    complement = torch.eye(d, dtype=torch.float64) - q @ q.T

    def coords(t):
        return t.double() @ q

    def rest_of(t):
        return t.double() @ complement

    with torch.no_grad():
        out = apply_write(x, featurizer=sub, mechanism="swap", params=None, operand=op)
    torch.testing.assert_close(coords(out), op.double(), atol=1e-5, rtol=0)
    torch.testing.assert_close(rest_of(out), rest_of(x), atol=1e-5, rtol=0)

    # features: only those coordinates take the operand's; the others keep x's.
    chosen = data.draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=k, unique=True))
    rest = [c for c in range(k) if c not in chosen]
    with torch.no_grad():
        out = apply_write(x, featurizer=sub, mechanism="swap", params=None, operand=op,
                          features=tuple(chosen))
    torch.testing.assert_close(coords(out)[:, chosen], op.double()[:, chosen], atol=1e-5, rtol=0)
    torch.testing.assert_close(coords(out)[:, rest], coords(x)[:, rest], atol=1e-5, rtol=0)
    torch.testing.assert_close(rest_of(out), rest_of(x), atol=1e-5, rtol=0)
    if len(chosen) < k:  # an operand already as narrow as the features, in their order
        narrow = op[:, chosen]
        with torch.no_grad():
            out2 = apply_write(x, featurizer=sub, mechanism="swap", params=None, operand=narrow,
                               features=tuple(chosen))
        assert torch.equal(out2, out)


def test_a_subspace_swap_with_its_own_features_returns_x():
    sub = Subspace(16, 4, seed=1)
    x = randn(3, 2, 16, seed=5)
    f, err = sub.featurize(x)
    out = apply_write(x, featurizer=sub, mechanism="swap", params=None, operand=f)
    assert torch.equal(out, x)  # equal in value; for the sign of a zero see the next test
    torch.testing.assert_close(err, x - f @ sub.basis().T, atol=0, rtol=0)


def test_a_subspace_round_trip_keeps_the_sign_of_a_zero():
    sub = Subspace(8, 3, seed=0)
    x = randn(4, 8, seed=1)
    x[0, 0] = -0.0
    f, _ = sub.featurize(x)
    out = apply_write(x, featurizer=sub, mechanism="swap", params=None, operand=f)
    assert torch.equal(bits(out), bits(x))


def test_pca_is_the_same_write_with_a_stored_basis():
    q = cayley(randn(16, 4, seed=2))
    pca, sub = feat.build("pca", 16, 4, tensors={"basis": q}), Subspace(16, 4, weight=randn(16, 4, seed=2))
    assert pca.parameters() == [] and torch.equal(pca.basis(), q)
    x, op = randn(5, 16, seed=3), randn(5, 4, seed=4)
    with torch.no_grad():
        a = apply_write(x, featurizer=pca, mechanism="swap", params=None, operand=op)
        b = apply_write(x, featurizer=sub, mechanism="swap", params=None, operand=op)
    assert torch.equal(a, b)


# =========================================================================== sae / linear


D, K = 12, 20


def dictionary(kind: str = "sae", *, tied: bool = False, seed: int = 0) -> tuple[Dictionary, dict]:
    """Random weights, scaled so the reconstruction is deliberately bad."""
    t = {"W_enc": randn(D, K, seed=seed), "b_enc": randn(K, seed=seed + 1) + 0.5,
         "b_dec": randn(D, seed=seed + 2)}
    if not tied:
        t["W_dec"] = 3.0 * randn(K, D, seed=seed + 3)
    return feat.build(kind, D, K, tensors=t), t


def activations(seed: int = 7) -> torch.Tensor:
    x = randn(4, 3, D, seed=seed)
    x[0, 0, 0] = -0.0  # the round trip keeps the sign of a zero too
    return x


@pytest.mark.parametrize("kind", ["sae", "linear"])
@pytest.mark.parametrize("tied", [False, True])
def test_dictionary_round_trip_is_bit_exact_however_bad_the_reconstruction(kind, tied):
    sae, t = dictionary(kind, tied=tied)
    x = activations()
    f, err = sae.featurize(x)
    assert err.abs().max() > 1.0, "the reconstruction was meant to be bad"
    torch.testing.assert_close(err, x - sae.decode(f), atol=0, rtol=0)
    assert torch.equal(bits(sae.inverse(f, err, x)), bits(x))
    out = apply_write(x, featurizer=sae, mechanism="swap", params=None, operand=f)
    assert torch.equal(bits(out), bits(x))
    # An operand cut by features, equal to what is there, is still nothing.
    out = apply_write(x, featurizer=sae, mechanism="swap", params=None, operand=f, features=(3, 0, 7))
    assert torch.equal(bits(out), bits(x))


def test_tied_weights_decode_with_w_enc_transposed():
    sae, t = dictionary("sae", tied=True)
    assert sae.tied and "W_dec" not in sae.tensors()
    assert torch.equal(sae.w_dec, t["W_enc"].T)
    f = sae.encode(activations())
    torch.testing.assert_close(sae.decode(f), f @ t["W_enc"].T + t["b_dec"], atol=1e-5, rtol=1e-6)
    untied, _ = dictionary("sae", tied=False)
    assert not untied.tied and torch.equal(untied.tensors()["W_dec"], untied.w_dec)


def test_linear_is_the_encoder_without_the_relu():
    lin, t = dictionary("linear")
    sae, _ = dictionary("sae")
    x = activations()
    pre = (x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]
    torch.testing.assert_close(lin.encode(x), pre, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(sae.encode(x), torch.relu(pre), atol=1e-5, rtol=1e-6)
    assert (lin.encode(x) < 0).any() and (sae.encode(x) >= 0).all()


@pytest.mark.parametrize("kind", ["sae", "linear"])
def test_ablating_one_latent_moves_x_by_minus_f_j_times_its_decoder_row(kind):
    sae, t = dictionary(kind)
    x = activations()
    f, _ = sae.featurize(x)
    j = int((f > 0).sum(dim=(0, 1)).argmax())  # the latent on most often
    assert (f[..., j] != 0).any(), "an ablation of a latent that is never on tests nothing"
    out = apply_write(x, featurizer=sae, mechanism="swap", params=None, operand=0.0, features=(j,))
    by_hand = x - f[..., j:j + 1] * t["W_dec"][j]
    torch.testing.assert_close(out, by_hand, atol=1e-5, rtol=1e-5)
    # Where the latent was already off, nothing moved, to the bit.
    off = f[..., j] == 0
    assert torch.equal(bits(out[off]), bits(x[off]))


# =========================================================================== gate


def test_a_hard_gate_all_on_is_the_operand_and_all_off_is_x():
    x, op = randn(3, 2, 10, seed=1), randn(3, 2, 10, seed=2)
    on = Gate(10, start=1.5)
    assert not on.training
    assert torch.equal(apply_write(x, featurizer=on, mechanism="swap", params=None, operand=op), op)
    for off in (Gate(10), Gate(10, start=-2.0), Gate(10, start=0.0)):
        out = apply_write(x, featurizer=off, mechanism="swap", params=None, operand=op)
        assert torch.equal(bits(out), bits(x))


def test_a_hard_gate_takes_exactly_the_units_whose_theta_is_positive():
    x, op = randn(4, 10, seed=1), randn(4, 10, seed=2)
    theta = torch.tensor([1., -1, 0, 2, -0.5, 3, 0, -3, 0.1, -0.1])
    gate = feat.build("gate", 10, None, start=5.0, tensors={"theta": theta})  # loaded: start is moot
    on = theta > 0
    out = apply_write(x, featurizer=gate, mechanism="swap", params=None, operand=op)
    assert torch.equal(out[:, on], op[:, on]) and torch.equal(out[:, ~on], x[:, ~on])


def test_a_training_gate_mixes_by_sigmoid_theta_over_t():
    x, op = randn(5, 10, seed=1), randn(5, 10, seed=2)
    theta = randn(10, seed=3)
    gate = Gate(10, theta=theta)
    gate.training, gate.temperature = True, 0.3
    m = torch.sigmoid(theta / 0.3)
    out = apply_write(x, featurizer=gate, mechanism="swap", params=None, operand=op)
    torch.testing.assert_close(out, m * op + (1 - m) * x, atol=1e-6, rtol=1e-6)
    out.sum().backward()
    assert gate.theta.grad is not None and gate.theta.grad.abs().sum() > 0
    gate.training = False  # the same θ, read hard
    out = apply_write(x, featurizer=gate, mechanism="swap", params=None, operand=op)
    torch.testing.assert_close(out, torch.where(theta > 0, op, x), atol=0, rtol=0)


def test_gate_start():
    fresh = Gate(6)
    assert torch.equal(fresh.theta.detach(), torch.zeros(6)) and fresh.temperature == 1.0
    fresh.training = True
    assert torch.equal(fresh.soft_mask(), torch.full((6,), 0.5))  # σ(0) = ½ while training
    x, op = randn(2, 6, seed=1), randn(2, 6, seed=2)
    out = apply_write(x, featurizer=fresh, mechanism="swap", params=None, operand=op)
    torch.testing.assert_close(out, 0.5 * op + 0.5 * x, atol=1e-6, rtol=0)
    fresh.training = False  # …and every unit off until a fit says otherwise
    assert torch.equal(apply_write(x, featurizer=fresh, mechanism="swap", params=None, operand=op), x)
    assert torch.equal(feat.build("gate", 6, None, start=0.75).theta.detach(), torch.full((6,), 0.75))
    assert torch.equal(feat.build("gate", 6, None).theta.detach(), torch.zeros(6))


# =========================================================================== the anneal schedule


@pytest.mark.parametrize("start,end,total", [(1.0, 0.1, 8), (2.0, 0.3, 5), (0.5, 4.0, 3), (1.0, 0.01, 40)])
def test_the_temperature_is_geometric_from_the_first_update_to_the_last(start, end, total):
    ts = [fit_mod._temperature(start, end, u, total) for u in range(total)]
    assert ts[0] == start
    assert ts[-1] == pytest.approx(end, rel=1e-12)
    ratios = [b / a for a, b in zip(ts, ts[1:])]
    assert ratios == pytest.approx([(end / start) ** (1 / (total - 1))] * (total - 1), rel=1e-12)


def test_a_one_update_fit_runs_at_the_start_temperature():
    assert fit_mod._temperature(1.0, 0.1, 0, 1) == 1.0


# =========================================================================== a planted problem


def test_das_recovers_a_planted_subspace():
    """A class lives in a known 2-d subspace; DAS at k=2 finds it, at k=1 cannot.

    x = codes[c] Pᵀ + noise in the complement of P; the label is read linearly from
    P's coordinates. Swapping the learned subspace from x_cf into x_base must make
    the readout say x_cf's class — only a Q that spans P does that for every pair.
    """
    torch.manual_seed(0)
    d, planted = 16, 2
    g = torch.Generator().manual_seed(0)
    P, _ = torch.linalg.qr(torch.randn(d, planted, generator=g))
    codes = torch.tensor([[1., 1], [1, -1], [-1, 1], [-1, -1]])

    def sample(n, gen):
        c = torch.randint(0, len(codes), (n,), generator=gen)
        noise = torch.randn(n, d, generator=gen)
        return codes[c] @ P.T + noise - noise @ P @ P.T, c

    def pairs(n, gen):
        (xb, _), (xc, cc) = sample(n, gen), sample(n, gen)
        return xb, xc, cc

    def readout(x):
        return 2.0 * (x @ P) @ codes.T

    def patched(sub, xb, xc):
        return apply_write(xb, featurizer=sub, mechanism="swap", params=None, operand=sub.featurize(xc)[0])

    held_out = pairs(2000, torch.Generator().manual_seed(3))
    iia = {}
    for k in (1, planted):
        sub = Subspace(d, k, seed=1)
        optimizer = torch.optim.AdamW(sub.parameters(), lr=0.05, weight_decay=0.0)
        gen = torch.Generator().manual_seed(2)
        for _ in range(200):
            xb, xc, cc = pairs(128, gen)
            loss = F.cross_entropy(readout(patched(sub, xb, xc)), cc)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        xb, xc, cc = held_out
        with torch.no_grad():
            iia[k] = (readout(patched(sub, xb, xc)).argmax(-1) == cc).float().mean().item()
        if k == planted:
            cosines = torch.linalg.svdvals(P.T @ sub.basis().detach())
            angles = torch.rad2deg(torch.arccos(cosines.clamp(max=1.0)))
            assert angles.max() < 4.0, f"principal angles to the planted span: {angles.tolist()} degrees"
    assert iia[planted] >= 0.95, iia
    assert iia[1] < 0.75, iia  # one direction can carry one of the two bits


# =========================================================================== fits on tiny-llama


def das_raw(epochs: int = 2) -> dict:
    raw = json.loads((V2 / "das.causalab.json").read_text())
    raw["steps"]["fit"]["epochs"] = epochs
    return raw


@pytest.fixture(scope="module")
def tiny_llama(engines):
    """engine name -> that engine on tiny-llama, the model of every document fitted here (the session's, shared)."""
    return lambda name: engines(V2 / "das.causalab.json", name)


@pytest.fixture(scope="module")
def das_runs(tiny_llama):
    """engine name -> das.causalab.json (2 epochs) run through it, once per module."""
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = cm.run(cm.read(das_raw(), path=V2 / "das.causalab.json"), loaded=tiny_llama(name)).plan
        return cache[name]

    return get


def _torch_modules(engine):
    model = engine.model
    yield model
    inner = getattr(model, "_model", None)  # nnterp's StandardizedTransformer wraps the HF module
    if isinstance(inner, torch.nn.Module):
        yield inner


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
def test_a_fit_leaves_the_model_without_gradients_and_moves_the_featurizer(engine, tiny_llama, das_runs):
    plan = das_runs(engine)
    for module in _torch_modules(tiny_llama(engine)):
        params = list(module.parameters())
        assert params
        assert all(p.grad is None for p in params), "a model parameter carries a gradient after the fit"
        assert not any(p.requires_grad for p in params), "the model is not frozen"
    fitted = plan.steps["weights"].results["rot"]["weight"]
    unfitted = Subspace(32, 4, seed=0).weight.detach()
    assert fitted.shape == unfitted.shape and (fitted - unfitted).abs().max() > 1e-3
    results = plan.steps["fit"].results
    epochs = int(results["epochs"])
    assert 1 <= epochs <= 2
    for name in ("loss", "iia", "ce", "logit_diff"):
        assert results[name].shape == (epochs,), name
    assert torch.isfinite(results["loss"]).all()


def test_both_engines_give_the_same_fit(das_runs):
    hooks, nnterp = das_runs("hooks"), das_runs("nnterp")
    a, b = hooks.steps["fit"].results, nnterp.steps["fit"].results
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert torch.equal(hooks.steps["weights"].results["rot"]["weight"],
                       nnterp.steps["weights"].results["rot"]["weight"])
    for name in ("iia", "logit_diff", "ce"):
        assert torch.equal(hooks.steps["score"].results[name], nnterp.steps["score"].results[name]), name


def test_the_weights_bundle_records_its_header_and_loads_back_as_the_same_basis(tiny_llama, das_runs, tmp_path):
    plan = das_runs("hooks")
    raw = das_raw()
    write(plan, tmp_path, plan.provenance)
    bundle = tmp_path / "rot.safetensors"
    meta = read_header(bundle)["__metadata__"]
    assert meta == {"model": raw["model"]["key"], "revision": raw["model"]["revision"], "kind": "subspace",
                    "component": "block_output", "layer": "1", "d": "32", "k": "4", "seed": "0",
                    "produced_by": plan.produced_by}
    saved = plan.steps["weights"].results["rot"]["weight"]
    assert torch.equal(load_file(bundle)["weight"], saved)

    apply_raw = json.loads((V2 / "das_apply.causalab.json").read_text())
    apply_raw["featurizers"]["rot"]["file_path"] = "rot.safetensors"
    document = tmp_path / "das_apply.causalab.json"
    document.write_text(json.dumps(apply_raw))
    applied = cm.run(cm.read(apply_raw, path=document), loaded=tiny_llama("hooks"), data=DATA).plan
    state = steps_mod.State()
    fit_mod.construct(applied.steps["featurizers"], state)
    loaded = state.featurizers["rot"]
    assert torch.equal(loaded.basis().detach(), cayley(saved))
    # The same Q on the same held-out rows: das's score, to the bit.
    for name in ("iia", "logit_diff", "ce"):
        assert torch.equal(applied.steps["apply"].results[name], plan.steps["score"].results[name]), name


def test_a_gate_fit_anneals_trains_only_during_updates_and_optimizes_only_its_params(tiny_llama, monkeypatch):
    raw = json.loads((V2 / "dbm.causalab.json").read_text())
    fit_raw = raw["steps"]["fit"]
    fit_raw["epochs"] = 2
    fit_raw["objective"] = [[1.0, "ce"], [0.01, "mask.mask"]]
    seen, optimizers = [], []
    observe, adamw = steps_mod.observe, torch.optim.AdamW

    def recording_observe(engine, step, state, *args, **kwargs):
        gate = state.featurizers.get("mask")
        if gate is not None:
            seen.append((step, gate.temperature, gate.training, torch.is_grad_enabled()))
        return observe(engine, step, state, *args, **kwargs)

    def recording_adamw(params, **kwargs):
        params = list(params)
        optimizers.append((params, kwargs))
        return adamw(params, **kwargs)

    monkeypatch.setattr(steps_mod, "observe", recording_observe)
    monkeypatch.setattr(torch.optim, "AdamW", recording_adamw)
    plan = cm.run(cm.read(raw, path=V2 / "dbm.causalab.json"), loaded=tiny_llama("hooks")).plan
    monkeypatch.undo()

    fit_step = plan.steps["fit"]
    updates = [u for epoch in fit_step.epochs for u in epoch]
    assert len(updates) >= 2
    by_step = {}
    for step, temperature, training, grad in seen:
        by_step.setdefault(id(step), []).append((temperature, training, grad))
    expected = [fit_mod._temperature(1.0, 0.1, u, len(updates)) for u in range(len(updates))]
    got = [by_step[id(u)][0] for u in updates]
    assert [t for t, _, _ in got] == pytest.approx(expected, rel=1e-12)
    assert got[0][0] == 1.0 and got[-1][0] == pytest.approx(0.1)
    assert all(training and grad for _, training, grad in got), got
    evaluation = by_step[id(fit_step.evaluation)]
    assert len(evaluation) == 2 and not any(training or grad for _, training, grad in evaluation)
    score = by_step[id(plan.steps["score"])]
    assert not any(training for _, training, _ in score)

    assert len(optimizers) == 1
    params, kwargs = optimizers[0]
    assert len(params) == 1 and params[0].shape == (32,) and kwargs.get("weight_decay") == 0.0
    theta = plan.steps["weights"].results["mask"]["theta"]
    assert theta.shape == (32,) and theta.abs().max() > 0  # moved off its start of 0
    # The kept-units curve ends at what the saved mask keeps (no early stop: the last epoch's).
    kept = fit_step.results["mask.kept"]
    assert kept.shape == (2,) and kept[-1].item() == int((theta > 0).sum())


# =========================================================================== header refusals


GOOD_HEADER = {"model": "tiny-llama",
               "revision": loading.revision_digest(MODELS / "tiny-llama"),
               "kind": "subspace", "component": "block_output", "layer": "1", "d": "32", "k": "4",
               "seed": "0", "produced_by": "test"}


def compile_apply(tmp_path: Path, weight: torch.Tensor, metadata: dict | None):
    save_file({"weight": weight}, str(tmp_path / "bundle.safetensors"), metadata=metadata)
    raw = json.loads((V2 / "das_apply.causalab.json").read_text())
    raw["featurizers"]["rot"]["file_path"] = "bundle.safetensors"
    return compiler.compile_plan(raw, document=tmp_path / "apply.causalab.json", models=MODELS, data=DATA)


def test_a_bundle_whose_header_agrees_compiles(tmp_path):
    plan = compile_apply(tmp_path, randn(32, 4), GOOD_HEADER)
    (spec,) = plan.steps["featurizers"].specs
    assert (spec.kind, spec.d, spec.k) == ("subspace", 32, 4)
    plan = compile_apply(tmp_path, randn(32, 4), None)  # no header: its shapes are all there is
    assert plan.steps["featurizers"].specs[0].k == 4


@pytest.mark.parametrize("key,value", [("layer", "0"), ("k", "8"), ("model", "other-model"), ("d", "16"),
                                       ("component", "attention_output"), ("kind", "pca"),
                                       ("revision", "sha256:" + "0" * 64)])
def test_a_bundle_whose_header_disagrees_is_refused_naming_the_key(tmp_path, key, value):
    with pytest.raises(CompileError) as info:
        compile_apply(tmp_path, randn(32, 4), {**GOOD_HEADER, key: value})
    err = info.value
    assert err.path == "featurizers.rot.file_path"
    assert f"{key}={value!r}" in err.problem, err.problem


def test_a_bundle_for_another_width_is_refused(tmp_path):
    with pytest.raises(CompileError) as info:
        compile_apply(tmp_path, randn(16, 4), None)
    assert info.value.path.endswith(".file_path") and "16-wide" in info.value.problem, str(info.value)
    with pytest.raises(CompileError) as info:
        compile_apply(tmp_path, randn(16, 4), {**GOOD_HEADER, "d": "16"})
    assert info.value.path == "featurizers.rot.file_path" and "d='16'" in info.value.problem

"""Property tests of positions and the write algebra, drawn with ``pytest_causalab.strategies``.

Each property is stated against an independent computation (Python slicing, a
hand-written projection, per-row resolution), so a wrong resolver or seam fails
it rather than agreeing with itself.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from causalab_mini import data as data_mod
from causalab_mini import vocab
from causalab_mini.document import read as front
from causalab_mini.ops import locate
from causalab_mini.ops.featurizers import IDENTITY
from causalab_mini.ops.intervene import apply_write, gather, scatter
from causalab_mini.plan import compile as compiler
from causalab_mini.shapes import Where
from paths import DATA, MODELS, REPO, V2
from pytest_causalab import strategies as cst


FAST = settings(max_examples=40, deadline=None)
SLOW = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def bits(t: torch.Tensor) -> torch.Tensor:
    """The float32 bit pattern: equality here is bit equality (it tells -0.0 from 0.0)."""
    return t.contiguous().view(torch.int32)


# =========================================================================== positions


@FAST
@given(st.data(), st.integers(1, 40), st.integers(0, 20))
def test_cut_is_inside_the_run_increasing_and_as_wide_as_declared(data, n, start):
    where = data.draw(cst.positions(n, frames=("prompt", "generated"), scopes=True))
    window = locate.cut(start, start + n, where)
    assert window is not None, f"{where} was drawn for a run of {n} and does not fit it"
    assert window, "a cut that fits names at least one position"
    assert all(start <= p < start + n for p in window)
    assert all(a < b for a, b in zip(window, window[1:]))
    if where.width is not None:
        assert len(window) == where.width
    if where.all:
        assert window == tuple(range(start, start + n))


@FAST
@given(st.data(), st.integers(1, 40), st.integers(0, 20))
def test_a_negative_end_counts_from_the_end_of_the_run(data, n, start):
    i = data.draw(st.integers(-n, -1))
    assert locate.cut(start, start + n, Where(index=i)) == locate.cut(start, start + n, Where(index=i + n))
    # Any span, spelled with both ends counted from the start, names the same window.
    where = data.draw(cst.positions(n, cuts=("span",)))
    a, b = where.span
    positive = Where(span=(a + n if a < 0 else a, b + n if b < 0 else b))
    assert locate.cut(start, start + n, where) == locate.cut(start, start + n, positive)


@FAST
@given(st.data(), st.integers(-70, 70), st.integers(1, 40))
def test_a_cut_that_does_not_fit_is_none_not_a_clipped_window(data, i, n):
    window = locate.cut(0, n, Where(index=i))
    assert (window is None) == (not -n <= i < n)
    k = data.draw(st.integers(1, 50))
    assert (locate.cut(0, n, Where(last=k)) is None) == (k > n)


@st.composite
def padded_batches(draw):
    """Row content lengths, the tokenizer prefix, and each row's padding (left or right)."""
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=6))
    prefix = draw(st.sampled_from((0, 1)))
    seq = max(lengths) + prefix + draw(st.integers(0, 3))
    side = draw(st.sampled_from(("left", "right")))
    return lengths, prefix, seq, side


def mask_of(n: int, prefix: int, seq: int, side: str) -> list[int]:
    real = [1] * (prefix + n)
    pad = [0] * (seq - len(real))
    return pad + real if side == "left" else real + pad


@FAST
@given(padded_batches(), st.data())
def test_resolution_is_invariant_to_padding_and_batch_composition(batch, data):
    lengths, prefix, seq, side = batch
    # Drawn to fit the first row only: rows it does not fit must say so, row by row.
    where = data.draw(cst.positions(lengths[0]))
    mask = [mask_of(n, prefix, seq, side) for n in lengths]
    spans = locate.content_spans(mask, prefix)
    windows = locate.cut_rows(spans, where)
    assert len(windows) == len(lengths)
    for r, n in enumerate(lengths):
        # Left padding shifts the run, and the window shifts by exactly as much.
        shift = (seq - prefix - n if side == "left" else 0) + prefix
        assert spans[r] == (shift, shift + n)
        alone = locate.cut(0, n, where)
        assert windows[r] == (None if alone is None else tuple(p + shift for p in alone))
        # The row resolved on its own, unpadded, is the same window less the shift.
        own = locate.cut_rows(locate.content_spans([[1] * (prefix + n)], prefix), where)[0]
        assert own == (None if alone is None else tuple(p + prefix for p in alone))
    # Reordering the batch reorders the windows and changes none of them.
    order = data.draw(st.permutations(range(len(lengths))))
    assert locate.cut_rows([spans[i] for i in order], where) == tuple(windows[i] for i in order)


@FAST
@given(st.lists(st.integers(1, 12), min_size=1, max_size=5).flatmap(
    lambda ns: st.tuples(st.just(ns), cst.positions(ns))))
def test_positions_for_several_lengths_fit_every_one(drawn):
    lengths, where = drawn
    assert all(locate.cut(0, n, where) is not None for n in lengths)


@FAST
@given(st.data(), st.integers(1, 20))
def test_position_spellings_round_trip(data, n):
    where = data.draw(cst.positions(n, frames=("prompt", "generated"), scopes=True))
    assert Where.from_json(where.to_json()) == where
    spelled = data.draw(cst.position_json(n, frames=("prompt", "generated"), scopes=True))
    parsed = Where.from_json(json.loads(json.dumps(spelled)))
    assert locate.cut(0, n, parsed) is not None
    if isinstance(spelled, int):
        assert parsed == Where(index=spelled)
    writable = data.draw(cst.positions(n, frames=("prompt", "generated"), scopes=True, writable=True))
    assert writable.frame == "prompt" or writable.is_step


# =========================================================================== anchored texts and the tokenizer


@pytest.fixture(scope="module")
def tok():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(MODELS / "tiny-llama"))


@FAST
@given(st.sampled_from(("unique", "missing", "ambiguous")).flatmap(
    lambda o: st.tuples(st.just(o), cst.anchored_texts(o))))
def test_anchored_texts_hit_as_asked(drawn):
    outcome, (text, value) = drawn
    hits = cst.anchor_hits(text, value)
    assert {"unique": hits == 1, "missing": hits == 0, "ambiguous": hits >= 2}[outcome]


@SLOW
@given(st.sampled_from(("unique", "missing", "ambiguous")).flatmap(
    lambda o: st.tuples(st.just(o), cst.anchored_texts(o))))
def test_anchored_texts_survive_the_tokenizer(tok, drawn):
    # The resolver searches the *decoded* prompt, so what a drawn text promises must
    # still hold after encoding and decoding on the shipped tokenizer.
    outcome, (text, value) = drawn
    prefix = len(locate.special_prefix(tok))
    decoded = tok.decode(tok(text)["input_ids"][prefix:])
    assert cst.anchor_hits(decoded, value) == cst.anchor_hits(text, value)


def python_slice(ids: list, where: Where) -> list:
    """The cut by Python's own slicing rules: an independent statement of the same semantics."""
    if where.index is not None:
        return [ids[where.index]]
    if where.last is not None:
        return ids[-where.last:]
    if where.all:
        return ids[:]
    return ids[where.span[0]:where.span[1]]


@SLOW
@given(st.lists(cst.anchored_texts().map(lambda tv: tv[0]), min_size=1, max_size=4),
       st.sampled_from(("left", "right")), st.data())
def test_prompt_frame_windows_decode_to_the_rows_own_tokens(tok, texts, side, data):
    # The prompt frame with no scope (a fixed cut): a padded batch, cut by content_spans +
    # cut_rows, addresses exactly the tokens Python's slicing finds in each row's own,
    # unpadded ids. Anchored (text) scopes are tested in test_locate.py.
    batch = tok(texts, padding=True, padding_side=side)
    prefix = len(locate.special_prefix(tok))
    spans = locate.content_spans(batch["attention_mask"], prefix)
    own = [tok(t)["input_ids"][prefix:] for t in texts]
    assert [b - a for a, b in spans] == [len(o) for o in own]
    where = data.draw(cst.positions([len(o) for o in own]))
    for r, window in enumerate(locate.cut_rows(spans, where)):
        got = [batch["input_ids"][r][p] for p in window]
        expected = python_slice(own[r], where)
        assert got == expected, (texts[r], where.spelling())
        assert tok.decode(got) == tok.decode(expected)


# =========================================================================== the write algebra


@st.composite
def act_and_operand(draw, max_rows=3, max_w=3, max_d=8):
    shape = (draw(st.integers(1, max_rows)), draw(st.integers(1, max_w)), draw(st.integers(1, max_d)))
    return draw(cst.activations(shape)), draw(cst.activations(shape))


def write(x, mechanism, params=None, operand=None, **kw):
    return apply_write(x, featurizer=kw.pop("featurizer", IDENTITY), mechanism=mechanism,
                       params=params or {}, operand=operand, **kw)


@FAST
@given(act_and_operand(), st.data())
def test_identity_swap_with_itself_is_bit_exact(xo, data):
    x, _ = xo
    # Signed zeros on purpose: an arithmetic "copy" (x * 1 + 0) turns -0.0 into +0.0.
    negative_zero = data.draw(st.lists(st.booleans(), min_size=x.numel(), max_size=x.numel()))
    x = torch.where(torch.tensor(negative_zero).reshape(x.shape), torch.tensor(-0.0), x)
    assert torch.equal(bits(write(x, "swap", operand=x.clone())), bits(x))
    features = tuple(data.draw(st.lists(st.integers(0, x.shape[-1] - 1), min_size=1, unique=True)))
    assert torch.equal(bits(write(x, "swap", operand=x.clone(), features=features)), bits(x))


@FAST
@given(act_and_operand())
def test_lerp_ends_are_swap_and_nothing(xo):
    x, o = xo
    swapped = write(x, "swap", operand=o)
    # Value-exact: no rounding at either end (torch.equal counts -0.0 == 0.0).
    assert torch.equal(write(x, "lerp", {"t": 1.0}, operand=o), swapped)
    assert torch.equal(write(x, "lerp", {"t": 0.0}, operand=o), x)
    assert torch.equal(write(x, "lerp", {"t": 1}, operand=o), o)


def test_lerp_ends_keep_the_sign_of_zero():
    x = torch.tensor([[[-0.0, 2.0]]])
    o = torch.tensor([[[3.0, -0.0]]])
    assert torch.equal(bits(write(x, "lerp", {"t": 0.0}, operand=o)), bits(x))
    assert torch.equal(bits(write(x, "lerp", {"t": 1.0}, operand=o)), bits(write(x, "swap", operand=o)))


@FAST
@given(act_and_operand())
def test_add_scaled_by_zero_is_exact(xo):
    x, o = xo
    assert torch.equal(write(x, "add_scaled", {"scale": 0.0}, operand=o), x)
    assert torch.equal(write(x, "add_scaled", {"scale": 0}, operand=1e30), x)


@FAST
@given(act_and_operand(), st.floats(-8, 8, allow_nan=False).filter(lambda s: abs(s) > 1e-3),
       st.sampled_from((1e-2, 1.0, 1e2)))
def test_renormalize_after_add_scaled_restores_each_norm(xo, scale, magnitude):
    x, o = (t * magnitude for t in xo)  # short and long vectors both
    steered = write(x, "add_scaled", {"scale": scale}, operand=o)
    # A zero vector has no direction to rescale along (renormalize returns it as it is).
    assume(bool((torch.linalg.vector_norm(steered, dim=-1) > 1e-4).all()))
    restored = write(steered, "renormalize", f0=x)
    want = torch.linalg.vector_norm(x, dim=-1)
    got = torch.linalg.vector_norm(restored, dim=-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # Only the length changed: the direction is the steered one.
    cos = torch.nn.functional.cosine_similarity(restored, steered, dim=-1)
    nonzero = want > 1e-4
    torch.testing.assert_close(cos[nonzero], torch.ones_like(cos[nonzero]), rtol=0, atol=1e-5)


@st.composite
def windows(draw, rows, seq):
    """One window per row: rectangular (a shared fixed cut) or ragged (any distinct positions)."""
    if draw(st.booleans()):
        where = draw(cst.positions(seq))
        return tuple(locate.cut(0, seq, where) for _ in range(rows)), False
    per_row = st.lists(st.integers(0, seq - 1), unique=True, max_size=seq).map(lambda ps: tuple(sorted(ps)))
    return tuple(draw(per_row) for _ in range(rows)), True


@FAST
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 5), st.data())
def test_gather_and_scatter_are_inverse(rows, seq, width, data):
    act = data.draw(cst.activations((rows, seq, width)))
    window, ragged = data.draw(windows(rows, seq))
    features = data.draw(st.none() | st.lists(st.integers(0, width - 1), min_size=1, unique=True).map(tuple))
    got = gather(act, window, ragged=ragged, features=features)
    # Writing back what was read changes nothing, to the bit.
    assert torch.equal(bits(scatter(act, window, got, ragged=ragged, features=features)), bits(act))
    # Reading back what was written gives it, and nothing outside the window moves.
    value = data.draw(cst.activations(tuple(got.shape)))
    written = scatter(act, window, value, ragged=ragged, features=features)
    assert torch.equal(bits(gather(written, window, ragged=ragged, features=features)), bits(value))
    touched = torch.zeros(act.shape, dtype=torch.bool)
    cols = list(features) if features is not None else list(range(width))
    for r, ps in enumerate(window):
        for p in ps:
            touched[r, p, cols] = True
    assert torch.equal(bits(written[~touched]), bits(act[~touched]))


@FAST
@given(act_and_operand(), cst.mechanisms(("swap", "add_scaled", "lerp", "clamp", "gaussian")), st.data())
def test_a_features_write_changes_only_those_columns(xo, mechanism, data):
    x, o = xo
    name, params = mechanism
    width = x.shape[-1]
    features = tuple(data.draw(st.lists(st.integers(0, width - 1), min_size=1, unique=True)))
    operand = o if vocab.MECHANISMS[name].operand else None
    out = write(x, name, params, operand=operand, features=features)
    rest = [c for c in range(width) if c not in features]
    assert torch.equal(bits(out[..., rest]), bits(x[..., rest]))
    # And the selected columns are what the mechanism makes of those columns alone.
    alone = write(x[..., list(features)], name, params,
                  operand=None if operand is None else o[..., list(features)])
    if name != "gaussian":  # the noise is drawn for the shape it is applied to
        assert torch.equal(bits(out[..., list(features)]), bits(alone))
    if name == "swap":
        assert torch.equal(bits(out[..., list(features)]), bits(o[..., list(features)]))


class Subspace:
    """A hand-written rotation featurizer: featurize Qᵀx (nothing thrown away), inverse Qf + (x − QQᵀx)."""

    def __init__(self, q: torch.Tensor):
        self.q = q

    def featurize(self, x):
        return x @ self.q, None

    def inverse(self, f, err, x):
        return f @ self.q.T + (x - (x @ self.q) @ self.q.T)


@FAST
@given(st.integers(2, 12).flatmap(lambda d: st.tuples(st.just(d), st.integers(1, d))), st.data())
def test_a_subspace_swap_leaves_the_complement_alone(dk, data):
    d, k = dk
    q = data.draw(cst.orthonormal_bases(d, k))
    assert q.shape == (d, k) and q.dtype == torch.float32
    torch.testing.assert_close(q.T @ q, torch.eye(k), rtol=0, atol=1e-5)
    rows, w = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
    x = data.draw(cst.activations((rows, w, d)))
    o = data.draw(cst.activations((rows, w, d)))
    feat = Subspace(q)
    out = apply_write(x, featurizer=feat, mechanism="swap", params={}, operand=o @ q)
    complement = torch.eye(d) - q @ q.T
    by_hand = x + (o @ q - x @ q) @ q.T  # x' = x + Q(Qᵀo − Qᵀx)
    torch.testing.assert_close(out, by_hand, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out @ complement, x @ complement, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out @ q, o @ q, rtol=1e-5, atol=1e-4)


@FAST
@given(st.integers(1, 16), st.integers(1, 32), st.sampled_from((True, False, None)), st.data())
def test_sae_weights_are_saelens_shaped(d, k, tied, data):
    w = data.draw(cst.sae_weights(d, k, tied=tied))
    assert w["W_enc"].shape == (d, k) and w["b_enc"].shape == (k,) and w["b_dec"].shape == (d,)
    if tied is True:
        assert "W_dec" not in w
    if tied is False:
        assert w["W_dec"].shape == (k, d)
        torch.testing.assert_close(w["W_dec"].norm(dim=1), torch.ones(k), rtol=0, atol=1e-5)
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in w.values())


@FAST
@given(cst.mechanisms(), st.integers(1, 3), st.integers(1, 3), st.integers(1, 6), st.data())
def test_every_drawn_mechanism_is_valid_and_runs(mechanism, rows, w, d, data):
    name, params = mechanism
    checked = vocab.check_params(name, params)
    assert set(checked) == set(vocab.MECHANISMS[name].params)
    x = data.draw(cst.activations((rows, w, d)))
    spec = vocab.MECHANISMS[name]
    operand = None
    if spec.operand:
        operand = data.draw(st.one_of(cst.activations((rows, w, d)), cst.activations((d,)),
                                      st.floats(-4, 4, allow_nan=False)))
    f0 = data.draw(cst.activations((rows, w, d))) if spec.needs_f0 else None
    out = apply_write(x, featurizer=IDENTITY, mechanism=name, params=params, operand=operand, f0=f0)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.isfinite(out).all()


# =========================================================================== rows and documents


@SLOW
@given(cst.rows(1, 6), st.booleans())
def test_drawn_rows_load_as_a_dataset_with_their_anchor_once(drawn, chat):
    with tempfile.TemporaryDirectory() as root:
        folder = Path(root) / "drawn"
        folder.mkdir()
        (folder / "train.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in drawn))
        ds = data_mod.load("drawn/train", [root])
        assert list(ds.rows) == drawn
    days = cst.WEEKDAYS
    for row in drawn:
        for field in ("input", "counterfactual_inputs[0]"):
            text = data_mod.get_field(row, field)
            entity = data_mod.variable_text(row, field, "entity")
            assert cst.anchor_hits(text, entity) == 1
        assert row["base_answer"] == " " + days[(days.index(row["entity"]) + 1) % 7]
        cf = row["counterfactual_inputs_variables"][0]["entity"]
        assert row["cf_answer"] == " " + days[(days.index(cf) + 1) % 7]
        assert cf != row["entity"]


def reorder(value, rnd: random.Random):
    """The same JSON with every object's keys in a shuffled order."""
    if isinstance(value, dict):
        keys = list(value)
        rnd.shuffle(keys)
        return {k: reorder(value[k], rnd) for k in keys}
    if isinstance(value, list):
        return [reorder(v, rnd) for v in value]
    return value


@SLOW
@given(st.sampled_from(("tiny-llama", "tiny-gpt2", "tiny-gemma2")).flatmap(
    lambda m: cst.documents(m, scopes=True)), st.randoms(use_true_random=False), st.text(max_size=20))
def test_drawn_documents_validate_and_their_digest_ignores_spelling(doc, rnd, description):
    points = front.points(doc)
    assert points
    shuffled = reorder(doc, rnd)
    # Steps keep their order (a fit before a score is not a score before a fit); within
    # each step, and everywhere else, key order is spelling.
    shuffled["steps"] = {k: shuffled["steps"][k] for k in doc["steps"]}
    reheadered = {**doc, "header": {"description": description}}
    for a, b, c in zip(points, front.points(shuffled), front.points(reheadered)):
        assert a.name == b.name == c.name
        assert a.spec.produced_by == b.spec.produced_by == c.spec.produced_by


@pytest.fixture(scope="module")
def facts():
    pytest.importorskip("transformers")
    cache = {}

    def get(model: str):
        if model not in cache:
            shipped = (json.loads(p.read_text()) for p in sorted(V2.glob("*.causalab.json")))
            raw = next(doc for doc in shipped if doc["model"]["key"] == model)
            cache[model] = compiler.model_facts(front.points(raw)[0].spec, None, models=[MODELS])
        return cache[model]
    return get


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(("tiny-llama", "tiny-gpt2", "tiny-gemma2")).flatmap(
    lambda m: st.tuples(st.just(m), cst.documents(m, scopes=True))))
def test_drawn_documents_compile_against_the_model_and_data(facts, drawn):
    # Stronger than validation: the compiler checks layers, heads, units and features
    # against the model's config and every fixed cut against every tokenized row.
    model, doc = drawn
    plan = compiler.compile_plan(doc, data=[DATA], facts=facts(model))
    assert plan is not None


def test_model_bounds_and_prompt_lengths_agree_with_the_engine(facts):
    f = facts("tiny-llama")
    b = cst.model_bounds("tiny-llama")
    assert (b["num_layers"], b["d_model"], b["n_heads"], b["n_kv_heads"], b["head_dim"], b["d_mlp"]) == \
        (f.num_layers, f.d_model, f.n_heads, f.n_kv_heads, f.head_dim, f.d_mlp)
    from causalab_mini.model.loading import revision_digest
    assert b["revision"] == revision_digest(MODELS / "tiny-llama")
    tok = f.tokenizer
    prefix = len(locate.special_prefix(tok))
    rows = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines()]
    texts = [r["input"] for r in rows] + [r["counterfactual_inputs"][0] for r in rows]
    assert cst.prompt_lengths("tiny-llama") == tuple(sorted({len(tok(t)["input_ids"]) - prefix for t in texts}))


def test_importing_the_strategies_imports_no_torch():
    # A property-test module pays only for what it draws. Imported first of all, before
    # hypothesis (whose entry point then registers the profile), it must also import cleanly.
    # pydantic is not counted: the metric registry (vocab.METRICS, which the document strategies
    # draw kinds from) holds each kind's params schema as a pydantic model.
    code = ("import sys, pytest_causalab.strategies; "
            "assert 'pytest_causalab.hypothesis_profile' in sys.modules, 'the entry point did not load'; "
            "heavy = [m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules]; "
            "assert not heavy, heavy; "
            "from hypothesis import settings; settings.get_profile('causalab')")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)

"""The metric registry: every kind held to an independent torch computation of its definition,
and a kind registered from outside the project scored like a built-in one."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from causalab_mini import metric_kinds, vocab
from causalab_mini.errors import EngineError
from causalab_mini.metric_kinds import MetricKind, metric, register_metric, unregister_metric
from causalab_mini.ops.metrics import score, scored


def _rows(lg):
    return torch.arange(lg.shape[0])


def _prob(lg, ids):
    """softmax(lg)[ids] as exp(logit − logsumexp), not softmax."""
    return torch.exp(lg[_rows(lg), ids] - lg.logsumexp(dim=-1))


def _rank(lg, token):
    """1 + the place of token's logit among the row's logits sorted high to low, its first
    occurrence: a tie takes the best rank it shares. A Python loop over sorted lists."""
    return torch.tensor([1.0 + sorted(row, reverse=True).index(row[t]) for row, t in
                         zip(lg.tolist(), token.tolist())])


def _top_k(lg, expected, *, k):
    """expected's logit at least the k-th largest (torch.topk): fewer than k tokens above it."""
    kth = lg.topk(min(k, lg.shape[-1]), dim=-1).values[:, -1]
    return (lg[_rows(lg), expected] >= kth).float()


def _kl(lg, *, reference):
    """KL(reference ‖ lg) by torch's own kl_div (its input is the log-probabilities of the read
    measured, its target the reference's)."""
    return torch.nn.functional.kl_div(torch.log_softmax(lg, dim=-1), torch.log_softmax(reference, dim=-1),
                                      reduction="none", log_target=True).sum(dim=-1)


def _normalized(lg, a, b, *, base, counterfactual, measure, min_denominator):
    """(m(lg) − m(base)) / (m(counterfactual) − m(base)) row by row in Python floats (float64), and
    which rows' denominators reach min_denominator."""
    def m(x):
        if measure == "logit_diff":
            return (x[_rows(x), a] - x[_rows(x), b]).double().tolist()
        return (_prob(x.double(), a) - _prob(x.double(), b)).tolist()
    values, defined = [], []
    for here, low, high in zip(m(lg), m(base), m(counterfactual)):
        defined.append(abs(high - low) >= min_denominator)
        values.append((here - low) / (high - low) if defined[-1] else 0.0)
    return torch.tensor(values, dtype=torch.float32), torch.tensor(defined)


# Each kind's definition (spec: reads-writes-metrics.md, metric_kinds.py's docstrings), written
# another way than its compute: indexing instead of gather, max instead of argmax, torch's
# cross_entropy, kl_div, topk and logsumexp instead of log_softmax/softmax, sorted lists for a
# rank, Python floats for a ratio. Value and whether it is exact. A reference takes the logits,
# the id columns, and by keyword the kind's other reads and its params (defaults filled).
REFERENCE = {
    # No ties in these inputs, so "the argmax is expected" is "expected's logit is the max".
    "match": (lambda lg, e: (lg[_rows(lg), e] == lg.max(dim=-1).values).float(), True),
    "logit_diff": (lambda lg, a, b: lg[_rows(lg), a] - lg[_rows(lg), b], True),
    "cross_entropy": (lambda lg, t: torch.nn.functional.cross_entropy(lg, t, reduction="none"), False),
    "token_logit": (lambda lg, t: lg[_rows(lg), t], True),
    "token_prob": (lambda lg, t: _prob(lg, t), False),
    "prob_diff": (lambda lg, a, b: _prob(lg, a) - _prob(lg, b), False),
    "token_rank": (_rank, True),
    "top_k": (_top_k, True),
    "kl_div": (_kl, False),
    "normalized_effect": (_normalized, False),
}

# The params each kind is checked with (a kind not here: its defaults, {}), every value of a
# choice and both sides of a bound.
PARAMS = {
    "top_k": [{"k": 1}, {"k": 3}, {"k": 40}, {"k": 41}],
    "normalized_effect": [{}, {"measure": "prob_diff"}, {"min_denominator": 4.0}],
}
CASES = [(kind, params) for kind in sorted(REFERENCE) for params in PARAMS.get(kind, [{}])]

# What vocab.METRICS declared before it was derived from the registry: its public shape.
DECLARED = {
    "match": (("expected",), "fraction", False, "match/v2"),
    "logit_diff": (("a", "b"), "logit", True, "logit_diff/v2"),
    "cross_entropy": (("target",), "nats", True, "cross_entropy/v1"),
    "token_logit": (("token",), "logit", True, "token_logit/v1"),
    "token_prob": (("token",), "probability", True, "token_prob/v1"),
    "prob_diff": (("a", "b"), "probability", True, "prob_diff/v1"),
    "token_rank": (("token",), "rank", False, "token_rank/v1"),
    "top_k": (("expected",), "fraction", False, "top_k/v1"),
    "kl_div": ((), "nats", True, "kl_div/v1"),
    "normalized_effect": (("a", "b"), "fraction of effect", True, "normalized_effect/v1"),
}
# The kinds that compare their read with others, take params or leave rows out: the reads, the
# params with their defaults (a param None: required; None: no schema), and the reason an undefined row is given.
DECLARED_SLOTS = {
    "top_k": ((), {"k": None}, ""),
    "kl_div": (("reference",), None, ""),
    "normalized_effect": (("base", "counterfactual"), {"measure": "logit_diff", "min_denominator": 1e-4},
                          "effect_denominator_near_zero"),
}


def _logits(seed: int, dtype: torch.dtype, n: int = 9, width: int = 40) -> torch.Tensor:
    """Distinct values per row (a shuffled grid, exact in bf16 and fp16), so no argmax is a tie."""
    g = torch.Generator().manual_seed(seed)
    scale = 0.25 * (1 + seed)
    rows = [torch.randperm(width, generator=g).float() * scale - width * scale / 2 for _ in range(n)]
    return torch.stack(rows).to(dtype)


def _ids(seed: int, kind: str, n: int, width: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1000 + seed)
    return tuple(torch.randint(0, width, (n,), generator=g) for _ in vocab.METRICS[kind].columns)


def _reads(seed: int, kind: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A second (and third) logits tensor for each read the kind compares with, drawn like the
    first with other seeds (scales 1.0 to 1.75: still exact in bf16)."""
    return {slot: _logits(seed + 3 + i, dtype) for i, slot in enumerate(vocab.METRICS[kind].reads)}


def _case(kind: str, params: dict, dtype: torch.dtype, seed: int):
    lg = _logits(seed, dtype)
    ids = _ids(seed, kind, *lg.shape)
    if kind in ("match", "top_k"):  # rows expect the token ranked 1st, 2nd, ...: both outcomes scored
        order = lg.float().argsort(dim=-1, descending=True)
        by_rank = order[_rows(lg), torch.arange(lg.shape[0]) % 5]
        ids = (torch.where(torch.arange(lg.shape[0]) % 2 == 0, by_rank, ids[0]),)
    if kind == "normalized_effect":  # row 0: a is b, every measure 0, the denominator too
        ids = (ids[0], torch.cat([ids[0][:1], ids[1][1:]]))
    return lg, ids, _reads(seed, kind, dtype), metric_kinds.check_params(vocab.METRICS[kind], params)


def test_every_registered_kind_has_a_reference():
    # A kind added to the registry without one here fails: its definition must be checked too.
    assert set(metric_kinds.METRICS) == set(REFERENCE)


@pytest.mark.parametrize("kind,params", CASES, ids=[f"{k}{p or ''}" for k, p in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kind_matches_its_definition(kind, params, dtype, seed):
    lg, ids, reads, params = _case(kind, params, dtype, seed)
    got, defined = scored(kind, lg, ids, reads=reads, params=params)
    reference, exact = REFERENCE[kind]
    want = reference(lg.float(), *ids, **{k: v.float() for k, v in reads.items()}, **params)
    assert got.dtype == torch.float32 and got.shape == (lg.shape[0],)
    if vocab.METRICS[kind].excludes:  # the reference says which rows are defined, too
        want, want_defined = want
        assert defined is not None and torch.equal(defined, want_defined), (defined, want_defined)
        assert not bool(defined[0])  # a is b on row 0: no effect to normalise by
        got, want = got[defined], want[defined]
    else:
        assert defined is None
    if exact:
        assert torch.equal(got, want), (got, want)
    elif kind == "normalized_effect":  # a ratio of fp32 differences against float64's
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:  # a different fp32 formula: equal to within a few ulps
        torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6 if kind == "kl_div" else 1e-7)
    if kind == "match" or kind == "top_k" and params["k"] < lg.shape[-1]:
        assert set(got.tolist()) == {0.0, 1.0}
    elif kind == "top_k":  # k the whole vocabulary or more: every token is in it
        assert set(got.tolist()) == {1.0}


def test_ranks_and_top_k_count_ties_in_the_tokens_favour():
    lg = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0], [5.0, -1.0, 5.0, 5.0]])
    token = torch.tensor([2, 3, 1])
    assert score("token_rank", lg, (token,)).tolist() == [1.0, 1.0, 4.0]
    assert torch.equal(score("token_rank", lg, (token,)), _rank(lg, token))
    for k, hits in ((1, [1.0, 1.0, 0.0]), (3, [1.0, 1.0, 0.0]), (4, [1.0, 1.0, 1.0])):
        assert score("top_k", lg, (token,), params={"k": k}).tolist() == hits
        assert torch.equal(score("top_k", lg, (token,), params={"k": k}), _top_k(lg, token, k=k))
    # kl_div of a read from itself is 0.
    assert score("kl_div", lg, (), reads={"reference": lg}).abs().max() < 1e-6
    uniform = torch.zeros(1, 4)
    one_hot = torch.tensor([[100.0, 0.0, 0.0, 0.0]])
    # KL(uniform ‖ one-hot-ish) is large, KL(one-hot-ish ‖ uniform) ≈ log 4: the order matters.
    assert score("kl_div", uniform, (), reads={"reference": one_hot}).item() == pytest.approx(math.log(4), rel=1e-5)
    assert score("kl_div", one_hot, (), reads={"reference": uniform}).item() > 20


@pytest.mark.parametrize("kind,params", CASES, ids=[f"{k}{p or ''}" for k, p in CASES])
def test_differentiable_is_what_the_compute_does(kind, params):
    lg, ids, reads, params = _case(kind, params, torch.float32, 0)
    out = score(kind, lg.requires_grad_(True), ids, reads=reads, params=params)
    assert out.requires_grad == vocab.METRICS[kind].differentiable


def test_vocab_reads_the_registry_with_its_public_shape_unchanged():
    assert vocab.METRICS is metric_kinds.METRICS  # one table, not a copy kept in step
    assert vocab.MetricKind is MetricKind
    assert list(vocab.METRICS) == list(DECLARED)  # declaration order, as before
    for kind, (columns, unit, differentiable, estimand) in DECLARED.items():
        m = vocab.METRICS[kind]
        assert (m.name, m.columns, m.unit, m.differentiable, m.estimand_version) == \
            (kind, columns, unit, differentiable, estimand)
        assert vocab.COLUMNS[kind] == columns
        reads, params, excludes = DECLARED_SLOTS.get(kind, ((), None, ""))
        assert (m.reads, m.excludes, m.origin) == (reads, excludes, metric_kinds.BUILT_IN)
        if params is None:
            assert m.params is None
        else:
            assert {name: (None if f.is_required() else f.default) for name, f in m.params.model_fields.items()} \
                == params
    assert dict(vocab.COLUMNS) == {k: v[0] for k, v in DECLARED.items()}
    # The keys vocab's JSON had keep their values (it may say more of a kind: its reads, params).
    logit_diff = vocab.as_json()["metric_kinds"]["logit_diff"]
    assert {k: logit_diff[k] for k in ("columns", "unit", "estimand_version")} == {
        "columns": ["a", "b"], "unit": "logit", "estimand_version": "logit_diff/v2"}


def test_registry_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from causalab_mini import metric_kinds, vocab\n"
            "assert vocab.METRICS is metric_kinds.METRICS and len(vocab.METRICS) == 10\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- a kind from outside

def _answer_prob(logits, answer):
    """softmax(logits)[answer], written by a user who has never read metric_kinds.py."""
    return torch.softmax(logits, dim=-1)[torch.arange(logits.shape[0]), answer]


@pytest.fixture
def registry():
    """The registry, with whatever a test registers in it taken out afterwards, so no other test sees it."""
    before = dict(metric_kinds.METRICS)
    yield metric_kinds.METRICS
    for name in set(metric_kinds.METRICS) - set(before):
        unregister_metric(name)
    assert metric_kinds.METRICS == before


def test_a_registered_kind_is_scored(registry):
    register_metric(MetricKind("answer_prob", ("token",), "probability", True, compute=_answer_prob))
    assert vocab.METRICS["answer_prob"].estimand_version == "answer_prob/v1"
    assert vocab.COLUMNS["answer_prob"] == ("token",)  # the derived view sees it too
    lg = _logits(3, torch.bfloat16)
    ids = _ids(3, "answer_prob", *lg.shape)
    got = score("answer_prob", lg, ids)
    torch.testing.assert_close(got, torch.exp(lg.float()[_rows(lg), ids[0]] - lg.float().logsumexp(dim=-1)),
                               rtol=2e-6, atol=1e-7)
    # The checks every kind shares apply to it: columns counted against its record.
    with pytest.raises(EngineError, match=r"answer_prob takes 1 id column \(token\), got 2"):
        score("answer_prob", lg, ids * 2)

    assert unregister_metric("answer_prob").compute is _answer_prob
    assert "answer_prob" not in vocab.METRICS and "answer_prob" not in vocab.COLUMNS
    with pytest.raises(EngineError, match="unknown metric kind 'answer_prob'"):
        score("answer_prob", lg, ids)


def test_the_decorator_registers_the_function_it_wraps(registry):
    @metric("answer_logit_margin", columns=("a", "b"), unit="logit", differentiable=True, version=3)
    def margin(logits, a, b):
        """logit[a] − logit[b], clipped at zero."""
        return (logits[_rows(logits), a] - logits[_rows(logits), b]).clamp(min=0)

    record = vocab.METRICS["answer_logit_margin"]
    assert record.compute is margin and record.estimand_version == "answer_logit_margin/v3"
    assert record.doc == "logit[a] − logit[b], clipped at zero."
    lg = torch.tensor([[1.0, 3.0, 2.0], [0.0, -1.0, 5.0]])
    assert score("answer_logit_margin", lg, (torch.tensor([1, 0]), torch.tensor([2, 2]))).tolist() == [1.0, 0.0]


def test_registration_refusals(registry):
    ok = MetricKind("answer_prob", ("token",), "probability", True, compute=_answer_prob)
    with pytest.raises(ValueError, match="'match' is already registered"):
        register_metric(MetricKind("match", ("expected",), "fraction", False, compute=_answer_prob))
    assert vocab.METRICS["match"].compute is metric_kinds.match  # the built-in is left as it was
    with pytest.raises(ValueError, match="compute must be a function"):
        register_metric(MetricKind("answer_prob", ("token",), "probability", True))
    with pytest.raises(ValueError, match="distinct names"):
        register_metric(MetricKind("answer_prob", ("a", "a"), "logit", True, compute=_answer_prob))
    with pytest.raises(ValueError, match="identifier"):
        register_metric(MetricKind("answer prob", ("token",), "probability", True, compute=_answer_prob))
    with pytest.raises(KeyError, match="not registered"):
        unregister_metric("answer_prob")
    assert "answer_prob" not in vocab.METRICS
    assert register_metric(ok) is registry["answer_prob"]  # and the well-formed one goes in


def test_a_compute_that_breaks_the_contract_is_refused(registry):
    register_metric(MetricKind("answer_pair", ("token",), "logit", True,
                               compute=lambda logits, t: logits[:, :2]))  # (n, 2), not (n,)
    with pytest.raises(EngineError, match=r"answer_pair: the compute registered for 'answer_pair' by causalab-mini "
                       r"returned torch.float32 \(3, 2\), not one float32 value per row \(3,\)"):
        score("answer_pair", torch.zeros(3, 4), (torch.tensor([0, 1, 2]),))

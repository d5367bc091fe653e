"""The metric registry: every kind held to an independent torch computation of its definition,
and a kind registered from outside the project scored like a built-in one."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from causalab_mini import metric_kinds, vocab
from causalab_mini.errors import EngineError
from causalab_mini.metric_kinds import MetricKind, metric, register_metric, unregister_metric
from causalab_mini.ops.metrics import score


def _rows(lg):
    return torch.arange(lg.shape[0])


# Each kind's definition (spec: reads-writes-metrics.md, metric_kinds.py's docstrings), written
# another way than its compute: indexing instead of gather, max instead of argmax, torch's
# cross_entropy and logsumexp instead of log_softmax/softmax. Value and whether it is exact.
REFERENCE = {
    # No ties in these inputs, so "the argmax is expected" is "expected's logit is the max".
    "match": (lambda lg, e: (lg[_rows(lg), e] == lg.max(dim=-1).values).float(), True),
    "logit_diff": (lambda lg, a, b: lg[_rows(lg), a] - lg[_rows(lg), b], True),
    "cross_entropy": (lambda lg, t: torch.nn.functional.cross_entropy(lg, t, reduction="none"), False),
    "token_logit": (lambda lg, t: lg[_rows(lg), t], True),
    "token_prob": (lambda lg, t: torch.exp(lg[_rows(lg), t] - lg.logsumexp(dim=-1)), False),
}

# What vocab.METRICS declared before it was derived from the registry: its public shape.
DECLARED = {
    "match": (("expected",), "fraction", False, "match/v2"),
    "logit_diff": (("a", "b"), "logit", True, "logit_diff/v2"),
    "cross_entropy": (("target",), "nats", True, "cross_entropy/v1"),
    "token_logit": (("token",), "logit", True, "token_logit/v1"),
    "token_prob": (("token",), "probability", True, "token_prob/v1"),
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


def test_every_registered_kind_has_a_reference():
    # A kind added to the registry without one here fails: its definition must be checked too.
    assert set(metric_kinds.METRICS) == set(REFERENCE)


@pytest.mark.parametrize("kind", sorted(REFERENCE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kind_matches_its_definition(kind, dtype, seed):
    lg = _logits(seed, dtype)
    ids = _ids(seed, kind, *lg.shape)
    if kind == "match":  # half the rows expect their argmax, so both outcomes are scored
        ids = (torch.where(torch.arange(lg.shape[0]) % 2 == 0, lg.float().argmax(dim=-1), ids[0]),)
    got = score(kind, lg, ids)
    reference, exact = REFERENCE[kind]
    want = reference(lg.float(), *ids)
    assert got.dtype == torch.float32 and got.shape == (lg.shape[0],)
    if exact:
        assert torch.equal(got, want), (got, want)
    else:  # a different fp32 formula: equal to within a few ulps
        torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-7)
    if kind == "match":
        assert set(got.tolist()) == {0.0, 1.0}


@pytest.mark.parametrize("kind", sorted(REFERENCE))
def test_differentiable_is_what_the_compute_does(kind):
    lg = _logits(0, torch.float32).requires_grad_(True)
    out = score(kind, lg, _ids(0, kind, *lg.shape))
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
    assert dict(vocab.COLUMNS) == {k: v[0] for k, v in DECLARED.items()}
    assert vocab.as_json()["metric_kinds"]["logit_diff"] == {
        "columns": ["a", "b"], "unit": "logit", "estimand_version": "logit_diff/v2"}


def test_registry_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from causalab_mini import metric_kinds, vocab\n"
            "assert vocab.METRICS is metric_kinds.METRICS and len(vocab.METRICS) == 5\n")
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
    with pytest.raises(EngineError, match=r"answer_pair: its compute returned torch.float32 \(3, 2\)"):
        score("answer_pair", torch.zeros(3, 4), (torch.tensor([0, 1, 2]),))

"""score and squeeze_positions against values worked out with ``math``."""
from __future__ import annotations

import math

import pytest
import torch

from causalab_mini import vocab
from causalab_mini.errors import EngineError
from causalab_mini.metric_kinds import check_params
from causalab_mini.ops.metrics import score, scored, squeeze_positions

ROWS = [[2.0, 0.5, -1.0, 3.0], [0.0, 0.0, 1.0, -2.0], [5.0, 4.0, 4.5, 1.0]]
LOGITS = torch.tensor(ROWS)


def ids(*values):
    return torch.tensor(values, dtype=torch.long)


def log_softmax(row, i):
    top = max(row)
    return row[i] - (top + math.log(sum(math.exp(v - top) for v in row)))


def test_match_is_zero_or_one():
    out = score("match", LOGITS, (ids(3, 1, 0),))
    # argmaxes are 3, 2, 0.
    assert out.dtype == torch.float32
    assert out.tolist() == [1.0, 0.0, 1.0]


def test_logit_diff():
    out = score("logit_diff", LOGITS, (ids(0, 2, 1), ids(3, 3, 2)))
    assert out.tolist() == [2.0 - 3.0, 1.0 - -2.0, 4.0 - 4.5]


def test_cross_entropy():
    target = (1, 3, 0)
    out = score("cross_entropy", LOGITS, (ids(*target),))
    for r, t in enumerate(target):
        assert out[r].item() == pytest.approx(-log_softmax(ROWS[r], t), rel=1e-6)


def test_token_logit_and_prob():
    token = (2, 0, 1)
    logit = score("token_logit", LOGITS, (ids(*token),))
    prob = score("token_prob", LOGITS, (ids(*token),))
    for r, t in enumerate(token):
        assert logit[r].item() == ROWS[r][t]
        expected = math.exp(ROWS[r][t]) / sum(math.exp(v) for v in ROWS[r])
        assert prob[r].item() == pytest.approx(expected, rel=1e-6)


def test_computed_in_fp32():
    half = LOGITS.to(torch.bfloat16)
    out = score("token_prob", half, (ids(0, 0, 0),))
    assert out.dtype == torch.float32


def test_gradients_flow_through_logit_diff():
    lg = LOGITS.clone().requires_grad_(True)
    score("logit_diff", lg, (ids(0, 2, 1), ids(3, 3, 2))).sum().backward()
    expected = torch.zeros(3, 4)
    expected[0, 0], expected[0, 3] = 1, -1
    expected[1, 2], expected[1, 3] = 1, -1
    expected[2, 1], expected[2, 2] = 1, -1
    assert torch.equal(lg.grad, expected)


# Other reads a kind may compare the scored one with, each unlike it and unlike the others (so a
# normalized effect's denominator is not zero), and the params a kind's schema requires.
OTHER_READS = {"reference": LOGITS.flip(-1), "base": LOGITS.roll(1, dims=-1), "counterfactual": 2 * LOGITS.flip(0)}
REQUIRED_PARAMS = {"top_k": {"k": 2}}


def test_gradients_flow_through_every_differentiable_kind():
    for kind, metric in vocab.METRICS.items():
        if not metric.differentiable:
            continue
        lg = LOGITS.clone().requires_grad_(True)
        # Each column a different id per row, and the columns different from each other.
        cols = tuple(ids(*((r + c) % 4 for r in range(3))) for c in range(len(vocab.COLUMNS[kind])))
        reads = {slot: OTHER_READS[slot] for slot in metric.reads}
        params = check_params(metric, REQUIRED_PARAMS.get(kind, {}))
        out, defined = scored(kind, lg, cols, reads=reads, params=params)
        assert out.requires_grad, kind
        assert defined is None or bool(defined.all()), kind
        out.sum().backward()
        assert lg.grad is not None and bool(lg.grad.abs().sum() > 0), kind  # reaches the scored read


def test_column_count_is_checked_against_vocab():
    with pytest.raises(EngineError, match=r"logit_diff takes 2 id columns \(a, b\), got 1"):
        score("logit_diff", LOGITS, (ids(0, 1, 2),))
    with pytest.raises(EngineError, match=r"match takes 1 id column \(expected\), got 2"):
        score("match", LOGITS, (ids(0, 1, 2), ids(0, 1, 2)))


def test_other_refusals():
    with pytest.raises(EngineError, match="unknown metric kind"):
        score("accuracy", LOGITS, (ids(0, 1, 2),))
    with pytest.raises(EngineError, match=r"\(n, vocab\)"):
        score("match", LOGITS[:, None, :], (ids(0, 1, 2),))
    with pytest.raises(EngineError, match=r"shape \(2,\), the logits 3 rows"):
        score("match", LOGITS, (ids(0, 1),))
    with pytest.raises(EngineError, match="outside the vocabulary of 4"):
        score("token_prob", LOGITS, (ids(0, 4, 1),))


def test_squeeze_positions():
    rect = torch.arange(12.0).view(3, 1, 4)
    assert torch.equal(squeeze_positions(rect, False), torch.arange(12.0).view(3, 4))
    flat = torch.arange(8.0).view(2, 4)
    assert squeeze_positions(flat, True) is flat
    with pytest.raises(EngineError, match="one position per row"):
        squeeze_positions(torch.zeros(3, 2, 4), False)
    with pytest.raises(EngineError, match="ragged read"):
        squeeze_positions(rect, True)

"""Reduced precision: ``model.dtype`` bf16 and fp16 load and run in that dtype on both engines.

Held to: run.json's served dtype; the two engines agreeing within the dtype's default tolerance
(``cm.checks.default_tolerance``); every row within a stated distance of the fp32 run; a featurizer's
arithmetic in float32 whatever the activation's dtype (a hand computation); and the plugin
holding a reduced-precision document's baselines to its dtype's default, not fp32's.
"""
from __future__ import annotations

import json

import pytest
import torch
from paths import DATA, MODELS, V2
from run_values import metric_rows

import causalab_mini as cm
from causalab_mini.ops.featurizers import Subspace
from causalab_mini.ops.intervene import apply_write

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("one_thread")

DOCS = ["patching", "layer_pos_sweep", "generate_probe", "sae_feature_ablation", "steer_renormalize", "das"]
SERVED = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}
# How far a reduced-precision row may sit from the fp32 run's: |a - b| <= ATOL + 10% of |fp32|.
# bf16 keeps 8 significant bits, fp16 11: a logit of ~10 carries ~0.04 (bf16) and ~0.005 (fp16) of
# rounding per op, and a dozen ops accumulate it; the fixtures measure 0.33 and 0.04 at most.
ATOL = {"bf16": 0.4, "fp16": 0.05}


def _document(name: str, dtype: str):
    path = V2 / f"{name}.causalab.json"
    raw = json.loads(path.read_text())
    raw["model"]["dtype"] = dtype
    if name == "das":
        raw["steps"]["fit"]["epochs"] = 1
    return cm.read(raw, path=path)


@pytest.fixture(scope="module")
def loaded():
    """Each engine loaded once per dtype (the model's dtype is chosen at load)."""
    cache: dict = {}

    def get(engine: str, dtype: str):
        if (engine, dtype) not in cache:
            cache[(engine, dtype)] = cm.load(_document("patching", dtype), engine=engine, models=[MODELS])
        return cache[(engine, dtype)]
    return get


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", DOCS)
def test_a_reduced_precision_run_on_both_engines(loaded, name, dtype):
    doc = _document(name, dtype)
    runs = {e: cm.run(doc, loaded=loaded(e, dtype), data=[DATA]) for e in ("nnterp", "hooks")}
    for run in runs.values():
        assert run.record["served_dtype"] == SERVED[dtype]
    held = {torch.float32: "torch.float32", torch.bfloat16: "torch.bfloat16", torch.float16: "torch.float16"}
    for engine in ("nnterp", "hooks"):
        model = loaded(engine, dtype).model
        weights = getattr(model, "_model", model).parameters()
        assert {held[w.dtype] for w in weights} == {SERVED[dtype]}
    # The two engines make the same calls in the same dtype: within the dtype's default, row by row.
    rtol, atol = cm.checks.default_tolerance(dtype)
    nnterp, hooks = metric_rows(runs["nnterp"]), metric_rows(runs["hooks"])
    assert nnterp.keys() == hooks.keys() and nnterp
    for key in nnterp:
        for a, b in zip(nnterp[key], hooks[key], strict=True):
            assert (a is None) == (b is None) and (a is None or cm.checks.close(a, b, rtol, atol)), key
    # Against fp32: every row within the stated distance.
    full = metric_rows(cm.run(_document(name, "fp32"), loaded=loaded("hooks", "fp32"), data=[DATA]))
    assert full.keys() == hooks.keys()
    moved = 0.0
    for key in full:
        for a, b in zip(full[key], hooks[key], strict=True):
            if a is None or b is None:
                continue
            assert abs(a - b) <= ATOL[dtype] + 0.1 * abs(a), (key, a, b)
            moved = max(moved, abs(a - b))
    assert moved > 0  # it did run in another dtype


def test_featurizer_arithmetic_stays_float32_on_a_bf16_activation():
    """A subspace swap of a bf16 activation: featurized, swapped and inverted in float32, then
    rounded to bf16 once — as a hand computation in float32 gives it."""
    torch.manual_seed(0)
    sub = Subspace(64, 8, seed=3)
    x = (torch.randn(4, 64) * 6).to(torch.bfloat16)
    op = torch.randn(4, 8) * 6
    with torch.no_grad():
        out = apply_write(x, featurizer=sub, mechanism="swap", params=None, operand=op)
        q = sub.basis().detach().to(torch.float32)
        x32 = x.to(torch.float32)
        by_hand = (x32 - (x32 @ q) @ q.T + op @ q.T).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16
    # Equal to one float32 computation rounded once; how bf16 arithmetic itself would round (its
    # matmul accumulation) is the machine's BLAS, so no test asserts it differs.
    torch.testing.assert_close(out, by_hand, rtol=0, atol=0)


def test_default_tolerance_follows_the_dtype():
    assert cm.checks.default_tolerance("fp32") == (1e-4, 1e-5)
    assert cm.checks.default_tolerance("bf16") == (4 * torch.finfo(torch.bfloat16).eps, torch.finfo(torch.bfloat16).eps)
    assert cm.checks.default_tolerance("fp16") == (4 * torch.finfo(torch.float16).eps, torch.finfo(torch.float16).eps)


def test_the_plugin_holds_a_bf16_baseline_to_the_bf16_default(tester):
    """A stored row moved by 1% of its value: within bf16's default (3.1e-2 relative), outside
    fp32's (1e-4) — the session's own dtype decides, and an explicit option still wins."""
    raw = json.loads((V2 / "patching.causalab.json").read_text())
    raw["model"]["dtype"] = "bf16"
    raw["header"]["expect"] = []
    (tester.path / "half.causalab.json").write_text(json.dumps(raw))
    first = tester.runpytest("--causalab-engine=hooks")
    first.assert_outcomes(passed=1, warnings=1)
    stored = tester.path / "baselines" / "half.json"
    baseline = json.loads(stored.read_text())
    rows = baseline["points"]["half"]["results"]["logit_diff"]["rows"]
    assert any(v != 0.0 for v in rows.values())
    baseline["points"]["half"]["results"]["logit_diff"]["rows"] = {k: v * 1.01 for k, v in rows.items()}
    stored.write_text(json.dumps(baseline, indent=1))
    tester.runpytest("--causalab-engine=hooks").assert_outcomes(passed=1)
    strict = tester.runpytest("--causalab-engine=hooks", "--causalab-rtol=1e-4", "--causalab-atol=1e-5")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*rtol 0.0001*"])


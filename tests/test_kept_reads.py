"""Activations out of a run: ``cm.run(..., reads=[...])`` keeps the named reads in memory
(``point.value(name)``), and a step's ``outputs`` + ``saves`` put one on disk.

Each value is held to the model's own residual stream, computed here with a plain transformers
forward on each prompt alone and a forward hook on decoder layer l (block_output of layer l is
what that layer returns; transformers' ``hidden_states`` applies the final norm to the last one).
"""
from __future__ import annotations

import json

import pytest
import torch
from model_calls import untimed
from paths import DATA, V2
from samples import saving_cf_resid

import causalab_mini as cm

pytestmark = pytest.mark.usefixtures("one_thread")

LAYER_POS = V2 / "layer_pos_sweep.causalab.json"
PATCHING = V2 / "patching.causalab.json"


def counterfactual_states(hf_model, dataset: str, layer: int) -> list[torch.Tensor]:
    """Per row of ``dataset``: the residual leaving ``layer`` at every token of its counterfactual
    prompt, each prompt run alone, unpadded."""
    model, tokenizer = hf_model("tiny-llama")
    rows = [json.loads(line) for line in (DATA / dataset / "train.jsonl").read_text().splitlines()]
    out, caught = [], []
    handle = model.model.layers[layer].register_forward_hook(
        lambda _m, _a, output: caught.append(output[0] if isinstance(output, tuple) else output))
    try:
        with torch.no_grad():
            for row in rows:
                model(**tokenizer(row["counterfactual_inputs"][0], return_tensors="pt"))
                out.append(caught.pop()[0])
    finally:
        handle.remove()
    return out


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
def test_a_kept_read_is_the_models_own_activation_rows_then_positions_then_width(engines, hf_model, engine):
    ran = cm.run(LAYER_POS, loaded=engines(LAYER_POS, engine), reads=["v_cf"])
    for layer in (0, 1):
        expected = counterfactual_states(hf_model, "weekdays_full", layer)
        for pos in (-4, -1):
            got = ran.point(layers=layer, pos=pos).value("v_cf")
            by_hand = torch.stack([states[pos] for states in expected]).unsqueeze(1)
            assert got.shape == by_hand.shape == (len(expected), 1, by_hand.shape[-1])
            torch.testing.assert_close(got, by_hand, rtol=1e-5, atol=1e-5)


def test_reads_all_keeps_every_read_and_names_it_as_the_document_does(engines, hf_model):
    ran = cm.run(PATCHING, loaded=engines(PATCHING, "hooks"), reads="all")
    point = ran.point()
    expected = counterfactual_states(hf_model, "weekdays", 0)
    torch.testing.assert_close(point.value("v_cf"), torch.stack([s[-1] for s in expected]).unsqueeze(1),
                               rtol=1e-5, atol=1e-5)
    logits = point.value("logits")  # the patched pass's last-token logits, which the metrics score
    assert logits.shape[:2] == (len(expected), 1)
    iia = point.result("iia")
    cf = [ans for ans, ok in zip(_answer_ids("weekdays", "cf_answer"), iia.eligible) if ok]
    assert [float(logits[i, 0].argmax() == a) for i, a in enumerate(cf)] == list(iia.values)


def _answer_ids(dataset: str, column: str) -> list[int]:
    from transformers import AutoTokenizer

    from paths import MODELS
    tok = AutoTokenizer.from_pretrained(MODELS / "tiny-llama")
    rows = [json.loads(line) for line in (DATA / dataset / "train.jsonl").read_text().splitlines()]
    return [tok(r[column], add_special_tokens=False)["input_ids"][0] for r in rows]


def test_reads_are_not_kept_unless_asked(engines):
    ran = cm.run(PATCHING, loaded=engines(PATCHING, "hooks"))
    with pytest.raises(cm.PlanError, match="not produced"):
        ran.point().value("v_cf")


def test_a_read_the_document_does_not_declare_is_refused_before_the_load(tmp_path):
    with pytest.raises(cm.PlanError, match=r"reads: 'v_base' is not a read of patching; name reads the "
                                           r"document declares: \['logits', 'v_cf'\]"):
        cm.run(PATCHING, engine="no such engine", reads=["v_base"])  # refused before the engine is looked up
    with pytest.raises(cm.PlanError, match="served from the cache ran no forward"):
        cm.run(PATCHING, engine="hooks", reads=["v_cf"], cache=tmp_path)


def test_kept_reads_change_nothing_on_disk(engines, tmp_path):
    loaded = engines(LAYER_POS, "hooks")
    cm.run(LAYER_POS, loaded=loaded, out=tmp_path / "plain")
    cm.run(LAYER_POS, loaded=loaded, out=tmp_path / "kept", reads="all")
    files = sorted(p.relative_to(tmp_path / "plain") for p in (tmp_path / "plain").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "kept") for p in (tmp_path / "kept").rglob("*") if p.is_file())
    for f in files:
        assert untimed(tmp_path / "plain" / f) == untimed(tmp_path / "kept" / f), f


def test_a_read_published_and_saved_is_on_disk_as_read(engines, hf_model, tmp_path):
    path = saving_cf_resid(tmp_path)
    cm.run(path, loaded=engines(PATCHING, "hooks"), out=tmp_path / "out", data=DATA)
    saved = cm.open(tmp_path / "out").point().saved_tensors()["cf_resid.safetensors"]["cf_resid"]
    expected = counterfactual_states(hf_model, "weekdays", 0)
    torch.testing.assert_close(saved, torch.stack([s[-1] for s in expected]).unsqueeze(1), rtol=1e-5, atol=1e-5)

"""Attribution patching: what is refused before any weights load, and expectations through the plugin.

Each refusal is a typed error naming the document path of the field, compiled against the model's
config and tokenizer only (from_pretrained of a model is made to fail here, so a refusal that
needed the weights would show). The CLI prints one without a traceback, exits non-zero and
writes nothing. Then the plugin holds a document to "spearman", passing and failing.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import causalab_mini as cm
from attribution_corpus import document, revision
from causalab_mini.errors import CompileError, DocumentError
from paths import DATA, MODELS, V2

pytest_plugins = ["pytester"]

CLI = Path(sys.executable).parent / "causalab-mini"


def base() -> dict:
    """One estimated step (residual patching, both layers x three positions) on tiny-llama, verified."""
    return document("tiny-llama", pin=revision("tiny-llama"), steps=("block_output",), verify={"top": 1})


@pytest.fixture
def no_weights(monkeypatch):
    """Loading a model's weights fails: a compile-time refusal must not need them."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a compile-time refusal loaded weights")
    for cls in ("AutoModelForCausalLM", "AutoModel"):
        monkeypatch.setattr(getattr(transformers, cls), "from_pretrained", refuse)


def refused(raw: dict, error=CompileError, engine: str = "hooks"):
    with pytest.raises(error) as caught:
        cm.compile(cm.read(raw, path=V2 / "refused.causalab.json"), engine=engine, models=[MODELS], data=[DATA])
    return caught.value


def iv(raw: dict) -> dict:
    return raw["interventions"]["block_output"]


def _match(raw):
    iv(raw)["metrics"]["iia"] = {"kind": "match", "of": "logits", "expected": "cf_answer"}


def _sequence(raw):
    iv(raw)["metrics"]["ld"]["score"] = "sequence"


def _decode(raw):
    iv(raw)["decode"] = 2


def _outputs(raw):
    raw["steps"]["block_output"]["outputs"] = {"cf_values": "cf"}


def _inside_softmax(component):
    def edit(raw):
        raw["sites"]["block_output"].update(component=component, heads=[0])
    return edit


def _operand_from_written(raw):
    """The write at layer 1 takes layer 0's output read from the written (patched) model itself."""
    raw["sites"]["l0"] = {"component": "block_output", "layers": [0]}
    raw["sites"]["block_output"]["layers"] = [1]
    i = iv(raw)
    del i["reads"]["cf"]
    i["reads"]["src"] = {"site": "l0", "pos": -1, "model": "patched", "input": "base"}
    i["writes"]["w"].update(pos=-1, operand="src")


def _kl_from_base(raw):
    """KL(base run || patched run): 0 at the base, and so is its gradient."""
    i = iv(raw)
    i["reads"]["clean"] = {"site": "logits", "pos": -1, "model": "original", "input": "base"}
    i["metrics"]["kl"] = {"kind": "kl_div", "of": "logits", "reference": "clean"}


def _verify_metric(raw):
    raw["steps"]["block_output"]["estimate"]["verify"]["metric"] = "nope"


ESTIMATE = "interventions.block_output"
REFUSALS = {  # name: (edit, path, words the refusal must say)
    "match": (_match, f"{ESTIMATE}.metrics.iia.kind", ("no gradient", "logit_diff")),
    "sequence": (_sequence, f"{ESTIMATE}.metrics.ld.score", ("whole answer", 'leave "score" out')),
    "decode": (_decode, f"{ESTIMATE}.decode", ("cannot decode",)),
    "outputs": (_outputs, "steps.block_output.outputs", ("publishes no outputs",)),
    "query": (_inside_softmax("attention_query"), f"{ESTIMATE}.writes.w.site", ("softmax", "QK fix")),
    "key": (_inside_softmax("attention_key"), f"{ESTIMATE}.writes.w.site", ("softmax", "QK fix")),
    "operand": (_operand_from_written, f"{ESTIMATE}.writes.w.operand", ("'src'", "written model", "original")),
    "kl_from_base": (_kl_from_base, f"{ESTIMATE}.metrics.kl.reference", ("minimum", "gradient is 0", "logit_diff")),
    "verify_metric": (_verify_metric, "steps.block_output.estimate.verify.metric", ("'nope'", "['ld']")),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_what_an_estimate_cannot_stand_for_is_refused_at_compile_time(no_weights, name):
    edit, path, words = REFUSALS[name]
    raw = base()
    edit(raw)
    err = refused(raw, engine="nnterp" if name in ("query", "key") else "hooks")
    assert err.path == path, str(err)
    assert err.fix and all(w in str(err) for w in words), str(err)
    # The same document without "estimate" compiles: the refusal is the estimate's, not the experiment's.
    del raw["steps"]["block_output"]["estimate"]
    cm.compile(cm.read(raw, path=V2 / "exact.causalab.json"), engine="nnterp", models=[MODELS], data=[DATA])


def test_an_estimate_in_a_document_that_trains_is_refused(no_weights):
    raw = json.loads((V2 / "das.causalab.json").read_text())
    raw["steps"]["score"]["estimate"] = {"by": "attribution"}
    err = refused(raw)
    assert err.path == "steps.score.estimate" and "fit step" in err.problem, str(err)


def test_spearman_on_a_result_no_step_estimates_is_refused(no_weights):
    raw = base()
    del raw["steps"]["block_output"]["estimate"]
    raw["header"]["expect"] = [{"result": "ld", "mean": {"<": 100}}, {"result": "ld", "spearman": {">=": 0.5}}]
    err = refused(raw, DocumentError)
    assert err.path == "header.expect.1.spearman" and "no step estimates" in err.problem, str(err)
    # estimated but not verified: nothing to hold spearman to either
    raw = base()
    del raw["steps"]["block_output"]["estimate"]["verify"]
    raw["header"]["expect"] = [{"result": "ld", "recall": {">=": 0.5}}]
    assert refused(raw, DocumentError).path == "header.expect.0.recall"
    # a step named: the one it names must estimate and verify the result (another step that does is not it)
    raw = base()
    assert "clean" in raw["steps"] and "estimate" not in raw["steps"]["clean"]
    raw["header"]["expect"] = [{"result": "ld", "step": "clean", "error": {"<=": 50}}]
    err = refused(raw, DocumentError)
    assert err.path == "header.expect.0.error" and "'clean'" in err.problem, str(err)


def test_the_cli_prints_a_refusal_without_a_traceback_and_writes_nothing(tmp_path):
    raw = base()
    _match(raw)
    doc = tmp_path / "match.causalab.json"
    doc.write_text(json.dumps(raw))
    out = tmp_path / "out"
    done = subprocess.run([str(CLI), "run", str(doc), "--out", str(out), "--models", str(MODELS),
                           "--data", str(DATA), "--quiet"], capture_output=True, text=True, timeout=300)
    text = done.stdout + done.stderr
    assert done.returncode != 0, text
    assert "interventions.block_output.metrics.iia.kind" in text and "logit_diff" in text, text
    assert "Traceback" not in text, text
    assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))


# --- expectations through the pytest plugin -----------------------------------------------------

def _plugin_document(tester, threshold: float) -> dict:
    raw = document("tiny-llama", pin=revision("tiny-llama"), steps=("block_output",), verify={"all": True})
    # "ld" is scored by two steps here (clean, block_output): the expectation names the estimated one
    raw["header"]["expect"] = [{"result": "ld", "step": "block_output", "spearman": {">=": threshold}}]
    (tester.path / "estimated.causalab.json").write_text(json.dumps(raw, indent=1))
    return raw


def test_the_plugin_holds_spearman(tester):
    _plugin_document(tester, 0.5)
    tester.runpytest("--causalab-engine=hooks").assert_outcomes(passed=6, warnings=6)  # 6 baselines written


def test_the_plugin_fails_an_unmet_spearman_with_its_row(tester, engines):
    raw = _plugin_document(tester, 1.01)
    run = cm.run(cm.read(raw, path=V2 / "estimated.causalab.json"), loaded=engines(raw, "hooks", document=V2 / "x"))
    got = run.point("layer=1,pos=-1").result("ld", step="block_output").verification["spearman"]
    assert 0.5 < got <= 1  # the premise: a real figure, below the threshold
    result = tester.runpytest("--causalab-engine=hooks")
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines([
        f"1 of 1 checks failed on hooks: ld spearman got {got:.6g}, expected >= 1.01",
        "point * result  aggregate  expected/baseline  got * difference",
        f"layer=1,pos=-1  ld      spearman   >= 1.01            {got:.6g}* {got - 1.01:.6g}*"])
    assert "Traceback" not in result.stdout.str()

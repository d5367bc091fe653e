"""Anchored positions inside a run, on both engines: where each op acted, what a row without
its anchor does to a write and to a read, and the refusals of shared/spec/positions.md.

The expected windows are computed here from the tokenizer alone (the prompt encoded up to
the end of the anchor), and the expected numbers from tiny-llama loaded with
``transformers`` and patched with plain ``register_forward_hook`` on a batch left padded
by hand — none of this package's tokenization, positions, ops or engines.
"""
from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from paths import DATA, V2
from reference import answer_id, padded

import causalab_mini as cm
from causalab_mini.document import read as front
from causalab_mini.engine import steps
from causalab_mini.errors import CompileError, EngineError
from causalab_mini.ops import locate
from causalab_mini.outputs.write import write
from causalab_mini.plan import compile as compiler
from causalab_mini.plan.plan import Observe
from causalab_mini.shapes import Where

transformers = pytest.importorskip("transformers")

ENTITY = V2 / "entity_patch.causalab.json"
PATCHING = V2 / "patching.causalab.json"
ROWS = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines() if line.strip()]
ENGINES = ("hooks", "nnterp")
TOL = 1e-5
SKIP_SENTENCE = ("A read may skip a row; a write may not — writing nothing somewhere is not an "
                 "intervention, and the row would score as if one had happened")


@pytest.fixture(scope="module")
def tiny_llama(engines):
    """engine name -> that engine on tiny-llama, the model of every document here (the session's, shared)."""
    return lambda name: engines(ENTITY, name)


@pytest.fixture(scope="module")
def hf(hf_model):
    """tiny-llama as a plain transformers (model, tokenizer): the session's shared load, hooks removed after use."""
    return hf_model("tiny-llama")


# --- the independent side ------------------------------------------------------------------------

def last_of(tok, text: str, value: str, width: int) -> int:
    """Where the last token of ``value`` sits in ``text``'s row of a batch left padded to ``width``."""
    own = tok(text)["input_ids"]
    upto = tok(text[: text.index(value) + len(value)])["input_ids"]
    assert own[: len(upto)] == upto
    return width - len(own) + len(upto) - 1


def piece(tok, text: str, k: int, width: int) -> str:
    """The text of the token at padded index ``k`` of ``text``'s row, as it reads in the prompt:
    the decoded content up to and including it, less the decoded content before it."""
    own = tok(text)["input_ids"]
    bos = len(tok("")["input_ids"])
    j = k - (width - len(own))  # index in the row's own ids
    return tok.decode(own[bos:j + 1])[len(tok.decode(own[bos:j])):]


def width_of(tok, texts) -> int:
    return max(len(tok(t)["input_ids"]) for t in texts)


def hand_logits(hf, base, cf=None, read_at=None, write_at=None, logits_at=None) -> torch.Tensor:
    """lm_head logits of ``base`` at ``logits_at[r]`` (default: the last token); when ``cf`` is
    given, layer 0's output at ``write_at[r]`` replaced by ``cf``'s at ``read_at[r]``."""
    model, tok = hf
    layer = model.model.layers[0]
    rows = torch.arange(len(base))

    def batch(texts):
        ids, mask, positions = padded(tok, texts)
        return dict(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)

    seen = {}

    def read(_m, _a, output):
        hidden = output[0] if isinstance(output, tuple) else output
        seen["v"] = hidden[rows, torch.tensor(read_at)].detach().clone()

    def patch(_m, _a, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        hidden[rows, torch.tensor(write_at)] = seen["v"]
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    with torch.no_grad():
        if cf is not None:
            handle = layer.register_forward_hook(read)
            try:
                model(**batch(cf))
            finally:
                handle.remove()
            handle = layer.register_forward_hook(patch)
        else:
            handle = None
        try:
            logits = model(**batch(base)).logits
        finally:
            if handle is not None:
                handle.remove()
    at = torch.tensor(logits_at) if logits_at is not None else torch.full((len(base),), logits.shape[1] - 1)
    return logits[rows, at]


def metric_values(tok, logits, rows) -> dict:
    cf = torch.tensor([answer_id(tok, r["cf_answer"]) for r in rows])
    base = torch.tensor([answer_id(tok, r["base_answer"]) for r in rows])
    i = torch.arange(len(rows))
    return {"iia": (logits.argmax(-1) == cf).float().tolist(),
            "logit_diff": (logits[i, cf] - logits[i, base]).tolist()}


def close(got, expected, tol=TOL) -> bool:
    return len(got) == len(expected) and all(g is not None and abs(g - e) <= tol for g, e in zip(got, expected))


# --- a dataset and documents made here -----------------------------------------------------------

def write_data(root: Path, rows) -> Path:
    (root / "weekdays").mkdir(parents=True, exist_ok=True)
    (root / "weekdays" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def misanchored(tmp_path: Path) -> Path:
    """weekdays/train with row 1's base entity a weekday its prompt does not contain."""
    rows = copy.deepcopy(ROWS)
    assert "Wednesday" not in rows[1]["input"]
    rows[1]["entity"] = "Wednesday"
    return write_data(tmp_path / "data", rows)


def entity_doc(tmp_path: Path, name: str, edit=None) -> tuple[Path, dict]:
    raw = json.loads(ENTITY.read_text())
    if edit:
        edit(raw)
    path = tmp_path / f"{name}.causalab.json"
    path.write_text(json.dumps(raw, indent=1))
    return path, raw


def read_only(raw: dict) -> None:
    """No write: the un-patched model's logits read at the last token of the row's entity."""
    iv = raw["interventions"]["patching"]
    del iv["writes"], iv["models"]
    iv["reads"] = {"logits": {"site": "head", "pos": {"index": -1, "scope": {"variable": "entity"}},
                              "model": "original", "input": "base"}}
    raw["roles"] = {"base": raw["roles"]["base"]}
    raw["steps"]["score"]["rows"] = {"base": "weekdays/train"}


# --- entity_patch, as shipped ------------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_entity_patch_acts_on_each_rows_own_entity(tiny_llama, hf, engine, tmp_path):
    _, tok = hf
    plan = cm.run(ENTITY, loaded=tiny_llama(engine)).plan
    score = plan.steps["score"]
    assert isinstance(score, Observe)
    base = [r["input"] for r in ROWS]
    cf = [r["counterfactual_inputs"][0] for r in ROWS]
    wb, wc = width_of(tok, base), width_of(tok, cf)
    base_at = [last_of(tok, r["input"], r["entity"], wb) for r in ROWS]
    cf_at = [last_of(tok, r["counterfactual_inputs"][0], r["counterfactual_inputs_variables"][0]["entity"], wc)
             for r in ROWS]
    positions = score.results["positions"]
    assert set(positions) == {"v_cf", "patch", "logits"}
    for name in positions:
        assert positions[name]["reason"] == ("",) * len(ROWS)
    assert positions["patch"]["rows"] == tuple((k,) for k in base_at)
    assert positions["v_cf"]["rows"] == tuple((k,) for k in cf_at)
    assert positions["logits"]["rows"] == ((wb - 1,),) * len(ROWS)
    assert positions["patch"]["tokens"] == tuple(repr(piece(tok, t, k, wb)) for t, k in zip(base, base_at))
    assert positions["v_cf"]["tokens"] == tuple(repr(piece(tok, t, k, wc)) for t, k in zip(cf, cf_at))
    assert positions["logits"]["tokens"] == (repr(" is"),) * len(ROWS)
    # Where an entity is several pieces, the write (or the operand) lands on its last piece, not
    # its first; there is at least one such entity, so the anchor's "last" is exercised.
    split = 0
    for r, row in enumerate(ROWS):
        for name, word in (("patch", row["entity"]), ("v_cf", row["counterfactual_inputs_variables"][0]["entity"])):
            ids = tok(" " + word, add_special_tokens=False)["input_ids"]
            if len(ids) > 1:
                split += 1
                assert positions[name]["tokens"][r] == repr(tok.decode(ids[-1:])), (name, word)
    assert split
    assert score.results["eligible"] == {"iia": (True,) * 4, "logit_diff": (True,) * 4}

    # The numbers: the same swap written by hand at the same (independently found) indices.
    expected = metric_values(tok, hand_logits(hf, base, cf, read_at=cf_at, write_at=base_at), ROWS)
    assert score.results["iia"].tolist() == expected["iia"]
    assert close(score.results["logit_diff"].tolist(), expected["logit_diff"])
    # And it is not the last-token patch: the anchored window changes the numbers.
    last = metric_values(tok, hand_logits(hf, base, cf, read_at=[wc - 1] * 4, write_at=[wb - 1] * 4), ROWS)
    assert not close(last["logit_diff"], expected["logit_diff"])

    # On disk: every metric row says where its number was read — the logits read, not the entity.
    write(plan, tmp_path, plan.provenance)
    for name in ("iia", "logit_diff"):
        rows = json.loads((tmp_path / f"{name}.json").read_text())
        assert [r["example_id"] for r in rows] == [str(i) for i in range(len(ROWS))]
        for r in rows:
            assert r["eligible"] is True and r["value"] is not None
            assert r["positions"] == [wb - 1] and r["reason"] == "" and r["tokens"] == repr(" is")
        assert [r["value"] for r in rows] == score.results[name].tolist()




# --- a row whose anchor is not in its prompt ---------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_a_write_with_nothing_to_write_on_a_row_is_refused(tiny_llama, tmp_path, engine):
    data = misanchored(tmp_path)
    doc, raw = entity_doc(tmp_path, "entity")
    with pytest.raises(EngineError) as caught:
        cm.run(cm.read(raw, path=doc), loaded=tiny_llama(engine), data=[data])
    err = caught.value
    assert err.path == "patch"
    assert err.problem.startswith(f"write 'patch' has nothing to write on row(s) {{1: 'alignment_missing'}}. "
                                  f"{SKIP_SENTENCE}")
    assert "alignment_ambiguous" in err.fix  # each reason's fix is named


@pytest.mark.parametrize("engine", ENGINES)
def test_a_read_without_its_anchor_excludes_the_row(tiny_llama, hf, tmp_path, engine):
    _, tok = hf
    data = misanchored(tmp_path)
    doc, raw = entity_doc(tmp_path, "entity_read", edit=read_only)
    plan = cm.run(cm.read(raw, path=doc), loaded=tiny_llama(engine), data=[data]).plan
    score = plan.steps["score"]
    record = score.results["positions"]["logits"]
    assert record["reason"] == ("", locate.MISSING, "", "")
    assert record["rows"][1] == () and record["tokens"][1] == ""
    assert score.results["eligible"] == {"iia": (True, False, True, True), "logit_diff": (True, False, True, True)}

    kept = [0, 2, 3]
    base = [r["input"] for r in ROWS]
    wb = width_of(tok, base)
    at = [last_of(tok, r["input"], r["entity"], wb) for r in ROWS]
    assert [record["rows"][i] for i in kept] == [(at[i],) for i in kept]
    logits = hand_logits(hf, base, logits_at=at)[kept]
    expected = metric_values(tok, logits, [ROWS[i] for i in kept])
    assert score.results["iia"].tolist() == expected["iia"]
    assert close(score.results["logit_diff"].tolist(), expected["logit_diff"])

    out = tmp_path / "out"
    write(plan, out, plan.provenance)
    for name in ("iia", "logit_diff"):
        rows = json.loads((out / f"{name}.json").read_text())
        assert len(rows) == len(ROWS)  # the excluded row is still a row of the table
        excluded = rows[1]
        assert excluded["value"] is None and excluded["eligible"] is False
        assert excluded["reason"] == "alignment_missing"
        assert excluded["positions"] == [] and excluded["tokens"] == ""
        values = [rows[i]["value"] for i in kept]
        assert close(values, expected[name])
        assert [r["positions"] for r in (rows[i] for i in kept)] == [[at[i]] for i in kept]
        mean = sum(values) / len(values)
        assert abs(mean - sum(expected[name]) / len(kept)) <= TOL
        assert abs(score.results[name].mean().item() - mean) <= TOL  # the mean is over the kept rows

    # One row per batch: the excluded row's batch reads nothing at all, and the rest agree.
    alone = cm.run(cm.read(raw, path=doc), loaded=tiny_llama(engine), data=[data], batch_size=1).plan.steps["score"]
    assert alone.results["eligible"] == score.results["eligible"]
    assert close(alone.results["logit_diff"].tolist(), expected["logit_diff"])


# --- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_a_write_and_its_operand_of_different_lengths_are_refused(tiny_llama, hf, engine):
    _, tok = hf
    raw = json.loads(ENTITY.read_text())
    iv = raw["interventions"]["patching"]
    iv["writes"]["patch"]["pos"] = iv["reads"]["v_cf"]["pos"] = {"all": True, "scope": {"variable": "entity"}}
    with pytest.raises(EngineError) as caught:
        cm.run(cm.read(raw, path=ENTITY), loaded=tiny_llama(engine))

    def pieces(word):
        return len(tok(" " + word, add_special_tokens=False)["input_ids"])

    lengths = {i: (pieces(r["entity"]), pieces(r["counterfactual_inputs_variables"][0]["entity"]))
               for i, r in enumerate(ROWS)}
    differ = {i: f"{a} here, {b} in 'v_cf'" for i, (a, b) in lengths.items() if a != b}
    assert differ, "the data has entities of different token lengths"
    assert caught.value.path == "patch.operand"
    assert f"on row(s) {differ}" in caught.value.problem


def test_a_fixed_cut_no_row_fits_is_refused_at_compile_time(tiny_llama):
    raw = json.loads(ENTITY.read_text())
    raw["interventions"]["patching"]["writes"]["patch"]["pos"] = {"index": 40}
    with pytest.raises(CompileError) as caught:
        compiler.compile_plan(raw, document=ENTITY, facts=tiny_llama("hooks"))
    err = caught.value
    assert err.path == "interventions.patching.writes.patch.pos"
    assert "'patch'" in err.problem and "{index:40}" in err.problem
    assert "does not fit row(s) [0, 1, 2, 3]" in err.problem


@pytest.mark.parametrize("engine", ENGINES)
def test_a_fixed_cut_that_does_not_fit_is_refused_where_it_is_resolved(tiny_llama, engine):
    # Past the compiler (a plan made elsewhere, a skewed tokenizer): the run refuses it too.
    eng = tiny_llama(engine)
    plan = compiler.compile_plan(front.read(PATCHING), document=PATCHING, facts=eng)
    forwards = plan.steps["score"].forwards
    target = next(f for f in forwards if f.writes)
    op = target.writes[0]
    moved = replace(op, where=Where(index=40))
    taps = tuple(replace(t, writes=tuple(moved if w is op else w for w in t.writes)) for t in target.taps)
    bad = tuple(replace(f, taps=taps) if f is target else f for f in forwards)
    with pytest.raises(EngineError) as caught:
        steps.resolve(eng, bad)
    err = caught.value
    assert err.path == op.name
    assert "{index:40}" in err.problem and "row(s) [0, 1, 2, 3]" in err.problem
    assert locate.OUTSIDE in err.problem


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tokenizer_skew_is_refused_before_any_text_is_searched(tiny_llama, engine):
    eng = tiny_llama(engine)
    plan = compiler.compile_plan(front.read(ENTITY), document=ENTITY, facts=eng)
    forwards = plan.steps["score"].forwards
    resolved, record = steps.resolve(eng, forwards)  # as compiled: agrees
    assert record is not None
    first = forwards[0]
    assert first.sample == eng.tokenizer.decode([t for t, m in zip(first.ids[0], first.mask[0]) if m])
    skewed = replace(first, sample=first.sample.replace("Saturday", "Caturday"))
    assert skewed.sample != first.sample
    with pytest.raises(EngineError) as caught:
        steps.resolve(eng, (skewed, *forwards[1:]))
    assert repr(first.sample) in caught.value.problem and repr(skewed.sample) in caught.value.problem
    assert "tokenizer" in caught.value.fix


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pass_of_bare_integers_records_no_positions(tiny_llama, engine, tmp_path):
    plan = cm.run(PATCHING, loaded=tiny_llama(engine)).plan
    score = plan.steps["score"]
    assert all(op.where.fixed for f in score.forwards for op in (*f.reads, *f.writes))
    assert "positions" not in score.results
    assert score.results["eligible"] == {"iia": (True,) * 4, "logit_diff": (True,) * 4}
    write(plan, tmp_path, plan.provenance)
    for name in ("iia", "logit_diff"):
        for row in json.loads((tmp_path / f"{name}.json").read_text()):
            assert row["positions"] is None and row["reason"] == "" and "tokens" not in row


def test_the_run_and_the_compiler_report_the_same_prompt_lengths(tiny_llama):
    eng = tiny_llama("hooks")
    raw = json.loads(PATCHING.read_text())
    raw["interventions"]["patching"]["writes"]["patch"]["pos"] = 40
    with pytest.raises(CompileError) as compiled:
        compiler.compile_plan(raw, document=PATCHING, facts=eng)
    plan = compiler.compile_plan(front.read(PATCHING), document=PATCHING, facts=eng)
    forwards = plan.steps["score"].forwards
    target = next(f for f in forwards if f.writes)
    taps = tuple(replace(t, writes=tuple(replace(w, where=Where(index=40)) for w in t.writes)) for t in target.taps)
    with pytest.raises(EngineError) as ran:
        steps.resolve(eng, tuple(replace(f, taps=taps) if f is target else f for f in forwards))
    tok = eng.tokenizer
    bos = len(tok("")["input_ids"])
    content = sorted({len(tok(r["input"])["input_ids"]) - bos for r in ROWS})
    for refusal in (compiled.value, ran.value):
        assert f"their prompts are {content} token(s)" in refusal.problem
        assert "cut_outside_scope" in refusal.problem and "'patch'" in refusal.problem

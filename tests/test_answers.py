"""What a metric scores, per row, and the rows it must not score: answers that share a token.

Every expectation here is computed from the tokenizer in the test (encode "a " + word, take
the new ids), never typed in: which words collide differs by tokenizer, and the fixtures
may be rebuilt.
"""
from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from causalab_mini import cli
from causalab_mini.errors import CompileError
from causalab_mini.plan import compile as compiler
from paths import DATA, MODELS
from samples import patching_document

MODEL_KEYS = ("tiny-llama", "tiny-gpt2", "tiny-gemma2")
WORDS = ("Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May "
         "June July August September October November December Alice Alexander Bob Robert").split()
ROWS = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines() if line.strip()]


def pieces(tok, word: str) -> list[int]:
    head = tok("a", add_special_tokens=False)["input_ids"]
    return tok("a " + word, add_special_tokens=False)["input_ids"][len(head):]


def pairs(tok):
    """(a pair of different words whose first tokens are one id, a pair whose first tokens differ)."""
    first = {w: pieces(tok, w)[0] for w in WORDS}
    shared = next((a, b) for a, b in itertools.combinations(WORDS, 2) if first[a] == first[b])
    apart = next((a, b) for a, b in itertools.combinations(WORDS, 2) if first[a] != first[b])
    return shared, apart


def dataset(tmp_path: Path, answers: list[tuple[str, str]]) -> Path:
    """weekdays/train with each row's (cf_answer, base_answer) replaced, in a data root of its own."""
    rows = []
    for i, (cf, base) in enumerate(answers):
        row = copy.deepcopy(ROWS[i % len(ROWS)])
        row.update(cf_answer=" " + cf, label=" " + cf, base_answer=" " + base, answer=" " + base)
        rows.append(row)
    folder = tmp_path / "data" / "weekdays"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path / "data"


def document(model: str) -> dict:
    raw = patching_document()
    raw["model"]["key"] = model
    return raw


@pytest.mark.parametrize("model", MODEL_KEYS)
def test_answers_that_share_a_token_are_excluded_by_name_at_compile_time(tmp_path, model):
    tok = AutoTokenizer.from_pretrained(MODELS / model)
    (s1, s2), (a1, a2) = pairs(tok)
    data = dataset(tmp_path, [(a1, a2), (s1, s2), (a2, a1), (s2, s1)])
    plan = compiler.compile_plan(document(model), models=[MODELS], data=[data])
    score = plan.steps["score"]
    metrics = {m.name: m for m in score.metrics}
    for name in ("logit_diff", "iia"):  # the match is held apart from the logit_diff's other answer
        m = metrics[name]
        assert m.column_reasons == ("", "answers_share_token", "", "answers_share_token")
        assert m.column_eligible == (True, False, True, False)
        assert m.answers == ((" " + a1, " " + s1, " " + a2, " " + s2), (" " + a2, " " + s2, " " + a1, " " + s1))
    assert metrics["iia"].compared == (("expected", "cf_answer"), ("distinct_from", "base_answer"))
    token = tok.convert_ids_to_tokens(pieces(tok, s1)[0])
    text = documents_explain(plan)
    assert (f"metric 'logit_diff': 2 of 4 rows excluded, answers_share_token: example 1: ' {s1}' / ' {s2}' -> "
            f"{token!r}; example 3: ' {s2}' / ' {s1}' -> {token!r}") in text


def documents_explain(plan) -> str:
    from causalab_mini.plan.explain import explain
    return explain(plan)


@pytest.mark.parametrize("model", MODEL_KEYS)
def test_a_metric_whose_every_row_compares_a_token_with_itself_is_refused(tmp_path, model):
    tok = AutoTokenizer.from_pretrained(MODELS / model)
    (s1, s2), _ = pairs(tok)
    data = dataset(tmp_path, [(s1, s2), (s2, s1)])
    with pytest.raises(CompileError) as caught:
        compiler.compile_plan(document(model), models=[MODELS], data=[data])
    token = tok.convert_ids_to_tokens(pieces(tok, s1)[0])
    assert str(caught.value) == (
        f"interventions.patching.metrics.iia: every row's answers share their scored token (2 of 2: example 0: "
        f"' {s1}' / ' {s2}' -> {token!r}; example 1: ' {s2}' / ' {s1}' -> {token!r}): each row would compare a "
        "token with itself; use answers whose first tokens differ on this tokenizer (`causalab-mini explain "
        "--tokens` shows them), or score whole answers (\"score\": \"sequence\")")


def test_a_single_answer_metric_compares_nothing_unless_told(tmp_path):
    """token_prob of one answer has no second answer to collide with; ``distinct_from`` gives it one."""
    tok = AutoTokenizer.from_pretrained(MODELS / "tiny-llama")
    (s1, s2), (a1, a2) = pairs(tok)
    data = dataset(tmp_path, [(a1, a2), (s1, s2)])
    raw = document("tiny-llama")
    metrics = raw["interventions"]["patching"]["metrics"]
    metrics.clear()
    metrics["p"] = {"kind": "token_prob", "of": "logits", "token": "cf_answer"}
    metrics["p_apart"] = {"kind": "token_prob", "of": "logits", "token": "cf_answer", "distinct_from": "base_answer"}
    raw["steps"]["score"]["saves"] = [{"value": "p", "file_path": "p.json"}]
    plan = compiler.compile_plan(raw, models=[MODELS], data=[data])
    got = {m.name: m for m in plan.steps["score"].metrics}
    assert got["p"].column_reasons == ("", "") and got["p"].compared == (("token", "cf_answer"),)
    assert got["p_apart"].column_reasons == ("", "answers_share_token")
    assert got["p_apart"].contrast_from == "distinct_from"


def test_distinct_from_leaves_an_experiment_that_never_used_it_unchanged():
    from causalab_mini.document.spec import validate_spec

    raw = patching_document()
    before = validate_spec(raw).produced_by
    raw["interventions"]["patching"]["metrics"]["iia"]["distinct_from"] = "base_answer"
    assert validate_spec(raw).produced_by != before  # using it is another experiment
    del raw["interventions"]["patching"]["metrics"]["iia"]["distinct_from"]
    assert validate_spec(raw).produced_by == before


def test_excluded_rows_are_written_with_the_reason_and_both_answers(tmp_path, capsys):
    tok = AutoTokenizer.from_pretrained(MODELS / "tiny-gpt2")
    (s1, s2), (a1, a2) = pairs(tok)
    data = dataset(tmp_path, [(a1, a2), (s1, s2)])
    doc = tmp_path / "doc.causalab.json"
    doc.write_text(json.dumps(document("tiny-gpt2")))
    out = tmp_path / "out"
    assert cli.main(["run", str(doc), "--engine", "hooks", "--models", str(MODELS), "--data", str(data),
                     "--out", str(out), "--quiet"]) == 0
    for name, labels in (("logit_diff", ("a", "b")), ("iia", ("expected", "distinct_from"))):
        kept, excluded = json.loads((out / f"{name}.json").read_text())
        assert kept["eligible"] is True and kept["reason"] == "" and kept["value"] is not None
        assert (excluded["value"], excluded["eligible"], excluded["reason"]) == (None, False, "answers_share_token")
        token = tok.convert_ids_to_tokens(pieces(tok, s1)[0])
        assert {k: (v["text"], v["token"], v["tokens"]) for k, v in excluded["answers"].items()} == {
            labels[0]: (" " + s1, token, len(pieces(tok, s1))), labels[1]: (" " + s2, token, len(pieces(tok, s2)))}
    # The run says so after its files: a mean over one of two rows is read as such.
    err = capsys.readouterr().err
    assert "note: score/logit_diff: 1 of 2 rows excluded (answers_share_token)" in err
    assert "note: score/iia: 1 of 2 rows excluded (answers_share_token)" in err


@pytest.mark.parametrize("model", MODEL_KEYS)
def test_explain_tokens_shows_each_rows_tokens_positions_and_scored_answers(tmp_path, model, capsys):
    tok = AutoTokenizer.from_pretrained(MODELS / model)
    multi = next(w for w in WORDS if len(pieces(tok, w)) > 1)
    single = next(w for w in WORDS if len(pieces(tok, w)) == 1 and pieces(tok, w)[0] != pieces(tok, multi)[0])
    data = dataset(tmp_path, [(multi, single), (single, multi)])
    doc = tmp_path / "doc.causalab.json"
    doc.write_text(json.dumps(document(model)))
    assert cli.main(["explain", str(doc), "--tokens", "--rows", "2", "--models", str(MODELS),
                     "--data", str(data)]) == 0
    out = capsys.readouterr().out
    m, s = pieces(tok, multi), pieces(tok, single)
    shown = lambda ids: repr(tok.convert_ids_to_tokens(ids[0]))  # noqa: E731
    assert (f"row 0 (0): expected ' {multi}' -> {shown(m)} (1 of {len(m)} tokens); "
            f"distinct_from ' {single}' -> {shown(s)}") in out
    assert f"row 1 (1): a ' {single}' -> {shown(s)}; b ' {multi}' -> {shown(m)} (1 of {len(m)} tokens)" in out
    # Each row of the patched forward as tokens, the write and the read at its last one.
    prompt = ROWS[0]["input"]
    ids = tok(prompt)["input_ids"]
    special = len(tok("")["input_ids"])
    run = tok.convert_ids_to_tokens(ids[special:])
    lead = " ".join(repr(t) for t in tok.convert_ids_to_tokens(ids[:special]))
    tokens = " ".join(f"{i}:{t!r}" for i, t in enumerate(run))
    assert f"row 0 ({len(run)} tokens): {(lead + ' ') if lead else ''}{tokens}" in out
    assert f"write 'patch': {len(run) - 1} (-1) {run[-1]!r}" in out
    # logit_diff scores both answers (one of them several tokens on each row); the match only its expected
    assert "metric 'logit_diff': 2 of 2 rows scored on the first of their answer's several tokens" in out
    assert "metric 'iia': 1 of 2 rows scored on the first of their answer's several tokens" in out

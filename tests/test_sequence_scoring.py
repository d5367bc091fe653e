"""Whole-answer scoring (``"score": "sequence"``) held to a teacher-forced loop written here.

One document patches the residual stream leaving layer 0 at the prompt's last token with the
counterfactual prompt's value there, and scores the patched logits at the prompt's last token
with the four kinds that score whole answers (cross_entropy, token_prob, logit_diff, match), each
summed and per token (``"per_token": "mean"``), beside two first-token metrics. It runs through
``cm.run`` on both engines. The hand side is the raw Hugging Face model, one unpadded row at a
time: the counterfactual's layer-0 output at its last token taken by a forward hook, then the
prompt followed by the answer's tokens run with a hook writing that vector at the prompt's last
token only, and the log-softmax read at the positions that predict each answer token.

Answers: weekdays_full/train (one or two tokens a day name, ragged within a batch) and a small
dataset written here whose answers are phrases of one to nine tokens on every shipped tokenizer,
with one row whose two answers are the same and one whose answers share only their first token.
Models: tiny-llama (BOS), tiny-gpt2 (no BOS, absolute positions: a wrong position id moves its
logits), tiny-gemma2 (its own tokenizer and BOS id, final-logit soft cap), and a Gemma-2 checkpoint
built at test time (``families.build``; the soft cap is in the model's own logits, which is what
the hand side reads).

Then: batch windows and points at once give the values of one whole batch and of points run
alone; the write at -1 stays on the prompt's last token during the forced tokens (a loop that lets
it follow them gives other values, and the engines match the one that does not); the "scored on the
first of several tokens" note is made for first-token metrics and not for whole answers; and the
refusals a misused ``score`` gets.
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from paths import DATA, MODELS
from reference import hidden_of, with_hidden

import causalab_mini as cm
from causalab_mini.errors import CompileError, DocumentError
from causalab_mini.plan import show_tokens
from causalab_mini.plan.plan import Observe

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

ATOL, RTOL = 1e-5, 1e-4
# One run against another of other batch shapes: fp32 rounding only. A forced row's logits move
# by an ulp or two with the width of the batch it is padded in (the raw model's sdpa does the same
# when a row is padded wider: ~3e-6 on tiny-llama's logits), measured up to 1.9e-6 on values of 5
# to 10 — and a logit_diff is the difference of two such sums, so its error is theirs, not a
# fraction of its own (small) value. Hence an absolute tolerance of a few ulps at 8.
BATCH_ATOL, BATCH_RTOL = 5e-6, 0.0
ENGINES = ("hooks", "nnterp")
LAYERS = {"gpt2": "transformer.h", "llama": "model.layers", "gemma2": "model.layers"}
COLUMNS = ("cf_answer", "base_answer")
WEEKDAYS = "weekdays_full/train"
PHRASES = "phrases/train"
AGGS = ("sum", "mean")
# (the model case, the dataset): tiny-llama on weekdays_full (ragged one- and two-token answers in
# one batch), every model on the phrases.
CASES = [("tiny-llama", WEEKDAYS), ("tiny-llama", PHRASES), ("tiny-gpt2", WEEKDAYS), ("tiny-gpt2", PHRASES),
         ("tiny-gemma2", PHRASES), ("family:gemma2", PHRASES)]

# Prompts of the weekdays shape; answers from one word to a phrase of up to nine tokens.
PHRASE_ROWS = [
    ("Monday", "Sunday", " Tuesday", " Monday again"),
    ("Tuesday", "Friday", " Wednesday, then Thursday", " Saturday night"),
    ("Wednesday", "Sunday", " Thursday", " the day after Monday"),
    ("Monday", "Monday", " Tuesday morning", " Tuesday"),  # the same first token, other answers
    ("Saturday", "Saturday", " Sunday", " Sunday"),  # the same answer: nothing to compare
    ("Friday", "Thursday", " Saturday night", " Friday evening"),
    ("Wednesday", "Thursday", " Thursday", " Friday"),
    ("Sunday", "Tuesday", " Monday", " Wednesday"),
]


def _phrase_row(base_day: str, cf_day: str, base_answer: str, cf_answer: str) -> dict:
    return {"input": f"If today is {base_day}, tomorrow is",
            "counterfactual_inputs": [f"If today is {cf_day}, tomorrow is"],
            "base_answer": base_answer, "cf_answer": cf_answer}


# --------------------------------------------------------------------------- the document

def _metrics() -> dict:
    metrics = {
        "first_ce": {"kind": "cross_entropy", "of": "logits", "target": "cf_answer"},
        "first_ld": {"kind": "logit_diff", "of": "logits", "a": "cf_answer", "b": "base_answer"},
    }
    for agg in AGGS:
        whole = {"score": "sequence", **({"per_token": "mean"} if agg == "mean" else {})}
        metrics[f"ce_{agg}"] = {"kind": "cross_entropy", "of": "logits", "target": "cf_answer", **whole}
        metrics[f"tp_{agg}"] = {"kind": "token_prob", "of": "logits", "token": "cf_answer", **whole}
        metrics[f"ld_{agg}"] = {"kind": "logit_diff", "of": "logits", "a": "cf_answer", "b": "base_answer",
                                **whole}
        metrics[f"m_{agg}"] = {"kind": "match", "of": "logits", "expected": "cf_answer", **whole}
    return metrics


SEQUENCE = [f"{k}_{agg}" for agg in AGGS for k in ("ce", "tp", "ld", "m")]


def document(key: str, dataset: str, layers=(0,)) -> dict:
    return {
        "header": {"description": "whole answers scored after a residual patch at the prompt's last token"},
        "model": {"key": key, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"component": "block_output", "layers": list(layers)},
                  "head": {"component": "logits"}},
        "interventions": {"patching": {
            "reads": {
                "v_cf": {"site": "target", "pos": -1, "model": "original", "input": "counterfactual"},
                "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"},
            },
            "writes": {"patch": {"site": "target", "pos": -1, "mechanism": "swap", "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": _metrics(),
        }},
        "steps": {"score": {"kind": "observe", "interventions": "patching",
                            "rows": {"base": dataset, "counterfactual": dataset},
                            "saves": [{"value": "ce_sum", "file_path": "ce_sum.json"}]}},
    }


# --------------------------------------------------------------------------- the hand side

def answer_pieces(tok, text: str) -> list[int]:
    """The answer said after a word: encode "a " + it without specials, take the new ids (the
    project's space_prefixed rule, spelled out here)."""
    head = tok("a", add_special_tokens=False)["input_ids"]
    full = tok("a " + text.strip(), add_special_tokens=False)["input_ids"]
    assert full[: len(head)] == head and len(full) > len(head), text
    return list(full[len(head):])


class Hand:
    """The raw model, one unpadded row at a time: per answer column, per row, the float64
    log-probability of each forced answer token and whether it is the argmax there.

    ``follow``: the patch is also written at every forced token (what the engine must NOT do)."""

    def __init__(self, model, tok, rows: list[dict], follow: bool = False):
        self.model, self.tok, self.rows = model, tok, rows
        self.layer0 = model.get_submodule(f"{LAYERS[model.config.model_type]}.0")
        self.pieces = {c: [answer_pieces(tok, r[c]) for r in rows] for c in COLUMNS}
        self.logp: dict = {c: [] for c in COLUMNS}
        self.hits: dict = {c: [] for c in COLUMNS}
        for i, r in enumerate(rows):
            v = self._last_layer0(tok(r["counterfactual_inputs"][0])["input_ids"])
            prompt = tok(r["input"])["input_ids"]
            for c in COLUMNS:
                answer = self.pieces[c][i]
                logits = self._forced(prompt, answer, v, follow)
                at = logits[len(prompt) - 1: len(prompt) - 1 + len(answer)].double()
                ids = torch.tensor(answer)
                self.logp[c].append(at.log_softmax(-1).gather(-1, ids[:, None])[:, 0])
                self.hits[c].append(at.argmax(-1) == ids)

    def _last_layer0(self, ids) -> torch.Tensor:
        kept = {}

        def hook(module, args, output):
            kept["v"] = hidden_of(output)[0, -1].clone()

        handle = self.layer0.register_forward_hook(hook)
        try:
            with torch.no_grad():
                self.model(input_ids=torch.tensor([ids]), use_cache=False)
        finally:
            handle.remove()
        return kept["v"]

    def _forced(self, prompt, answer, v, follow: bool) -> torch.Tensor:
        last = len(prompt) - 1

        def hook(module, args, output):
            h = hidden_of(output).clone()
            h[0, last] = v
            if follow:
                h[0, last + 1:] = v
            return with_hidden(output, h)

        handle = self.layer0.register_forward_hook(hook)
        try:
            with torch.no_grad():
                return self.model(input_ids=torch.tensor([list(prompt) + list(answer)]), use_cache=False).logits[0]
        finally:
            handle.remove()

    def values(self, name: str) -> list:
        """Per row, the metric's value (None where the row is left out: identical whole answers)."""
        kind, agg = name.split("_")
        reduce = (lambda x: x.sum().item()) if agg == "sum" else (lambda x: x.mean().item())
        out = []
        for i in range(len(self.rows)):
            a, b = self.logp["cf_answer"][i], self.logp["base_answer"][i]
            identical = self.pieces["cf_answer"][i] == self.pieces["base_answer"][i]
            if kind == "ce":
                out.append(-reduce(a))
            elif kind == "tp":
                out.append(math.exp(reduce(a)))
            elif kind == "ld":
                out.append(None if identical else reduce(a) - reduce(b))
            else:  # match: held apart from base_answer (the logit_diff's other answer)
                hits = self.hits["cf_answer"][i].double()
                out.append(None if identical else (hits.min() if agg == "sum" else hits.mean()).item())
        return out


# --------------------------------------------------------------------------- fixtures: each model once

@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sequence_data")
    (root / "phrases").mkdir()
    (root / "phrases" / "train.jsonl").write_text(
        "".join(json.dumps(_phrase_row(*r)) + "\n" for r in PHRASE_ROWS))
    # The phrases with a null answer on two rows: one in the metrics' own column, one in the other.
    nulls = [_phrase_row(*r) for r in PHRASE_ROWS]
    nulls[1]["cf_answer"] = None
    nulls[2]["base_answer"] = None
    (root / "nulls").mkdir()
    (root / "nulls" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in nulls))
    # Every row's two answers the same phrase.
    (root / "same").mkdir()
    (root / "same" / "train.jsonl").write_text("".join(
        json.dumps(_phrase_row(day, day, " Tuesday morning", " Tuesday morning")) + "\n"
        for day in ("Monday", "Friday")))
    return root


def _rows(dataset: str, data_root: Path) -> list[dict]:
    root = data_root if dataset == PHRASES else DATA
    return [json.loads(line) for line in (root / f"{dataset}.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def raw_models(folders, hf_model):
    """(model, tokenizer) of a case: the session's shipped ones, a family checkpoint loaded once here."""
    cache: dict = {}

    def get(case: str):
        if case not in cache:
            if case.startswith("family:"):
                from transformers import AutoModelForCausalLM, AutoTokenizer

                key, root = folders(case)
                cache[case] = (AutoModelForCausalLM.from_pretrained(root / key, dtype=torch.float32).eval(),
                               AutoTokenizer.from_pretrained(root / key))
            else:
                cache[case] = hf_model(case)
        return cache[case]
    yield get
    cache.clear()


@pytest.fixture(scope="module")
def hands(raw_models, data_root):
    cache: dict = {}

    def get(case: str, dataset: str, follow: bool = False) -> Hand:
        if (case, dataset, follow) not in cache:
            model, tok = raw_models(case)
            cache[case, dataset, follow] = Hand(model, tok, _rows(dataset, data_root), follow=follow)
        return cache[case, dataset, follow]
    yield get
    cache.clear()


@pytest.fixture(scope="module")
def runs(folders, engines, data_root):
    """``runs(case, dataset, engine, **options)``: the Run of the document, each made once."""
    cache: dict = {}

    def get(case: str, dataset: str, engine: str, layers=(0,), **options):
        tag = (case, dataset, engine, json.dumps(layers), json.dumps(options, sort_keys=True))
        if tag not in cache:
            key, root = folders(case)
            raw = document(key, dataset, layers)
            loaded = engines({"key": key, "dtype": "fp32"}, engine, models=(root,))
            cache[tag] = cm.run(raw, loaded=loaded, models=[root], data=[DATA, data_root], **options)
        return cache[tag]
    yield get
    cache.clear()


def _values(result) -> list:
    return [row["value"] for row in result.rows]


def _close(got: list, want: list, what: str, atol: float = ATOL, rtol: float = RTOL) -> None:
    assert [g is None for g in got] == [w is None for w in want], f"{what}: rows left out differ: {got} {want}"
    pairs = [(g, w) for g, w in zip(got, want) if w is not None]
    torch.testing.assert_close(torch.tensor([g for g, _ in pairs], dtype=torch.float64),
                               torch.tensor([w for _, w in pairs], dtype=torch.float64),
                               atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


# --------------------------------------------------------------------------- 1. the hand loop, every kind

@pytest.mark.parametrize("case,dataset", CASES, ids=[f"{c}-{d.split('/')[0]}" for c, d in CASES])
def test_whole_answers_equal_the_hand_teacher_forced_loop_on_both_engines(case, dataset, hands, runs):
    hand = hands(case, dataset)
    n = len(hand.rows)
    lengths = [len(p) for p in hand.pieces["cf_answer"] + hand.pieces["base_answer"]]
    # Ragged answers in one batch: one-token rows and longer ones side by side.
    assert min(lengths) == 1 and max(lengths) >= 2, lengths
    if dataset == PHRASES:
        assert max(lengths) >= 5, lengths
    points = {engine: runs(case, dataset, engine).points[0] for engine in ENGINES}
    for engine, point in points.items():
        for name in SEQUENCE:
            result = point.result(name)
            want = hand.values(name)
            _close(_values(result), want, f"{case} {dataset} {engine} {name}")
            for row, w in zip(result.rows, want):
                assert row["eligible"] == (w is not None), row
                assert row["reason"] == ("" if w is not None else "answers_identical"), row
            kind, agg = name.split("_")
            assert result.rows[0]["estimand_version"].endswith(f"+sequence_{agg}"), result.rows[0]
            assert result.rows[0]["unit"] == {"ce": "nats", "tp": "probability", "ld": "nats",
                                              "m": "fraction"}[kind]
        # The answers scored are the hand side's, token for token (count and first piece).
        labels = {"ld_sum": (("a", "cf_answer"), ("b", "base_answer")), "ce_sum": (("target", "cf_answer"),)}
        for name, pairs in labels.items():
            for i, row in enumerate(point.result(name).rows):
                for label, column in pairs:
                    said = row["answers"][label]
                    assert said["column"] == column and said["text"] == hand.rows[i][column]
                    assert said["tokens"] == len(hand.pieces[column][i]), (name, i, said)
                    assert said["token"] == hand.tok.convert_ids_to_tokens(hand.pieces[column][i][0])
    # Not vacuous: a one-token answer's whole is its first token, and a longer answer is no more
    # likely than its first token alone (less likely on some row).
    hooks = points["hooks"]
    multi = [i for i, p in enumerate(hand.pieces["cf_answer"]) if len(p) > 1]
    assert multi, "no multi-token cf_answer"
    ce, ce_mean, first = (_values(hooks.result(k)) for k in ("ce_sum", "ce_mean", "first_ce"))
    for i in range(n):
        if i in multi:
            assert ce[i] >= first[i] - ATOL, (i, ce[i], first[i])
        else:
            assert ce[i] == pytest.approx(first[i], abs=ATOL) and ce_mean[i] == pytest.approx(ce[i], abs=ATOL)
    if dataset == PHRASES:  # weekdays' second pieces ("esday") are near certain after the first
        assert any(ce[i] > first[i] + 1e-2 for i in multi), (ce, first)
    # The two engines agree with each other, row for row, bit for bit (the same model call).
    for name in SEQUENCE:
        assert points["hooks"].result(name).rows == points["nnterp"].result(name).rows, name


def test_the_phrases_rows_are_left_out_by_whole_answers_not_first_tokens(runs):
    """Row 3's answers share their first token only: a first-token logit_diff leaves it out, a
    whole-answer one scores it. Row 4's are the same answer: left out of both, for its own reason."""
    point = runs("tiny-llama", PHRASES, "hooks").points[0]
    first = point.result("first_ld").rows
    whole = point.result("ld_sum").rows
    assert [r["reason"] for r in first][3:5] == ["answers_share_token", "answers_share_token"]
    assert [r["reason"] for r in whole][3:5] == ["", "answers_identical"]
    assert whole[3]["value"] is not None and whole[4]["value"] is None
    assert all(r["reason"] == "" for r in point.result("ce_sum").rows)  # one answer: nothing to collide


def test_a_null_answer_leaves_its_row_out_and_the_others_unchanged(runs):
    """Row 1 has no cf_answer (every metric's own column): out of all of them, no_answer. Row 2 has
    no base_answer: out of logit_diff (its own column b); a match only holds its answer apart from
    base_answer, so it scores the row. The other rows keep the full dataset's values (their forced
    batch is padded to other widths: rounding only)."""
    for engine in ENGINES:
        full = runs("tiny-llama", PHRASES, engine).points[0]
        holed = runs("tiny-llama", "nulls/train", engine).points[0]
        for name in SEQUENCE:
            rows = holed.result(name).rows
            out = {1} | ({2} if name.startswith("ld") else set())
            assert {i for i, r in enumerate(rows) if r["reason"] == "no_answer"} == out, (name, rows)
            want = [None if i in out else v for i, v in enumerate(_values(full.result(name)))]
            _close(_values(holed.result(name)), want, f"{engine} {name} with nulls", atol=BATCH_ATOL, rtol=BATCH_RTOL)


# --------------------------------------------------------------------------- 2. batch windows, points at once

@pytest.mark.parametrize("engine", ENGINES)
def test_batch_windows_give_the_whole_batchs_values(engine, runs):
    whole = runs("tiny-llama", WEEKDAYS, engine).points[0]
    windowed = runs("tiny-llama", WEEKDAYS, engine, batch_size=3).points[0]
    for name in SEQUENCE:
        _close(_values(windowed.result(name)), _values(whole.result(name)), f"{engine} batch_size=3 {name}",
               atol=BATCH_ATOL, rtol=BATCH_RTOL)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_swept_document_at_once_gives_each_point_run_alone(engine, runs, folders, engines, data_root):
    key, root = folders("tiny-llama")
    raw = document(key, WEEKDAYS, layers=({"sweep": [0, 1]},))
    doc = cm.read(raw)
    names = [p.name for p in doc.points]
    assert len(names) == 2
    loaded = engines({"key": key, "dtype": "fp32"}, engine, models=(root,))
    options = dict(loaded=loaded, models=[root], data=[DATA, data_root])
    together = cm.run(raw, at_once=2, share=True, **options)
    windowed = cm.run(raw, at_once=2, share=True, batch_size=4, **options)
    alone = {name: cm.run(doc.point(name), **options).points[0] for name in names}
    assert [p.name for p in together.points] == names
    for ran, what in ((together, "at_once=2"), (windowed, "at_once=2 batch_size=4")):
        for point in ran.points:
            for name in SEQUENCE:
                _close(_values(point.result(name)), _values(alone[point.name].result(name)),
                       f"{engine} {what} {point.name} {name}", atol=BATCH_ATOL, rtol=BATCH_RTOL)
    # The point at layer 0 is the unswept document; layer 1's patch gives other values.
    plain = runs("tiny-llama", WEEKDAYS, engine).points[0]
    at0, at1 = (alone[n] for n in names)
    _close(_values(at0.result("ce_sum")), _values(plain.result("ce_sum")), "layer 0 point",
           atol=BATCH_ATOL, rtol=BATCH_RTOL)
    assert _values(at1.result("ce_sum")) != _values(at0.result("ce_sum"))


# --------------------------------------------------------------------------- 3. the write stays on the prompt

@pytest.mark.parametrize("case", ["tiny-llama", "tiny-gpt2"])
def test_a_write_at_minus_one_does_not_follow_the_forced_tokens(case, hands, runs):
    prompt_only = hands(case, PHRASES)
    following = hands(case, PHRASES, follow=True)
    multi = [i for i, p in enumerate(prompt_only.pieces["cf_answer"]) if len(p) > 1]
    assert len(multi) >= 3
    for engine in ENGINES:
        point = runs(case, PHRASES, engine).points[0]
        for name in ("ce_sum", "ce_mean", "ld_sum", "ld_mean"):
            got = _values(point.result(name))
            _close(got, prompt_only.values(name), f"{engine} {name} (prompt only)")
            followed = following.values(name)
            # Where the two loops differ (answers of several tokens), the engine is not the other one.
            apart = [i for i in multi if followed[i] is not None
                     and abs(followed[i] - prompt_only.values(name)[i]) > 1e-2]
            assert apart, (name, followed, prompt_only.values(name))
            assert all(abs(got[i] - followed[i]) > 1e-3 for i in apart), (engine, name)
    # One-token answers read only the prompt's last position: the two loops agree there.
    single = [i for i, p in enumerate(prompt_only.pieces["cf_answer"]) if len(p) == 1]
    _close([prompt_only.values("ce_sum")[i] for i in single], [following.values("ce_sum")[i] for i in single],
           "one-token rows", atol=1e-6, rtol=0)


# --------------------------------------------------------------------------- 4. the first-token note

def _observe(run) -> Observe:
    (step,) = [s for _, s in run.plan.walk() if isinstance(s, Observe)]
    return step


def test_first_token_metrics_note_their_partial_rows_and_whole_answers_none(runs, hands):
    hand = hands("tiny-llama", WEEKDAYS)
    run = runs("tiny-llama", WEEKDAYS, "hooks")
    metrics = {m.name: m for m in _observe(run).metrics}
    n = len(hand.rows)
    cf_multi = sum(1 for p in hand.pieces["cf_answer"] if len(p) > 1)
    either_multi = sum(1 for a, b in zip(hand.pieces["cf_answer"], hand.pieces["base_answer"])
                       if a[0] != b[0] and (len(a) > 1 or len(b) > 1))
    assert 0 < cf_multi < n and either_multi > cf_multi
    assert metrics["first_ce"].partial == cf_multi
    assert metrics["first_ld"].partial == either_multi
    for name in SEQUENCE:
        assert metrics[name].partial == 0, name
        assert metrics[name].sequence == name.split("_")[1]
    notes = show_tokens.notes(run.plan)
    assert f"note: score/first_ce: {cf_multi} of {n} rows scored on the first of several tokens" in notes, notes
    assert f"note: score/first_ld: {either_multi} of {n} rows scored on the first of several tokens" in notes, notes
    assert not [line for line in notes if any(f"/{name}:" in line for name in SEQUENCE)], notes
    # explain's summary of a metric says the same.
    ids = _observe(run).example_ids
    assert any("first of" in line for line in show_tokens.metric_summary(metrics["first_ce"], ids, ""))
    for name in SEQUENCE:
        assert not any("first of" in line for line in show_tokens.metric_summary(metrics[name], ids, "")), name


# --------------------------------------------------------------------------- 5. refusals

BASE = document("tiny-llama", WEEKDAYS)
MP = "interventions.patching.metrics"


def _with(name: str, metric: dict, reads: dict | None = None) -> dict:
    doc = copy.deepcopy(BASE)
    iv = doc["interventions"]["patching"]
    iv["reads"]["clean"] = {"site": "head", "pos": -1, "model": "original", "input": "base"}
    iv["reads"].update(reads or {})
    iv["metrics"][name] = metric
    return doc


# (the metric, the field refused, words of the problem)
REFUSALS = [
    pytest.param({"kind": "token_logit", "of": "logits", "token": "cf_answer", "score": "sequence"},
                 "score", "token_logit", id="token_logit"),
    pytest.param({"kind": "kl_div", "of": "logits", "reference": "clean", "score": "sequence"},
                 "score", "kl_div", id="kl_div"),
    pytest.param({"kind": "top_k", "of": "logits", "expected": "cf_answer", "params": {"k": 2}, "score": "sequence"},
                 "score", "top_k", id="top_k"),
    pytest.param({"kind": "cross_entropy", "of": "logits", "target": "cf_answer", "per_token": "mean"},
                 "per_token", "per_token", id="per_token-without-sequence"),
    pytest.param({"kind": "cross_entropy", "of": "logits", "target": "cf_answer", "per_token": "mean",
                  "score": "first_token"}, "per_token", "per_token", id="per_token-with-first_token"),
    pytest.param({"kind": "cross_entropy", "of": "logits_m2", "target": "cf_answer", "score": "sequence"},
                 "score", "{index:-2}", id="read-at-pos-minus-2"),
    pytest.param({"kind": "match", "of": "logits", "expected": "cf_answer", "distinct_from": "base_answer",
                  "score": "sequence"}, "distinct_from", "distinct_from", id="distinct_from"),
]
MINUS_2 = {"logits_m2": {"site": "head", "pos": -2, "model": "patched", "input": "base"}}


def _refusal(metric: dict) -> DocumentError:
    with pytest.raises(DocumentError) as caught:
        cm.read(_with("bad", metric, MINUS_2))
    return caught.value


@pytest.mark.parametrize("metric,field,problem", REFUSALS)
def test_a_misused_score_is_refused_with_a_fix(metric, field, problem):
    err = _refusal(metric)
    assert err.path in (f"{MP}.bad", f"{MP}.bad.{field}"), str(err)
    assert problem in err.problem, str(err)
    assert err.fix.strip(), f"no fix: {err}"


@pytest.mark.parametrize("metric,field,problem", REFUSALS)
def test_a_misused_score_is_refused_at_the_field(metric, field, problem):
    assert _refusal(metric).path == f"{MP}.bad.{field}"


def test_every_row_with_identical_whole_answers_is_refused_for_that(engines, data_root):
    raw = document("tiny-llama", "same/train")
    for first in ("first_ce", "first_ld"):  # a first-token logit_diff is refused for its shared token
        del raw["interventions"]["patching"]["metrics"][first]
    with pytest.raises(CompileError) as caught:
        cm.compile(raw, loaded=engines({"key": "tiny-llama", "dtype": "fp32"}, "hooks"), models=[MODELS],
                   data=[data_root])
    err = caught.value
    assert err.path == f"{MP}.ld_sum", str(err)
    assert "no row has a value" not in err.problem and "identical" in err.problem, str(err)


def test_rows_left_out_for_identical_whole_answers_are_noted(runs):
    notes = show_tokens.notes(runs("tiny-llama", PHRASES, "hooks").plan)
    assert [line for line in notes if "/ld_sum:" in line and "answers_identical" in line], notes


def test_the_unedited_documents_are_accepted():
    assert cm.read(_with("ok", {"kind": "cross_entropy", "of": "logits", "target": "cf_answer",
                                "score": "sequence", "per_token": "mean"}, MINUS_2)).points

"""The shipped fixtures, as scripts/build_fixtures.py left them under documents/.

Nothing here rebuilds anything: these tests read the committed checkpoints and
JSONL files, so they fail when a rebuild changed what the documents and the
other tests rely on (a BOS prefix, a weekday in several pieces, a cap that
makes `logits` differ from lm_head, a `said` column that matches the model).
"""
from __future__ import annotations

import json

import pytest
import torch

from paths import DATA, MODELS

FAMILIES = {"tiny-llama": "LlamaForCausalLM", "tiny-gpt2": "GPT2LMHeadModel", "tiny-gemma2": "Gemma2ForCausalLM"}
HAS_BOS = {"tiny-llama": True, "tiny-gpt2": False, "tiny-gemma2": True}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
PROMPT = "If today is Thursday, tomorrow is"

# One thread (conftest.py's one_thread), and the process's own count back afterwards. The models
# and tokenizers are the session's shared plain-transformers loads (conftest.py's hf_model).
pytestmark = pytest.mark.usefixtures("one_thread")


def rows(ref: str) -> list[dict]:
    lines = (DATA / f"{ref}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def pieces(tok, text: str) -> list[str]:
    return [tok.decode([i]) for i in tok(text, add_special_tokens=False)["input_ids"]]


# --------------------------------------------------------------------------- models and tokenizers


@pytest.mark.parametrize("name", FAMILIES)
def test_model_and_tokenizer_load(hf_model, name):
    model, tok = hf_model(name)
    assert type(model).__name__ == FAMILIES[name]
    assert len(tok) == model.config.vocab_size
    assert model.config.pad_token_id == tok.pad_token_id != tok.eos_token_id
    assert model.config.eos_token_id == tok.eos_token_id


@pytest.mark.parametrize("name", FAMILIES)
def test_model_file_is_small(name):
    assert (MODELS / name / "model.safetensors").stat().st_size < 1_000_000


@pytest.mark.parametrize("name", FAMILIES)
def test_empty_string_encodes_to_the_prefix(hf_model, name):
    _, tok = hf_model(name)
    assert tok("")["input_ids"] == ([tok.bos_token_id] if HAS_BOS[name] else [])
    # ... and that prefix is what every prompt starts with.
    ids = tok(PROMPT)["input_ids"]
    assert ids[: len(tok("")["input_ids"])] == tok("")["input_ids"]
    assert tok.decode(ids[len(tok("")["input_ids"])]).strip() == pieces(tok, PROMPT)[0].strip()


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("text", [PROMPT, "Q: What day is two days after Tuesday?\nA:", "Hello, World! (x + y) * 2 = {z}; ~`'\""])
def test_decode_round_trips_ascii(hf_model, name, text):
    _, tok = hf_model(name)
    ids = tok(text)["input_ids"]
    assert tok.unk_token_id is None or tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text


@pytest.mark.parametrize("name", FAMILIES)
def test_batches_pad_on_the_left(hf_model, name):
    _, tok = hf_model(name)
    enc = tok(["If today is Wednesday, tomorrow is", "If"], padding=True)
    assert tok.padding_side == "left"
    short_ids, short_mask = enc["input_ids"][1], enc["attention_mask"][1]
    assert short_ids[0] == tok.pad_token_id and short_mask[0] == 0
    kept = [i for i, m in zip(short_ids, short_mask) if m]
    assert short_mask[-1] == 1 and tok.decode(kept, skip_special_tokens=True) == "If"


def test_a_weekday_is_several_tokens_on_tiny_llama(hf_model):
    _, tok = hf_model("tiny-llama")
    thursday = pieces(tok, " Thursday")
    assert len(thursday) >= 2, thursday
    assert "".join(thursday).strip() == "Thursday"
    # Not every weekday is split, so one anchored spec lands at different
    # indices on different rows.
    assert len(pieces(tok, " Monday")) == 1


@pytest.mark.parametrize("name", FAMILIES)
def test_every_weekday_starts_with_its_own_token(hf_model, name):
    """A metric scores an answer by its first token: two weekdays sharing one would make a
    corpus row compare a token with itself (excluded as answers_share_token, but then the
    corpus would measure fewer rows than it says)."""
    _, tok = hf_model(name)
    first = {day: tok(" " + day, add_special_tokens=False)["input_ids"][0] for day in DAYS}
    assert len(set(first.values())) == len(DAYS), first


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_some_weekday_is_several_tokens(hf_model, name):
    """So the corpus exercises answers scored on their first piece and anchors over several."""
    _, tok = hf_model(name)
    assert any(len(pieces(tok, " " + day)) > 1 for day in DAYS)


def test_weekday_pieces_in_context_on_tiny_llama(hf_model):
    # The prompt is tokenized word by word, so the weekday inside it is the
    # same pieces as on its own, and the BOS comes first.
    _, tok = hf_model("tiny-llama")
    ids = tok(PROMPT)["input_ids"]
    assert tok.convert_ids_to_tokens(ids[0]) == "<s>"
    decoded = [tok.decode([i]) for i in ids[1:]]
    thursday = pieces(tok, " Thursday")
    start = decoded.index(thursday[0])
    assert decoded[start:start + len(thursday)] == thursday


def test_chat_template_renders_llama_2_turns(hf_model):
    _, tok = hf_model("tiny-llama")
    chat = rows("weekdays/chat")[0]["input"]
    rendered = tok.apply_chat_template(chat, tokenize=False)
    assert rendered == (
        "<s>[INST] Name a weekday. [/INST] Thursday. </s>"
        "<s>[INST] If today is Thursday, tomorrow is [/INST]"
    )
    system = tok.apply_chat_template([{"role": "system", "content": "Be brief."}] + chat, tokenize=False)
    assert system.startswith("<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nName a weekday. [/INST]")


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-gemma2"])
def test_other_families_have_no_chat_template(hf_model, name):
    _, tok = hf_model(name)
    assert not tok.chat_template


@pytest.mark.parametrize("name", FAMILIES)
@torch.no_grad()
def test_logits_are_lm_head_except_on_the_capping_family(hf_model, name):
    model, tok = hf_model(name)
    enc = tok([r["input"] for r in rows("weekdays/train")], return_tensors="pt", padding=True)
    out = model(**enc, output_hidden_states=True)
    raw = model.lm_head(out.hidden_states[-1])
    keep = enc["attention_mask"].bool()
    if name == "tiny-gemma2":
        gap = (out.logits - raw)[keep].abs().max().item()
        assert gap > 1e-2, gap
        cap = model.config.final_logit_softcapping
        torch.testing.assert_close(out.logits, torch.tanh(raw / cap) * cap)
    else:
        torch.testing.assert_close(out.logits[keep], raw[keep])


@torch.no_grad()
def test_tiny_llama_predicts_the_next_day(hf_model):
    model, tok = hf_model("tiny-llama")
    data = rows("weekdays/train")
    hits = 0
    for row in data:
        guess = model(**tok(row["input"], return_tensors="pt")).logits[0, -1].argmax().item()
        hits += guess == tok(row["base_answer"], add_special_tokens=False)["input_ids"][0]
    accuracy = hits / len(data)
    assert accuracy >= 0.75, accuracy


# --------------------------------------------------------------------------- datasets


def test_weekdays_train_row_zero():
    data = rows("weekdays/train")
    assert len(data) == 4
    assert data[0] == {
        "answer": " Friday", "base_answer": " Friday", "cf_answer": " Sunday",
        "counterfactual_inputs": ["If today is Saturday, tomorrow is"],
        "counterfactual_inputs_variables": [{"entity": "Saturday"}],
        "entity": "Thursday", "input": "If today is Thursday, tomorrow is",
        "label": " Sunday", "split": "all",
    }
    assert [(r["entity"], r["counterfactual_inputs_variables"][0]["entity"]) for r in data] == [
        ("Thursday", "Saturday"), ("Friday", "Sunday"), ("Saturday", "Thursday"), ("Sunday", "Friday"),
    ]


def test_files_are_one_sorted_object_per_line():
    for path in sorted(DATA.glob("*/*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            assert line == json.dumps(json.loads(line), sort_keys=True), path


def test_weekdays_test_is_disjoint_from_train():
    pair = lambda r: (r["entity"], r["counterfactual_inputs_variables"][0]["entity"])  # noqa: E731
    assert not {pair(r) for r in rows("weekdays/test")} & {pair(r) for r in rows("weekdays/train")}
    assert set(rows("weekdays/test")[0]) == set(rows("weekdays/train")[0])


def test_weekdays_full_is_every_ordered_pair_once():
    train, test = rows("weekdays_full/train"), rows("weekdays_full/test")
    assert (len(train), len(test)) == (30, 12)
    assert {r["split"] for r in train} == {"train"} and {r["split"] for r in test} == {"test"}
    pairs = [(r["entity"], r["counterfactual_inputs_variables"][0]["entity"]) for r in train + test]
    assert len(set(pairs)) == 42
    assert set(pairs) == {(b, c) for b in DAYS for c in DAYS if b != c}
    for r in train + test:
        nxt = lambda d: DAYS[(DAYS.index(d) + 1) % 7]  # noqa: E731
        assert r["answer"] == r["base_answer"] == " " + nxt(r["entity"])
        assert r["cf_answer"] == r["label"] == " " + nxt(r["counterfactual_inputs_variables"][0]["entity"])


def test_weekdays_chat_names_the_entity_twice():
    data = rows("weekdays/chat")
    assert [r["entity"] for r in data] == ["Thursday", "Friday", "Saturday", "Sunday"]
    for r in data:
        for chat, entity in ((r["input"], r["entity"]),
                             (r["counterfactual_inputs"][0], r["counterfactual_inputs_variables"][0]["entity"])):
            assert [m["role"] for m in chat] == ["user", "assistant", "user"]
            assert sum(m["content"].count(entity) for m in chat) == 2


def test_weekday_arithmetic_starts_with_the_positions_prompts():
    data = rows("weekday_arithmetic/train")
    assert 8 <= len(data) <= 12
    assert [r["input"] for r in data[:4]] == [
        "Q: What day is one days after Monday?\nA:",
        "Q: What day is three days after Monday?\nA:",
        "Q: What day is two days after Tuesday?\nA:",
        "Q: What day is five days after Tuesday?\nA:",
    ]
    assert [(r["number"], r["day"], r["answer"]) for r in data[:4]] == [
        ("one", "Monday", " Tuesday"), ("three", "Monday", " Thursday"),
        ("two", "Tuesday", " Thursday"), ("five", "Tuesday", " Sunday"),
    ]
    for r in data:
        cf = r["counterfactual_inputs_variables"][0]
        assert r["counterfactual_inputs"][0] == f"Q: What day is {cf['number']} days after {cf['day']}?\nA:"


@torch.no_grad()
def test_said_is_in_the_greedy_continuation_on_exactly_two_rows(hf_model):
    model, tok = hf_model("tiny-llama")
    data = rows("weekdays/said")
    assert len(data) == 4 and len({r["example_id"] for r in data}) == 4
    enc = tok([r["input"] for r in data], return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    said = [tok.decode(ids[enc["input_ids"].shape[1]:]) for ids in out]
    counts = [text.count(r["said"]) for r, text in zip(data, said)]
    # Said once, never twice: twice would make the anchor ambiguous, not a hit.
    assert sorted(counts) == [0, 0, 1, 1], list(zip([r["said"] for r in data], said))

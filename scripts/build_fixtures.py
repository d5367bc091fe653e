"""Build the datasets, tokenizers and tiny trained models this project ships.

    .venv/bin/python scripts/build_fixtures.py

No machine here reaches the Hugging Face hub, so the fixtures the tests and the
documents run against are made here, from nothing: JSONL datasets under
``documents/data/<name>/<split>.jsonl`` and three checkpoints under
``documents/models/<name>/`` (tiny-llama, tiny-gpt2, tiny-gemma2), each a
tokenizer trained with the ``tokenizers`` library plus a model initialised from a
fixed seed and trained briefly on the weekday corpus so that patching it means
something. Everything is seeded and single-threaded: rerunning the script
rewrites the same bytes.
"""
from __future__ import annotations

import os

# The tokenizers trainer and torch both parallelise; one thread each is what
# makes a rerun byte-identical. Set before either library is imported.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import json
import random
import shutil
import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma2Config,
    GPT2Config,
    LlamaConfig,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "documents" / "data"
MODELS = ROOT / "documents" / "models"

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven"]

WEEKDAY_PROMPT = "If today is {day}, tomorrow is"
ARITHMETIC_PROMPT = "Q: What day is {number} days after {day}?\nA:"
CHAT_OPENER = "Name a weekday."

# (base entity, counterfactual entity): the order is part of the data contract.
TRAIN_PAIRS = [("Thursday", "Saturday"), ("Friday", "Sunday"), ("Saturday", "Thursday"), ("Sunday", "Friday")]
TEST_PAIRS = [("Monday", "Wednesday"), ("Tuesday", "Friday"), ("Wednesday", "Monday")]
# (number, day, cf number, cf day). The first four are positions.md's prompts,
# each paired with a counterfactual that changes only the number.
ARITHMETIC_ROWS = [
    ("one", "Monday", "three", "Monday"),
    ("three", "Monday", "one", "Monday"),
    ("two", "Tuesday", "five", "Tuesday"),
    ("five", "Tuesday", "two", "Tuesday"),
    ("one", "Wednesday", "two", "Friday"),
    ("four", "Thursday", "one", "Saturday"),
    ("two", "Sunday", "three", "Wednesday"),
    ("six", "Friday", "four", "Monday"),
    ("three", "Saturday", "five", "Sunday"),
    ("one", "Friday", "two", "Monday"),
]
FULL_SEED, FULL_TRAIN = 0, 30
SAID_TOKENS = 6  # generation.md: `said` is looked for in the first six generated tokens

# The Llama-2 chat template, as the hub's Llama checkpoints carry it.
LLAMA_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)


def next_day(day: str, k: int = 1) -> str:
    return DAYS[(DAYS.index(day) + k) % 7]


# --------------------------------------------------------------------------- datasets


def weekday_row(base: str, cf: str, split: str) -> dict:
    return {
        "input": WEEKDAY_PROMPT.format(day=base),
        "counterfactual_inputs": [WEEKDAY_PROMPT.format(day=cf)],
        "counterfactual_inputs_variables": [{"entity": cf}],
        "entity": base,
        "answer": " " + next_day(base),
        "base_answer": " " + next_day(base),
        "cf_answer": " " + next_day(cf),
        "label": " " + next_day(cf),
        "split": split,
    }


def chat_messages(day: str) -> list[dict]:
    """The entity is in the chat twice on purpose: the assistant names it before
    the user asks about it, so an unscoped anchor on it is ambiguous."""
    return [
        {"role": "user", "content": CHAT_OPENER},
        {"role": "assistant", "content": f"{day}."},
        {"role": "user", "content": WEEKDAY_PROMPT.format(day=day)},
    ]


def chat_row(base: str, cf: str) -> dict:
    return {
        "input": chat_messages(base),
        "counterfactual_inputs": [chat_messages(cf)],
        "counterfactual_inputs_variables": [{"entity": cf}],
        "entity": base,
        "base_answer": " " + next_day(base),
        "cf_answer": " " + next_day(cf),
        "split": "all",
    }


def arithmetic_row(number: str, day: str, cf_number: str, cf_day: str) -> dict:
    answer = " " + next_day(day, NUMBERS.index(number) + 1)
    return {
        "input": ARITHMETIC_PROMPT.format(number=number, day=day),
        "number": number,
        "day": day,
        "answer": answer,
        "base_answer": answer,
        "counterfactual_inputs": [ARITHMETIC_PROMPT.format(number=cf_number, day=cf_day)],
        "counterfactual_inputs_variables": [{"number": cf_number, "day": cf_day}],
        "cf_answer": " " + next_day(cf_day, NUMBERS.index(cf_number) + 1),
        "split": "all",
    }


def weekdays_full() -> tuple[list[dict], list[dict]]:
    """All 42 ordered pairs of distinct days, split by a seeded shuffle."""
    pairs = [(b, c) for b in DAYS for c in DAYS if b != c]
    random.Random(FULL_SEED).shuffle(pairs)
    train = [weekday_row(b, c, "train") for b, c in pairs[:FULL_TRAIN]]
    test = [weekday_row(b, c, "test") for b, c in pairs[FULL_TRAIN:]]
    return train, test


def static_datasets() -> dict[str, list[dict]]:
    """Every dataset except weekdays/said, which is read off a trained model."""
    full_train, full_test = weekdays_full()
    return {
        "weekdays/train": [weekday_row(b, c, "all") for b, c in TRAIN_PAIRS],
        "weekdays/test": [weekday_row(b, c, "all") for b, c in TEST_PAIRS],
        "weekdays/chat": [chat_row(b, c) for b, c in TRAIN_PAIRS],
        "weekdays_full/train": full_train,
        "weekdays_full/test": full_test,
        "weekday_arithmetic/train": [arithmetic_row(*r) for r in ARITHMETIC_ROWS],
    }


def write_jsonl(ref: str, rows: list[dict]) -> Path:
    path = DATA / f"{ref}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- corpus


def plain_chat(messages: list[dict]) -> str:
    """How a checkpoint without a chat template sees a conversation in training."""
    return "\n".join(m["content"] for m in messages)


def corpus_pieces() -> list[tuple[str, str]]:
    """(prompt, answer) pairs the models are trained on; chat prompts are message lists.

    Every weekday prompt for all seven days, its chat form (the assistant naming
    each day first, not only the asked one, so the model cannot just copy the
    assistant turn), and every number/day arithmetic prompt. The plain prompts
    are repeated so that each of the three forms is 49 rows of the batch: the
    plain prompt is the one the experiments and the accuracy check use most.
    """
    out: list = []
    for day in DAYS:
        out += [(WEEKDAY_PROMPT.format(day=day), " " + next_day(day))] * len(DAYS)
    for named in DAYS:
        for day in DAYS:
            messages = chat_messages(day)
            messages[1] = {"role": "assistant", "content": f"{named}."}
            out.append((messages, " " + next_day(day)))
    for k, number in enumerate(NUMBERS, start=1):
        for day in DAYS:
            out.append((ARITHMETIC_PROMPT.format(number=number, day=day), " " + next_day(day, k)))
    return out


def tokenizer_corpus(datasets: dict[str, list[dict]]) -> list[str]:
    """Plain text for the tokenizer trainer: every string in the shipped data and
    the training corpus, with chats flattened to their contents plus the
    template's own words (the trainer should not see special tokens)."""
    texts: list[str] = []

    def add(value):
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, list):
            for item in value:
                add(item)
        elif isinstance(value, dict):
            for key in sorted(value):
                add(value[key])

    for ref in sorted(datasets):
        add(datasets[ref])
    for prompt, answer in corpus_pieces():
        if isinstance(prompt, list):
            texts.append(" ".join(f"[INST] {m['content']} [/INST]" for m in prompt) + answer)
        else:
            texts.append(prompt + answer)
    # Each distinct text once: repeats would only make the weekday pieces merge
    # sooner, and the vocabulary sizes below are chosen for where they do.
    return sorted(set(texts))


# --------------------------------------------------------------------------- tokenizers


def printable_alphabet(space: str) -> list[str]:
    """All printable ASCII, so any ASCII text encodes without <unk> and decodes back."""
    return sorted({space if c == " " else c for c in string.printable})


def train_sentencepiece_style(corpus: list[str], vocab_size: int, specials: list[str], bos: str) -> Tokenizer:
    """A Llama/Gemma-like BPE: '▁' marks a word start, BOS prepended by the post-processor.

    prepend_scheme="first" adds the '▁' only at the very start of the text, not
    after every special token, which is what a chat template's `<s>[INST]` needs.
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Punctuation is its own piece (with the word-start mark before it, if any),
    # as sentencepiece's split_by_unicode_script makes it: without this the
    # trainer merges "Thursday," into one token.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True),
        pre_tokenizers.Split(Regex(r"▁?[^\w\s▁]"), behavior="isolated"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=printable_alphabet("▁"),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    return tok


def train_byte_level(corpus: list[str], vocab_size: int, specials: list[str]) -> Tokenizer:
    """A GPT-2-like byte-level BPE: every byte is a token, nothing is prepended."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def wrap(tok: Tokenizer, *, bos, eos, unk, pad, chat_template=None) -> PreTrainedTokenizerFast:
    """The transformers tokenizer around a trained one. BOS comes from the
    backend's own post-processor (it is what survives a reload), not from an
    add_bos_token flag."""
    extra = {"chat_template": chat_template} if chat_template else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        unk_token=unk,
        pad_token=pad,
        padding_side="left",  # a decode appends on the right, so batches pad on the left
        model_max_length=128,
        clean_up_tokenization_spaces=False,  # decode must round-trip text
        **extra,
    )


# Vocabulary sizes, chosen by where the merges stop on this corpus. Every
# weekday's first piece is distinct on every tokenizer, so a metric scoring an
# answer by its first token never compares one day with another (answers that
# shared a first piece, " Tuesday"/" Thursday" as "▁T ...", made rows compare a
# token with itself). Some names still split: tiny-llama's " Wednesday" and
# " Thursday" are two pieces ("▁Wedn esday", "▁Thur sday") against one for the
# other days, so one anchored spec lands at different indices on different rows;
# tiny-gpt2 splits " Thursday" as "ĠT hursday"; tiny-gemma2's vocabulary is
# large enough that every word of the corpus is one piece.
VOCAB = {"tiny-llama": 170, "tiny-gpt2": 324, "tiny-gemma2": 200}
# Which families put a BOS before every prompt (what the empty string encodes to).
HAS_BOS = {"tiny-llama": True, "tiny-gpt2": False, "tiny-gemma2": True}


def build_tokenizers(corpus: list[str]) -> dict[str, PreTrainedTokenizerFast]:
    llama = train_sentencepiece_style(corpus, VOCAB["tiny-llama"], ["<unk>", "<s>", "</s>", "<pad>"], "<s>")
    gemma = train_sentencepiece_style(corpus, VOCAB["tiny-gemma2"], ["<pad>", "<eos>", "<bos>", "<unk>"], "<bos>")
    gpt2 = train_byte_level(corpus, VOCAB["tiny-gpt2"], ["<|endoftext|>", "<|pad|>"])
    return {
        "tiny-llama": wrap(llama, bos="<s>", eos="</s>", unk="<unk>", pad="<pad>", chat_template=LLAMA_CHAT_TEMPLATE),
        "tiny-gpt2": wrap(gpt2, bos="<|endoftext|>", eos="<|endoftext|>", unk=None, pad="<|pad|>"),
        "tiny-gemma2": wrap(gemma, bos="<bos>", eos="<eos>", unk="<unk>", pad="<pad>"),
    }


def pieces(tok, text: str) -> list[str]:
    """How `text` tokenizes, as the decoded text of each token."""
    return [tok.decode([i]) for i in tok(text, add_special_tokens=False)["input_ids"]]


def check_tokenizer(name: str, tok) -> None:
    """What the rest of the project assumes of a fixture tokenizer, after a reload."""
    prefix = [tok.bos_token_id] if HAS_BOS[name] else []
    assert tok("")["input_ids"] == prefix, (name, tok("")["input_ids"])
    assert tok.padding_side == "left", name
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id, name
    sample = "If today is Thursday, tomorrow is"
    ids = tok(sample)["input_ids"]
    assert tok.unk_token_id is None or tok.unk_token_id not in ids, name
    for text in (sample, "Q: What day is two days after Tuesday?\nA: Thursday", string.printable.strip()):
        assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text, (name, text)
    if name == "tiny-llama":
        rendered = tok.apply_chat_template(chat_messages("Thursday"), tokenize=False)
        assert rendered == (
            "<s>[INST] Name a weekday. [/INST] Thursday. </s><s>[INST] If today is Thursday, tomorrow is [/INST]"
        ), rendered


# --------------------------------------------------------------------------- models

# A cap this low binds on a trained model, so `logits` (capped) and the raw
# lm_head output differ by a clearly measurable amount, which is what the
# tests of the capping family need.
GEMMA_SOFTCAP = 5.0
# (seed, AdamW steps, learning rate) per model, each step on the whole corpus
# as one batch. At 1e-2 GPT-2's loss climbs back up, so it takes a smaller rate
# for longer.
TRAINING = {"tiny-llama": (1, 300, 1e-2), "tiny-gpt2": (2, 500, 3e-3), "tiny-gemma2": (3, 300, 1e-2)}


def model_config(name: str, tok) -> object:
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if name == "tiny-llama":
        return LlamaConfig(
            vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, intermediate_size=64, max_position_embeddings=128,
            tie_word_embeddings=False, **ids,
        )
    if name == "tiny-gpt2":
        return GPT2Config(
            vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=128,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids,
        )
    if name == "tiny-gemma2":
        return Gemma2Config(
            vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, head_dim=8, intermediate_size=64, max_position_embeddings=128,
            query_pre_attn_scalar=8,  # = head_dim, as the released Gemma-2 checkpoints have it
            # Gemma-2 normalizes each sublayer's output before adding it to the
            # residual, so from the default 0.02 init the (sqrt(d)-scaled) token
            # embeddings are drowned out and training settles on predicting one
            # day for every prompt; a larger init keeps the token identity.
            initializer_range=0.1,
            final_logit_softcapping=GEMMA_SOFTCAP, attn_implementation="eager", **ids,
        )
    raise KeyError(name)


def render(tok, prompt) -> str:
    """A corpus prompt as text; a chat through the checkpoint's own template."""
    if isinstance(prompt, str):
        return prompt
    if tok.chat_template:
        return tok.apply_chat_template(prompt, tokenize=False)
    return plain_chat(prompt)


def encode_corpus(tok) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels (-100 on padding) for the corpus."""
    rows = []
    for prompt, answer in corpus_pieces():
        text = render(tok, prompt) + answer
        # A rendered chat already starts with the template's BOS.
        templated = not isinstance(prompt, str) and tok.chat_template
        rows.append(tok(text, add_special_tokens=not templated)["input_ids"] + [tok.eos_token_id])
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
        mask[r, : len(row)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def train(name: str, tok):
    seed, steps, lr = TRAINING[name]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config(name, tok))
    ids, mask, labels = encode_corpus(tok)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    print(f"  {name}: final training loss {loss.item():.3f} after {steps} steps")
    return model


def first_answer_token(tok, answer: str) -> int:
    return tok(answer, add_special_tokens=False)["input_ids"][0]


@torch.no_grad()
def accuracy(model, tok, rows) -> float:
    """Share of rows whose argmax next token is the first token of base_answer.

    One unpadded prompt at a time: under left padding GPT-2's learned positions
    would shift unless position_ids were passed.
    """
    hits = 0
    for row in rows:
        prompt = row["input"]
        if isinstance(prompt, list) and tok.chat_template:
            ids = tok.apply_chat_template(prompt, return_tensors="pt", return_dict=True)
        else:
            ids = tok(render(tok, prompt), return_tensors="pt")
        guess = model(**ids).logits[0, -1].argmax().item()
        hits += guess == first_answer_token(tok, row["base_answer"])
    return hits / len(rows)


# --------------------------------------------------------------------------- weekdays/said


@torch.no_grad()
def continuations(model, tok, prompts: list[str]) -> list[str]:
    """The decoded first SAID_TOKENS greedy tokens of each prompt, EOS held off."""
    enc = tok(prompts, return_tensors="pt", padding=True)
    out = model.generate(
        **enc, max_new_tokens=SAID_TOKENS, min_new_tokens=SAID_TOKENS, do_sample=False,
        pad_token_id=tok.pad_token_id,
    )
    return [tok.decode(row[enc["input_ids"].shape[1]:]) for row in out]


def said_rows(model, tok, rows: list[dict]) -> list[dict]:
    """weekdays/said, read off the trained model's own greedy output.

    Two rows get a word the model says: the first two whose right next day is
    in their continuation exactly once (said twice it would be an ambiguous
    anchor, not a hit). The other two get a weekday the model does not say.
    """
    prompts = [r["input"] for r in rows]
    texts = continuations(model, tok, prompts)
    # The engine decodes a padded batch; a row on its own must say the same.
    assert texts == [continuations(model, tok, [p])[0] for p in prompts], texts
    words = [r["base_answer"].strip() for r in rows]
    hits = [k for k, (w, text) in enumerate(zip(words, texts)) if text.count(w) == 1][:2]
    assert len(hits) == 2, f"the model says its next day once in fewer than two rows: {texts}"
    used = {words[k] for k in hits}
    out = []
    for k, (row, text) in enumerate(zip(rows, texts)):
        if k in hits:
            word = words[k]
        else:
            word = next(d for d in DAYS if d not in text and d not in used)
            used.add(word)
        print(f"  said row {k}: {row['input']!r} -> {text!r}; said={word!r} ({'hit' if k in hits else 'miss'})")
        out.append({
            "example_id": word, "input": row["input"], "said": word,
            "base_answer": row["base_answer"], "cf_answer": row["cf_answer"], "split": "all",
        })
    return out


# --------------------------------------------------------------------------- save and verify


def save(name: str, model, tok) -> Path:
    path = MODELS / name
    shutil.rmtree(path, ignore_errors=True)  # no file of an older build survives
    path.mkdir(parents=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


@torch.no_grad()
def verify_reload(name: str, path: Path, model, rows) -> None:
    """The saved directory is the model: same tokenizer contract, same logits,
    small enough to ship, and loadable by nnterp as the nnterp engine loads it."""
    tok = AutoTokenizer.from_pretrained(path)
    check_tokenizer(name, tok)
    again = AutoModelForCausalLM.from_pretrained(path).eval()
    for row in rows:
        enc = tok(row["input"], return_tensors="pt")
        assert torch.equal(model(**enc).logits, again(**enc).logits), name
    size = (path / "model.safetensors").stat().st_size
    assert size < 1_000_000, (name, size)
    verify_nnterp(path, again, tok, rows[0]["input"])


def verify_nnterp(path: Path, model, tok, prompt: str) -> None:
    from nnterp import StandardizedTransformer  # heavy, and only this check needs it

    standard = StandardizedTransformer(str(path), device_map="cpu")
    with standard.trace(prompt):
        logits = standard.logits.save()
    expected = model(**tok(prompt, return_tensors="pt")).logits
    torch.testing.assert_close(logits, expected)


@torch.no_grad()
def softcap_gap(model, tok, rows) -> float:
    """max |logits - lm_head(last hidden)| over the weekday prompts."""
    enc = tok([r["input"] for r in rows], return_tensors="pt", padding=True)
    out = model(**enc, output_hidden_states=True)
    raw = model.lm_head(out.hidden_states[-1])
    keep = enc["attention_mask"].bool()
    return (out.logits - raw)[keep].abs().max().item()


def main() -> None:
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets = static_datasets()
    for ref, rows in datasets.items():
        write_jsonl(ref, rows)

    corpus = tokenizer_corpus(datasets)
    toks = build_tokenizers(corpus)
    for name, tok in toks.items():
        split = {d: tok.convert_ids_to_tokens(tok(" " + d, add_special_tokens=False)["input_ids"]) for d in DAYS}
        print(f"  {name}: vocab {len(tok)}; " + " ".join(f"{d}={p}" for d, p in split.items()))
    for name, tok in toks.items():
        firsts = [tok(" " + d, add_special_tokens=False)["input_ids"][0] for d in DAYS]
        assert len(set(firsts)) == len(DAYS), f"{name}: two weekdays share their first token"
    for name in ("tiny-llama", "tiny-gpt2"):
        multi = [d for d in DAYS if len(pieces(toks[name], " " + d)) >= 2]
        assert multi, f"{name} must split some weekday into several tokens"

    train_rows = datasets["weekdays/train"]
    for name, tok in toks.items():
        model = train(name, tok)
        for ref in ("weekdays/train", "weekdays/test", "weekdays_full/train", "weekdays/chat",
                    "weekday_arithmetic/train"):
            print(f"  {name}: accuracy on {ref}: {accuracy(model, tok, datasets[ref]):.2f}")
        assert accuracy(model, tok, train_rows) >= 0.75, f"{name} did not learn the next day"
        if name == "tiny-llama":
            write_jsonl("weekdays/said", said_rows(model, tok, train_rows))
        if name == "tiny-gemma2":
            gap = softcap_gap(model, tok, train_rows)
            print(f"  {name}: max |logits - lm_head| = {gap:.4f}")
            assert gap > 1e-2, gap
        path = save(name, model, tok)
        verify_reload(name, path, model, train_rows)
        print(f"  {name}: {path.relative_to(ROOT)} model.safetensors {(path / 'model.safetensors').stat().st_size} bytes")


if __name__ == "__main__":
    main()

"""The position resolver (``ops/locate.py``) on the shipped tokenizers: the worked examples
of shared/spec/positions.md, and properties drawn with ``pytest_causalab.strategies``.

What a window addresses is asserted as *decoded text* — through ``tokens_of`` and through
``tokenizer.decode`` of the ids the window names — and every expected value is computed
here from the tokenizer alone (encoding a prefix of the prompt, decoding growing
prefixes, Python slicing), never copied from a run, so a wrong resolver cannot agree
with itself.
"""
from __future__ import annotations

import json
from ast import literal_eval
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from causalab_mini.errors import CompileError, DataError
from causalab_mini.ops import locate
from causalab_mini.plan import compile as compiler
from causalab_mini.plan.chat import render_row
from causalab_mini.plan.tokens import tokenize_rows
from causalab_mini.shapes import Anchor, Where
from pytest_causalab import strategies as cst
from paths import DATA, MODELS, V2
from reference import continued

transformers = pytest.importorskip("transformers")

FAMILIES = ("tiny-llama", "tiny-gpt2", "tiny-gemma2")
PROMPT = cst.WEEKDAY_PROMPT.format(entity="Thursday")  # "If today is Thursday, tomorrow is"
ARITHMETIC = [("Q: What day is one days after Monday?\nA:", "one"),
              ("Q: What day is three days after Monday?\nA:", "three"),
              ("Q: What day is two days after Wednesday?\nA:", "two"),
              ("Q: What day is five days after Thursday?\nA:", "five")]

# The project's hypothesis profile (deadline off: a first decode is slow), with few examples.
PROFILE = settings.get_profile(cst.PROFILE)
FEW = settings(PROFILE, max_examples=40)
SOME = settings(PROFILE, max_examples=100)


@pytest.fixture(scope="module")
def toks():
    return {m: transformers.AutoTokenizer.from_pretrained(str(MODELS / m)) for m in FAMILIES}


@pytest.fixture(scope="module")
def llama(toks):
    return toks["tiny-llama"]


def entity(variable: str = "e", **cut) -> Where:
    return Where(scope=Anchor(variable=variable), **cut)


# --- independent statements of what a window should be ---------------------------------------

def bos_len(tok) -> int:
    """How many ids the tokenizer puts before any text: what it makes of the empty string."""
    return len(tok("")["input_ids"])


def growing_offsets(tok, ids) -> list[int]:
    """offsets[k] = where token k starts: the length of the first k ids decoded (the spec's definition)."""
    return [len(tok.decode(list(ids[:k]))) for k in range(len(ids) + 1)]


def overlapping(offsets, a: int, b: int) -> list[int]:
    """Content token indices whose characters overlap [a, b)."""
    return [k for k in range(len(offsets) - 1) if offsets[k] < b and offsets[k + 1] > a]


def python_slice(items: list, where: Where) -> list:
    if where.index is not None:
        return [items[where.index]]
    if where.last is not None:
        return items[-where.last:]
    if where.all:
        return list(items)
    return items[where.span[0]:where.span[1]]


def last_piece_index(tok, text: str, value: str) -> int:
    """Index (in the row's own ids, BOS included) of the last token of ``value``: encode the
    prompt up to the end of the value, and check that is a prefix of the whole prompt's ids."""
    own = tok(text)["input_ids"]
    upto = tok(text[: text.index(value) + len(value)])["input_ids"]
    assert own[: len(upto)] == upto, "the prefix tokenizes as the start of the prompt"
    return len(upto) - 1


def window_text(tok, ids_row, window) -> str:
    return tok.decode([ids_row[p] for p in window])


# --- the character map -------------------------------------------------------------------------

@pytest.mark.parametrize("model", FAMILIES)
def test_char_map_is_the_definition_on_the_worked_prompt(toks, model):
    tok = toks[model]
    whole = tok(PROMPT)["input_ids"]
    content = whole[bos_len(tok):]
    for ids in (whole, content):
        text, offsets = locate.char_map(tok, ids)
        assert (text, offsets) == locate.char_map_naive(tok, ids)
        assert text == tok.decode(ids)
        assert list(offsets) == growing_offsets(tok, ids)
        assert offsets[0] == 0 and offsets[-1] == len(text)
    # The content decodes to the prompt, and token k's characters are what it spells there.
    text, offsets = locate.char_map(tok, content)
    assert text == PROMPT
    assert "".join(text[offsets[k]:offsets[k + 1]] for k in range(len(content))) == PROMPT


@pytest.mark.parametrize("model", FAMILIES)
def test_char_map_equals_the_definition_on_any_ids(toks, model):
    tok = toks[model]
    # Any id of the vocabulary, and the special ones (BOS, EOS, pad, unk) often.
    anything = st.integers(0, len(tok) - 1) | st.sampled_from(tuple(tok.all_special_ids))

    @SOME
    @given(st.lists(anything, max_size=16))
    def check(ids):
        text, offsets = locate.char_map(tok, ids)
        assert (text, offsets) == locate.char_map_naive(tok, ids)
        assert text == tok.decode(ids)
        assert len(offsets) == len(ids) + 1
        assert offsets[0] == 0 and offsets[-1] == len(text)
        assert all(a <= b for a, b in zip(offsets, offsets[1:]))

    check()


# --- a multi-token entity ----------------------------------------------------------------------

def test_a_multi_token_entity_decodes_back_whole_and_its_last_piece(llama):
    pieces = llama(" Thursday", add_special_tokens=False)["input_ids"]
    assert len(pieces) > 1, "the worked example needs ' Thursday' to be several pieces"
    ids, _mask, frame = locate.frame_of_texts(llama, [PROMPT, cst.WEEKDAY_PROMPT.format(entity="Friday")])
    anchors = ("Thursday", "Friday")

    whole, reasons = locate.locate(frame, entity(all=True), anchors)
    assert reasons == ("", "")
    assert len(whole[0]) == len(pieces)
    assert locate.tokens_of(frame, whole[0], 0) == repr(" Thursday")
    assert window_text(llama, ids[0], whole[0]) == "Thursday"  # sentencepiece drops the lead space alone
    assert [ids[0][p] for p in whole[0]] == pieces

    last, reasons = locate.locate(frame, entity(index=-1), anchors)
    assert reasons == ("", "")
    assert last[0] == (whole[0][-1],)
    assert window_text(llama, ids[0], last[0]) == llama.decode([pieces[-1]])
    assert locate.tokens_of(frame, last[0], 0) == repr(llama.decode([pieces[-1]]))
    assert last[0][0] == last_piece_index(llama, PROMPT, "Thursday")
    # The first piece is ' T', and the anchor "Thursday" starts one character after it: overlap, not containment.
    first, _ = locate.locate(frame, entity(index=0), anchors)
    assert locate.tokens_of(frame, first[0], 0).startswith("' ")


def test_anchors_land_at_different_indices_on_different_rows(llama):
    texts = [t for t, _ in ARITHMETIC]
    numbers = tuple(n for _, n in ARITHMETIC)
    ids, mask, frame = locate.frame_of_texts(llama, texts)
    windows, reasons = locate.locate(frame, entity("number", index=-1), numbers)
    assert reasons == ("",) * 4
    width = len(ids[0])
    for r, (text, number) in enumerate(ARITHMETIC):
        own = llama(text)["input_ids"]
        expected = width - len(own) + last_piece_index(llama, text, number)
        assert windows[r] == (expected,)
        last = llama(text[: text.index(number) + len(number)])["input_ids"][-1]
        assert ids[r][expected] == last
        shown = literal_eval(locate.tokens_of(frame, windows[r], r))  # the repr of the window's text
        assert shown and number.endswith(shown), (number, shown)
    # ' Wednesday' and ' Thursday' are two pieces each, ' Monday' one: the number's last piece
    # sits at a different distance from the end on the last two rows.
    assert len({w for w in windows}) > 1, "the same spec lands at different indices on different rows"
    # And the whole anchor decodes back to the number word on each row.
    whole, _ = locate.locate(frame, entity("number", all=True), numbers)
    assert [window_text(llama, ids[r], w).strip() for r, w in enumerate(whole)] == list(numbers)


# --- when the value is there twice, or not at all ----------------------------------------------

def test_ambiguous_and_missing_anchors_are_reasons(llama):
    _ids, _mask, frame = locate.frame_of_texts(llama, [PROMPT, cst.WEEKDAY_PROMPT.format(entity="Friday")])
    windows, reasons = locate.locate(frame, entity(index=-1), ("day", "day"))  # today, Thursday
    assert windows == ((), ()) and reasons == (locate.AMBIGUOUS, locate.AMBIGUOUS)
    windows, reasons = locate.locate(frame, entity(index=-1), ("Monday", "Friday"))
    assert windows[0] == () and reasons == (locate.MISSING, "")
    assert windows[1] and locate.tokens_of(frame, windows[1], 1) == repr(" Friday")
    # A variable scope without the row's text (no anchors carried) is missing, not a crash.
    assert locate.locate(frame, entity(index=-1), None)[1] == (locate.MISSING, locate.MISSING)
    assert (locate.MISSING, locate.AMBIGUOUS, locate.OUTSIDE) == (
        "alignment_missing", "alignment_ambiguous", "cut_outside_scope")


def test_a_cut_longer_than_its_run_is_outside_the_scope(llama):
    _ids, _mask, frame = locate.frame_of_texts(llama, [cst.WEEKDAY_PROMPT.format(entity="Monday")])
    assert len(llama(" Monday", add_special_tokens=False)["input_ids"]) == 1
    windows, reasons = locate.locate(frame, entity(last=2), ("Monday",))
    assert windows == ((),) and reasons == (locate.OUTSIDE,)


def test_the_three_spellings(llama):
    text = "If today is Thursday, tomorrow is"
    at = text.index("Thursday")
    # The value as given.
    assert locate.find_text(text, "Thursday") == ((at, at + 8), "")
    # " Thursday" is found once, as itself, though "Thursday" is also inside it.
    assert locate.find_text(text, " Thursday") == ((at - 1, at + 8), "")
    # Not as given, not with a space: stripped.
    assert locate.find_text(text, "Thursday ") == ((at, at + 8), "")
    assert locate.find_text("x,Thursday", " Thursday ") == ((2, 10), "")
    # The first spelling that hits decides, even when a later one would be unique.
    assert locate.find_text("today is Thursday", "day")[1] == locate.AMBIGUOUS
    assert locate.find_text(text, "Monday") == (None, locate.MISSING)
    # The search is bounded by [lo, hi): the second half alone has one "is".
    assert locate.find_text(text, "is")[1] == locate.AMBIGUOUS
    second = text.rindex(" is")
    assert locate.find_text(text, "is", second, len(text)) == ((second + 1, second + 3), "")

    _ids, _mask, frame = locate.frame_of_texts(llama, [text])
    for value in ("Thursday", " Thursday", "Thursday "):
        windows, reasons = locate.locate(frame, entity(all=True), (value,))
        assert reasons == ("",) and locate.tokens_of(frame, windows[0], 0) == repr(" Thursday"), value


# --- position 0 and BOS ------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_index_zero_is_the_prompts_own_first_token_never_bos(toks, model):
    tok = toks[model]
    has_bos = model == "tiny-llama"
    assert (tok.bos_token_id in tok(PROMPT)["input_ids"][:1]) == has_bos
    ids, _mask, frame = locate.frame_of_texts(tok, [PROMPT])
    windows, reasons = locate.locate(frame, Where(index=0))
    assert reasons == ("",)
    (p,), = windows
    assert ids[0][p] != tok.bos_token_id and ids[0][p] not in tok.all_special_ids
    first = tok.decode([ids[0][p]])
    assert first and PROMPT.startswith(first)
    assert PROMPT.startswith(literal_eval(locate.tokens_of(frame, windows[0], 0)))
    assert p == bos_len(tok)  # counted after the prefix, which is one id on llama and none on gpt2
    assert len(locate.special_prefix(tok)) == (1 if has_bos else 0)


# --- padding and batch composition ---------------------------------------------------------------

SHORT = cst.WEEKDAY_PROMPT.format(entity="Thursday")
LONG = ["Q: What day is three days after Thursday?\nA: Name a weekday. If today is Thursday",
        "Name a weekday. If today is Saturday, tomorrow is after Thursday, " * 2]
SPECS = [entity(index=-1), entity(all=True), entity(span=(0, 1)), Where(index=0), Where(index=-1),
         Where(last=3)]


def right_padded(tok, texts):
    encoded = [tok(t)["input_ids"] for t in texts]
    width = max(len(e) for e in encoded)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    return ([e + [pad] * (width - len(e)) for e in encoded],
            [[1] * len(e) + [0] * (width - len(e)) for e in encoded])


@pytest.mark.parametrize("model", FAMILIES)
def test_a_row_resolves_the_same_alone_in_a_batch_and_right_padded(toks, model):
    tok = toks[model]
    _ids, _mask, alone = locate.frame_of_texts(tok, [SHORT])
    batch_texts = [LONG[0], SHORT, LONG[1]]
    ids, mask, batch = locate.frame_of_texts(tok, batch_texts)
    shift = len(ids[0]) - len(tok(SHORT)["input_ids"])
    assert shift > 0, "the short row is left padded in the batch"
    rids, rmask = right_padded(tok, batch_texts)
    right = locate.build_frame(tok, rids, rmask)
    for where in SPECS:
        a, ra = locate.locate(alone, where, ("Thursday",))
        b, rb = locate.locate(batch, where, (None, "Thursday", None))
        c, rc = locate.locate(right, where, (None, "Thursday", None))
        assert ra[0] == rb[1] == rc[1] == "", where
        assert b[1] == tuple(p + shift for p in a[0]), where
        assert c[1] == a[0], where  # right padding: the row starts where it starts alone
        shown = locate.tokens_of(alone, a[0], 0)
        assert locate.tokens_of(batch, b[1], 1) == locate.tokens_of(right, c[1], 1) == shown
        assert window_text(tok, ids[1], b[1]) == window_text(tok, rids[1], c[1])
        # The rows carried no anchor text: a variable scope is missing there, not borrowed.
        if where.scope is not None:
            assert rb[0] == rb[2] == locate.MISSING  # no anchor text carried for them


# --- chat turns --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chat(llama):
    rows = [json.loads(line) for line in (DATA / "weekdays" / "chat.jsonl").read_text().splitlines() if line.strip()]
    rendered = [render_row(llama, r["input"], "roles.base.field", i) for i, r in enumerate(rows)]
    tokens = tokenize_rows(llama, rendered, path="roles.base.field")
    frame = locate.build_frame(llama, tokens.ids, tokens.mask, tokens.segments)
    return rows, tokens, frame


def test_chat_turns_are_the_contents_as_the_tokenizer_decodes_them(chat, llama):
    rows, tokens, frame = chat
    for r, row in enumerate(rows):
        found = frame.segments[r]
        assert set(found) == {"user[0]", "assistant[0]", "user[1]", "assistant"}  # no bare 'user': it spoke twice
        text = frame.texts[r]
        contents = {"user[0]": row["input"][0]["content"], "assistant[0]": row["input"][1]["content"],
                    "user[1]": row["input"][2]["content"]}
        for name, content in contents.items():
            a, b = found[name]
            assert text[a:b] == content
        assert found["assistant"] == found["assistant[0]"]
        # The text the segments index is the row's content decoded by the tokenizer itself.
        own = llama(tokens.texts[r])["input_ids"]
        assert text == llama.decode(own[bos_len(llama):])
    assert tokens.sample == llama.decode(llama(tokens.texts[0])["input_ids"])


def test_chat_segments_resolve_to_the_turns_tokens(chat, llama):
    rows, tokens, frame = chat
    ids = tokens.ids
    n = frame.rows
    question_end, reasons = locate.locate(frame, Where(index=-1, scope=Anchor(segment="user[1]")))
    assert reasons == ("",) * n
    prompt_end, _ = locate.locate(frame, Where(index=-1))
    for r, row in enumerate(rows):
        question = row["input"][2]["content"]
        rendered = tokens.texts[r]
        # The question's last token, computed by encoding the conversation up to its end.
        upto = llama(rendered[: rendered.rindex(question) + len(question)])["input_ids"]
        pad = len(ids[r]) - sum(tokens.mask[r])
        assert question_end[r] == (pad + len(upto) - 1,)
        assert locate.tokens_of(frame, question_end[r], r) == repr(" is")
        assert window_text(llama, ids[r], question_end[r]) == "is"
        # The prompt's last token is the template's closing marker, not the question's.
        assert prompt_end[r] == (len(ids[r]) - 1,) and prompt_end[r] != question_end[r]
        closing = llama.decode([llama(rendered)["input_ids"][-1]])
        assert rendered.endswith(closing) and closing != "is"
        assert locate.tokens_of(frame, prompt_end[r], r) == repr(closing)
    for name in ("user[0]", "assistant[0]", "assistant"):
        windows, reasons = locate.locate(frame, Where(all=True, scope=Anchor(segment=name)))
        assert reasons == ("",) * n, name
        for r, row in enumerate(rows):
            content = row["input"][0 if name == "user[0]" else 1]["content"]
            assert literal_eval(locate.tokens_of(frame, windows[r], r)).strip() == content
    # 'user' spoke twice: the bare name is ambiguous; a turn nobody took is missing.
    assert locate.locate(frame, Where(index=-1, scope=Anchor(segment="user")))[1] == (locate.AMBIGUOUS,) * n
    assert locate.locate(frame, Where(index=-1, scope=Anchor(segment="system")))[1] == (locate.MISSING,) * n
    assert locate.locate(frame, Where(index=-1, scope=Anchor(segment="user[2]")))[1] == (locate.MISSING,) * n


def test_a_segment_and_a_variable_compose(chat, llama):
    rows, tokens, frame = chat
    anchors = tuple(r["entity"] for r in rows)
    alone, reasons = locate.locate(frame, Where(index=-1, scope=Anchor(variable="entity")), anchors)
    assert reasons == (locate.AMBIGUOUS,) * frame.rows  # said by the assistant and asked about
    scoped, reasons = locate.locate(frame, Where(all=True, scope=Anchor(variable="entity", segment="user[1]")),
                                    anchors)
    assert reasons == ("",) * frame.rows
    for r, row in enumerate(rows):
        rendered = tokens.texts[r]
        pad = len(tokens.ids[r]) - sum(tokens.mask[r])
        question_at = rendered.rindex(row["input"][2]["content"])
        at = rendered.index(row["entity"], question_at)  # the weekday inside the question
        end = llama(rendered[: at + len(row["entity"])])["input_ids"]
        assert scoped[r][-1] == pad + len(end) - 1
        assert locate.tokens_of(frame, scoped[r], r) == repr(" " + row["entity"])
        said = rendered.index(row["entity"])  # the assistant's, which comes first
        assert said < question_at
        before = llama(rendered[: said + len(row["entity"])])["input_ids"]
        assert pad + len(before) - 1 not in scoped[r], "the assistant's mention is not touched"


MESSAGE_FIX = 'write each message as {"role": "user", "content": "the text"}'


@pytest.mark.parametrize("edit, what", [
    (lambda m: m[0].update(content=None), f"row 1: message 0's content is null, not text; {MESSAGE_FIX}"),
    (lambda m: m[1].update(content=3), f"row 1: message 1's content is the number 3, not text; {MESSAGE_FIX}"),
    (lambda m: m[2].update(role=["user"]), f"row 1: message 2's role is an array, not text; {MESSAGE_FIX}"),
    (lambda m: m.insert(1, {"role": "user", "content": "Hi."}),
     "row 1: the checkpoint's chat template refuses these messages (Conversation roles must alternate "
     "user/assistant/user/assistant/...); write the conversation as this checkpoint's template takes it"),
], ids=["content null", "content a number", "role an array", "turns out of order"])
def test_chat_messages_the_template_cannot_render_are_refused_naming_the_row(tmp_path, edit, what):
    """Before, the template's own exceptions (jinja2's UndefinedError on ``None.strip()``, its
    ``raise_exception`` for turns out of order) came out of the compile as they were."""
    rows = [json.loads(line) for line in (DATA / "weekdays" / "chat.jsonl").read_text().splitlines() if line.strip()]
    edit(rows[1]["counterfactual_inputs"][0])
    (tmp_path / "weekdays").mkdir()
    (tmp_path / "weekdays" / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = json.loads((V2 / "chat_turn.causalab.json").read_text())
    with pytest.raises(DataError) as caught:
        compiler.compile_plan(raw, document=V2 / "chat_turn.causalab.json", models=[MODELS], data=[tmp_path])
    assert str(caught.value) == f"roles.counterfactual.field: {what}"


def test_a_chat_template_that_does_not_parse_is_the_checkpoints_refusal():
    tok = transformers.AutoTokenizer.from_pretrained(str(MODELS / "tiny-llama"))
    tok.chat_template = "{% if messages %}unclosed"
    with pytest.raises(CompileError) as caught:
        render_row(tok, [{"role": "user", "content": "Hi."}], "roles.base.field", 0)
    assert str(caught.value).startswith("roles.base.field: the checkpoint's chat template is not a template "
                                        "(Unexpected end of template.")
    assert str(caught.value).endswith(", line 1); fix the checkpoint's chat_template, or use plain-text prompts")


def test_eos_is_refused_in_the_prompt_frame():
    with pytest.raises(ValueError, match="eos"):
        Where(index=-1, scope=Anchor(segment="eos"))
    with pytest.raises(ValueError, match="eos"):
        Where.from_json({"index": -1, "scope": {"segment": "eos"}})
    with pytest.raises(ValueError, match="generated frame has only 'eos'"):
        Where(frame="generated", index=-1, scope=Anchor(segment="user[1]"))


def test_the_continuation_frame_of_hand_made_ids(llama):
    # The generated frame is the ids a decode produced, cut at each row's first stop token.
    # mini's decode never stops (min_new_tokens == max_new_tokens), so eos is reachable only here.
    eos = llama.eos_token_id
    said = llama(" Thursday.", add_special_tokens=False)["input_ids"]
    other = llama(" Friday, then", add_special_tokens=False)["input_ids"]
    stopped = said + [eos] + other[:2]  # what follows the stop is not the row's
    running = other + other[:1]  # never stopped: the whole bound
    frame = locate.continuation_frame(llama, [stopped, running], [eos])
    stop_at = stopped.index(eos)
    assert frame.ends == (stop_at + 1, len(running)) and frame.starts == (0, 0)
    assert frame.texts[0] == continued(llama, stopped[:stop_at + 1])
    windows, reasons = locate.locate(frame, Where(frame="generated", index=-1, scope=Anchor(segment="eos")))
    assert windows == ((stop_at,), ()) and reasons == ("", locate.MISSING)
    assert locate.tokens_of(frame, windows[0], 0) == repr(llama.eos_token)
    last, _ = locate.locate(frame, Where(frame="generated", index=-1))
    assert last == ((stop_at,), (len(running) - 1,))
    # The row's own said text, found in what it generated (before its stop).
    found, reasons = locate.locate(frame, Where(frame="generated", all=True, scope=Anchor(variable="said")),
                                   ("Thursday", "Thursday"))
    assert reasons == ("", locate.MISSING)
    assert [stopped[p] for p in found[0]] == llama(" Thursday", add_special_tokens=False)["input_ids"]
    assert continued(llama, [stopped[p] for p in found[0]]) == " Thursday"


def test_a_segment_on_a_plain_text_role_is_refused_at_compile_time():
    raw = json.loads((V2 / "entity_patch.causalab.json").read_text())
    raw["interventions"]["patching"]["writes"]["patch"]["pos"] = {"index": -1, "scope": {"segment": "user[1]"}}
    with pytest.raises(CompileError) as caught:
        compiler.compile_plan(raw, models=[MODELS], data=[DATA])
    assert caught.value.path.endswith(".pos.scope.segment")
    assert caught.value.path == "interventions.patching.writes.patch.pos.scope.segment"
    assert "plain-text" in caught.value.problem


# --- properties --------------------------------------------------------------------------------

@st.composite
def batches(draw):
    model = draw(st.sampled_from(FAMILIES))
    outcomes = draw(st.lists(st.sampled_from(("unique", "unique", "missing", "ambiguous")), min_size=1, max_size=4))
    drawn = [draw(cst.anchored_texts(o)) for o in outcomes]
    return model, [t for t, _ in drawn], [v for _, v in drawn]


@FEW
@given(batches(), st.data())
def test_anchored_windows_cover_the_anchor_and_ignore_padding_and_order(toks, drawn, data):
    model, texts, values = drawn
    tok = toks[model]
    p = bos_len(tok)
    own = [tok(t)["input_ids"] for t in texts]
    decoded = [tok.decode(o[p:]) for o in own]

    # The run, independently: the tokens overlapping the value's characters in the decoded row.
    runs = []
    for r, (text, value) in enumerate(zip(decoded, values)):
        hits = cst.anchor_hits(text, value)
        if hits != 1:
            runs.append((None, locate.MISSING if hits == 0 else locate.AMBIGUOUS))
            continue
        spelling = next(s for s in (value, " " + value, value.strip()) if s and s in text)
        a = text.index(spelling)
        offsets = growing_offsets(tok, own[r][p:])
        runs.append((overlapping(offsets, a, a + len(spelling)), ""))
    lengths = [len(run) for run, _ in runs if run]
    if lengths:
        where = replace(data.draw(cst.positions(lengths)), scope=Anchor(variable="v"))
    else:
        where = entity("v", index=-1)

    ids, mask, frame = locate.frame_of_texts(tok, texts)
    windows, reasons = locate.locate(frame, where, values)
    width = len(ids[0])
    for r, (run, why) in enumerate(runs):
        if run is None:
            assert windows[r] == () and reasons[r] == why
            assert locate.tokens_of(frame, windows[r], r) == ""
            continue
        shift = width - len(own[r]) + p
        assert reasons[r] == ""
        assert windows[r] == tuple(shift + k for k in python_slice(run, where)), (texts[r], where)
        got = window_text(tok, ids[r], windows[r])
        if where.all:
            assert values[r].strip() in got
        # Every token of the window overlaps the value's characters, and tokens_of shows them.
        offsets = growing_offsets(tok, own[r][p:])
        ks = [q - shift for q in windows[r]]
        shown = decoded[r][offsets[ks[0]]:offsets[ks[-1] + 1]]
        assert locate.tokens_of(frame, windows[r], r) == repr(shown)
        assert shown.strip() and got.strip() in shown

    # Right padding and any order of the rows: the same tokens.
    rids, rmask = right_padded(tok, texts)
    right, rreasons = locate.locate(locate.build_frame(tok, rids, rmask), where, values)
    assert rreasons == reasons
    for r in range(len(texts)):
        shift = width - len(own[r])
        assert right[r] == tuple(q - shift for q in windows[r])
        assert [rids[r][q] for q in right[r]] == [ids[r][q] for q in windows[r]]
    order = data.draw(st.permutations(range(len(texts))))
    pids, _pmask, pframe = locate.frame_of_texts(tok, [texts[i] for i in order])
    permuted, preasons = locate.locate(pframe, where, [values[i] for i in order])
    assert preasons == tuple(reasons[i] for i in order)
    assert permuted == tuple(windows[i] for i in order)
    assert [locate.tokens_of(pframe, w, k) for k, w in enumerate(permuted)] == \
        [locate.tokens_of(frame, windows[i], i) for i in order]
    # Each row alone: the same tokens, shifted by its padding in the batch.
    for r in range(len(texts)):
        _i, _m, alone = locate.frame_of_texts(tok, [texts[r]])
        (w,), _ = locate.locate(alone, where, [values[r]])
        assert tuple(q + width - len(own[r]) for q in w) == windows[r]

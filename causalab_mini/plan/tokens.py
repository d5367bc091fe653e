"""Tokenization on the client: prompts left padded, and one vocabulary id per answer.

The ids are made by ``locate.encode_rows`` — the encoding the resolver's own
``frame_of_texts`` uses — so the client and the run cannot disagree about what
a row is. A chat row's turns are located here, in the row's *decoded* content:
the coordinates the resolver works in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import CompileError
from ..ops import locate


@dataclass(frozen=True)
class Rendered:
    text: str
    turns: Optional[tuple[tuple[str, str], ...]] = None  # (role, content) of a chat; None for a plain prompt


@dataclass(frozen=True)
class Tokenized:
    ids: tuple[tuple[int, ...], ...]
    mask: tuple[tuple[int, ...], ...]
    texts: tuple[str, ...]
    sample: str  # row 0's ids decoded by this tokenizer
    prefix: int  # tokens the tokenizer puts before every prompt (BOS)
    segments: Optional[tuple[dict, ...]]


def tokenize_rows(tok, rendered: list[Rendered], *, path: str = "", prefix: Optional[int] = None) -> Tokenized:
    """``prefix``: what an earlier call with ``tok`` found it puts before every prompt (None: asked)."""
    ids, mask = locate.encode_rows(tok, [r.text for r in rendered])
    prefix = len(locate.special_prefix(tok)) if prefix is None else prefix
    segments = None
    if any(r.turns for r in rendered):
        segments = tuple(
            turn_spans(locate.content_text(tok, ids[i], mask[i], prefix), r.turns or (), path, i)
            for i, r in enumerate(rendered))
    first = [t for t, m in zip(ids[0], mask[0]) if m] if ids else []
    return Tokenized(ids=ids, mask=mask, texts=tuple(r.text for r in rendered),
                     sample=locate.decode(tok, first), prefix=prefix, segments=segments)


def turn_spans(text: str, turns, path: str, row: int) -> dict:
    """Each turn's content as a character span of ``text``: ``role[k]``, and ``role`` for a role that spoke once.

    Each content is found as itself, after the previous turn, so the template's
    control tokens sit between turns and inside none of them.
    """
    spans: dict = {}
    counts: dict = {}
    cursor = 0
    for role, content in turns:
        start = text.find(content, cursor)
        if start < 0:
            raise CompileError(path, f"row {row}: the {role} turn's content {content!r} is not in the "
                               "conversation as the tokenizer decodes it",
                               "use plain-text prompts, or messages the template renders verbatim")
        k = counts.get(role, 0)
        counts[role] = k + 1
        spans[f"{role}[{k}]"] = (start, start + len(content))
        cursor = start + len(content)
    for role, n in counts.items():
        if n == 1:  # the bare name only for a role that spoke once; twice is ambiguous
            spans[role] = spans[f"{role}[0]"]
    return spans


def answer_tokens(tok, value, *, path: str) -> tuple[int, ...]:
    """The ids a model would produce for ``value`` said after a word (token_form ``space_prefixed``);
    a metric scores the first, and says how many there are.

    Encoding ``" Sunday"`` alone is tokenizer-dependent (a sentencepiece tokenizer
    may prepend its own space marker); encoding it after a word and taking the
    new tokens is what the model actually predicts.
    """
    word = str(value).strip()
    if not word:
        raise CompileError(path, f"the answer {value!r} is empty", "give the row a non-empty answer")
    head = tok("a", add_special_tokens=False)["input_ids"]
    full = tok("a " + word, add_special_tokens=False)["input_ids"]
    continued = _continuation(head, full)
    if continued is None:
        raise CompileError(path, f"{value!r} does not tokenize as a continuation on this tokenizer",
                           "use an answer the tokenizer can spell after a space")
    return continued


def answers_tokens(tok, values: list) -> list[Optional[tuple[int, ...]]]:
    """``answer_tokens`` of each value, None where it would refuse (it says why, with the field
    that asked); the answers asked of the tokenizer together (``locate.encode_each``)."""
    words = [str(v).strip() for v in values]
    said = [w for w in words if w]
    if not said:
        return [None] * len(words)
    head = tok("a", add_special_tokens=False)["input_ids"]
    encoded = iter(locate.encode_each(tok, ["a " + w for w in said], add_special_tokens=False))
    return [_continuation(head, next(encoded)) if w else None for w in words]


def _continuation(head, full) -> Optional[tuple[int, ...]]:
    """The ids ``full`` adds after ``head`` (what the model predicts after the word), or None when
    it does not start with them or adds nothing."""
    if full[: len(head)] != head or len(full) == len(head):
        return None
    return tuple(full[len(head):])

"""Tokenization on the client: prompts left padded, and one vocabulary id per answer.

Each prompt is encoded on its own and padded on the left by hand, so the ids do
not depend on a tokenizer's padding defaults, and every row's last token sits
at the same index.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import CompileError
from ..ops.locate import special_prefix


@dataclass(frozen=True)
class Rendered:
    text: str
    segments: Optional[dict]  # chat turn name -> (start, end) in ``text``; None for a plain prompt


@dataclass(frozen=True)
class Tokenized:
    ids: tuple[tuple[int, ...], ...]
    mask: tuple[tuple[int, ...], ...]
    texts: tuple[str, ...]
    sample: str  # row 0's ids decoded by this tokenizer
    prefix: int  # tokens the tokenizer puts before every prompt (BOS)
    segments: Optional[tuple[dict, ...]]


def pad_id(tok) -> int:
    for candidate in (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id, 0):
        if candidate is not None:
            return candidate
    return 0


def tokenize_rows(tok, rendered: list[Rendered]) -> Tokenized:
    encoded = [list(tok(r.text)["input_ids"]) for r in rendered]
    width = max(len(e) for e in encoded)
    pad = pad_id(tok)
    ids = tuple(tuple([pad] * (width - len(e)) + e) for e in encoded)
    mask = tuple(tuple([0] * (width - len(e)) + [1] * len(e)) for e in encoded)
    segments = tuple(r.segments for r in rendered) if any(r.segments for r in rendered) else None
    return Tokenized(ids=ids, mask=mask, texts=tuple(r.text for r in rendered),
                     sample=tok.decode(encoded[0]), prefix=len(special_prefix(tok)), segments=segments)


def answer_token(tok, value, *, path: str) -> int:
    """The id a model would produce for ``value`` said after a word (token_form ``space_prefixed``).

    Encoding ``" Sunday"`` alone is tokenizer-dependent (a sentencepiece tokenizer
    may prepend its own space marker); encoding it after a word and taking the
    first new token is what the model actually predicts.
    """
    word = str(value).strip()
    if not word:
        raise CompileError(path, f"the answer {value!r} is empty", "give the row a non-empty answer")
    head = tok("a", add_special_tokens=False)["input_ids"]
    full = tok("a " + word, add_special_tokens=False)["input_ids"]
    if full[: len(head)] != head or len(full) == len(head):
        raise CompileError(path, f"{value!r} does not tokenize as a continuation on this tokenizer",
                           "use an answer the tokenizer can spell after a space")
    return full[len(head)]

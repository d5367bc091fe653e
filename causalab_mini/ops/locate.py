"""Position resolution: find the run, cut it, check the cut is inside it.

Imports nothing but the standard library and ``shapes`` (torch only where a
tensor is handed in), because it runs wherever the model is.

This module holds the cut: one ``Where`` applied to one run ``[start, end)`` of
absolute indices into the padded row. Negatives count from the end of the run,
not of the row, so ``{"index": -1}`` inside a scope is the anchor's last token.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..shapes import Where

Window = tuple[int, ...]


def cut(start: int, end: int, where: Where) -> Optional[Window]:
    """The absolute positions ``where``'s cut names in the run ``[start, end)``; None if it does not fit."""
    n = end - start
    if where.index is not None:
        i = where.index + n if where.index < 0 else where.index
        return (start + i,) if 0 <= i < n else None
    if where.last is not None:
        return tuple(range(end - where.last, end)) if where.last <= n else None
    if where.all:
        return tuple(range(start, end)) if n > 0 else None
    a, b = where.span
    a = a + n if a < 0 else a
    b = b + n if b < 0 else b
    if not (0 <= a < b <= n):
        return None
    return tuple(range(start + a, start + b))


def special_prefix(tok) -> tuple[int, ...]:
    """What the tokenizer puts before every prompt, asked rather than guessed: encode the empty string.

    Llama's sentencepiece prepends a BOS and GPT-2's BPE nothing; without asking,
    ``{"index": 0}`` would be ``<s>`` on one family and the first word on the other.
    """
    return tuple(tok("")["input_ids"])


def content_spans(mask: Sequence[Sequence[int]], prefix: int) -> tuple[tuple[int, int], ...]:
    """Each row's run: its real tokens after the prefix the tokenizer adds to everything (BOS)."""
    spans = []
    for row in mask:
        first = next((i for i, m in enumerate(row) if m), len(row))
        last = max((i for i, m in enumerate(row) if m), default=first - 1) + 1
        spans.append((min(first + prefix, last), last))
    return tuple(spans)


def cut_rows(spans: Sequence[tuple[int, int]], where: Where) -> tuple[Optional[Window], ...]:
    """The fixed cut of every row's run (the prompt frame with no scope)."""
    return tuple(cut(a, b, where) for a, b in spans)

"""Scoring: one position of logits per row, one vocabulary id per row per column, one number per row.

Which columns a kind takes, and in which order, is ``vocab.COLUMNS`` — read here
as well as by the document validator, so the two cannot disagree about which
data column is ``a`` and which is ``b``.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .. import vocab
from ..errors import EngineError
from .intervene import exact

# What to do about a refusal the compiler makes first, so that a document should not reach it.
_SEE_PLAN = ("check the document's sites, widths and operands with `causalab-mini explain DOC`; a document that compiles should never reach this check, so if it does, report it with the document")


def squeeze_positions(value: Tensor, ragged: bool, *, path: str = "") -> Tensor:
    """A metric's ``(n, vocab)`` from a read: the rectangle's unit window squeezed off, a flat read as it is."""
    if ragged:
        if value.dim() != 2:
            raise EngineError(path, f"a ragged read is (total, vocab), got {tuple(value.shape)}", _SEE_PLAN)
        return value
    if value.dim() != 3 or value.shape[1] != 1:
        raise EngineError(path, f"a metric scores one position per row: expected (rows, 1, vocab), "
                                f"got {tuple(value.shape)}", _SEE_PLAN)
    return value[:, 0, :]


def _pick(values: Tensor, ids: Tensor) -> Tensor:
    return values.gather(-1, ids[:, None]).squeeze(-1)


def score(kind: str, logits: Tensor, token_ids: Sequence[Tensor], *, path: str = "") -> Tensor:
    """One float32 value per row of ``logits`` ``(n, vocab)``; ``token_ids`` one ``(n,)`` id tensor per column.

    match: 1.0 where argmax == expected else 0.0; logit_diff: logit[a] − logit[b];
    cross_entropy: −log_softmax[target]; token_logit: logit[token];
    token_prob: softmax[token]. Differentiable for every kind but match.
    """
    if kind not in vocab.COLUMNS:
        raise EngineError(path, f"unknown metric kind {kind!r}; one of {', '.join(sorted(vocab.COLUMNS))}", _SEE_PLAN)
    columns = vocab.COLUMNS[kind]
    if len(token_ids) != len(columns):
        raise EngineError(path, f"{kind} takes {len(columns)} id column{'s' if len(columns) > 1 else ''} "
                                f"({', '.join(columns)}), got {len(token_ids)}", _SEE_PLAN)
    if logits.dim() != 2:
        raise EngineError(path, f"{kind} scores (n, vocab) logits, got {tuple(logits.shape)}",
                          "squeeze_positions takes a read to that shape")
    n, width = logits.shape
    ids = []
    for name, t in zip(columns, token_ids):
        t = torch.as_tensor(t)
        if tuple(t.shape) != (n,):
            raise EngineError(path, f"{kind}: column {name!r} has shape {tuple(t.shape)}, the logits {n} rows", _SEE_PLAN)
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise EngineError(path, f"{kind}: column {name!r} holds {t.dtype}, not vocabulary ids", _SEE_PLAN)
        # A bad id on CUDA is a device-side assert, not an exception: check first.
        if n and (int(t.min()) < 0 or int(t.max()) >= width):
            raise EngineError(path, f"{kind}: column {name!r} has ids outside the vocabulary of {width}", _SEE_PLAN)
        ids.append(t.to(device=logits.device, dtype=torch.long))

    with exact():
        lg = logits.to(torch.float32)
        if kind == "match":
            return (lg.argmax(dim=-1) == ids[0]).to(torch.float32)
        if kind == "logit_diff":
            return _pick(lg, ids[0]) - _pick(lg, ids[1])
        if kind == "cross_entropy":
            return -_pick(torch.log_softmax(lg, dim=-1), ids[0])
        if kind == "token_logit":
            return _pick(lg, ids[0])
        if kind == "token_prob":
            return _pick(torch.softmax(lg, dim=-1), ids[0])
    raise AssertionError(f"metric kind {kind!r} is in vocab.COLUMNS but has no scorer")  # pragma: no cover

"""Scoring: one position of logits per row, one vocabulary id per row per column, one number per row.

What each kind computes, and which columns it takes in which order, is its record
in the metric registry (``metric_kinds.METRICS``, the same table as ``vocab.METRICS``)
— read here as well as by the document validator, so the two cannot disagree about
which data column is ``a`` and which is ``b``. This module checks the inputs every
kind shares and calls the kind's ``compute``; it knows no kind by name.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from ..errors import EngineError
from ..metric_kinds import BUILT_IN, METRICS
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


def score(kind: str, logits: Tensor, token_ids: Sequence[Tensor], *, reads: Optional[dict] = None,
          params: Optional[dict] = None, path: str = "") -> Tensor:
    """One float32 value per row of ``logits`` ``(n, vocab)`` (``scored`` without the rows a kind
    leaves undefined: their values are whatever its compute put there)."""
    return scored(kind, logits, token_ids, reads=reads, params=params, path=path)[0]


def scored(kind: str, logits: Tensor, token_ids: Sequence[Tensor], *, reads: Optional[dict] = None,
           params: Optional[dict] = None, path: str = "") -> tuple[Tensor, Optional[Tensor]]:
    """``(values, defined)``: one float32 value per row of ``logits`` ``(n, vocab)``, and, for a
    kind that may leave a row undefined, which rows are (an ``(n,)`` bool tensor; else None).

    ``token_ids``: one ``(n,)`` id tensor per column; ``reads``: the kind's other reads by slot,
    each ``(n, vocab)`` at the same rows; ``params``: its validated parameters. The kind's
    ``compute`` (see metric_kinds.py) gets the logits and reads in float32 and the ids as long
    tensors on the logits' device, autocast off. Whatever it returns is held to that contract
    here — shape, dtype, no NaN — so a wrong kind (an extension's included) is refused by name,
    never averaged.
    """
    record = METRICS.get(kind)
    if record is None:
        raise EngineError(path, f"unknown metric kind {kind!r}; one of {', '.join(sorted(METRICS))}", _SEE_PLAN)
    columns = record.columns
    if len(token_ids) != len(columns):
        raise EngineError(path, f"{kind} takes {len(columns)} id column{'' if len(columns) == 1 else 's'} "
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
    reads = dict(reads or {})
    if set(reads) != set(record.reads):
        raise EngineError(path, f"{kind} compares with the reads {list(record.reads)}, got {sorted(reads)}", _SEE_PLAN)
    for slot, other in reads.items():
        if tuple(other.shape) != (n, width):
            raise EngineError(path, f"{kind}: read {slot!r} is {tuple(other.shape)}, the logits ({n}, {width})",
                              _SEE_PLAN)
        reads[slot] = other.to(device=logits.device, dtype=torch.float32)

    whose = f"the compute registered for {kind!r} by {record.origin}"
    # Logits held elsewhere (a stock NDIF server's, engine/request.py) are scored there, by the same
    # arithmetic (the built-in kinds' are the kernel's); None: here after all.
    elsewhere = getattr(type(logits), "scored_elsewhere", None) if record.origin == BUILT_IN else None
    got = elsewhere(logits, kind, ids, reads, dict(params or {})) if elsewhere is not None else None
    if got is None:
        with exact():
            try:
                got = record.compute(logits.to(torch.float32), *ids, **reads, **dict(params or {}))
            except Exception as err:  # noqa: BLE001 — a kind's own failure, named, not a traceback from the walk
                if record.origin == BUILT_IN:
                    raise
                raise EngineError(path, f"{kind}: {whose} raised {type(err).__name__}: {err}",
                                  f"fix or upgrade {record.origin}, or score with another kind") from None
    values, defined = got if isinstance(got, tuple) and len(got) == 2 else (got, None)
    # A registered kind's compute is outside this module's control: hold it to the contract
    # the callers rely on (one float32 per row), so a wrong one fails here and not in a mean.
    if not isinstance(values, Tensor) or tuple(values.shape) != (n,) or values.dtype != torch.float32:
        shown = (f"{values.dtype} {tuple(values.shape)}" if isinstance(values, Tensor) else type(values).__name__)
        raise EngineError(path, f"{kind}: {whose} returned {shown}, not one float32 value per row ({n},)",
                          f"fix the compute registered for {kind!r} (metric_kinds.register_metric)")
    if defined is not None:
        if not isinstance(defined, Tensor) or tuple(defined.shape) != (n,) or defined.dtype != torch.bool:
            shown = (f"{defined.dtype} {tuple(defined.shape)}" if isinstance(defined, Tensor) else type(defined).__name__)
            raise EngineError(path, f"{kind}: {whose} returned a row mask of {shown}, not ({n},) bool",
                              "return (values, defined) with defined a bool tensor, or values alone")
        if not record.excludes:
            raise EngineError(path, f"{kind}: {whose} returned a row mask but declares no reason (excludes)",
                              "register the kind with excludes=\"<why a row is undefined>\"")
    bad = values.isnan() if defined is None else values.isnan() & defined
    if bool(bad.any()):
        raise EngineError(path, f"{kind}: {whose} returned NaN on {int(bad.sum())} of {n} rows",
                          "a NaN is a bug, not a value: leave an undefined row out by returning (values, "
                          "defined) with an excludes reason" if record.origin != BUILT_IN else
                          "check the model's dtype (fp16 overflows) and its logits")
    return values, defined


def score_sequence(kind: str, columns: Sequence[tuple[Sequence[Tensor], Sequence[Tensor]]], per_token: str,
                   *, path: str = "") -> Tensor:
    """One float32 value per row for a whole-answer metric (``"score": "sequence"``).

    ``columns``: per answer column of the kind (its ``columns`` order), per scored row, the logits
    ``(L, vocab)`` at the positions that predict the answer's ``L`` tokens (teacher-forced) and
    those ``L`` token ids. Each row's answer log-probability is the sum of its tokens' (or their
    mean, ``per_token="mean"``); the kind then says what is reported (metric_kinds.SEQUENCE_KINDS).
    """
    from .. import kernel
    from ..metric_kinds import SEQUENCE_KINDS

    if kind not in SEQUENCE_KINDS:
        raise EngineError(path, f"{kind} does not score whole answers", _SEE_PLAN)
    for segments, answers in columns:
        for logits, ids in zip(segments, answers):
            if logits.dim() != 2 or logits.shape[0] != ids.shape[0] or not len(ids):
                raise EngineError(path, f"{kind}: a forced answer of {len(ids)} token(s) has logits "
                                  f"{tuple(logits.shape)}", _SEE_PLAN)
    # Logits held elsewhere (a stock NDIF server's, engine/request.py) are scored there; the
    # arithmetic is the kernel's either way.
    held = [type(logits) for segments, _ in columns for logits in segments]
    elsewhere = getattr(held[0], "sequence_scored_elsewhere", None) if held else None
    got = elsewhere(kind, columns, per_token) if elsewhere is not None else None
    if got is not None:
        return got
    with exact():
        return kernel.sequence_scores(kind, columns, per_token)

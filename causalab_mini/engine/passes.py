"""One pass, as both engines run it: positions resolved, forwards windowed, metrics scored.

What the walk (``steps.py``) and the attribution pass (``attribution.py``) share: the walk's state,
``resolve`` (every op's window per row, against the engine's tokenizer), ``run_forwards`` (a
pass's forwards window by window), and ``observe`` = ``prepare`` + the forwards + ``finish`` (the
continuations placed, the metrics scored — ``score`` — the outputs published). Each calls the
engine for exactly one thing, running a forward (``engine.forward``), and none touches the model.
``walking`` is one walk's scope (``running/execution.py`` enters it): inside it, what the passes
ask the engine's tokenizer is asked once, not once per pass.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional

import torch

from ..errors import EngineError
from ..memo import kept
from ..metric_kinds import BUILT_IN, METRICS
from ..ops import intervene, locate, metrics as metric_ops, reduce
from ..plan.plan import Forward, Observe, WriteOp
from . import progress, taps

@dataclass
class Published:
    """An output a step published: the value, and how to slice it when rows are windowed."""

    value: torch.Tensor
    per_row: bool  # rectangular (rows, …): windows slice it; a reduction has no row axis
    counts: Optional[tuple[int, ...]] = None  # flat (total, …): positions per row


@dataclass
class Lent:
    """A shared forward's read, as the points that borrow it take it: the op (its position spec),
    its value over every row, its window per row, and its positions record (None if not recorded)."""

    op: object
    value: Published
    window: tuple
    ragged: bool
    record: Optional[dict]


@dataclass
class State:
    """The walk's locals: published outputs, live featurizers, the shared forwards' reads (and the
    points still to borrow each). Never saved, never shipped."""

    outputs: dict = field(default_factory=dict)
    featurizers: dict = field(default_factory=dict)
    shared: dict = field(default_factory=dict)  # shared read name -> Lent
    borrowers: dict = field(default_factory=dict)  # shared read name -> points yet to run that borrow it
    estimates: dict = field(default_factory=dict)  # id of an estimated Observe -> its attribution pass's gradients



# --- positions ----------------------------------------------------------------

WRITE_SKIP = ("A read may skip a row; a write may not — writing nothing somewhere is not an "
              "intervention, and the row would score as if one had happened")
REASON_FIXES = ("`alignment_ambiguous` is a value that is in the prompt more than once, and scoping "
                "the anchor is what makes it one; `alignment_missing` is a value (or a segment) the "
                "row does not have; `cut_outside_scope` is a cut longer than the run it cuts")


def _ops(forward: Forward):
    return (*forward.writes, *forward.reads)


# What a walk has asked its engine's tokenizer: a tokenizer's special prefix, by the tokenizer's
# identity (memo.kept). None outside a walk (``walking``).
_ASKED: ContextVar[Optional[dict]] = ContextVar("causalab_walk_prefixes", default=None)


@contextmanager
def walking() -> Iterator[None]:
    """One walk of a plan (``running/execution.py`` runs every walk inside one): the engine's
    tokenizer does not change while it walks, so it is asked for its special prefix once, not once
    per pass — an encode of the empty string, which wakes the tokenizer's thread pool each time
    (a sweep's passes ask it between forwards). Each walk asks afresh."""
    token = _ASKED.set({})
    try:
        yield
    finally:
        _ASKED.reset(token)


def _prefix(tok) -> int:
    """The number of tokens ``tok`` puts before every prompt (``locate.special_prefix``)."""
    asked = _ASKED.get()
    if asked is None:
        return len(locate.special_prefix(tok))
    return kept(asked, tok, lambda: len(locate.special_prefix(tok)))


def resolve(engine, forwards: tuple[Forward, ...], *, anchored: Optional[bool] = None,
            lent: Optional[dict] = None) -> tuple[tuple[Forward, ...], Optional[dict]]:
    """Every op's window per row, resolved against the engine's tokenizer; and where they acted.

    A pass whose every position is fixed by the document (a bare index, span, last
    or all of the whole prompt) resolves the same integers on every row and run:
    no character map is built and nothing is recorded (None). Any other pass builds
    one frame per forward and records, per op, each row's window, the reason an
    empty one is empty, and the tokens it addressed.
    """
    tok = engine.tokenizer
    prefix = _prefix(tok)
    if anchored is None:
        anchored = any(not op.where.fixed for f in forwards for op in _ops(f))
    record: Optional[dict] = {} if anchored else None
    resolved = []
    for f in forwards:
        prompt_ops = [op for op in _ops(f) if op.where.frame == "prompt"]
        spans = locate.content_spans(f.mask, prefix)
        if anchored:
            _check_skew(tok, f, prefix)
            frame = locate.build_frame(tok, f.ids, f.mask, f.segments, prefix=prefix)
            found = {op.name: locate.locate(frame, op.where, op.anchors) for op in prompt_ops}
        else:
            found = {op.name: locate.fixed_windows(spans, op.where) for op in prompt_ops}
        for op in prompt_ops:
            _check_rows(op, f, spans, *found[op.name])
            if record is not None:
                windows, reasons = found[op.name]
                record[op.name] = {"rows": windows, "reason": reasons,
                                   "tokens": tuple(locate.tokens_of(frame, w, r) for r, w in enumerate(windows))}
        # A generated-frame op acts at its decode step's own position, and a cut of the
        # continuation is placed after the decode (``place_continuation``): nothing to resolve yet.
        entries = [(op.name, found[op.name][0], op.where.ragged) if op.where.frame == "prompt"
                   else (op.name, (), op.where.ragged) for op in _ops(f)]
        if f.forced is not None:
            # The scored read of a teacher-forced forward: every position that predicts an
            # answer token, a row's as many as its answer has (flat).
            entries = [(n, taps.forced_window(f), True) if n == f.forced_read else (n, w, r)
                       for n, w, r in entries]
        resolved.append(replace(f, windows=tuple(entries)))
    _check_operands(tuple(resolved), lent or {})
    return tuple(resolved), record


def _check_skew(tok, forward: Forward, prefix: int) -> None:
    """Row 0 decoded by the run's tokenizer must read as the client recorded it.

    A different tokenizer on the two sides would put every position in range and in
    the wrong place, silently. One row is a sample, not a proof.
    """
    here = locate.decode(tok, [t for t, m in zip(forward.ids[0], forward.mask[0]) if m])
    if here != forward.sample:
        raise EngineError(f"{forward.model} on {forward.input}",
                          f"the run's tokenizer decodes row 0 as {here!r}, and the client that "
                          f"compiled the plan recorded {forward.sample!r}",
                          "compile against the tokenizer of the checkpoint the engine serves "
                          "(the same key and revision)")


def _check_rows(op, forward: Forward, spans, windows, reasons) -> None:
    if all(windows):
        return
    empty = {r: why for r, (w, why) in enumerate(zip(windows, reasons)) if not w}
    if op.where.scope is None:
        # A cut of the whole prompt names the same tokens on every row: a row it does not
        # fit is a document wrong about its own prompts (the compiler refused it on its
        # tokenizer; a skewed one can still get here).
        problem, fix = locate.misfit(op.name, op.where, spans, sorted(empty))
        raise EngineError(op.name, f"{problem}, in {forward.model!r} on {forward.input!r}", fix)
    if isinstance(op, WriteOp):
        raise EngineError(op.name, f"write {op.name!r} has nothing to write on row(s) {empty}. "
                          f"{WRITE_SKIP}", REASON_FIXES)


def _check_operands(forwards: tuple[Forward, ...], lent: dict) -> None:
    """A write's operand read must hold, on every row, as many positions as the write acts on.
    ``lent``: reads borrowed from a shared forward, by this pass's names for them."""
    windows = {name: borrowed.window for name, borrowed in lent.items()}
    windows.update((name, w) for f in forwards for name, w, _ in f.windows)
    for f in forwards:
        for w in f.writes:
            if w.operand is None or w.operand.kind != "read" or w.operand.value not in windows:
                continue
            if w.step is not None or any(r.name == w.operand.value and r.step is not None
                                         for g in forwards for r in g.reads):
                continue  # a decode step's write acts on one position per row, and so does its operand
            mine, theirs = windows[w.name], windows[w.operand.value]
            if mine is theirs:  # one cut of one prompt set (locate.fixed_windows): the same positions
                continue
            bad = {r: (len(a), len(b)) for r, (a, b) in enumerate(zip(mine, theirs)) if len(a) != len(b)}
            if bad:
                shown = {r: f"{a} here, {b} in {w.operand.value!r}" for r, (a, b) in bad.items()}
                raise EngineError(f"{w.name}.operand", f"write {w.name!r} and its operand read "
                                  f"{w.operand.value!r} resolved to different numbers of positions on "
                                  f"row(s) {shown}. {WRITE_SKIP}",
                                  "scope both to anchors of the same token length, or read and write "
                                  "one token ({\"index\": -1})")


def place_continuation(engine, forward: Forward, values: dict, windows: dict, record: Optional[dict]) -> None:
    """After a decode: each generated-frame op's steps, and each stacked read cut against the continuation.

    A read of a cut of the continuation (``{"frame": "generated", "index": -1, "scope": …}``)
    fired at every step; here its stack ``(rows, steps, width)`` is cut per row at the steps
    the continuation frame names, a row that has no such place being skipped with its
    reason. Positions in this frame are steps, and the tokens reported are the ones produced.
    """
    generated = values[f"{forward.model}.generated"]
    frame = locate.continuation_frame(engine.tokenizer, generated.tolist(), _stop_ids(engine.tokenizer))
    steps_run = forward.decode
    for op in _ops(forward):
        if op.where.frame != "generated":
            continue
        if op.step == "stack":
            cut, reasons = locate.locate(frame, op.where, op.anchors)
            short = [r for r, w in enumerate(cut) if not w]
            if short and not op.where.ragged:
                # A cut of fixed width names the same number of steps on every row; a row that
                # stopped too early to have them cannot be read rectangularly.
                problem, fix = locate.misfit(op.name, op.where, tuple(zip(frame.starts, frame.ends)), short)
                raise EngineError(op.name, problem.replace("prompts", "continuations"),
                                  "scope the cut, or cut fewer steps than the earliest stop")
            values[op.name] = intervene.gather(values[op.name], cut, ragged=op.where.ragged, path=op.name)
        elif op.step == "all":
            cut, reasons = tuple(tuple(range(steps_run)) for _ in range(forward.rows)), ("",) * forward.rows
        else:
            cut, reasons = tuple((op.step,) for _ in range(forward.rows)), ("",) * forward.rows
        if op.step != "stack":
            # It acted at its step's position; the step is what it is reported at, rectangular.
            windows[op.name] = (cut, False)
        else:
            windows[op.name] = (cut, op.where.ragged)
        if record is not None:
            record[op.name] = {"rows": cut, "reason": reasons,
                               "tokens": tuple(locate.tokens_of(frame, w, r) for r, w in enumerate(cut))}


def _stop_ids(tokenizer) -> set:
    eos = tokenizer.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())


# --- batching windows ---------------------------------------------------------

def slice_forward(forward: Forward, a: int, b: int) -> Forward:
    return replace(forward, ids=forward.ids[a:b], mask=forward.mask[a:b], texts=forward.texts[a:b],
                   forced=forward.forced[a:b] if forward.forced is not None else None,
                   segments=forward.segments[a:b] if forward.segments else None,
                   windows=tuple((n, w[a:b], r) for n, w, r in forward.windows))


def slice_published(p: Published, a: int, b: int) -> torch.Tensor:
    if not p.per_row:
        return p.value
    if p.counts is None:
        return p.value[a:b]
    start = sum(p.counts[:a])
    return p.value[start:start + sum(p.counts[a:b])]


def run_forwards(engine, forwards: tuple[Forward, ...], state: State, rows: int,
                  batch_size: Optional[int], pass_name: str = "", lent: Optional[dict] = None) -> dict:
    """Every forward in schedule order, window by window; reads concatenated back in row order.
    Each window, once through every forward, is announced as a ``"batch"`` of ``pass_name``.
    ``lent``: reads borrowed from a shared forward (this pass's name -> Lent), given to each
    window's forwards as if this pass had read them."""
    size = batch_size or rows
    pieces: dict[str, list] = {}
    given = {**state.outputs, **{name: borrowed.value for name, borrowed in (lent or {}).items()}}
    for a in range(0, rows, size):
        b = min(rows, a + size)
        values = {name: slice_published(p, a, b) for name, p in given.items()}
        published = set(values)
        for f in forwards:
            engine.forward(slice_forward(f, a, b) if size < rows else f, values, state.featurizers)
        for name, value in values.items():
            if name not in published:
                pieces.setdefault(name, []).append(value)
        progress.announce_batch(pass_name, b - a, b, rows)
    return {name: parts[0] if len(parts) == 1 else torch.cat(parts, dim=0) for name, parts in pieces.items()}


# --- observe ------------------------------------------------------------------

@dataclass
class Pass:
    """An Observe made ready to run: its forwards with every op's window resolved, the positions
    record (None when every position is fixed), and the shared reads it borrows."""

    forwards: tuple
    positions: Optional[dict]
    lent: dict  # this pass's name for a borrowed read -> Lent


def observe(engine, obs: Observe, state: State, *, batch_size: Optional[int] = None,
            live: bool = False) -> dict:
    """One pass: forwards in order, then metrics and outputs. Returns the metrics live (for a fit)."""
    ready = prepare(engine, obs, state)
    values = run_forwards(engine, ready.forwards, state, obs.rows, batch_size, obs.name, ready.lent)
    return finish(engine, obs, state, ready, values, live=live)


def prepare(engine, obs: Observe, state: State) -> Pass:
    """Resolve the pass's positions (its borrowed reads' records first, where their forward ran)."""
    missing = [theirs for _, theirs in obs.borrowed if theirs not in state.shared]
    if missing:
        raise EngineError(obs.name, f"this pass borrows {missing[0]!r} from the root plan's shared step, "
                          "which has not run", "run the root plan, or compile with share=False to run "
                          "one point on its own")
    lent = {mine: state.shared[theirs] for mine, theirs in obs.borrowed}
    anchored = any(not op.where.fixed for op in (*(b.op for b in lent.values()),
                                                  *(op for f in obs.forwards for op in _ops(f))))
    forwards, positions = resolve(engine, obs.forwards, anchored=anchored, lent=lent)
    if positions is not None:
        positions = {**{mine: b.record for mine, b in lent.items()}, **positions}
    return Pass(forwards, positions, lent)


def finish(engine, obs: Observe, state: State, ready: Pass, values: dict, *, live: bool = False) -> dict:
    """After the forwards: continuations placed, metrics scored, outputs published, all onto ``obs``."""
    forwards, positions, lent = ready.forwards, ready.positions, ready.lent
    values = {**{mine: b.value.value for mine, b in lent.items()}, **values}
    windows = {mine: (b.window, b.ragged) for mine, b in lent.items()}
    windows.update((name, (w, r)) for f in forwards for name, w, r in f.windows)
    for f in forwards:
        if f.decode:
            place_continuation(engine, f, values, windows, positions)
            obs.results[f"{f.model}.generated"] = values[f"{f.model}.generated"]
    if positions is not None:
        obs.results["positions"] = positions
    scored = {}
    eligible = {}
    excluded = {}
    taken: dict = {}  # what this pass's built-in metrics share (score's ``taken``)
    for m in obs.metrics:
        got = score(m, values, windows, taken)
        scored[m.name], eligible[m.name] = got.value, got.rows
        if got.excluded is not None:
            excluded[m.name] = got.excluded
        obs.results[m.name] = got.value.detach().cpu()
    if excluded:
        obs.results["excluded"] = excluded
    if eligible:
        obs.results["eligible"] = eligible
    for name in obs.kept:  # asked for by the run (cm.run(reads=...)): the value as read, on the CPU
        value = values[name]
        obs.results[name] = value.detach().cpu() if torch.is_tensor(value) else value
    for out in obs.outputs:
        value = values[out.read]
        window, ragged = windows[out.read]
        path = f"steps.{obs.name}.outputs.{out.name}"  # an output's field in the document
        if out.reduce == "mean":
            where = f"interventions.{obs.intervention}.reads.{out.read}.pos"
            _check_harvested(path, where, out, window, positions)
            published = Published(reduce.mean(value), per_row=False)
        elif out.reduce == "pca":
            try:
                published = Published(reduce.pca(value, out.k), per_row=False)
            except ValueError as err:
                raise EngineError(path, str(err), "harvest more vectors (e.g. every token: "
                                  "{\"all\": true}) or a smaller k") from None
        else:
            counts = tuple(len(w) for w in window) if ragged else None
            published = Published(value, per_row=True, counts=counts)
        state.outputs[out.name] = published
        obs.results[out.name] = published.value.detach().cpu()
    return scored if live else {}


@dataclass
class Score:
    """One metric scored: its values at the scored rows, which rows those are (per row of the pass),
    and the kind's reason per row where it left some undefined (else None)."""

    value: torch.Tensor
    rows: tuple
    excluded: Optional[tuple]


def placed(m, windows: dict) -> tuple:
    """Per row, whether metric ``m`` can score it: a value in every answer column (the client's
    half), and — the half only the run knows — a position found in the read it scores and in
    every read its kind compares that one with."""
    found = [True] * len(m.column_eligible)
    for op in (m.of, *(read for _, read in m.reads)):
        found = [f and len(w) > 0 for f, w in zip(found, windows[op][0])]
    return tuple(c and p for c, p in zip(m.column_eligible, found))


def score(m, values: dict, windows: dict, taken: Optional[dict] = None) -> Score:
    """Metric ``m`` on a pass's ``values``: only rows with a value in every answer column and a
    position in the read it scores and in every read its kind compares that one with; a row the
    kind leaves undefined is taken out with its reason. The value keeps its graph (attribution
    differentiates it).

    ``taken``: what one pass's metrics share, made by the first that asks — the rows a metric can
    score, and, given to built-in kinds only (they read what they are given and change none of
    it), the scored rows of a read and the ids of a column: ``iia`` and ``logit_diff`` on one read
    are given the same tensors. An extension's kind is always given its own."""
    rows = placed(m, windows) if taken is None else \
        _taken(taken, ("placed", m.of, m.reads, m.column_eligible), lambda: placed(m, windows))
    if not any(rows):
        raise EngineError(m.name, "no row survives both halves of eligibility (a value in every "
                          "column, and a position the run could place): a metric of nothing has "
                          "no mean", "check the answer columns and the read's position")
    if m.sequence is not None:
        value, defined = _whole_answers(m, values, windows, rows), None
    else:
        kept = [i for i, ok in enumerate(rows) if ok]
        share = taken if taken is not None and METRICS[m.kind].origin == BUILT_IN else {}
        logits = _taken(share, ("rows", m.of, rows), lambda: _scored_rows(values[m.of], *windows[m.of], rows, m.name))
        others = {slot: _taken(share, ("rows", op, rows), lambda op=op, slot=slot: _scored_rows(
            values[op], *windows[op], rows, f"{m.name}.{slot}")) for slot, op in m.reads}
        ids = [_taken(share, ("ids", col, rows), lambda col=col: torch.tensor([col[i] for i in kept], dtype=torch.long))
               for col in m.token_ids]
        value, defined = metric_ops.scored(m.kind, logits, ids, reads=others, params=dict(m.params),
                                           path=m.name)
    excluded = None
    if defined is not None and not bool(defined.all()):
        # The kind left some rows undefined (a zero denominator): out of the scored set, with
        # its reason, exactly as a row without an answer is.
        undefined = {i for i, k in zip([i for i, ok in enumerate(rows) if ok], defined.tolist()) if not k}
        # Per row of the step: the kind's reason where it left the row out, else "".
        excluded = tuple(m.excludes if i in undefined else "" for i in range(len(rows)))
        rows = tuple(ok and i not in undefined for i, ok in enumerate(rows))
        value = value[defined]
        if not any(rows):
            raise EngineError(m.name, f"{m.kind} left every row undefined ({m.excludes}): a metric "
                              "of nothing has no mean", "check the reads it compares (they may not differ)")
    return Score(value, rows, excluded)


def _taken(taken: dict, key, make):
    """``taken[key]``, made first if it is not there."""
    if key not in taken:
        taken[key] = make()
    return taken[key]


def _whole_answers(m, values: dict, windows: dict, rows: tuple):
    """A whole-answer metric's values at the scored rows: per answer column, each row's logits at
    the positions of its teacher-forced forward that predict the answer's tokens, and those tokens."""
    columns = []
    for k, name in enumerate(m.forced_reads):
        window, _ = windows[name]
        segments = torch.split(values[name], [len(w) for w in window])
        columns.append(([segments[i] for i, ok in enumerate(rows) if ok],
                        [torch.tensor(m.pieces[k][i], dtype=torch.long) for i, ok in enumerate(rows) if ok]))
    return metric_ops.score_sequence(m.kind, columns, m.sequence, path=m.name).to(torch.float32)


def _scored_rows(value, window, ragged: bool, rows: tuple, path: str):
    """A read's ``(n, vocab)`` logits at the scored rows: its unit window squeezed off; a flat read
    (one entry per row whose position resolved) indexed by each scored row's place among those."""
    logits = metric_ops.squeeze_positions(value, ragged, path=path)
    if ragged:
        places = [i for i, w in enumerate(window) if len(w) > 0]
        take = [places.index(i) for i, ok in enumerate(rows) if ok]
    else:  # a rectangle has every row: a scored row's place is its own
        take = [i for i, ok in enumerate(rows) if ok]
    return logits.index_select(0, torch.tensor(take, dtype=torch.long, device=logits.device))


def _check_harvested(path: str, pos: str, out, window, positions: Optional[dict]) -> None:
    """A mean needs one vector at least. A fixed cut that fits no row is refused at compile time,
    but an anchored one is resolved here, per row, against the run's tokenizer (positions.md):
    a read skips each row its anchor misses, and when it skips every row there is nothing to
    average — a mean of nothing, which torch would give as NaN and reduce.mean refuses untyped."""
    if any(len(w) for w in window):
        return
    reasons = (positions or {}).get(out.read, {}).get("reason", ())
    counted = {r: reasons.count(r) for r in dict.fromkeys(reasons) if r}
    why = f" ({', '.join(f'{r} on {n}' for r, n in counted.items())})" if counted else ""
    raise EngineError(path, f"no row had a position for read {out.read!r}: its pos ({pos}) landed on "
                      f"none of the {len(window)} rows{why}, so the mean it publishes is a mean of no vectors",
                      "give the read a position every prompt has (`causalab-mini explain DOC --tokens` "
                      f"shows where it lands), or a fixed one such as -1; {REASON_FIXES}")

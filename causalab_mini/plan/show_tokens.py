"""``explain --tokens``: each row as the model sees it, where every op lands, what each metric scores.

Tokens are shown by the tokenizer's own spelling (``'▁Th'``, ``'ĠT'``), numbered as a
document counts them: from the first token of the row's run, after what the tokenizer
puts before every prompt (shown first, unnumbered). A fixed cut is resolved here, from
the plan alone; a cut scoped to a variable or a chat turn, or in the continuation,
resolves at run time, and says so.
"""
from __future__ import annotations

from typing import Sequence

from ..ops import locate
from .plan import Forward, Metric, Observe, ReadOp


def _resolved_here(op) -> bool:
    return op.where.frame == "prompt" and op.where.scope is None


def forward_rows(f: Forward, tok, rows: int, indent: str) -> list[str]:
    """The first ``rows`` rows of a forward: tokens, then each op's positions on that row."""
    prefix = len(locate.special_prefix(tok))
    spans = locate.content_spans(f.mask, prefix)
    ops = [op for tap in f.taps for op in (*tap.writes, *tap.reads)]
    cuts = {op.name: locate.cut_rows(spans, op.where) for op in ops if _resolved_here(op)}
    lines = []
    for r in range(min(rows, f.rows)):
        start, end = spans[r]
        pad = next((i for i, m in enumerate(f.mask[r]) if m), len(f.mask[r]))
        lead = [repr(t) for t in tok.convert_ids_to_tokens(list(f.ids[r][pad:start]))]
        run = tok.convert_ids_to_tokens(list(f.ids[r][start:end]))
        shown = " ".join([*lead, *(f"{i}:{t!r}" for i, t in enumerate(run))])
        lines.append(f"{indent}row {r} ({end - start} tokens): {shown}")
        for op in ops:
            verb = "read " if isinstance(op, ReadOp) else "write"
            if not _resolved_here(op):
                when = "in the continuation" if op.where.frame == "generated" else "from the text"
                lines.append(f"{indent}  {verb} {op.name!r}: {op.where.spelling()} resolves at run time ({when})")
                continue
            window = cuts[op.name][r]
            if window is None:
                lines.append(f"{indent}  {verb} {op.name!r}: {op.where.spelling()} does not fit this row")
                continue
            at = ", ".join(f"{p - start} ({p - end}) {run[p - start]!r}" for p in window)
            lines.append(f"{indent}  {verb} {op.name!r}: {at}")
    if f.rows > rows:
        lines.append(f"{indent}… {f.rows - rows} more row{'s' if f.rows - rows != 1 else ''} "
                     "(--rows N shows more)")
    return lines


def answer_text(m: Metric, k: int, r: int) -> str:
    """``' Thursday' -> '▁Th' (1 of 2 tokens)``: an answer, the token it is scored by, how much of it that is."""
    text, pieces = m.answers[k][r], m.pieces[k][r]
    if pieces is None:
        return "no answer"
    part = f" (1 of {len(pieces)} tokens)" if len(pieces) > 1 else ""
    return f"{text!r} -> {m.scored[k][r]!r}{part}"


def metric_rows(obs: Observe, rows: int, indent: str) -> list[str]:
    """Per metric, the first ``rows`` rows: each answer's scored token, and why a row is excluded."""
    lines = []
    for m in obs.metrics:
        if not m.compared:
            continue
        lines.append(f"{indent}metric {m.name!r} ({m.kind}):")
        for r in range(min(rows, len(m.column_eligible))):
            said = "; ".join(f"{label} {answer_text(m, k, r)}" for k, (label, _) in enumerate(m.compared))
            why = f"  excluded: {m.column_reasons[r]}" if m.column_reasons[r] else ""
            lines.append(f"{indent}  row {r} ({obs.example_ids[r]}): {said}{why}")
    return lines


def collision(m: Metric) -> tuple[str, int]:
    """Why a metric's rows are excluded for comparing an answer with itself, and how many: a shared
    scored token (first-token scoring), or the same whole answer (``"score": "sequence"``)."""
    reason = "answers_identical" if m.sequence is not None else "answers_share_token"
    return reason, m.column_reasons.count(reason)


def exclusions(m: Metric, example_ids: Sequence[str], *, first: int = 3) -> str:
    """The first few rows excluded for a shared token: ``example 2: ' Tuesday' / ' Thursday' -> 'ĠT'``
    (whole answers: the answers alone)."""
    reason, count = collision(m)
    shown = []
    for r, why in enumerate(m.column_reasons):
        if why == reason and len(shown) < first:
            texts = " / ".join(repr(a[r]) for a in m.answers)
            shown.append(f"example {example_ids[r]}: {texts}"
                         + ("" if m.sequence is not None else f" -> {m.scored[0][r]!r}"))
    more = count - len(shown)
    return "; ".join(shown) + (f"; {more} more" if more > 0 else "")


def metric_summary(m: Metric, example_ids: Sequence[str], indent: str) -> list[str]:
    """What explain says of a metric's rows whatever the flags: rows excluded for a shared token,
    rows scored on part of their answer, and where a contrast came from."""
    lines = []
    n = len(m.column_eligible)
    reason, shared = collision(m)
    if m.contrast_from and m.contrast_from != "distinct_from":
        lines.append(f"{indent}metric {m.name!r}: held apart from {m.compared[-1][1]!r} "
                     f"(the other answer of {m.contrast_from})")
    if shared:
        lines.append(f"{indent}metric {m.name!r}: {shared} of {n} rows excluded, {reason}: "
                     f"{exclusions(m, example_ids)}")
    if m.partial:
        lines.append(f"{indent}metric {m.name!r}: {m.partial} of {n} rows scored on the first of "
                     "their answer's several tokens")
    return lines


def notes(plan) -> list[str]:
    """One line per metric of a run whose rows are not all scored on whole, distinct answers:
    what ``causalab-mini run`` prints after the files, so a mean is read for what it is. A sweep
    says it once per metric (and per distinct count), naming the points it applies to."""
    said: dict[tuple[str, str], list[str]] = {}  # (step/metric, what) -> points, in run order
    for path, step in plan.walk():
        if not isinstance(step, Observe):
            continue
        point, where = path.split("/", 1) if _under_point(plan, path) else ("", path)
        for m in step.metrics:
            what = _caveats(m)
            if what:
                said.setdefault((f"{where}/{m.name}", what), []).append(point)
    lines = []
    swept = sum(1 for s in plan.steps.values() if hasattr(s, "steps"))
    for (metric, what), points in said.items():
        named = [p for p in points if p]
        at = ("" if not named else f" (at all {swept} points)" if len(named) == swept
              else f" (at {_points(named)})")
        lines.append(f"note: {metric}: {what}{at}")
    return lines


def _under_point(plan, path: str) -> bool:
    """Whether a step's path starts with a sweep point's name (``layers=0,pos=-1/score``)."""
    head = path.split("/", 1)[0]
    return "/" in path and head in plan.steps and hasattr(plan.steps[head], "steps")


def _points(names: list[str]) -> str:
    """``3 points: a, b, c``, the list cut after five."""
    shown = ", ".join(names[:5]) + (f", … ({len(names) - 5} more)" if len(names) > 5 else "")
    return f"{len(names)} point{'s' if len(names) != 1 else ''}: {shown}"


def _caveats(m: Metric) -> str:
    """What a metric's rows are short of: excluded rows, answers scored on their first token."""
    n = len(m.column_eligible)
    said = []
    reason, shared = collision(m)
    missing = m.column_reasons.count("no_answer")
    if shared:
        said.append(f"{shared} of {n} rows excluded ({reason})")
    if missing:
        said.append(f"{missing} of {n} rows excluded (no_answer)")
    if m.partial:
        said.append(f"{m.partial} of {n} rows scored on the first of several tokens")
    return ", ".join(said)

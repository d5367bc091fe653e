"""How a point differs from its stored baseline, in the words a failure leads with.

``baseline.check`` decides and stores; this module finds what moved and says it: per
result, the rows (or aggregates) beyond tolerance with one summing-up line that names
the worst row and its prompt, and for a changed experiment the fields that changed
(dotted paths, old → new). Kept apart so the file's loading, locking and verdict rules
read without the wording, and the wording can change without touching them.
"""
from __future__ import annotations

import json
import math
from typing import Optional

from causalab_mini import Point

from .checks import Check, close, compare_rows, number

ROW_TEXT = 60  # characters of a row's prompt shown in a drift line


def rows_drift(point: Point, name: str, reference: list, result, rtol: float, atol: float) -> tuple:
    """The rows beyond tolerance (worst first) and the line that sums them up."""
    checks = compare_rows(point.name, name, "baseline", reference, result.pairs(), rtol, atol)
    if not checks:
        return [], ""
    got = result.pairs()
    if [r[0] for r in reference] != [r[0] for r in got]:
        return checks, (f"{name}: the rows are not the same examples ({len(reference)} rows in the baseline, "
                        f"{len(got)} now): the data changed")
    old = [v for _, v in reference if v is not None]
    old_mean = math.fsum(old) / len(old) if old else math.nan
    moved = [(i, eid, ref, now) for i, ((eid, ref), (_, now)) in enumerate(zip(reference, got))
             if not close(ref, now, rtol, atol)]

    def size(m):  # an eligibility change (None on one side) outranks any value
        return math.inf if m[2] is None or m[3] is None else abs(m[3] - m[2])

    i, eid, ref, now = max(moved, key=size)
    change = (f"{now - ref:+.6g}" if size((i, eid, ref, now)) != math.inf
              else f"{_cell(ref)} → {_cell(now)}")
    text = row_text(point, name, eid)
    line = (f"{name}: mean {number(old_mean)} → {number(result.mean())}, {len(moved)} of {len(got)} rows moved, "
            f"worst row {eid} ({change})" + (f" {text!r}" if text is not None else ""))
    order = {f"row {m[1]}": size(m) for m in moved}
    return sorted(checks, key=lambda c: -order.get(c.aggregate, 0)), line


def _cell(value) -> str:
    return "excluded" if value is None else number(value)


def _stored_aggregates(stored: dict) -> tuple:
    """(mean or nan, n, n_rows) of a stored result, aggregates or rows (a rows baseline in aggregates mode)."""
    if "rows" in stored:
        values = [v for v in stored["rows"].values() if v is not None]
        mean = math.fsum(values) / len(values) if values else math.nan
        return mean, len(values), len(stored["rows"])
    mean = stored.get("mean")
    return (math.nan if mean is None else mean), stored["n"], stored["n_rows"]


def aggregates_drift(point: str, name: str, stored: dict, result, rtol: float, atol: float) -> tuple:
    """Aggregates mode: the mean within tolerance, n (eligible rows) and n_rows exactly."""
    old_mean, old_n, old_rows = _stored_aggregates(stored)
    mean, n, n_rows = result.mean(), len(result.values), len(result.rows)
    checks = []
    if not close(old_mean, mean, rtol, atol):
        diff = None if math.isnan(old_mean) or math.isnan(mean) else mean - old_mean
        checks.append(Check(point, name, "mean", f"baseline {number(old_mean)}", mean, diff, False,
                            f"rtol {number(rtol)}, atol {number(atol)}"))
    if n != old_n:
        checks.append(Check(point, name, "n", f"baseline {old_n}", n, n - old_n, False,
                            "eligible rows, held exactly"))
    if n_rows != old_rows:
        checks.append(Check(point, name, "n_rows", f"baseline {old_rows}", n_rows, n_rows - old_rows, False,
                            "the data changed"))
    if not checks:
        return [], ""
    line = (f"{name}: mean {number(old_mean)} → {number(mean)}, n {old_n}" + (f" → {n}" if n != old_n else "")
            + (f", rows {old_rows} → {n_rows}" if n_rows != old_rows else ""))
    return checks, line


def row_text(point: Point, result: str, example_id: str) -> Optional[str]:
    """The prompt of one row of a saved result (``Point.prompt`` in the step that scored it),
    cut to ``ROW_TEXT`` characters for a drift line; None when the point has no such text."""
    text = point.prompt(example_id, step=_step_of(point, result))
    if text is None:
        return None
    return text if len(text) <= ROW_TEXT else text[:ROW_TEXT - 1] + "…"


def _step_of(point: Point, result: str) -> str:
    """The step that scored a saved result (``saved()``'s key: the name, or ``step/name``)."""
    step, _, name = result.rpartition("/")
    if step:
        return step
    return next(s.step for s in point.scored if s.name == name and s.file is not None)


# --- which fields of an experiment changed ---------------------------------------------------

FIELDS_SHOWN = 5
_ABSENT = object()


def experiment_lines(stored: dict, produced_by: str, experiment: Optional[dict], fmt: str) -> list:
    """What a failure says of a changed experiment: the fields that changed (dotted paths, old → new),
    or, without a recorded experiment (a causalab-baseline/1 entry), the two digests."""
    old = stored.get("experiment")
    digests = f"produced_by {str(stored.get('produced_by'))[:12]} → {str(produced_by)[:12]}"
    if old is None or experiment is None:
        why = (f"the baseline ({fmt}) does not record the experiment's fields" if old is None
               else "this run did not record the experiment's fields")
        return [f"experiment changed: {digests} ({why}; updating the baseline records them)"]
    try:
        changes = diff_fields(old, experiment)
    except RecursionError:  # a hand-made file nested past Python's stack: the digests still say it
        return [f"experiment changed: {digests}"]
    if not changes:
        return [f"experiment changed: {digests}, but no field differs from the recorded experiment"]
    lines = [f"experiment changed ({len(changes)} field{'s' if len(changes) > 1 else ''}):"]
    lines += [f"  {where}: {_shown(a)} → {_shown(b)}" for where, a, b in changes[:FIELDS_SHOWN]]
    if len(changes) > FIELDS_SHOWN:
        lines.append(f"  … and {len(changes) - FIELDS_SHOWN} more fields")
    return lines


def diff_fields(old, new, at: str = "") -> list:
    """(dotted path, old, new) of every leaf that differs; lists of one length by index, others whole.
    At the top the steps' order counts too (``produced_by`` digests it)."""
    out = []
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(k for k in new if k not in old)]:
            out += diff_fields(old.get(key, _ABSENT), new.get(key, _ABSENT), f"{at}.{key}" if at else str(key))
        if not at:
            before, after = list(old.get("steps", {})), list(new.get("steps", {}))
            if before != after and sorted(before) == sorted(after):
                out.append(("steps (order)", before, after))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            out += diff_fields(a, b, f"{at}.{i}")
        return out
    if old is _ABSENT or new is _ABSENT or type(old) is not type(new) or old != new:
        out.append((at, old, new))
    return out


def _shown(value, width: int = 40) -> str:
    if value is _ABSENT:
        return "absent"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[:width - 1] + "…"

"""Checks: a run's results held to its document's expectations, to each other and to baselines.

``evaluate`` checks one point's results against expectations (their schema is the compiler's:
``Expectation``), passing checks included; ``verdicts`` does it for every point of a ``Run``;
``compare_rows`` holds rows to a reference (a baseline, another engine). The pytest plugin's
failure table and the HTML report both show these ``Check`` rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Protocol, Sequence

from .document.expect import VERIFIED, Comparison, Expectation


# --- run-time checks --------------------------------------------------------------------------

class Values(Protocol):
    """What ``evaluate`` needs of a result: eligible values, and eligibility per row."""

    values: Sequence[float]
    eligible: Sequence[bool]
    example_ids: Sequence[str]


@dataclass(frozen=True)
class Check:
    """One line of a failure table (and, passing, of nothing)."""

    point: str
    result: str
    aggregate: str  # mean, min, …, "row 3", "rows"
    expected: str  # the threshold, or "baseline 0.25", or "nnterp 0.25"
    got: Any
    difference: Optional[float]
    ok: bool
    note: str = ""


def evaluate(expectations: Iterable[Expectation], point: Optional[str], coords, results: Mapping[str, Values],
             *, label: Optional[str] = None) -> list[Check]:
    """Every (expectation, aggregate) that applies at this point, checked. Passing ones included.

    ``results`` maps a metric's name — and ``step/name``, which an expectation naming its
    ``step`` looks up — to its values.
    """
    shown = label or point or ""
    checks = []
    for exp in expectations:
        if not exp.applies(point, coords):
            continue
        key = f"{exp.step}/{exp.result}" if exp.step else exp.result
        result = results.get(key)
        for aggregate, cmp in exp.aggregates():
            expected = cmp.spelling(exp.rtol, exp.atol)
            if result is None:
                checks.append(Check(shown, key, aggregate, expected, None, None, False,
                                    f"no result {key!r} at this point: {sorted(results)}"))
                continue
            checks.append(_aggregate(shown, exp, aggregate, cmp, result))
    return checks


def _aggregate(point: str, exp: Expectation, aggregate: str, cmp: Comparison, result: Values) -> Check:
    expected = cmp.spelling(exp.rtol, exp.atol)
    if aggregate in VERIFIED:
        # The sweep's verification figure (an attribution estimate's), the same at every point.
        figures = getattr(result, "verification", None)
        got = None if figures is None else figures.get(aggregate)
        if got is None:
            why = ("this result was not estimated by a verified attribution" if figures is None else
                   f"the verification has no {aggregate} (too few verified points, or one side constant)")
            return Check(point, exp.result, aggregate, expected, None, None, False, why)
        return _scalar(point, exp, aggregate, expected, cmp, float(got))
    values = [float(v) for v in result.values]
    if aggregate == "eligible":
        n = len(result.eligible)
        got = sum(map(bool, result.eligible)) / n if n else math.nan
        return _scalar(point, exp, aggregate, expected, cmp, got)
    if not values:
        return Check(point, exp.result, aggregate, expected, None, None, False, "no eligible rows")
    if aggregate != "all":
        got = {"mean": math.fsum(values) / len(values), "min": min(values), "max": max(values)}[aggregate]
        return _scalar(point, exp, aggregate, expected, cmp, got)
    misses = [cmp.miss(v, exp.rtol, exp.atol) for v in values]
    # Failing: the row that misses by most. Passing: the row nearest to missing, so "got" says
    # how much room the claim had (for > 0, the smallest value, not the first row's).
    worst = max(range(len(values)), key=lambda i: (misses[i], -_slack(cmp, values[i])))
    failing = sum(m > 0 for m in misses)
    ids = [e for e, ok in zip(result.example_ids, result.eligible) if ok]
    note = f"{failing}/{len(values)} rows miss; worst is row {ids[worst]}" if failing else ""
    return Check(point, exp.result, aggregate, expected, values[worst], _difference(cmp, values[worst]),
                 failing == 0, note)


def _slack(cmp: Comparison, got: float) -> float:
    """How far a passing value is from missing: its distance to the threshold (to the nearer
    end of an interval; for ≈, the tolerance left, as minus the distance from the target)."""
    op, x = cmp.operator
    if op == "between":
        return min(got - x[0], x[1] - got)
    if op == "approx":
        return -abs(got - x)
    return abs(got - x)


def _scalar(point, exp, aggregate, expected, cmp: Comparison, got: float) -> Check:
    return Check(point, exp.result, aggregate, expected, got, _difference(cmp, got),
                 cmp.miss(got, exp.rtol, exp.atol) == 0)


def _difference(cmp: Comparison, got: float) -> Optional[float]:
    op, x = cmp.operator
    if got is None or math.isnan(got):
        return None
    if op == "between":  # distance outside the interval, signed toward the nearer end
        return got - x[0] if got < x[0] else (got - x[1] if got > x[1] else 0.0)
    return got - x


# The machine epsilon of each dtype a model may be served in (the spacing of floats just above 1):
# float32 2^-23, bfloat16 2^-7 (7 stored mantissa bits), float16 2^-10.
EPSILON = {"fp32": 2.0 ** -23, "bf16": 2.0 ** -7, "fp16": 2.0 ** -10}


def default_tolerance(dtype: str = "fp32") -> tuple[float, float]:
    """(rtol, atol) a rerun or another engine is held to when nothing narrower is asked for.

    float32: 1e-4 and 1e-5 — what batch shape, thread count and kernel choice move on a float32
    model (a few hundred ulps after a dozen layers). A reduced-precision model rounds every op to
    its own epsilon, so there the default is four epsilons relative and one absolute (bf16: 3.1e-2
    and 7.8e-3; fp16: 3.9e-3 and 9.8e-4): a value that moves more than that moved for a reason."""
    if dtype == "fp32":
        return 1e-4, 1e-5
    eps = EPSILON[dtype]
    return 4 * eps, eps


def tolerance(expectations: Iterable[Expectation], point: Optional[str], coords, result: str,
              default: tuple[float, float]) -> tuple[float, float]:
    """(rtol, atol) for a result's rows at a point: the document's last word on it, else ``default``."""
    rtol, atol = default
    for exp in expectations:
        if exp.result == result and exp.applies(point, coords):
            rtol = exp.rtol if exp.rtol is not None else rtol
            atol = exp.atol if exp.atol is not None else atol
    return rtol, atol


def close(reference: Optional[float], got: Optional[float], rtol: float, atol: float) -> bool:
    """``got`` within ``atol + rtol·|reference|`` of ``reference``; None (ineligible) equals only None."""
    if reference is None or got is None:
        return reference is None and got is None
    if math.isnan(reference) or math.isnan(got):
        return math.isnan(reference) and math.isnan(got)
    return abs(got - reference) <= atol + rtol * abs(reference)


def compare_rows(point: str, result: str, reference: str, ref_rows: Sequence[tuple[str, Optional[float]]],
                 got_rows: Sequence[tuple[str, Optional[float]]], rtol: float, atol: float) -> list[Check]:
    """Row-by-row differences beyond tolerance, as failing checks (empty when they agree).

    Rows are ``(example_id, value or None)``; ``reference`` names the other side
    ("baseline", "nnterp"). Different example ids are one check: the data changed.
    """
    ref_ids, got_ids = [r[0] for r in ref_rows], [r[0] for r in got_rows]
    if ref_ids != got_ids:
        return [Check(point, result, "rows", f"{reference} {len(ref_ids)} rows", f"{len(got_ids)} rows",
                      None, False, "the rows are not the same examples: the data changed")]
    out = []
    for (example_id, ref), (_, got) in zip(ref_rows, got_rows):
        if not close(ref, got, rtol, atol):
            diff = None if ref is None or got is None else got - ref
            out.append(Check(point, result, f"row {example_id}", f"{reference} {number(ref)}", got, diff,
                             False, f"rtol {number(rtol)}, atol {number(atol)}"))
    return out




def verdicts(run) -> list[Check]:
    """Every expectation of the run's document checked at every point it applies to (passing ones
    included), in point order: what ``pytest`` would hold the run to, without pytest."""
    from .plots.choose import spec_of

    out: list[Check] = []
    for point in run.points:
        expectations = spec_of(point).header.expect
        out += evaluate(expectations, point.name if point.coords else None, point.coords, point.lookup(),
                        label=point.name)
    return out


def number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)



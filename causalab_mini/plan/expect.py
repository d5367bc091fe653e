"""Expectations: what a document's ``header.expect`` says its results should be, and the checks.

An expectation names a metric result and compares aggregates of its per-row
values against thresholds::

    {"result": "iia", "mean": {"<=": 0.25}}
    {"result": "logit_diff", "all": {"<": 0}, "points": {"pos": [-1, -2]}}
    {"result": "iia", "eligible": {">=": 0.9}, "mean": {"between": [0.4, 0.6]}}
    {"result": "logit_diff", "mean": {"approx": -12.3, "atol": 0.05}, "rtol": 1e-4}

The header is outside ``produced_by``, so tightening a threshold is not a new
experiment. Everything here is pure: the models (which ``Header.expect`` uses,
so ``causalab-mini schema`` shows them), the checks a document's points are
held to at collection time, and ``evaluate``/``compare_rows``, which turn
numbers into ``Check`` rows for one failure table — shared by the pytest
plugin, its assertion helpers and its baselines.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Iterable, Mapping, Optional, Protocol, Sequence, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from ..errors import DocumentError
from ..jsontext import array_as_tuple

AGGREGATES = ("mean", "min", "max", "all", "eligible")
OPERATORS = (">", ">=", "<", "<=", "approx", "between")
# pytest.approx's defaults: an expectation written as a bare number means "this number",
# not "roughly this number"; a researcher who means roughly writes the tolerance.
APPROX_RTOL, APPROX_ATOL = 1e-6, 1e-12


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a threshold is a number, not a boolean")
    return value


class Comparison(BaseModel):
    """Exactly one operator: ``>``, ``>=``, ``<``, ``<=``, ``approx`` (with ``rtol``/``atol``) or ``between``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)
    gt: Optional[float] = Field(None, alias=">")
    ge: Optional[float] = Field(None, alias=">=")
    lt: Optional[float] = Field(None, alias="<")
    le: Optional[float] = Field(None, alias="<=")
    approx: Optional[float] = Field(None, description="Equal within rtol/atol (default: the "
                                                      "expectation's, else 1e-6 relative).")
    between: Optional[Annotated[tuple[float, float], BeforeValidator(array_as_tuple)]] = Field(None, description="[low, high], both inclusive.")
    rtol: Optional[float] = Field(None, ge=0, description="Relative tolerance of approx.")
    atol: Optional[float] = Field(None, ge=0, description="Absolute tolerance of approx.")

    @model_validator(mode="before")
    @classmethod
    def _bare_number(cls, value: Any) -> Any:
        # A bare number is the common case ("mean": 0.5): one type with a shorthand, not a
        # union, so a malformed comparison is refused once, at its own path.
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return {"approx": value}
        if not isinstance(value, (dict, Comparison)):
            raise ValueError(f"a threshold is a number or one comparison like {{\">\": 0.8}}, "
                             f"not {value!r}")
        return value

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):
        schema = handler.resolve_ref_schema(handler(core_schema))
        return {"anyOf": [{"type": "number", "description": "shorthand for {\"approx\": n}"},
                          dict(schema)], "title": "Comparison"}

    @field_validator("gt", "ge", "lt", "le", "approx", "between", mode="before")
    @classmethod
    def _numbers(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            for v in value:
                _no_bool(v)
        return _no_bool(value)

    @model_validator(mode="after")
    def _one(self) -> "Comparison":
        named = [op for op, field in zip(OPERATORS, ("gt", "ge", "lt", "le", "approx", "between"))
                 if getattr(self, field) is not None]
        if len(named) != 1:
            raise ValueError(f"a comparison has exactly one operator ({', '.join(OPERATORS)}); "
                             f"this one has {len(named)}{': ' + ', '.join(named) if named else ''}")
        if (self.rtol is not None or self.atol is not None) and self.approx is None:
            raise ValueError("rtol/atol belong to \"approx\"; the other operators are exact")
        if self.between is not None and self.between[0] > self.between[1]:
            raise ValueError(f"between [{self.between[0]}, {self.between[1]}] is empty: write [low, high]")
        return self

    @property
    def operator(self) -> tuple[str, Any]:
        for op, field in zip(OPERATORS, ("gt", "ge", "lt", "le", "approx", "between")):
            value = getattr(self, field)
            if value is not None:
                return op, value
        raise AssertionError("validated comparisons have one operator")

    def tolerance(self, rtol: Optional[float], atol: Optional[float]) -> tuple[float, float]:
        return (_first(self.rtol, rtol, APPROX_RTOL), _first(self.atol, atol, APPROX_ATOL))

    def miss(self, got: float, rtol: Optional[float] = None, atol: Optional[float] = None) -> float:
        """How far ``got`` is from holding: 0.0 when it holds, else a positive distance (inf for NaN)."""
        if got is None or math.isnan(got):
            return math.inf
        op, x = self.operator
        if op == ">":
            return 0.0 if got > x else (x - got) or math.ulp(x)  # equal is a miss, by a hair
        if op == ">=":
            return max(0.0, x - got)
        if op == "<":
            return 0.0 if got < x else (got - x) or math.ulp(x)
        if op == "<=":
            return max(0.0, got - x)
        if op == "between":
            return max(0.0, x[0] - got, got - x[1])
        r, a = self.tolerance(rtol, atol)
        return max(0.0, abs(got - x) - (a + r * abs(x)))

    def target(self) -> Optional[float]:
        """The number a difference is measured from (an interval's nearer end is chosen per value)."""
        op, x = self.operator
        return None if op == "between" else x

    def spelling(self, rtol: Optional[float] = None, atol: Optional[float] = None) -> str:
        op, x = self.operator
        if op == "between":
            return f"in [{number(x[0])}, {number(x[1])}]"
        if op == "approx":
            r, a = self.tolerance(rtol, atol)
            return f"≈ {number(x)} (rtol {number(r)}, atol {number(a)})"
        return f"{op} {number(x)}"


Threshold = Comparison


class Expectation(BaseModel):
    """What one metric result should be: aggregates compared with thresholds, at some or all points.

    A bare number as a threshold (``"mean": 0.5``) means ``{"approx": 0.5}``.
    ``rtol``/``atol`` at this level are the tolerance this result's rows are held
    to against the stored baseline and across engines (and approx's default).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    result: str = Field(description="A metric's name (its name in the intervention's metrics).")
    step: Optional[str] = Field(None, description="The step that scores it, when several do.")
    points: Optional[Union[list[str], dict[str, Any]]] = Field(
        None, description='Where it applies: point names ["pos=-1"], or axis values {"pos": [-1, -2]} '
                          "(a value, or a list of alternatives). Default: every point.")
    mean: Optional[Threshold] = Field(None, description="The mean over eligible rows.")
    min: Optional[Threshold] = Field(None, description="The smallest eligible row.")
    max: Optional[Threshold] = Field(None, description="The largest eligible row.")
    all: Optional[Threshold] = Field(None, description="Every eligible row, one by one.")
    eligible: Optional[Threshold] = Field(None, description="The fraction of rows that are eligible.")
    rtol: Optional[float] = Field(None, ge=0)
    atol: Optional[float] = Field(None, ge=0)

    @model_validator(mode="after")
    def _something(self) -> "Expectation":
        if not self.aggregates() and self.rtol is None and self.atol is None:
            raise ValueError("an expectation compares an aggregate (mean, min, max, all, eligible) "
                             "with a threshold, or sets a tolerance (rtol, atol); this one does neither")
        return self

    def aggregates(self) -> list[tuple[str, Comparison]]:
        return [(a, getattr(self, a)) for a in AGGREGATES if getattr(self, a) is not None]

    def applies(self, point: Optional[str], coords: Sequence[tuple[str, Any]]) -> bool:
        if self.points is None:
            return True
        if isinstance(self.points, list):
            return point in self.points
        have = {axis: _label(v) for axis, v in coords}
        for axis, wanted in self.points.items():
            options = wanted if isinstance(wanted, list) else [wanted]
            if have.get(axis) not in {_label(o) for o in options}:
                return False
        return True


# --- collection-time checks -------------------------------------------------------------------

def metric_names(spec) -> set[str]:
    return {name for iv in spec.interventions.values() for name in iv.metrics}


def check_points(points) -> None:
    """Refuse expectations that name a result no point scores, or points the sweep does not have.

    ``points``: ``documents.points(raw)`` (name, spec, coords). Run at collection, so a typo in
    an expectation is a collection error, not a silently vacuous pass.
    """
    names = [p.name for p in points]
    axes: dict[str, set[str]] = {}
    for p in points:
        for axis, value in p.coords:
            axes.setdefault(axis, set()).add(_label(value))
    for p in points:
        for i, exp in enumerate(p.spec.header.expect):
            path = f"header.expect.{i}"
            scored = metric_names(p.spec)
            if exp.result not in scored and exp.applies(p.name, p.coords):
                raise DocumentError(f"{path}.result", f"no metric named {exp.result!r}",
                                    f"metrics here: {sorted(scored)}")
            if exp.points is None:
                continue
            if names == [None]:
                raise DocumentError(f"{path}.points", "this document is not swept: it has one point",
                                    "remove \"points\"")
            if isinstance(exp.points, list):
                unknown = [n for n in exp.points if n not in names]
                if unknown:
                    raise DocumentError(f"{path}.points", f"no point named {unknown[0]!r}",
                                        f"points: {names}")
                continue
            for axis, wanted in exp.points.items():
                if axis not in axes:
                    raise DocumentError(f"{path}.points.{axis}", f"no axis named {axis!r}",
                                        f"axes: {sorted(axes)}")
                options = wanted if isinstance(wanted, list) else [wanted]
                missing = [o for o in options if _label(o) not in axes[axis]]
                if missing:
                    raise DocumentError(f"{path}.points.{axis}", f"axis {axis!r} has no value "
                                        f"{_label(missing[0])}", f"values: {sorted(axes[axis])}")


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
    worst = max(range(len(values)), key=lambda i: misses[i])
    failing = sum(m > 0 for m in misses)
    ids = [e for e, ok in zip(result.example_ids, result.eligible) if ok]
    note = f"{failing}/{len(values)} rows miss; worst is row {ids[worst]}" if failing else ""
    return Check(point, exp.result, aggregate, expected, values[worst], _difference(cmp, values[worst]),
                 failing == 0, note)


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


# --- the table --------------------------------------------------------------------------------

COLUMNS = ("point", "result", "aggregate", "expected/baseline", "got", "difference")


def render(checks: Sequence[Check], *, limit: int = 20) -> str:
    """Checks as an aligned text table; more than ``limit`` rows are summarised on one line."""
    rows = [COLUMNS] + [(c.point, c.result, c.aggregate, c.expected, number(c.got), number(c.difference))
                        for c in checks[:limit]]
    notes = [c.note for c in checks[:limit]]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for i, row in enumerate(rows):
        line = "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip()
        if i and notes[i - 1]:
            line += f"   ({notes[i - 1]})"
        lines.append(line)
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if len(checks) > limit:
        lines.append(f"... and {len(checks) - limit} more")
    return "\n".join(lines)


def number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _label(value: Any) -> str:
    from .sweep import label
    return label(value)


def _first(*values):
    return next(v for v in values if v is not None)

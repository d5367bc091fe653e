"""Expectations: what a document's ``header.expect`` says its results should be, and the checks.

An expectation names a metric result and compares aggregates of its per-row
values against thresholds::

    {"result": "iia", "mean": {"<=": 0.25}}
    {"result": "logit_diff", "all": {"<": 0}, "points": {"pos": [-1, -2]}}
    {"result": "iia", "eligible": {">=": 0.9}, "mean": {"between": [0.4, 0.6]}}
    {"result": "logit_diff", "mean": {"approx": -12.3, "atol": 0.05}, "rtol": 1e-4}

The header is outside ``produced_by``, so tightening a threshold is not a new
experiment. This is the schema (the models ``Header.expect`` uses, so
``causalab-mini schema`` shows them) and the checks a document's points are
held to when it is validated. Holding results to expectations, comparing rows
and rendering the failure table are the pytest plugin's
(``pytest_causalab.checks``).
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Optional, Sequence, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from ..errors import DocumentError
from ..jsontext import array_as_tuple
from ..suggest import suggest_fix

AGGREGATES = ("mean", "min", "max", "all", "eligible")
# An attribution estimate's verification figures (document/estimate.py): the sweep's, not a point's
# — Spearman between estimated and exact effects, recall of the exact top-k, worst row error.
VERIFIED = ("spearman", "recall", "error")
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
    def _bare__number(cls, value: Any) -> Any:
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
            return f"in [{_number(x[0])}, {_number(x[1])}]"
        if op == "approx":
            r, a = self.tolerance(rtol, atol)
            return f"≈ {_number(x)} (rtol {_number(r)}, atol {_number(a)})"
        return f"{op} {_number(x)}"


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
    spearman: Optional[Threshold] = Field(None, description="Estimated by attribution: the rank correlation "
                                          "of estimated and exact effects over the verified points.")
    recall: Optional[Threshold] = Field(None, description="Estimated by attribution: the fraction of the exact "
                                        "top-k verified points among the estimated top-k.")
    error: Optional[Threshold] = Field(None, description="Estimated by attribution: the largest absolute "
                                       "difference between a row's estimate and its exact value.")
    rtol: Optional[float] = Field(None, ge=0)
    atol: Optional[float] = Field(None, ge=0)

    @model_validator(mode="after")
    def _something(self) -> "Expectation":
        if not self.aggregates() and self.rtol is None and self.atol is None:
            raise ValueError("an expectation compares an aggregate (mean, min, max, all, eligible; "
                             "spearman, recall, error of an attribution estimate) with a threshold, or "
                             "sets a tolerance (rtol, atol); this one does neither")
        return self

    def aggregates(self) -> list[tuple[str, Comparison]]:
        return [(a, getattr(self, a)) for a in AGGREGATES + VERIFIED if getattr(self, a) is not None]

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

    ``points``: ``document.read.points(raw)`` (name, spec, coords). Run at collection, so a typo in
    an expectation is a collection error, not a silently vacuous pass.

    The refusal is the first in the order: each point in turn, each of its expectations in
    turn, the result and then the point selector. Points that share one list of expectations
    (``read.points`` validates a header no sweep changes once) are checked in time that grows with
    points plus expectations: the selectors, the same at every point, with the first point;
    after it, only a result some point does not score is looked for where it applies.
    """
    names = [p.name for p in points]
    axes: dict[str, set[str]] = {}
    spelled = _Labels()
    for p in points:
        for axis, value in p.coords:
            axes.setdefault(axis, set()).add(spelled(value))
    known = set(names)
    shared = bool(points) and all(p.spec.header.expect is points[0].spec.header.expect for p in points)
    for n, p in enumerate(points):
        if shared and n:
            _check_results(points)
            return
        _check_point(p, names, axes, known)


def _check_results(points) -> None:
    """``_check_point``'s first refusal for the points after the first, when every point holds
    the same expectations and the first passed (so every selector is valid): the first point,
    and at it the first expectation, whose result its point does not score where it applies.
    Found from the expectations a point's metrics leave unscored (one set of metrics for all
    points, unless a sweep changes them) and the points each of those applies to."""
    exps = points[0].spec.header.expect
    scored = [frozenset(metric_names(p.spec)) for p in points]
    lacking = {s: {i for i, e in enumerate(exps) if e.result not in s} for s in set(scored)}
    suspects = sorted(set().union(*lacking.values()))
    if not suspects:
        return
    where = applying(exps, [(p.name, p.coords) for p in points])
    first: Optional[tuple[int, int]] = None  # (point, expectation)
    for i in suspects:
        for j in where[i]:  # in order: the first point it applies to and its metrics leave unscored
            if i in lacking[scored[j]]:
                first = min(first, (j, i)) if first is not None else (j, i)
                break
    if first is not None:
        j, i = first
        result, metrics = exps[i].result, sorted(scored[j])
        raise DocumentError(f"header.expect.{i}.result", f"no metric named {result!r}",
                            suggest_fix(result, metrics, f"metrics here: {metrics}"))


def applying(exps: Sequence["Expectation"], points: Sequence[tuple]) -> list[list[int]]:
    """For each expectation, the indices of the ``(name, coords)`` points it ``applies`` to, in
    order; found from each expectation's selector (the points by name, the points with an
    axis value), so it costs what the selectors name and what they select, not points x
    expectations."""
    everywhere = list(range(len(points)))
    by_name = {name: j for j, (name, _) in enumerate(points)}
    by_value: dict[str, dict[str, list[int]]] = {}  # axis -> value's label -> points
    spelled = _Labels()
    for j, (_, coords) in enumerate(points):
        for axis, value in coords:
            by_value.setdefault(axis, {}).setdefault(spelled(value), []).append(j)
    out = []
    for exp in exps:
        if exp.points is None:
            out.append(everywhere)
        elif isinstance(exp.points, list):
            out.append(sorted({by_name[n] for n in exp.points if n in by_name}))
        else:
            chosen: Optional[set] = None
            for axis, wanted in exp.points.items():
                options = wanted if isinstance(wanted, list) else [wanted]
                values = by_value.get(axis, {})
                here = {j for label in {_label(o) for o in options} for j in values.get(label, ())}
                chosen = here if chosen is None else chosen & here
                if not chosen:
                    break
            out.append(everywhere if chosen is None else sorted(chosen))
    return out


def verified_metrics(spec) -> set[tuple[str, str]]:
    """(step, metric) for every metric an observe step estimates by attribution and verifies: what
    spearman, recall and error can be held to."""
    out: set[tuple[str, str]] = set()
    for name, step in spec.steps.items():
        est = getattr(step, "estimate", None)
        if est is not None and est.verify is not None:
            out |= {(name, m) for m in spec.interventions[step.interventions].metrics}
    return out


def _check_point(p, names: list, axes: dict, known: set) -> None:
    """One point's expectations, in order: each one's result, then its point selector."""
    scored = metric_names(p.spec)
    verified = None
    for i, exp in enumerate(p.spec.header.expect):
        path = f"header.expect.{i}"
        asked = [a for a in VERIFIED if getattr(exp, a) is not None]
        if asked and exp.result in scored:
            verified = verified_metrics(p.spec) if verified is None else verified
            if not any(m == exp.result and exp.step in (None, step) for step, m in verified):
                raise DocumentError(f"{path}.{asked[0]}", f"{asked[0]} is a figure of an attribution estimate's "
                                    f"verification, and no step{'' if exp.step is None else ' ' + repr(exp.step)} "
                                    f"estimates and verifies {exp.result!r}",
                                    'give its observe step "estimate": {"by": "attribution", "verify": '
                                    '{"top": 5, "random": 5}}, or hold the result to mean/min/max/all')
        if exp.result not in scored and exp.applies(p.name, p.coords):
            raise DocumentError(f"{path}.result", f"no metric named {exp.result!r}",
                                suggest_fix(exp.result, sorted(scored), f"metrics here: {sorted(scored)}"))
        if exp.points is None:
            continue
        if names == [None]:
            raise DocumentError(f"{path}.points", "this document is not swept: it has one point",
                                "remove \"points\"")
        if isinstance(exp.points, list):
            unknown = [n for n in exp.points if n not in known]
            if unknown:
                raise DocumentError(f"{path}.points", f"no point named {unknown[0]!r}",
                                    suggest_fix(unknown[0], names, f"points: {names}"))
            continue
        for axis, wanted in exp.points.items():
            if axis not in axes:
                raise DocumentError(f"{path}.points.{axis}", f"no axis named {axis!r}",
                                    suggest_fix(axis, sorted(axes), f"axes: {sorted(axes)}"))
            options = wanted if isinstance(wanted, list) else [wanted]
            missing = [o for o in options if _label(o) not in axes[axis]]
            if missing:
                raise DocumentError(f"{path}.points.{axis}", f"axis {axis!r} has no value "
                                    f"{_label(missing[0])}", suggest_fix(_label(missing[0]), sorted(axes[axis]),
                                                                         f"values: {sorted(axes[axis])}"))


def _number(value: Any) -> str:
    """A threshold as a failure table prints it (``pytest_causalab.checks.number``, the same)."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


class _Labels:
    """``_label``, once per value object: a sweep's points hold their axis's values themselves,
    so 10,000 points' coordinates are a few hundred objects."""

    def __init__(self):
        self._seen: dict[int, tuple[Any, str]] = {}

    def __call__(self, value: Any) -> str:
        got = self._seen.get(id(value))
        if got is None or got[0] is not value:
            got = self._seen[id(value)] = (value, _label(value))  # the value kept: its id stays its own
        return got[1]


def _label(value: Any) -> str:
    from ..names import label
    return label(value)


def _first(*values):
    return next(v for v in values if v is not None)

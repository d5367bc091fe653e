"""A run's results as Python objects: ``Run`` → ``Point`` → ``Result``.

``run.point("pos=-2").result("iia").mean()``; ``point.table("iia")`` is the
metric's rows exactly as a run writes them to disk (``outputs.write.metric_rows``),
so a test, a notebook and a file never disagree. A point holds either the
executed sub-plan (every metric, every tensor it produced) or, opened from a run
directory, what that run saved (``open``: the ``.json`` metrics and the
``.safetensors`` files its document asks for).

Across points, ``run.table("iia")`` is one record per (point, row) with the
sweep's coordinates as columns and ``run.grid("iia", "layers", "pos")`` the mean
per cell; ``to_frame()`` gives either as a pandas DataFrame when pandas is
installed (``pip install causalab-mini[frames]``).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from functools import partial
from typing import Any, Callable, Iterator, Optional, Union

from ..errors import PlanError
from ..formats import ROWS, format_of
from ..plan.plan import Fit, Observe, Plan, Weights


class Result:
    """One metric at one point: its rows as on disk, ``value`` ``None`` where a row was excluded.

    ``len``, iteration, ``mean``/``std``/``min``/``max`` and ``ci`` are over the scored
    (eligible) rows; ``rows`` and ``eligible`` keep every row, excluded ones included.
    """

    def __init__(self, name: str, rows: Union[list[dict], Callable[[], list[dict]]],
                 verification: Optional[dict] = None):
        self.name = name
        # The rows, or what makes them on first use: an executed point's rows are made from its
        # plan only when read (a sweep scores several metrics at every point; a caller may read one).
        self._rows = rows
        # Estimated by attribution and verified: the sweep's figures for this metric (spearman,
        # recall, error, ...; run.json's ``attribution``), the same at every point. None otherwise.
        self.verification = verification

    @property
    def rows(self) -> list[dict]:
        """Every row as on disk, excluded ones included (``value`` None)."""
        if callable(self._rows):
            self._rows = self._rows()
        return self._rows

    @property
    def values(self) -> tuple[float, ...]:
        """The eligible rows' values, in row order: what the aggregates are over."""
        return tuple(r["value"] for r in self.rows if r["eligible"])

    @property
    def eligible(self) -> tuple[bool, ...]:
        """Per row, whether it was scored (an excluded row has a missing anchor, say)."""
        return tuple(bool(r["eligible"]) for r in self.rows)

    @property
    def example_ids(self) -> tuple[str, ...]:
        return tuple(r["example_id"] for r in self.rows)

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[float]:
        return iter(self.values)

    def mean(self) -> float:
        values = self.values
        return math.fsum(values) / len(values) if values else math.nan

    def std(self) -> float:
        """The sample standard deviation (n − 1 in the denominator); NaN below two rows."""
        values = self.values
        if len(values) < 2:
            return math.nan
        mean = self.mean()
        return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))

    def min(self) -> float:
        return min(self.values, default=math.nan)

    def max(self) -> float:
        return max(self.values, default=math.nan)

    def ci(self, level: float = 0.95, *, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
        """A percentile bootstrap confidence interval of the mean: ``resamples`` means of rows
        drawn with replacement, cut at (1 − level)/2 and (1 + level)/2. Seeded, so the same
        result gives the same interval; NaNs when no row was scored."""
        if not 0 < level < 1:
            raise PlanError("ci(level=...)", f"{level!r} is not a confidence level",
                            "give a number strictly between 0 and 1, like 0.95")
        if resamples < 1:
            raise PlanError("ci(resamples=...)", f"{resamples!r} resamples", "give a positive number")
        values = self.values
        if not values:
            return (math.nan, math.nan)
        rng = random.Random(seed)
        n = len(values)
        means = sorted(math.fsum(rng.choices(values, k=n)) / n for _ in range(resamples))
        return (_quantile(means, (1 - level) / 2), _quantile(means, (1 + level) / 2))

    def fraction_eligible(self) -> float:
        return sum(self.eligible) / len(self.rows) if self.rows else math.nan

    def pairs(self) -> list[tuple[str, Optional[float]]]:
        """(example_id, value or None) per row: what baselines store and engines are compared on."""
        return [(r["example_id"], r["value"]) for r in self.rows]

    def __repr__(self) -> str:
        return f"<Result {self.name}: {len(self)}/{len(self.rows)} rows, mean {self.mean():.6g}>"


def _quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values, interpolated linearly between order statistics
    (numpy's default, ``method="linear"``)."""
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


@dataclass(frozen=True)
class Scored:
    """One metric scored by one step of a point: its rows, and the ``.json`` file it is saved to."""

    step: str
    name: str
    result: Result
    file: Optional[str] = None


def _scoring_steps(plan: Plan) -> list[tuple[str, Observe]]:
    """(step name, Observe) whose metrics are the point's results; a fit's evaluation stands for it."""
    out = []
    for name, step in plan.steps.items():
        if isinstance(step, Observe):
            out.append((name, step))
        elif isinstance(step, Fit) and step.evaluation is not None:
            out.append((name, step.evaluation))
    return out


def scored_in_plan(plan: Plan) -> list[Scored]:
    """Every metric an executed plan scored, with the file a save of metric rows writes it to."""
    from .write import metric_rows

    found = []
    for step_name, step in _scoring_steps(plan):
        files = {s.value: s.file_path for s in plan.steps[step_name].saves
                 if format_of(s.file_path).holds == ROWS}
        for metric in step.metrics:
            if metric.name in step.results:
                rows = partial(metric_rows, step, metric.name, plan.produced_by)  # made when first read
                figures = step.results.get("verification", {}).get(metric.name)
                found.append(Scored(step_name, metric.name, Result(metric.name, rows, figures),
                                    files.get(metric.name)))
    return found


@dataclass
class Point:
    """One sweep point (or an unswept document) after it ran on one engine."""

    document: Optional[Path]
    name: str
    coords: dict  # axis → the value this point has on it, in the document's order
    engine: str
    scored: list[Scored]
    produced_by: Optional[str]
    plan: Optional[Plan] = None  # the executed sub-plan; None for a point opened from disk
    out: Optional[Path] = None  # where its files are
    tensors: dict = field(default_factory=dict)  # opened from disk: file → {name: tensor}
    # The weights it ran on (run.json's model.weights: a local checkpoint's sha256) and its config.json's
    # sha256 (model.config), given by its Run.
    weights: Optional[str] = None
    config_digest: Optional[str] = None
    # The checkpoint's revision (run.json's model.revision: the digest a document pins, covering
    # weights, config and tokenizer files; a hub commit), given by its Run.
    revision: Optional[str] = None

    @classmethod
    def from_plan(cls, document, name: str, coords, engine: str, plan: Plan, out=None) -> "Point":
        return cls(document, name, dict(coords), engine, scored_in_plan(plan), plan.produced_by, plan, out)

    @property
    def metrics(self) -> list[str]:
        """Every metric result this point has, by name (``step/name`` where two steps share one)."""
        return list(self.results())

    def _by_name(self) -> dict[str, list[Scored]]:
        found: dict[str, list[Scored]] = {}
        for s in self.scored:
            found.setdefault(s.name, []).append(s)
        return found

    def results(self) -> dict[str, Result]:
        """Every metric result; a name scored by several steps appears only as ``step/name``."""
        out: dict[str, Result] = {}
        for name, hits in self._by_name().items():
            if len(hits) == 1:
                out[name] = hits[0].result
            else:
                out.update((f"{s.step}/{name}", s.result) for s in hits)
        return out

    def result(self, name: str, step: Optional[str] = None) -> Result:
        hits = [s for s in self._by_name().get(name, []) if step is None or s.step == step]
        if len(hits) == 1:
            return hits[0].result
        if not hits:
            kept = " (a run opened from disk has what it saved)" if self.plan is None else ""
            raise PlanError(f"result {name!r}", f"not produced at {self.name}{kept}"
                            + (f" by step {step!r}" if step else ""), f"results: {sorted(self.results())}")
        raise PlanError(f"result {name!r}", f"scored by {len(hits)} steps at {self.name}",
                        f"name the step: result({name!r}, step={hits[0].step!r})")

    def lookup(self) -> dict[str, Result]:
        """``results()`` plus ``step/name`` for every result: what expectations are evaluated against."""
        out = self.results()
        out.update((f"{s.step}/{s.name}", s.result) for s in self.scored)
        return out

    def table(self, name: str, step: Optional[str] = None) -> list[dict]:
        """The metric's rows as on disk (``iia.json``): example_id, value, eligible, positions, …"""
        return self.result(name, step).rows

    def means(self) -> dict[str, float]:
        return {name: r.mean() for name, r in self.results().items()}

    def saved(self) -> dict[str, Result]:
        """The metrics the document saves as ``.json``, keyed as ``results()`` keys them: a baseline's."""
        found = [s for s in self.scored if s.file is not None]
        shared = {s.name for s in found if sum(t.name == s.name for t in found) > 1}
        return {(f"{s.step}/{s.name}" if s.name in shared else s.name): s.result for s in found}

    def saved_tensors(self) -> dict[str, dict[str, Any]]:
        """The tensors the document saves, by file path (as the run writes them)."""
        if self.plan is None:
            return dict(sorted(self.tensors.items()))
        from .write import saved_tensors

        out: dict = {}
        for step in self.plan.steps.values():
            if isinstance(step, (Observe, Fit, Weights)):
                out.update(saved_tensors(step))
        return dict(sorted(out.items()))

    def value(self, name: str) -> Any:
        """A raw result (an output tensor, a generated value) by name, from whichever step has it."""
        if self.plan is None:
            raise PlanError(f"value {name!r}", "a point opened from disk has only what its run saved",
                            "use point.saved_tensors() or point.result(...), or run the document again")
        for _, step in _scoring_steps(self.plan):
            if name in step.results:
                return step.results[name]
        raise PlanError(f"value {name!r}", f"not produced at {self.name}",
                        f"values: {sorted({k for _, s in _scoring_steps(self.plan) for k in s.results})}")

    def prompt(self, example_id: str, step: Optional[str] = None) -> Optional[str]:
        """The prompt text of one row as the run tokenized it (a chat rendered through its template).

        The text is the base input's: the forward of the role named ``base``, else the step's
        first forward. The row is looked up in ``step`` (a fit's evaluation stands for the fit),
        or, without one, in the first step that scored results and has that example id. None
        for a point opened from disk (a run directory keeps no prompts), and when no such
        step or row exists.
        """
        if self.plan is None:
            return None
        for name, observe in _scoring_steps(self.plan):
            if (step is not None and name != step) or example_id not in observe.example_ids:
                continue
            if not observe.forwards:
                return None
            forward = next((f for f in observe.forwards if f.input == "base"), observe.forwards[0])
            index = observe.example_ids.index(example_id)
            return forward.texts[index] if index < len(forward.texts) else None
        return None

    def __repr__(self) -> str:
        where = self.document.name if self.document else "<document>"
        return f"<Point {where}::{self.name} on {self.engine}>"


@dataclass
class Grid:
    """A metric's per-point aggregate laid out over two sweep axes: ``values[i][j]`` is the cell
    (``rows[i]``, ``columns[j]``); NaN where the sweep has no such point."""

    result: str
    row_axis: str
    column_axis: Optional[str]
    rows: list
    columns: list
    values: list[list[float]]

    def to_frame(self):
        pandas = _pandas()
        return pandas.DataFrame(self.values, index=pandas.Index(self.rows, name=self.row_axis),
                                columns=pandas.Index(self.columns, name=self.column_axis))


@dataclass
class Run:
    """Every point of one document on one engine."""

    document: Optional[Path]
    engine: str
    points: list[Point]
    out: Optional[Path] = None
    record: Optional[dict] = None  # run.json, for a run opened from disk or written by run(out=...)
    plan: Optional[Plan] = field(default=None, repr=False)  # the executed plan tree (a run in memory)
    files: list = field(default_factory=list)  # the files run(out=...) wrote, in manifest order

    def __post_init__(self) -> None:
        # Every point of a run ran on the run's weights; a baseline stores them per point.
        model = (self.record or {}).get("model") or {}
        verified = {}  # an attributed run opened from disk: its verification, from run.json
        for record in ((self.record or {}).get("attribution") or {}).values():
            verified.update(((record.get("step"), m), f) for m, f in (record.get("figures") or {}).items())
        for p in self.points:
            for s in p.scored:
                if s.result.verification is None and (s.step, s.name) in verified:
                    s.result.verification = verified[(s.step, s.name)]
            if p.weights is None:
                p.weights = model.get("weights")
            if p.config_digest is None:
                p.config_digest = model.get("config")
            if p.revision is None:
                p.revision = model.get("revision")

    @property
    def axes(self) -> list[str]:
        """The sweep's axis names, in the document's order (none for an unswept document)."""
        return list(self.points[0].coords) if self.points else []

    def point(self, name: Optional[str] = None, **coords) -> Point:
        """A point by name (``"layers=1,pos=-1"``) or by coordinates (``layers=1, pos=-1``); with
        neither, the only point of an unswept document."""
        if coords:
            if name is not None:
                raise PlanError("point", "a name and coordinates both", "give one of them")
            return self._only(self.select(**coords).points, coords)
        if name is None:
            if len(self.points) != 1:
                raise PlanError("point", f"{self._shown} has {len(self.points)} points",
                                f"name one: {[p.name for p in self.points]}")
            return self.points[0]
        for p in self.points:
            if p.name == name:
                return p
        raise PlanError(f"point {name!r}", f"not in {self._shown}", f"points: {[p.name for p in self.points]}")

    def select(self, **coords) -> "Run":
        """The points whose coordinates match every ``axis=value`` given (a value or a list of them)."""
        for axis in coords:
            if axis not in self.axes:
                raise PlanError(f"point({axis}=...)", f"no axis named {axis!r}", f"axes: {self.axes}")
        kept = [p for p in self.points if all(_matches(p.coords[a], v) for a, v in coords.items())]
        return Run(self.document, self.engine, kept, self.out, self.record)

    def _only(self, points: list[Point], coords: dict) -> Point:
        if len(points) == 1:
            return points[0]
        spelled = ",".join(f"{a}={v!r}" for a, v in coords.items())
        problem = f"no point at {spelled}" if not points else f"{len(points)} points at {spelled}"
        return_fix = f"points: {[p.name for p in (points or self.points)]}"
        raise PlanError("point", problem, return_fix if not points else f"fix every axis: {self.axes}")

    def result(self, name: str, step: Optional[str] = None) -> Result:
        """The result of an unswept run; on a sweep, asking the run rather than a point is refused."""
        if len(self.points) != 1:
            raise PlanError(f"result {name!r}", f"{len(self.points)} in this run, one per point",
                            f"name the point: run.point({self.points[0].name!r}).result({name!r}), "
                            f"or run.table({name!r}) / run.grid({name!r}, ...) for all of them")
        return self.points[0].result(name, step)

    def table(self, name: str, step: Optional[str] = None) -> list[dict]:
        """One record per (point, row): the point's name, its coordinates as columns, then the row
        as on disk (example_id, value, eligible, …)."""
        out = []
        for p in self.points:
            for row in p.result(name, step).rows:
                out.append({"point": p.name, **p.coords, **row})
        return out

    def grid(self, name: str, rows: str, columns: Optional[str] = None, *, step: Optional[str] = None,
             aggregate: str = "mean") -> Grid:
        """The metric's ``aggregate`` (mean, min, max, std) per point, over one or two axes; every
        other axis must be fixed first (``run.select(axis=value).grid(...)``)."""
        wanted = [rows] + ([columns] if columns else [])
        for axis in wanted:
            if axis not in self.axes:
                raise PlanError(f"grid axis {axis!r}", "not an axis of this run", f"axes: {self.axes}")
        free = [a for a in self.axes if a not in wanted and len(_distinct(p.coords[a] for p in self.points)) > 1]
        if free:
            raise PlanError("grid", f"axis {free[0]!r} varies too, so a cell would hold several points",
                            f"fix it: run.select({free[0]}=...).grid({name!r}, ...)")
        if aggregate not in ("mean", "min", "max", "std"):
            raise PlanError(f"aggregate {aggregate!r}", "not an aggregate", "use mean, min, max or std")
        row_values = _distinct(p.coords[rows] for p in self.points)
        column_values = _distinct(p.coords[columns] for p in self.points) if columns else [None]
        cells = [[math.nan] * len(column_values) for _ in row_values]
        for p in self.points:
            i = _index(row_values, p.coords[rows])
            j = _index(column_values, p.coords[columns]) if columns else 0
            cells[i][j] = getattr(p.result(name, step), aggregate)()
        return Grid(name, rows, columns, row_values, column_values if columns else [name], cells)

    def to_frame(self, name: str, step: Optional[str] = None):
        """``table(name)`` as a pandas DataFrame (pandas is optional: ``causalab-mini[frames]``)."""
        return _pandas().DataFrame(self.table(name, step))

    def means(self) -> dict[str, dict[str, float]]:
        return {p.name: p.means() for p in self.points}

    @property
    def _shown(self) -> str:
        if self.document:
            return self.document.name
        return self.out.name if self.out else "this run"

    def __repr__(self) -> str:
        return f"<Run {self._shown} on {self.engine}: {len(self.points)} points>"


def _matches(value, wanted) -> bool:
    if isinstance(wanted, tuple) or (isinstance(wanted, list) and not isinstance(value, list)):
        return any(_matches(value, w) for w in wanted)
    return value == wanted


def _distinct(values) -> list:
    """Distinct values in order of first appearance (lists allowed: a heads axis is [0], [1], …)."""
    out: list = []
    for v in values:
        if not any(v == o for o in out):
            out.append(v)
    return out


def _index(values: list, value) -> int:
    return next(i for i, v in enumerate(values) if v == value)


def _pandas():
    try:
        import pandas
    except ImportError:
        raise PlanError("to_frame()", "pandas is not installed",
                        "pip install 'causalab-mini[frames]' (or pandas), or use .table() / .grid()") from None
    return pandas

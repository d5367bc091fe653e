"""A run's results as Python objects: ``Run`` → ``Point`` → ``Result``.

``run.point("pos=-2").result("iia").mean()``; ``point.table("iia")`` is the
metric's rows exactly as ``causalab-mini run`` writes them to disk
(``plan.write.metric_rows``), so a test and a file never disagree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from causalab_mini.documents import SUFFIX
from causalab_mini.errors import PlanError
from causalab_mini.plan.plan import Fit, Observe, Plan, Weights
from causalab_mini.plan.write import metric_rows, saved_tensors


def stem(path: Path) -> str:
    """``patching.causalab.json`` → ``patching``: an unswept document's one point is called this."""
    name = Path(path).name
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else Path(path).stem


def point_name(path: Path, name: Optional[str]) -> str:
    return name if name is not None else stem(path)


class Result:
    """One metric at one point: a value per row (``None`` where the row was not eligible)."""

    def __init__(self, name: str, rows: list[dict]):
        self.name = name
        self.rows = rows

    @property
    def values(self) -> tuple[float, ...]:
        """The eligible rows' values, in row order: what mean/min/max aggregate."""
        return tuple(r["value"] for r in self.rows if r["eligible"])

    @property
    def eligible(self) -> tuple[bool, ...]:
        """Per row, whether it was scored (ineligible rows have no answer token, say)."""
        return tuple(bool(r["eligible"]) for r in self.rows)

    @property
    def example_ids(self) -> tuple[str, ...]:
        return tuple(r["example_id"] for r in self.rows)

    def mean(self) -> float:
        values = self.values
        return math.fsum(values) / len(values) if values else math.nan

    def min(self) -> float:
        return min(self.values, default=math.nan)

    def max(self) -> float:
        return max(self.values, default=math.nan)

    def fraction_eligible(self) -> float:
        return sum(self.eligible) / len(self.rows) if self.rows else math.nan

    def pairs(self) -> list[tuple[str, Optional[float]]]:
        """(example_id, value or None) per row: what baselines store and engines are compared on."""
        return [(r["example_id"], r["value"]) for r in self.rows]

    def __repr__(self) -> str:
        return f"<Result {self.name}: {len(self.values)}/{len(self.rows)} rows, mean {self.mean():.6g}>"


def _scoring_steps(plan: Plan) -> list[tuple[str, Observe]]:
    """(step name, Observe) whose metrics are the point's results; a fit's evaluation stands for it."""
    out = []
    for name, step in plan.steps.items():
        if isinstance(step, Observe):
            out.append((name, step))
        elif isinstance(step, Fit) and step.evaluation is not None:
            out.append((name, step.evaluation))
    return out


@dataclass
class Point:
    """One sweep point (or an unswept document) after it ran on one engine."""

    document: Path
    name: str
    coords: tuple
    engine: str
    plan: Plan  # the point's sub-plan, results filled
    out: Optional[Path] = None  # where its files were written

    @property
    def produced_by(self) -> str:
        return self.plan.produced_by

    @property
    def metrics(self) -> list[str]:
        """Every metric result this point produced, by name (``step/name`` where two steps share one)."""
        return list(self.results())

    def _scored(self) -> dict[str, list[tuple[str, Result]]]:
        found: dict[str, list[tuple[str, Result]]] = {}
        for step_name, step in _scoring_steps(self.plan):
            for metric in step.metrics:
                if metric.name in step.results:
                    rows = metric_rows(step, metric.name, self.produced_by)
                    found.setdefault(metric.name, []).append((step_name, Result(metric.name, rows)))
        return found

    def results(self) -> dict[str, Result]:
        """Every metric result; a name scored by several steps appears only as ``step/name``."""
        out: dict[str, Result] = {}
        for name, hits in self._scored().items():
            if len(hits) == 1:
                out[name] = hits[0][1]
            else:
                out.update((f"{step}/{name}", result) for step, result in hits)
        return out

    def result(self, name: str, step: Optional[str] = None) -> Result:
        hits = [(s, r) for s, r in self._scored().get(name, []) if step is None or s == step]
        if len(hits) == 1:
            return hits[0][1]
        if not hits:
            raise PlanError(f"result {name!r}", f"not produced at {self.name}"
                            + (f" by step {step!r}" if step else ""), f"results: {sorted(self.results())}")
        raise PlanError(f"result {name!r}", f"scored by {len(hits)} steps at {self.name}",
                        f"name the step: result({name!r}, step={hits[0][0]!r})")

    def lookup(self) -> dict[str, Result]:
        """``results()`` plus ``step/name`` for every result: what expectations are evaluated against."""
        out = self.results()
        for name, hits in self._scored().items():
            out.update((f"{step}/{name}", result) for step, result in hits)
        return out

    def table(self, name: str, step: Optional[str] = None) -> list[dict]:
        """The metric's rows as on disk (``iia.json``): example_id, value, eligible, positions, …"""
        return self.result(name, step).rows

    def means(self) -> dict[str, float]:
        return {name: r.mean() for name, r in self.results().items()}

    def saved(self) -> dict[str, Result]:
        """The metrics the document saves as ``.json``, keyed as ``results()`` keys them: a baseline's."""
        found = []
        for step_name, step in _scoring_steps(self.plan):
            for save in getattr(self.plan.steps[step_name], "saves", ()):
                if save.file_path.endswith(".json") and save.value in step.results:
                    found.append((step_name, save.value,
                                  Result(save.value, metric_rows(step, save.value, self.produced_by))))
        shared = {name for name in {n for _, n, _ in found} if sum(n == name for _, n, _ in found) > 1}
        return {(f"{s}/{n}" if n in shared else n): r for s, n, r in found}

    def saved_tensors(self) -> dict[str, dict[str, Any]]:
        """The tensors the document saves, by file path (as ``plan.write`` writes them)."""
        out: dict = {}
        for step in self.plan.steps.values():
            if isinstance(step, (Observe, Fit, Weights)):
                out.update(saved_tensors(step))
        return dict(sorted(out.items()))

    def value(self, name: str) -> Any:
        """A raw result (an output tensor, a generated value) by name, from whichever step has it."""
        for _, step in _scoring_steps(self.plan):
            if name in step.results:
                return step.results[name]
        raise PlanError(f"value {name!r}", f"not produced at {self.name}",
                        f"values: {sorted({k for _, s in _scoring_steps(self.plan) for k in s.results})}")

    def __repr__(self) -> str:
        return f"<Point {self.document.name}::{self.name} on {self.engine}>"


@dataclass
class Run:
    """Every point of one document on one engine."""

    document: Path
    engine: str
    points: list[Point]

    def point(self, name: Optional[str] = None) -> Point:
        """A point by name; with no name, the only point (an unswept document)."""
        if name is None:
            if len(self.points) != 1:
                raise PlanError("point", f"{self.document.name} has {len(self.points)} points",
                                f"name one: {[p.name for p in self.points]}")
            return self.points[0]
        for p in self.points:
            if p.name == name:
                return p
        raise PlanError(f"point {name!r}", f"not in {self.document.name}",
                        f"points: {[p.name for p in self.points]}")

    def __repr__(self) -> str:
        return f"<Run {self.document.name} on {self.engine}: {len(self.points)} points>"

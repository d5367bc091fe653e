"""Where a run's time went: loading the model, compiling the plan, and computing each point.

Recorded in ``run.json`` under ``"timing"`` — the one part of a run's files that a rerun
changes (everything else is byte-identical run to run) — and printed by ``causalab-mini run``.
A sweep's ``points`` are each point's own work (its patched passes); ``shared_s`` is what the
walk spent on forwards every point borrows, run once for all of them (``plan/share.py``).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterable, Optional

from .engine.progress import Stopwatch, listening

KEY = "timing"  # run.json's key


def _s(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 3)  # milliseconds: all a person reads


class Clock:
    """Seconds spent per stage of one run, measured with ``measure`` and ``walk``."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.points: dict[str, float] = {}
        self._owned = 0.0  # sum(self.points.values()), kept as they come: a point's record is O(1)

    @contextmanager
    def measure(self, stage: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.spent[stage] = self.spent.get(stage, 0.0) + time.perf_counter() - started

    @contextmanager
    def walk(self, names: Iterable[str]):
        """Around an engine's ``execute``: the walk's seconds, and each named point's own."""
        watch = Stopwatch(names)
        with listening(watch), self.measure("compute"):
            yield
        for name, seconds in watch.seconds.items():
            self._owned += seconds - self.points.get(name, 0.0)
            self.points[name] = seconds

    @property
    def shared(self) -> float:
        """The walk's seconds no point owns: its shared forwards (and the steps between points; an
        attribution pass and its exact verification)."""
        return max(0.0, self.spent.get("compute", 0.0) - self._owned)

    def record(self, points: Optional[dict[str, str]] = None) -> dict:
        """run.json's timing of a run: ``points`` maps each sweep point's step name to the name the
        run gives it (none for an unswept run, whose compute is its one point's)."""
        out = {f"{stage}_s": _s(self.spent.get(stage)) for stage in ("load", "compile", "compute")}
        if points:
            out["shared_s"] = _s(self.shared)
            out["points"] = {shown: _s(self.points.get(step)) for step, shown in points.items()}
        return out

    def point_record(self, step: str) -> dict:
        """The timing of one point handed back as its own run (run_points, the pytest plugin): its
        own seconds, and the shared forwards it borrowed — run once for every point of the walk."""
        return {"load_s": _s(self.spent.get("load")), "compile_s": _s(self.spent.get("compile")),
                "compute_s": _s(self.points.get(step)), "shared_s": _s(self.shared)}

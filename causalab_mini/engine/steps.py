"""The walk: one plain function per step kind, each taking the engine.

``run(engine, step)`` is the whole executor: a plan's steps in order — the shared forwards lent
to the points that borrow them, an attribution pass, each point's steps — and each step handed to
what runs it: one pass (``passes.py``), an estimate (``attribution.py``), a fit (``fit.py``).
Every function calls the engine for exactly one thing — running a forward (``engine.forward``) —
and none of them touches the model. Positions are resolved inside the run, against
``engine.tokenizer``; metrics, outputs and batching windows are in ``passes.py``, so both engines
share them unchanged.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..errors import EngineError
from ..plan.plan import Attribution, Featurizers, Fit, Observe, Plan, Shared, Weights
from . import at_once as at_once_mod
from . import attribution as attributing
from . import fit as fitting
from . import progress
# What callers reach through the walk (``steps.State``, ``steps.observe``, ``steps.resolve``): one pass's.
from .passes import (Lent, Published, State, finish, observe, place_continuation, prepare, resolve,
                     run_forwards)

__all__ = ["run", "check_options", "lend", "release", "rows_in", "reporting", "listening", "Lent", "Published",
           "State", "finish", "observe", "place_continuation", "prepare", "resolve", "run_forwards"]

# The names callers know (``with steps.reporting(callback):``); they live in progress.py.
reporting = progress.reporting
listening = progress.listening

def check_options(batch_size: Optional[int], at_once: int) -> None:
    """Refuse a batch size or an at_once that is not a positive integer (before anything runs)."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or batch_size < 1):
        raise EngineError("batch_size", f"{batch_size!r} is not a number of rows",
                          "give a positive integer, or leave it out for the whole batch")
    if isinstance(at_once, bool) or not isinstance(at_once, int) or at_once < 1:
        raise EngineError("at_once", f"{at_once!r} is not a number of points",
                          "give a positive integer (1: each point's forwards on their own)")


def run(engine, step, *, batch_size: Optional[int] = None, state: Optional[State] = None, at_once: int = 1):
    check_options(batch_size, at_once)
    if state is None:  # the walk starts: how many rows it will push through, for a bar's total
        progress.announce_run(getattr(step, "name", ""), rows_in(step))
    state = state or State()
    if isinstance(step, Plan):
        estimating = [c for c in step.steps.values() if isinstance(c, Attribution)]
        at_once = 1 if estimating else at_once  # an estimated point runs no forward to stack
        points = [n for n, c in step.steps.items() if isinstance(c, Plan)]
        stacked = {g[0][0]: g for g in at_once_mod.groups(
            [(n, c) for n, c in step.steps.items() if isinstance(c, Plan)], at_once, batch_size)
            if len(g) > 1} if at_once > 1 else {}
        later = {n for g in stacked.values() for n, _, _ in g[1:]}  # run with the first of their group
        for name, child in step.steps.items():
            if isinstance(child, Shared):
                with torch.no_grad():
                    lend(engine, child, state, batch_size=batch_size)
                continue
            if isinstance(child, Attribution):
                attributing.lend(engine, child, step, state, batch_size=batch_size)
                continue
            if name in later:
                continue
            if name in stacked:
                group = stacked[name]
                progress.announce_point(name, points.index(name), len(points))
                with torch.no_grad():
                    at_once_mod.run_group(engine, group, state, prepare=prepare, finish=finish,
                                          sub_state=lambda: State(featurizers=state.featurizers, shared=state.shared))
                for member, _, _ in group:
                    release(state, member)
                    progress.announce(member, points.index(member) + 1, len(points))
                continue
            # A nested plan (a sweep point) gets its own outputs and the same featurizers,
            # so points cannot see each other's published values; the shared reads it borrows.
            sub = State(featurizers=state.featurizers, shared=state.shared, estimates=state.estimates) \
                if isinstance(child, Plan) else state
            if isinstance(child, Plan):
                progress.announce_point(name, points.index(name), len(points))
            run(engine, child, batch_size=batch_size, state=sub, at_once=at_once)
            if isinstance(child, Plan):
                if not estimating:  # verification may run any point exactly after the last: kept till then
                    release(state, name)
                progress.announce(name, points.index(name) + 1, len(points))
        for child in estimating:
            if child.estimate.verifies:
                attributing.verify(engine, step, child, state, batch_size=batch_size)
        for name in points if estimating else ():
            release(state, name)
        return step
    if isinstance(step, Observe):
        if step.estimate is not None:
            attributing.estimate(engine, step, state, batch_size=batch_size)
            return step
        with torch.no_grad():
            observe(engine, step, state, batch_size=batch_size)
        return step
    if isinstance(step, Featurizers):
        fitting.construct(step, state)
        return step
    if isinstance(step, Fit):
        # The fit's updates and held-out passes are this module's ``observe``, handed over so
        # that fit.py needs nothing of the walk's (and the walk can import fit.py).
        fitting.fit(engine, step, state, observe=observe, batch_size=batch_size)
        return step
    if isinstance(step, Weights):
        fitting.weights(step, state)
        return step
    raise TypeError(f"unknown step {type(step).__name__}")


def lend(engine, step: Shared, state: State, *, batch_size: Optional[int] = None) -> None:
    """Run the shared forwards once, each window by window as a point's would be, and keep every
    read for the points that borrow it (``release`` frees a read after its last borrower)."""
    for forward in step.forwards:
        (resolved,), positions = resolve(engine, (forward,), anchored=step.record)
        values = run_forwards(engine, (resolved,), State(), forward.rows, batch_size, step.name)
        for name, window, ragged in resolved.windows:
            op = next(r for r in resolved.reads if r.name == name)
            counts = tuple(len(w) for w in window) if ragged else None
            state.shared[name] = Lent(op, Published(values[name], per_row=True, counts=counts), window, ragged,
                                      positions.get(name) if positions is not None else None)
    state.borrowers.update((name, set(points)) for name, points in step.users)


def release(state: State, point: str) -> None:
    """``point`` has run: free every shared read no point still to run borrows."""
    for name in [n for n, waiting in state.borrowers.items() if point in waiting]:
        state.borrowers[name].discard(point)
        if not state.borrowers[name]:
            del state.borrowers[name]
            state.shared.pop(name, None)


def rows_in(step) -> int:
    """The rows a walk of ``step`` pushes through its passes, each pass's rows counted once
    (not once per forward): the total a progress bar counts ``"batch"`` events against. A fit
    counts every epoch's updates and held-out pass; one that stops early pushes fewer."""
    if isinstance(step, Plan):
        return sum(rows_in(child) for child in step.steps.values())
    if isinstance(step, Observe) and step.estimate is not None:
        # Scored from the attribution pass's rows (counted there), after any un-written forward of its own.
        return step.rows if any(not f.writes for f in step.forwards) else 0
    if isinstance(step, Attribution):
        # Its pass, then each point it verifies run exactly.
        est, points = step.estimate, len(step.users)
        return step.rows * (1 + (points if est.all else min(points, est.top + est.random)))
    if isinstance(step, (Observe, Shared)):
        return step.rows
    if isinstance(step, Fit):
        held_out = step.evaluation.rows if step.evaluation is not None else 0
        return len(step.epochs) * (step.epochs.rows + held_out)
    return 0

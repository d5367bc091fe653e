"""Progress reporting for a run: who to tell as a walk starts, pushes a batch of rows through a
pass, starts and finishes a sweep point, and finishes a fit's epoch.

Its own module because both the walk (``steps``: the run, sweep points, batches) and the fit
(``fit``: epochs) report, and neither should have to import the other to do it.

Two ways to listen:

* ``listening(listener)``: ``listener(event)`` for every ``Event`` (the kinds below) — what a
  progress bar counting rows needs;
* ``reporting(callback)``: ``callback(name, done, total)`` as sweep points and epochs finish
  (the ``"done"`` events only), the older and smaller interface.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

Callback = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Event:
    """One thing a run did.

    ``kind`` is one of

    * ``"run"``: a walk starts; ``total`` is the rows it will push through its passes (every
      observe, fit update and held-out pass counted once per row; a fit that stops early
      pushes fewer), ``done`` is 0;
    * ``"point"``: a sweep point starts; ``done`` points finished before it, of ``total``;
    * ``"batch"``: a window of ``rows`` rows went through every forward of the pass ``name``
      (an observe step's name); ``done`` of the pass's ``total`` rows are now through;
    * ``"done"``: a sweep point or a fit's epoch finished, ``done`` of ``total`` (the event
      ``reporting``'s callbacks get).
    """

    kind: str
    name: str
    done: int
    total: int
    rows: int = 0


Listener = Callable[[Event], None]

# A process-wide slot rather than an argument, because the walk may run inside an engine's
# session on another thread, and the engine contract has no say in how a caller reports progress.
_listeners: list[Listener] = []


@contextmanager
def listening(listener: Listener):
    """Call ``listener(event)`` for every ``Event`` of the runs inside the block."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


@contextmanager
def reporting(callback: Callback):
    """Call ``callback(name, done, total)`` as runs inside the block finish sweep points and epochs."""

    def finished(event: Event) -> None:
        if event.kind == "done":
            callback(event.name, event.done, event.total)

    with listening(finished):
        yield


def _tell(event: Event) -> None:
    for listener in list(_listeners):
        listener(event)


def announce(name: str, done: int, total: int) -> None:
    """Tell every listener that ``done`` of ``total`` are finished, the last being ``name``
    (a sweep point or a fit's epoch)."""
    if _listeners:
        _tell(Event("done", name, done, total))


def announce_run(name: str, rows: int) -> None:
    """A walk starts that will push ``rows`` rows through its passes."""
    if _listeners:
        _tell(Event("run", name, 0, rows))


def announce_point(name: str, done: int, total: int) -> None:
    """Sweep point ``name`` starts, ``done`` of ``total`` having finished before it."""
    if _listeners:
        _tell(Event("point", name, done, total))


def announce_batch(name: str, rows: int, done: int, total: int) -> None:
    """``rows`` more rows of pass ``name`` went through its forwards: ``done`` of ``total``."""
    if _listeners:
        _tell(Event("batch", name, done, total, rows))


class Stopwatch:
    """Seconds each sweep point's own work took, from a walk's events (``listening(stopwatch)``).

    A point's time runs from its ``"point"`` event to its ``"done"``; points stacked into one call
    (``at_once``) finish together and share their group's time evenly. What no point owns — the
    shared forwards every point borrows from — is the walk's time less the points' sum, which the
    caller measures around the walk. ``names``: the sweep points' step names (a fit's epochs also
    finish with a ``"done"``, under other names).
    """

    def __init__(self, names) -> None:
        self.names = set(names)
        self.seconds: dict[str, float] = {}
        self._started: float | None = None
        self._group: list[str] = []

    def __call__(self, event: Event) -> None:
        import time

        if event.kind == "point":
            self._started, self._group = time.perf_counter(), []
        elif event.kind == "done" and event.name in self.names and self._started is not None:
            self._group.append(event.name)
            each = (time.perf_counter() - self._started) / len(self._group)
            for name in self._group:
                self.seconds[name] = each


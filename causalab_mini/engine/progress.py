"""Progress reporting for a run: who to tell when a sweep point or a fit's epoch finishes.

Its own module because both the walk (``steps``: sweep points) and the fit (``fit``: epochs)
report, and neither should have to import the other to do it.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

Callback = Callable[[str, int, int], None]

# A process-wide slot rather than an argument, because the walk may run inside an engine's
# session on another thread, and the engine contract has no say in how a caller reports progress.
_listeners: list[Callback] = []


@contextmanager
def reporting(callback: Callback):
    """Call ``callback(name, done, total)`` as runs inside the block finish sweep points and epochs."""
    _listeners.append(callback)
    try:
        yield
    finally:
        _listeners.remove(callback)


def announce(name: str, done: int, total: int) -> None:
    """Tell every listener that ``done`` of ``total`` are finished, the last being ``name``."""
    for callback in list(_listeners):
        callback(name, done, total)

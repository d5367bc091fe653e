"""An HTML report of runs: one self-contained page (images embedded, no script, nothing fetched)
that a person opens from disk and reads at a glance.

::

    from causalab_mini import report

    page = report.from_folders(["runs/layer_pos", "runs/das"])   # or causalab-mini report runs/
    report.write(page, "report.html")

Per document: its description, each point's outcome and result means, the figures ``plot``
would draw (a heatmap for every two-axis sweep), the expectation verdicts and links to the
points' files. The pytest plugin writes the same page with ``--causalab-report=DIR``, adding
what only a test session knows: pytest's outcome of each point and its baseline drift.
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

from .build import from_folders, point_row, run_folders, section_of
from .model import ERROR, FAILED, OUTCOMES, PASSED, RAN, SKIPPED, Figure, Page, PointRow, Section

__all__ = ["from_folders", "section_of", "point_row", "run_folders", "write", "render", "Page", "Section",
           "PointRow", "Figure", "OUTCOMES", "PASSED", "FAILED", "SKIPPED", "ERROR", "RAN"]


def render(page: Page, *, at=None) -> str:
    """The page as HTML text (links relative to the folder ``at``)."""
    from .html import render as html

    return html(page, at=at)


def write(page: Page, path: Union[str, Path]) -> Path:
    """Write ``page`` to ``path`` whole (never half a page on disk); links relative to its folder."""
    from ..errors import WriteError
    from ..files import write_atomic

    path = Path(path)
    if path.is_dir():
        raise WriteError(str(path), "a folder, not a file", f"name the page's file: {path / 'index.html'}")
    text = render(page, at=path.parent).encode("utf-8")  # drawn before anything touches the disk
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError as err:
        raise WriteError(str(path), f"{err.strerror or err}; nothing was written there",
                         "give a path in a folder you can write to") from None
    return path

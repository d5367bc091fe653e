"""What a report page shows, as plain data: a ``Page`` of ``Section``s (one a document), each with
its ``PointRow``s and ``Figure``s. Built from run folders (``from_runs``) or by the pytest plugin
from its items' reports; drawn by ``html.render``. Nothing here reads files or draws."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# A point's outcome: the pytest verdict, or for a run read from disk, what its expectations say
# ("ran": no expectation applies there).
PASSED, FAILED, SKIPPED, ERROR, RAN = "passed", "failed", "skipped", "error", "ran"
OUTCOMES = (FAILED, ERROR, PASSED, RAN, SKIPPED)  # also the order a section's own outcome is decided in


@dataclass
class PointRow:
    """One point of a document as the report lists it."""

    name: str
    coords: dict = field(default_factory=dict)
    outcome: str = RAN
    message: str = ""  # why it failed, errored or was skipped
    means: dict = field(default_factory=dict)  # result → mean over eligible rows (the first engine's)
    counts: dict = field(default_factory=dict)  # result → (eligible rows, rows)
    checks: list = field(default_factory=list)  # causalab_mini.Check: expectations (passing too), failures
    baseline: Optional[str] = None  # written | updated | drifted | changed | missing | unchanged
    drift: list = field(default_factory=list)  # the drift's lead lines: one per result that moved
    folder: Optional[Path] = None  # where its files are
    files: list = field(default_factory=list)  # their names, relative to folder


@dataclass
class Figure:
    """One embedded image: PNG bytes, what it shows."""

    caption: str
    png: bytes
    kind: str  # heatmap | line | bars | gate | attention
    result: Optional[str] = None


@dataclass
class Section:
    """One document: where it is, what it is for, its points and figures."""

    name: str
    source: Optional[str] = None  # the document's path as the user names it
    description: str = ""
    model: str = ""
    engine: str = ""
    points: list = field(default_factory=list)
    figures: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # why a figure is missing, a collection error, …
    # Why its run folder could not be read back (cm.open's refusal: a file run.json lists is gone
    # or cut short): a damaged run has no points to show, and the page and the CLI count it apart.
    damaged: str = ""

    @property
    def outcome(self) -> str:
        """The worst of its points' outcomes (a failure anywhere fails the document)."""
        found = {p.outcome for p in self.points}
        return next((o for o in OUTCOMES if o in found), ERROR if self.notes and not self.points else RAN)

    @property
    def badge(self) -> str:
        """What its badge says: its outcome, or ``damaged`` (an error) where its folder is."""
        return "damaged" if self.damaged else self.outcome

    @property
    def results(self) -> list:
        """Every result some point has a mean of, in first-seen order: the points table's columns."""
        return list(dict.fromkeys(name for p in self.points for name in p.means))

    @property
    def anchor(self) -> str:
        """The section's id in the page: its name with anything but letters, digits, - and _ as -."""
        return "doc-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in self.name)


@dataclass
class Page:
    title: str
    sections: list = field(default_factory=list)
    subtitle: str = ""  # what produced it: "pytest documents/ (engine nnterp)", the folders read

    @property
    def damaged(self) -> list:
        """The sections whose run folder is damaged (shown, with why, but holding no points)."""
        return [s for s in self.sections if s.damaged]

    def counts(self) -> dict:
        """Outcome → number of points, over every section, in ``OUTCOMES`` order (absent ones left out)."""
        found: dict = {}
        for section in self.sections:
            for p in section.points:
                found[p.outcome] = found.get(p.outcome, 0) + 1
        return {o: found[o] for o in OUTCOMES if o in found}

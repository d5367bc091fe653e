"""Report sections from runs: a ``Run`` (in memory, or opened from its folder) and its verdicts
become a ``Section`` with its ``PointRow``s and figures. ``from_folders`` finds the runs under
the folders it is given (``causalab-mini report OUT_DIR...``); the pytest plugin builds its rows
with ``point_row`` and adds what only it knows (the pytest outcome, baseline drift)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from ..errors import CausalabError, PlanError
from .figures import figures
from .model import FAILED, PASSED, RAN, Page, PointRow, Section

RUN = "run.json"


def point_row(point, *, name: Optional[str] = None, coords: Optional[dict] = None, checks=(),
              outcome: Optional[str] = None) -> PointRow:
    """A point's row: the means and counts of what it saves (everything it scored, for a point in
    memory that saves nothing), its folder's files. ``outcome``: given, or decided by ``checks``
    (a failing check fails it; none at all is ``ran``)."""
    results = point.saved() or point.results()
    checks = list(checks)
    if outcome is None:
        outcome = FAILED if any(not c.ok for c in checks) else (PASSED if checks else RAN)
    folder = Path(point.out) if point.out is not None else None
    files = sorted(f.name for f in folder.iterdir() if f.is_file()) if folder and folder.is_dir() else []
    return PointRow(name or point.name, dict(point.coords if coords is None else coords), outcome,
                    means={k: r.mean() for k, r in results.items()},
                    counts={k: (len(r), len(r.rows)) for k, r in results.items()},
                    checks=checks, folder=folder, files=files)


def document_facts(point) -> tuple[str, str]:
    """(description, model key) of the document a point ran, from its own document."""
    from ..plots.choose import spec_of

    try:
        spec = spec_of(point)
    except PlanError:
        return "", ""
    return spec.header.description, spec.model.key


def section_of(run, *, name: Optional[str] = None, source: Optional[str] = None,
               rows: Optional[list] = None) -> Section:
    """A run's section: every point with its means, expectation verdicts and files; its figures.
    ``rows``: the points' rows when the caller has them already (the pytest plugin, whose rows
    carry pytest's own outcomes and checks), so the expectations are not checked a second time."""
    from ..checks import verdicts

    if rows is None:
        checks = verdicts(run) if run.points else []
        rows = [point_row(p, checks=[c for c in checks if c.point == p.name]) for p in run.points]
    description, model = document_facts(run.points[0]) if run.points else ("", "")
    shown = name or (run.record or {}).get("document") or (Path(run.out).name if run.out else "run")
    pictures, notes = figures(run)
    return Section(shown, source, description, model, run.engine, rows, pictures, notes)


def run_folders(paths: Iterable) -> list[Path]:
    """Every finished run folder at or under ``paths``, in the order given, each tree sorted by
    path. A folder holding ``run.json`` is one run (its point folders are not searched again)."""
    from ..outputs.write import state

    found: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise PlanError(str(path), "not a folder", "give the folder a run wrote, or one holding such folders")
        if (path / RUN).is_file():
            found.append(path)
            continue
        tops = sorted(p.parent for p in path.rglob(RUN))
        runs = [p for p in tops if not any(q != p and q in p.parents for q in tops)]
        found += [p for p in runs if state(p) == "complete"]
        if not runs:
            raise PlanError(str(path), f"no {RUN} in it or under it: no run was written here",
                            "give the --out folder of causalab-mini run, cm.run(out=...) or --causalab-out")
    return found


def from_folders(paths: Iterable, *, title: str = "causalab-mini report") -> Page:
    """The page of every run under ``paths``: a section a run, in the order found."""
    from ..api import open as open_run

    folders = run_folders(paths)
    sections = []
    for folder in folders:
        try:
            sections.append(section_of(open_run(folder), source=str(folder)))
        except CausalabError as err:  # a damaged run is shown as one, not left out in silence
            sections.append(Section(folder.name, str(folder), notes=[f"damaged, not read: {err}"],
                                    damaged=str(err)))
    return Page(title, sections, subtitle=f"{len(folders)} run folder{'s' if len(folders) != 1 else ''}")

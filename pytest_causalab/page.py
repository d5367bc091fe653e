"""``--causalab-report=DIR``: the session as one HTML page, ``DIR/index.html``.

Each point that ran records, in ``item.user_properties`` (which xdist carries from a worker
to the controller), the folders its files went to, every check it was held to (passing ones
included) and its baseline's drift. At the end of the session the controller reads those
back from the reports, opens each point's folder (``causalab_mini.open``), draws each
document's figures from the opened points and writes the page with ``causalab_mini.report``.
A point that did not run (skipped, refused) is still a row, with pytest's reason.
"""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional

from causalab_mini import SUFFIX, CausalabError, Check, Run, open as open_run, report
from causalab_mini.names import stem

from .baseline import STATUS
from .report import COORDS, INDEX

FACTS = "causalab.report"  # the user property holding a point's folders, checks and drift


def record(item, ran: dict, checks: list, drift: list) -> None:
    """What the page needs of a point that ran, as one JSON user property."""
    facts = {"folders": {engine: str(p.out) for engine, p in ran.items() if p.out is not None},
             "checks": [asdict(c) for c in checks], "drift": list(drift)}
    item.user_properties.append((FACTS, json.dumps(facts, default=str)))


def write(reports, errors, state, config) -> Path:
    """Build the page from the session's reports (call reports, and collection errors) and write
    it to ``<report>/index.html``; returns its path."""
    root = Path(config.rootpath)
    by_document: dict = {}
    for r in reports:
        document, _, name = r.nodeid.partition("::")
        by_document.setdefault(document, []).append((name, r))
    documents = sorted(by_document)
    stems = [stem(d) for d in documents]
    # A document is called by its stem, as everywhere; two of one stem (protocol/ and v2/) by their paths.
    names = [n if stems.count(n) == 1 else d.removesuffix(SUFFIX) for n, d in zip(stems, documents)]
    sections = [_section(d, name, by_document[d], state, root) for d, name in zip(documents, names)]
    for r in errors:
        sections.append(report.Section(r.nodeid or "collection", source=r.nodeid, notes=[_message(r)]))
    engine = state.settings.engine
    page = report.Page("causalab report", sections,
                       subtitle=f"pytest {' '.join(config.invocation_params.args)} · engine {engine}".rstrip())
    return report.write(page, state.settings.report / "index.html")


def _section(document: str, name: str, found: list, state, root: Path):
    path = root / document
    order = _point_order(path, state)
    found.sort(key=lambda nr: (order.get(nr[0], len(order)), _index(nr[1])))
    rows, points = [], []
    for point_name, r in found:
        row, point = _row(point_name, r)
        rows.append(row)
        if point is not None:
            points.append(point)
    run = Run(path, state.settings.engines[0], points, record={"document": stem(path)})
    section = report.section_of(run, name=name, source=document, rows=rows)
    section.engine = state.settings.engine
    if not points:
        section.description, section.model = _document_facts(path, state)
    return section


def _row(name: str, r) -> tuple:
    """(the report's row, the opened point or None) for one call report."""
    props = dict(r.user_properties or ())
    coords = json.loads(props[COORDS]) if COORDS in props else {}
    if FACTS not in props:  # skipped or refused before it ran
        return report.PointRow(name, coords, _outcome(r), _message(r)), None
    facts = json.loads(props[FACTS])
    checks = [Check(**c) for c in facts["checks"]]
    point = None
    folder = next(iter(facts["folders"].values()), None)
    if folder is not None:
        try:
            point = replace(open_run(folder).point(), name=name, coords=coords)
        except CausalabError:  # the folder is gone or unfinished: the row says what pytest knew
            point = None
    if point is None:
        row = report.PointRow(name, coords, _outcome(r), _message(r), checks=checks)
    else:
        row = report.point_row(point, checks=checks, outcome=_outcome(r))
        row.message = _message(r) if r.outcome != "passed" else ""
    row.baseline, row.drift = props.get(STATUS), facts["drift"]
    return row, point


def _outcome(r) -> str:
    return {"passed": report.PASSED, "failed": report.FAILED, "skipped": report.SKIPPED}.get(r.outcome, report.ERROR)


def _message(r) -> str:
    longrepr = getattr(r, "longrepr", None)
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    return getattr(r, "longreprtext", "") or ""


def _index(r) -> int:
    return int(dict(r.user_properties or ()).get(INDEX, 0))


def _point_order(path: Path, state) -> dict:
    try:
        return {name: i for i, name in enumerate(state.document(path).point_names)}
    except (CausalabError, OSError):
        return {}


def _document_facts(path: Path, state) -> tuple[str, str]:
    try:
        doc = state.document(path)
    except (CausalabError, OSError):
        return "", ""
    description: Optional[str] = (doc.raw.get("header") or {}).get("description")
    return description or "", doc.model.key

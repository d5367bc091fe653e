"""The end-of-session baselines report: how many points were written, updated, drifted,
missing or unchanged, by document, and the stale entries kept or removed.

Read back from the test reports' ``user_properties`` (``baseline.record`` writes them), so
under xdist the controller reports what every worker checked. Apart from ``baseline``
because it only reads verdicts: nothing here loads, compares or writes a baseline file.
"""
from __future__ import annotations

import json
from typing import Optional

from .baseline import CHANGED, DRIFTED, MISSING, REMOVED, STALE, STATUS, UNCHANGED, UPDATED, WRITTEN

CATEGORIES = (WRITTEN, UPDATED, DRIFTED, MISSING, UNCHANGED)
NAMES_SHOWN = 8


def session_report(reports, *, update: Optional[str], detailed: bool) -> list:
    """The end-of-session lines: counts, then each category's documents and points. Unchanged
    points are listed only when ``detailed`` (-v, --causalab-summary); stale entries always."""
    status: dict = {}
    stale: dict = {}
    removed: dict = {}
    for report in reports:
        props = dict(getattr(report, "user_properties", ()) or ())
        if STATUS not in props:
            continue
        document, _, name = report.nodeid.partition("::")
        status[(document, name)] = props[STATUS]  # one verdict an item: a rerun replaces it
        for key, into in ((STALE, stale), (REMOVED, removed)):
            if key in props:
                into.setdefault(document, set()).update(json.loads(props[key]))
    if not status and not stale and not removed:
        return []
    by: dict = {c: {} for c in CATEGORIES}
    for (document, name), s in status.items():
        category = DRIFTED if s == CHANGED else s
        label = f"{name} (experiment changed)" if s == CHANGED else name
        by.setdefault(category, {}).setdefault(document, []).append(label)
    kept = {d: names - removed.get(d, set()) for d, names in stale.items()}
    kept = {d: names for d, names in kept.items() if names}
    counts = [f"{sum(map(len, by[c].values()))} {c}" for c in CATEGORIES if c != MISSING or by[c]]
    n_kept, n_removed = sum(map(len, kept.values())), sum(map(len, removed.values()))
    stale_count = [f"{n} stale ({how})" for n, how in ((n_kept, "kept"), (n_removed, "removed")) if n]
    lines = [f"{len(status)} point{'s' if len(status) != 1 else ''}: {', '.join(counts)}; "
             f"{', '.join(stale_count) or '0 stale'}"]
    for category in CATEGORIES:
        if category == UNCHANGED and not detailed:
            continue
        for document, names in by[category].items():
            lines.append(f"  {category:<9}  {document}: {_names(names)}")
    for document, names in removed.items():
        lines.append(f"  {'stale':<9}  {document}: {_names(sorted(names))} (removed)")
    for document, names in kept.items():
        lines.append(f"  {'stale':<9}  {document}: {_names(sorted(names))} (kept: not points of the document "
                     "any more; --causalab-update-baselines removes them)")
    return lines


def _names(names: list) -> str:
    more = len(names) - NAMES_SHOWN
    return ", ".join(names[:NAMES_SHOWN]) + (f", … and {more} more" if more > 0 else "")

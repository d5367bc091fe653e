"""What a point leaves behind for people and dashboards: junit properties and the summary table.

Everything goes through ``item.user_properties``, which xdist carries from a
worker back to the controller, so the summary table is the same with ``-n``.
"""
from __future__ import annotations

import math
from collections import defaultdict

ENGINE = "causalab.engine"
MEAN = "causalab.mean."
COLUMN = "causalab.column."


def record(item, ran: dict) -> None:
    """Each engine's result means (and hook columns) as junit properties of the item."""
    props = item.user_properties
    props.append((ENGINE, ",".join(ran)))
    for i, (engine, point) in enumerate(ran.items()):
        suffix = "" if i == 0 else f"@{engine}"
        for name, mean in point.means().items():
            props.append((f"{MEAN}{name}{suffix}", mean))
    primary = next(iter(ran.values()))
    for columns in item.config.hook.pytest_causalab_summary_columns(point=primary, config=item.config):
        for key, value in (columns or {}).items():
            props.append((f"{COLUMN}{key}", str(value)))


def row(report) -> dict | None:
    """A call report's summary row, or None when the item is not a point that ran."""
    props = dict(report.user_properties)
    if ENGINE not in props:
        return None
    return {"nodeid": report.nodeid, "outcome": report.outcome, **props}


def _num(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _per_engine(r: dict) -> list[tuple[str, dict]]:
    """A row's means split by engine: the first engine's keys bare, the others' as ``name@engine``."""
    engines = r[ENGINE].split(",")
    out = []
    for i, engine in enumerate(engines):
        cells = {}
        for k, v in r.items():
            if not k.startswith((MEAN, COLUMN)):
                continue
            name, _, at = k.partition("@")
            if (i == 0 and not at) or at == engine:
                cells[name.removeprefix(MEAN).removeprefix(COLUMN)] = v
        out.append((engine, cells))
    return out


def render(rows: list[dict]) -> list[str]:
    """One small table per document: point, engine, outcome, each result's mean, hook columns."""
    by_doc: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_doc[r["nodeid"].split("::")[0]].append(r)
    lines = []
    for doc, doc_rows in by_doc.items():
        body, keys = [], []
        for r in doc_rows:
            for engine, cells in _per_engine(r):
                keys += [k for k in cells if k not in keys]
                body.append((r["nodeid"].split("::", 1)[-1], engine, r["outcome"], cells))
        table = [["point", "engine", "outcome", *keys]]
        table += [[p, e, o, *(_num(c.get(k, "")) for k in keys)] for p, e, o, c in body]
        widths = [max(len(t[i]) for t in table) for i in range(len(table[0]))]
        lines.append(doc)
        for t in table:
            lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip())
    return lines

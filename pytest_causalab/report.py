"""What a point leaves behind for people and dashboards: junit properties and the summary table.

Everything goes through ``item.user_properties``, which xdist carries from a
worker back to the controller, so the summary table is the same with ``-n``.

A swept point also records its coordinates (``causalab.coords``, a JSON object in the
document's axis order) and its place in the session's run order (``causalab.index``:
the document's order, which the plugin keeps), so the summary lays a two-axis sweep
out as a grid per result: the first axis down, the second across.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest

from causalab_mini.names import label

ENGINE = "causalab.engine"
MEAN = "causalab.mean."
COLUMN = "causalab.column."
COORDS = "causalab.coords"
INDEX = "causalab.index"
CACHED = "causalab.cached"  # the engines whose results for the point the result cache gave


def cache_lines(reports, folder) -> list:
    """The end-of-session cache line: how many points the cache served (nothing computed), which."""
    points = [r for r in reports if ENGINE in dict(getattr(r, "user_properties", ()) or ())]
    served = [r.nodeid for r in points if CACHED in dict(r.user_properties)]
    if not points:
        return []
    lines = [f"{len(served)} of {len(points)} points served from {folder} (not computed)"]
    shown = served[:8]
    lines += [f"  cached     {nodeid}" for nodeid in shown]
    if len(served) > len(shown):
        lines.append(f"  … and {len(served) - len(shown)} more")
    return lines

_ORDER = pytest.StashKey[dict]()


def _index(item) -> int:
    """The item's place in the session's items (built once per session): within a document,
    the order of its points, which the plugin's reordering by model keeps."""
    order = item.config.stash.get(_ORDER, None)
    if order is None or item.nodeid not in order:
        order = {it.nodeid: i for i, it in enumerate(item.session.items)}
        item.config.stash[_ORDER] = order
    return order.get(item.nodeid, len(order))


def record(item, ran: dict) -> None:
    """Each engine's result means (and hook columns) as junit properties of the item; a sweep
    point's coordinates and run-order index too."""
    props = item.user_properties
    props.append((ENGINE, ",".join(ran)))
    for i, (engine, point) in enumerate(ran.items()):
        suffix = "" if i == 0 else f"@{engine}"
        for name, mean in point.means().items():
            props.append((f"{MEAN}{name}{suffix}", mean))
    primary = next(iter(ran.values()))
    if primary.coords:
        props.append((COORDS, json.dumps(primary.coords, ensure_ascii=False)))
        props.append((INDEX, _index(item)))
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
    """Per document: a two-axis sweep as one grid per result (and engine) — the first axis down,
    the second across, each cell that point's mean; anything else as one small table: point,
    engine, outcome, each result's mean, hook columns."""
    by_doc: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_doc[r["nodeid"].split("::")[0]].append(r)
    lines = []
    for doc, doc_rows in by_doc.items():
        lines.append(doc)
        axes = _two_axes(doc_rows)
        lines += _grids(doc_rows, *axes) if axes else _flat(doc_rows)
    return lines


def _table(table: list[list[str]], widths=None) -> list[str]:
    widths = widths or [max(len(t[i]) for t in table) for i in range(len(table[0]))]
    return ["  " + "  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip() for t in table]


def _flat(doc_rows: list[dict]) -> list[str]:
    body, keys = [], []
    for r in doc_rows:
        for engine, cells in _per_engine(r):
            keys += [k for k in cells if k not in keys]
            body.append((r["nodeid"].split("::", 1)[-1], engine, r["outcome"], cells))
    table = [["point", "engine", "outcome", *keys]]
    table += [[p, e, o, *(_num(c.get(k, "")) for k in keys)] for p, e, o, c in body]
    return _table(table)


def _coords(r: dict):
    try:
        found = json.loads(r[COORDS])
    except (KeyError, TypeError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _two_axes(doc_rows: list[dict]):
    """The document's two axes when every row has coordinates on exactly the same two; else None."""
    found = [_coords(r) for r in doc_rows]
    if any(c is None for c in found):
        return None
    axes = [list(c) for c in found]
    return tuple(axes[0]) if len(axes[0]) == 2 and all(a == axes[0] for a in axes) else None


def _ordered(doc_rows: list[dict], axis: str) -> list:
    """The axis's values in the document's order (the points' run-order index; first seen without one)."""
    ranked = sorted(enumerate(doc_rows), key=lambda ir: (_rank(ir[1]), ir[0]))
    values: list = []
    for _, r in ranked:
        value = _coords(r)[axis]
        if value not in values:
            values.append(value)
    return values


def _rank(r: dict) -> float:
    try:
        return float(r[INDEX])
    except (KeyError, TypeError, ValueError):
        return math.inf


def _grids(doc_rows: list[dict], down: str, across: str) -> list[str]:
    """One table per result and engine: ``down``'s values as rows, ``across``'s as columns, each
    cell the point's mean (``-`` where no point reported); then the points that did not pass."""
    rows_of, columns_of = _ordered(doc_rows, down), _ordered(doc_rows, across)
    cells: dict = {}  # (key, engine) -> {(row value label, column value label): cell}
    for r in doc_rows:
        c = _coords(r)
        at = (label(c[down]), label(c[across]))
        for engine, found in _per_engine(r):
            for key, value in found.items():
                cells.setdefault((key, engine), {})[at] = value
    keys: list = []
    for key, _ in cells:
        keys += [key] if key not in keys else []
    engines = list(dict.fromkeys(e for _, e in cells))
    grids = []
    for key in keys:
        for engine in engines:
            if (key, engine) not in cells:
                continue
            grid = cells[key, engine]
            table = [[f"{key} ({engine})", *(f"{across}={label(v)}" for v in columns_of)]]
            for value in rows_of:
                table.append([f"{down}={label(value)}",
                              *(_num(grid[label(value), label(v)]) if (label(value), label(v)) in grid else "-"
                                for v in columns_of)])
            grids.append(table)
    if not grids:  # no result to lay out
        return _flat(doc_rows)
    # One set of column widths for the document's grids, so they stack into one block.
    widths = [max(len(t[i]) for table in grids for t in table) for i in range(1 + len(columns_of))]
    lines = [line for table in grids for line in _table(table, widths)]
    unpassed = [(r["nodeid"].split("::", 1)[-1], r["outcome"]) for r in doc_rows if r["outcome"] != "passed"]
    if unpassed:
        lines.append("  not passed: " + "; ".join(f"{p} ({o})" for p, o in unpassed))
    return lines

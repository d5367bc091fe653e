"""A run's results as flat tables: the records ``causalab-mini table`` writes, and the means
``causalab-mini run`` prints.

::

    run = causalab_mini.open("runs/layer_pos")
    rows = records(run)                # every saved metric: point, coordinates, result, row fields
    rows = records(run, "iia")         # one metric: exactly run.table("iia")
    print(to_csv(rows)); print(to_markdown(rows))
    means(run)                         # {point: {metric: mean}} over the saved metrics
    print("\\n".join(aligned(*means_table(run))))

Nothing here imports torch, pandas or pydantic.
"""
from __future__ import annotations

import csv
import io
import json
import math
from typing import Any, Optional

from ..errors import PlanError

FORMATS = ("csv", "json", "md")


def saved(point) -> dict:
    """The point's saved (``.json``) metrics by the names a table accepts: ``point.saved()``'s
    keys, and ``step/name`` for every one of them."""
    found = {f"{s.step}/{s.name}": s.result for s in point.scored if s.file is not None}
    found.update(point.saved())
    return found


def result_names(run) -> list[str]:
    """Every saved metric of the run, by the name ``point.saved()`` keys it, in first-seen order."""
    names: list[str] = []
    for p in run.points:
        names += [n for n in p.saved() if n not in names]
    return names


def records(run, result: Optional[str] = None) -> list[dict]:
    """One record per (point, row): ``point``, the point's coordinates as columns, then the row as
    on disk (``example_id``, ``value``, ``eligible``, …) — ``run.table(result)`` for one result.
    With no ``result``, every saved metric, one after another, with a ``result`` column after
    the coordinates. A name the run did not save is refused with the names it has."""
    names = result_names(run)
    if not names:
        raise PlanError(str(run.out) if run.out else "run", "this run saved no .json metric, so it has no rows "
                        "to tabulate", "its saved tensors are point.saved_tensors() in Python")
    if result is None:
        return [{"point": p.name, **p.coords, "result": name, **row}
                for name in names for p in run.points if name in p.saved()
                for row in p.saved()[name].rows]
    holders = [p for p in run.points if result in saved(p)]
    if not holders:
        raise PlanError(f"result {result!r}", "not a metric this run saved",
                        f"results: {names}")
    return [{"point": p.name, **p.coords, **row} for p in holders for row in saved(p)[result].rows]


def columns(rows: list[dict]) -> list[str]:
    """Every key of the records, in first-seen order (a row may carry fields another lacks)."""
    seen: dict[str, None] = {}
    for r in rows:
        seen.update(dict.fromkeys(r))
    return list(seen)


def cell(value: Any) -> str:
    """A value as a csv or markdown cell: text as itself, nothing (None) as empty, everything
    else — numbers, true/false, a list coordinate like ``[0,1,2,3]``, a row's positions — as its
    compact JSON text, so a number reads back as the same float."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def to_csv(rows: list[dict]) -> str:
    """The records as CSV: a header of ``columns(rows)``, then one line per record."""
    out = io.StringIO()
    keys = columns(rows)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(keys)
    for r in rows:
        writer.writerow([cell(r.get(k)) for k in keys])
    return out.getvalue()


def _md(value: Any) -> str:
    return cell(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def to_markdown(rows: list[dict]) -> str:
    """The records as a GitHub markdown table (``|`` in a cell escaped), columns padded to line up."""
    keys = columns(rows)
    body = [[_md(k) for k in keys]] + [[_md(r.get(k)) for k in keys] for r in rows]
    widths = [max(3, *(len(line[i]) for line in body)) for i in range(len(keys))]

    def line(values):
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"

    return "\n".join([line(body[0]), line(["-" * w for w in widths]), *map(line, body[1:])]) + "\n"


def to_json(rows: list[dict]) -> str:
    """The records as a JSON array, values as on disk (a list coordinate stays a list)."""
    return json.dumps(rows, indent=1, ensure_ascii=False) + "\n"


def render(rows: list[dict], fmt: str = "csv") -> str:
    if fmt not in FORMATS:
        raise PlanError(f"format {fmt!r}", "not a table format", f"use one of {', '.join(FORMATS)}")
    return {"csv": to_csv, "json": to_json, "md": to_markdown}[fmt](rows)


# --- means per point ------------------------------------------------------------------------

def number(value: Any) -> str:
    """A mean as a table shows it: four significant digits, ``nan`` where no row was scored."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def means(run) -> dict[str, dict[str, float]]:
    """Each point's saved metrics' means, by point name then metric (``point.saved()``'s keys)."""
    return {p.name: {name: r.mean() for name, r in p.saved().items()} for p in run.points}


def means_table(run) -> tuple[list[str], list[list[str]]]:
    """(header, body) of the means: one row per point, one column per saved metric."""
    names = result_names(run)
    found = means(run)
    body = [[p.name, *(number(found[p.name][n]) if n in found[p.name] else "" for n in names)]
            for p in run.points]
    return ["point", *names], body


def aligned(header: list[str], body: list[list[str]], indent: str = "") -> list[str]:
    """A plain text table: columns padded to their widest cell, two spaces apart, a rule under
    the header; trailing spaces stripped."""
    table = [header, *body]
    widths = [max(len(t[i]) for t in table) for i in range(len(header))]
    rule = ["-" * w for w in widths]
    return [(indent + "  ".join(v.ljust(w) for v, w in zip(t, widths))).rstrip()
            for t in (header, rule, *body)]


def means_json(run) -> dict:
    """``{"out", "files", "points": {name: {"coords", "means"}}}``: what ``run --json`` prints.
    A mean of no scored rows is null (JSON has no NaN)."""
    found = means(run)
    return {
        "out": str(run.out) if run.out is not None else None,
        "files": [str(f) for f in run.files],
        "points": {p.name: {"coords": dict(p.coords),
                            "means": {k: (None if isinstance(v, float) and math.isnan(v) else v)
                                      for k, v in found[p.name].items()}}
                   for p in run.points},
    }

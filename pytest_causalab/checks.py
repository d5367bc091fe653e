"""Checks as the failure table pytest prints: ``render``.

``evaluate`` (a point against its document's expectations), ``compare_rows`` (rows against a
baseline or another engine) and ``Check`` are ``causalab_mini``'s, re-exported here for the
plugin's modules.
"""
from __future__ import annotations

from typing import Sequence

# The checks themselves are causalab_mini's (the HTML report and notebooks show the same rows);
# this module lays them out as the failure table.
from causalab_mini import Check, evaluate
from causalab_mini.checks import close, compare_rows, default_tolerance, number, tolerance

__all__ = ["Check", "close", "compare_rows", "default_tolerance", "evaluate", "number", "tolerance", "render"]


# --- the table --------------------------------------------------------------------------------

COLUMNS = ("point", "result", "aggregate", "expected/baseline", "got", "difference")


ROWS_SHOWN = 5  # row checks shown per (point, result); the rest are one "… and N more rows" line


def render(checks: Sequence[Check], *, limit: int = 20, rows_shown: int = ROWS_SHOWN) -> str:
    """Checks as an aligned text table; more than ``limit`` rows are summarised on one line, and
    more than ``rows_shown`` ``row …`` checks of one result (drift, an engine difference) too."""
    seen: dict = {}
    shown = []
    for c in checks:
        if c.aggregate.startswith("row "):
            seen[c.point, c.result] = seen.get((c.point, c.result), 0) + 1
            if seen[c.point, c.result] > rows_shown:
                continue
        shown.append(c)
    rest = len(shown) - limit
    shown = shown[:limit]
    rows = [COLUMNS] + [(c.point, c.result, c.aggregate, c.expected, number(c.got), number(c.difference))
                        for c in shown]
    notes = [c.note for c in shown]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(COLUMNS))]
    last = {(c.point, c.result): i for i, c in enumerate(shown) if c.aggregate.startswith("row ")}
    more = {i: seen[key] - rows_shown for key, i in last.items() if seen[key] > rows_shown}
    lines = []
    for i, row in enumerate(rows):
        line = "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip()
        if i and notes[i - 1]:
            line += f"   ({notes[i - 1]})"
        lines.append(line)
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
        elif i - 1 in more:
            lines.append(f"{row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}  … and {more[i - 1]} more rows")
    if rest > 0:
        lines.append(f"... and {rest} more")
    return "\n".join(lines)



"""A ``Page`` as one self-contained HTML file: inline CSS, images as ``data:`` URIs, no script and
nothing fetched, so it opens from disk anywhere and reads the same offline.

Every number a person reads is also in the markup exactly: a mean's cell carries
``data-point``, ``data-result`` and ``data-value`` (Python's ``repr`` of the float), so what the
page says can be checked against the run it came from.
"""
from __future__ import annotations

import base64
import math
import os
from html import escape
from pathlib import Path
from typing import Optional
from urllib.parse import quote

from .model import Page, PointRow, Section

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330; margin: 0;
       background: #f6f7f9; }
header, main { max-width: 1100px; margin: 0 auto; padding: 0 24px; }
header { padding-top: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 0 0 6px; }
h3 { font-size: 14px; margin: 14px 0 6px; }
.subtitle, .source { color: #5b6475; margin: 0 0 8px; }
.totals span { margin-right: 12px; }
section.document { background: #fff; border: 1px solid #dde1e8; border-radius: 8px; padding: 16px 20px;
                   margin: 18px 0; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border-bottom: 1px solid #e8ebf0; padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
th { color: #5b6475; font-weight: 600; }
td.mean, td.number { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; font-weight: 600; }
.passed { color: #17692f; } .badge.passed { background: #dcf3e2; }
.failed, .error { color: #a4161a; } .badge.failed, .badge.error { background: #fbe0e0; }
.skipped { color: #7a5b00; } .badge.skipped { background: #fbf0cf; }
.ran { color: #35507a; } .badge.ran { background: #e2eaf6; }
.description { max-width: 80ch; }
.figures { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; } figure img { max-width: 520px; height: auto; border: 1px solid #e8ebf0; }
figcaption { color: #5b6475; font-size: 12px; max-width: 520px; }
pre { background: #f3f4f7; padding: 8px; overflow-x: auto; font-size: 12px; white-space: pre-wrap; }
.files a { margin-right: 8px; }
.scroll { overflow-x: auto; }
.note { color: #7a5b00; }
"""


def render(page: Page, *, at: Optional[Path] = None) -> str:
    """The page's HTML. ``at``: the folder the page will be written to, so links to the points'
    files are relative to it (absolute ``file:`` links otherwise)."""
    counts = page.counts()
    totals = "".join(f'<span class="{o}" data-outcome="{o}" data-count="{n}">{n} {o}</span>'
                     for o, n in counts.items())
    damaged = len(page.damaged)
    if damaged:  # counted apart: a damaged run has no points, so the points' totals never show it
        totals += (f' <span class="error" data-damaged="{damaged}">{damaged} damaged run'
                   f'{"s" if damaged != 1 else ""}</span>')
    body = [f"<header><h1>{escape(page.title)}</h1>",
            f'<p class="subtitle">{escape(page.subtitle)}</p>' if page.subtitle else "",
            f'<p class="totals">{len(page.sections)} documents, {sum(counts.values())} points: {totals}</p>',
            _index(page), "</header><main>"]
    body += [_section(s, at, anchor) for s, anchor in zip(page.sections, anchors(page))]
    body.append("</main>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(page.title)}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(part for part in body if part) + "\n</body></html>\n")


def anchors(page: Page) -> list[str]:
    """Each section's id in the page: ``Section.anchor``, made unique with -2, -3, … where two
    documents share a name."""
    seen: dict = {}
    out = []
    for s in page.sections:
        seen[s.anchor] = seen.get(s.anchor, 0) + 1
        out.append(s.anchor if seen[s.anchor] == 1 else f"{s.anchor}-{seen[s.anchor]}")
    return out


def _index(page: Page) -> str:
    rows = []
    for s, anchor in zip(page.sections, anchors(page)):
        n = len(s.points)
        rows.append(f'<tr><td><a href="#{anchor}">{escape(s.name)}</a></td>'
                    f'<td><span class="badge {s.outcome}">{s.badge}</span></td>'
                    f'<td class="number">{n} point{"s" if n != 1 else ""}</td>'
                    f'<td>{len(s.figures)} figure{"s" if len(s.figures) != 1 else ""}</td></tr>')
    return ('<table class="index"><thead><tr><th>document</th><th>outcome</th><th>points</th><th>figures</th>'
            "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _section(s: Section, at: Optional[Path], anchor: str) -> str:
    where = " · ".join(escape(x) for x in (s.source or "", f"model {s.model}" if s.model else "",
                                             f"engine {s.engine}" if s.engine else "") if x)
    parts = [f'<section class="document" id="{anchor}" data-document="{escape(s.name)}" '
             f'data-outcome="{s.outcome}"' + (' data-damaged="true">' if s.damaged else ">"),
             f'<h2>{escape(s.name)} <span class="badge {s.outcome}">{s.badge}</span></h2>',
             f'<p class="source">{where}</p>' if where else "",
             f'<p class="description">{escape(s.description)}</p>' if s.description else ""]
    parts += [f'<p class="note">{escape(n)}</p>' for n in s.notes]
    if s.figures:
        parts.append('<div class="figures">' + "".join(_figure(f) for f in s.figures) + "</div>")
    if s.points:
        parts.append(_points(s, at))
        parts.append(_checks(s))
        parts.append(_drift(s))
        parts.append(_problems(s))
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def _figure(f) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    width, height = _png_size(f.png)
    return (f'<figure data-kind="{f.kind}" data-result="{escape(f.result or "")}">'
            f'<img src="data:image/png;base64,{data}" width="{width}" height="{height}" '
            f'alt="{escape(f.caption)}"><figcaption>{escape(f.caption)}</figcaption></figure>')


def _png_size(png: bytes) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk (bytes 16–24), for the img tag."""
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def _points(s: Section, at: Optional[Path]) -> str:
    results = s.results
    head = "".join(f"<th>{escape(r)}</th>" for r in results)
    rows = []
    for p in s.points:
        cells = "".join(_mean(p, r) for r in results)
        rows.append(f'<tr class="point" data-point="{escape(p.name)}" data-outcome="{p.outcome}">'
                    f"<td>{escape(p.name)}</td>"
                    f'<td><span class="badge {p.outcome}">{p.outcome}</span></td>{cells}'
                    f"<td>{escape(p.baseline or '')}</td><td class=\"files\">{_files(p, at)}</td></tr>")
    return (f'<div class="scroll"><table class="points"><thead><tr><th>point</th><th>outcome</th>{head}'
            f"<th>baseline</th><th>files</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def _mean(p: PointRow, result: str) -> str:
    if result not in p.means:
        return '<td class="mean"></td>'
    value = float(p.means[result])
    eligible, total = p.counts.get(result, (None, None))
    title = f' title="mean of {eligible} of {total} rows"' if total is not None else ""
    return (f'<td class="mean" data-point="{escape(p.name)}" data-result="{escape(result)}" '
            f'data-value="{value!r}"{title}>{number(value)}</td>')


def number(value) -> str:
    """A mean as the page shows it: four significant digits, ``nan`` for no scored row."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return escape(str(value))


def _files(p: PointRow, at: Optional[Path]) -> str:
    if p.folder is None:
        return ""
    links = [f'<a href="{_href(p.folder, at)}/">folder</a>']
    links += [f'<a href="{_href(Path(p.folder) / name, at)}">{escape(name)}</a>' for name in p.files]
    return "".join(links)


def _href(path: Path, at: Optional[Path]) -> str:
    path = Path(path).resolve()
    if at is not None:
        rel = os.path.relpath(path, Path(at).resolve())
        return quote(Path(rel).as_posix(), safe="/")
    return "file://" + quote(path.as_posix(), safe="/")


def _checks(s: Section) -> str:
    checks = [(p, c) for p in s.points for c in p.checks]
    if not checks:
        return ""
    failing = sum(not c.ok for _, c in checks)
    verdict = f"{failing} of {len(checks)} fail" if failing else f"all {len(checks)} pass"
    rows = "".join(
        f'<tr class="check" data-ok="{str(c.ok).lower()}"><td>{escape(c.point)}</td><td>{escape(c.result)}</td>'
        f"<td>{escape(c.aggregate)}</td><td>{escape(c.expected)}</td><td class=\"number\">{number(c.got)}</td>"
        f'<td class="{"passed" if c.ok else "failed"}">{"pass" if c.ok else "fail"}</td>'
        f"<td>{escape(c.note)}</td></tr>" for _, c in checks)
    return (f"<h3>Checks: {verdict}</h3><div class=\"scroll\"><table class=\"checks\"><thead><tr><th>point</th>"
            "<th>result</th><th>aggregate</th><th>expected</th><th>got</th><th>verdict</th><th>note</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>")


def _drift(s: Section) -> str:
    moved = [p for p in s.points if p.drift]
    if not moved:
        return ""
    blocks = "".join(f'<div class="drift" data-point="{escape(p.name)}"><b>{escape(p.name)}</b>'
                     f"<pre>{escape(chr(10).join(line.strip() for line in p.drift))}</pre></div>" for p in moved)
    return f"<h3>Baseline drift</h3>{blocks}"


def _problems(s: Section) -> str:
    shown = [p for p in s.points if p.message and p.outcome in ("failed", "error", "skipped")]
    if not shown:
        return ""
    blocks = "".join(f'<div class="problem" data-point="{escape(p.name)}"><b class="{p.outcome}">'
                     f"{escape(p.name)}: {p.outcome}</b><pre>{escape(p.message)}</pre></div>" for p in shown)
    return f"<h3>Failures and skips</h3>{blocks}"

"""A report page as the tests read it: the standard library's HTML parser over what a browser is
given (or, from tests/test_report_browser.py, what a browser made of it: ``--dump-dom``)."""
from __future__ import annotations

from html.parser import HTMLParser


class ReportPage(HTMLParser):
    """The parts of a report page the tests check: mean cells with their text, sections, point and
    check rows, figures (with the section they sit in), images, links, <body>'s attributes, and
    anything that would run or be fetched."""

    def __init__(self, text: str):
        super().__init__()
        self.body: dict = {}
        self.means: list[dict] = []  # {point, result, value, text}
        self.sections: list[dict] = []
        self.rows: list[dict] = []
        self.checks: list[dict] = []
        self.figures: list[dict] = []
        self.images: list[dict] = []
        self.links: list[str] = []
        self.scripts = 0
        self.external: list[str] = []  # src/href that would fetch over a network
        self._cell = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "body":
            self.body = a
        elif tag == "td" and "mean" in classes and "data-value" in a:
            self._cell = {"point": a["data-point"], "result": a["data-result"], "value": a["data-value"], "text": ""}
        elif tag == "section":
            self.sections.append(a)
        elif tag == "tr" and "point" in classes:
            self.rows.append(a)
        elif tag == "tr" and "check" in classes:
            self.checks.append(a)
        elif tag == "figure":
            self.figures.append({**a, "section": self.sections[-1].get("data-document") if self.sections else None})
        elif tag == "img":
            self.images.append(a)
        elif tag == "a":
            self.links.append(a["href"])
        elif tag == "script":
            self.scripts += 1
        for key in ("src", "href"):
            if a.get(key, "").startswith(("http:", "https:", "//")):
                self.external.append(a[key])

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.means.append(self._cell)
            self._cell = None

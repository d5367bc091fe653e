"""Names that become paths: one rule for every one of them, checked before the filesystem sees it.

A save's ``file_path``, a featurizer's ``file_path``, a model key, a dataset's name and
split: each is joined onto a folder, so each is held to what every common filesystem
takes — components of at most 255 bytes, no NUL, no backslash — and, where it must stay
inside its folder, to a relative path without ``..``.

A document's stem and its points' names become paths too (``runs/<stem>/<engine>/<point>``,
a baseline's file, a pytest item's id), so they are spelled here, once: ``stem``,
``point_name`` and ``label`` (a swept value's spelling in a point name). A public module
(``causalab_mini.names``). Standard library only.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

SUFFIX = ".causalab.json"  # what makes a file a document: the CLI, cm.read and pytest collection

MAX_COMPONENT_BYTES = 255  # one path component on every common filesystem


def problem(name: str, *, relative: bool = True) -> Optional[str]:
    """What is wrong with ``name`` as a path, or None. ``relative``: it must stay inside its folder."""
    if not isinstance(name, str) or not name:
        return "is empty"
    if "\0" in name:
        return "holds a NUL character"
    if "\\" in name:
        return "holds a backslash; separate folders with /"
    if relative and (name.startswith(("/", "~")) or ".." in name.split("/")):
        return "must be a relative path inside its folder (no leading / or ~, no ..)"
    for part in name.split("/"):
        if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            return f"has a component over {MAX_COMPONENT_BYTES} bytes, longer than a filesystem allows"
    return None


def stem(path) -> str:
    """``patching.causalab.json`` → ``patching``: an unswept document's one point is called this."""
    name = Path(path).name
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else Path(path).stem


def point_name(path, name: Optional[str]) -> str:
    """A point's name: its sweep label, or the document's stem for an unswept document's one point."""
    return name if name is not None else stem(path)


def label(value) -> str:
    """A value's spelling in a point name: [x] as x, strings bare, the rest compact JSON."""
    if isinstance(value, list) and len(value) == 1:
        return label(value[0])  # a one-element band/head/latent is named by its element
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))

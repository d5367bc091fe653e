"""Names that become paths: one rule for every one of them, checked before the filesystem sees it.

A save's ``file_path``, a featurizer's ``file_path``, a model key, a dataset's name and
split: each is joined onto a folder, so each is held to what every common filesystem
takes — components of at most 255 bytes, no NUL, no backslash — and, where it must stay
inside its folder, to a relative path without ``..``. Standard library only.
"""
from __future__ import annotations

from typing import Optional

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

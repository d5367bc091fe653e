"""A finished run's files, read back by ``cm.open`` and checked before they are believed.

``run.json`` commits a run folder (``outputs/write.py``), but a folder can be damaged after the
commit: a copy cut short, a file deleted by hand, a disk that filled while something else
rewrote it. Every reader (``table``, ``plot``, ``report``) goes through ``open``, so a damaged
file is refused here, once, as a ``DamagedRun`` naming the file, what is wrong with it and
the fix (run the document again into the folder) — never a ``JSONDecodeError`` traceback
from deep inside a reader, and never a damaged file read as a result.

``run.json`` and ``document.json`` are checked here; a save's file is checked by its format's own
``read`` (``formats.py``: which one a file gets is ``formats.format_of(path)``'s to say, never its
suffix here), through the same JSON reader (``formats.json_file``) and the same fix (``again``).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import DamagedRun
from ..formats import again, json_file

RUN = "run.json"  # write.py's commit record (not imported: that module loads the plan's types)


def record(directory: Path) -> dict:
    """``run.json``: an object listing the run's files (``files``), every one of them present.
    A listed file that is gone is refused here, before anything is read as a result."""
    path = directory / RUN
    value = json_file(path, directory)
    listed = value.get("files") if isinstance(value, dict) else None
    if not isinstance(listed, list) or not all(isinstance(f, str) and f for f in listed):
        raise DamagedRun(str(path), "is not a run's record: a JSON object whose \"files\" lists the run's files",
                         again(directory))
    for rel in listed:
        if not (directory / rel).is_file():
            raise DamagedRun(str(directory / rel), f"{rel} is listed in {RUN}, but the file is missing",
                             again(directory))
    return value


def json_object(path: Path, directory: Path) -> dict:
    """A run's own JSON object (its ``document.json``)."""
    value = json_file(path, directory)
    if not isinstance(value, dict):
        raise DamagedRun(str(path), "is not a JSON object, as a run's document is", again(directory))
    return value

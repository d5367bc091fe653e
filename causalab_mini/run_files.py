"""A finished run's files, read back by ``cm.open`` and checked before they are believed.

``run.json`` commits a run folder (``plan/write.py``), but a folder can be damaged after the
commit: a copy cut short, a file deleted by hand, a disk that filled while something else
rewrote it. Every reader (``table``, ``plot``, ``report``) goes through ``open``, so a damaged
file is refused here, once, as a ``DamagedRun`` naming the file, what is wrong with it and
the fix (run the document again into the folder) — never a ``JSONDecodeError`` traceback
from deep inside a reader, and never a damaged file read as a result.

``metric_rows`` and ``tensors`` are the checks of the save formats (``formats.py``); which one a
save's file gets is its format's to say, ``formats.format_of(path).read``, never its suffix here.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import DamagedRun

RUN = "run.json"  # plan/write.py's commit record (not imported: that module loads the plan's types)


def again(directory: Path) -> str:
    """The one fix for a damaged run: its files are a computation's output, not a source."""
    return f"run the document again into this folder (--out {directory})"


def json_file(path: Path, directory: Path) -> Any:
    """The parsed JSON of one of the run's files, or a refusal saying whether it is missing,
    unreadable or not JSON (a file cut short mid-write or mid-copy is the usual cause)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise DamagedRun(str(path), "the file is missing", again(directory)) from None
    except OSError as err:
        raise DamagedRun(str(path), f"cannot be read ({err.strerror or err})", again(directory)) from None
    except UnicodeDecodeError:
        raise DamagedRun(str(path), "cannot be read as JSON: it is not UTF-8 text", again(directory)) from None
    try:
        return json.loads(text)
    except ValueError as err:
        raise DamagedRun(str(path), f"cannot be read as JSON (truncated?): {err}", again(directory)) from None


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


def metric_rows(path: Path, directory: Path) -> list[dict]:
    """A ``.json`` save: a JSON array of row objects, each with the ``example_id``, ``eligible``
    and ``value`` a ``Result`` reads (a value a number, or null where the row was excluded)."""
    rows = json_file(path, directory)
    if not isinstance(rows, list):
        raise DamagedRun(str(path), f"is not a metric file: a JSON array of row objects, not {_json_kind(rows)}",
                         again(directory))
    for i, row in enumerate(rows):
        problem = _row_problem(row)
        if problem:
            raise DamagedRun(str(path), f"is not a metric file: a JSON array of row objects, and row {i} {problem}",
                             again(directory))
    return rows


def _json_kind(value) -> str:
    """What JSON calls a parsed value's type (an object, not a dict)."""
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "true or false", type(None): "null"}
    return kinds.get(type(value), "a number")


def _row_problem(row) -> str:
    if not isinstance(row, dict):
        return "is not an object"
    missing = [k for k in ("example_id", "eligible", "value") if k not in row]
    if missing:
        return f"has no {', '.join(missing)}"
    if not isinstance(row["eligible"], bool):
        return "has an eligible that is not true or false"
    value = row["value"]
    # bool is an int to Python, and a mean over true/false is not what a metric wrote.
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return "has a value that is neither a number nor null"
    return ""


def tensors(path: Path, directory: Path) -> dict:
    """A ``.safetensors`` save, every tensor in it; a file that does not load is refused."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise DamagedRun(str(path), "the file is missing", again(directory))
    try:
        return dict(load_file(str(path)))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise DamagedRun(str(path), f"does not load as a safetensors file (truncated?): {err}",
                         again(directory)) from None

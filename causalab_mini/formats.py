"""The formats a run saves a value in: one record each, found by the file name's suffix.

A save's ``file_path`` names its format, and this module is the one place that reads it.
The document's rules ask it which format takes a value and what to say when the file name
picks another (``check_fits``), the writer how a value becomes bytes (``write``), ``open``
how a finished run's file is read back and checked (``read``), the cache how a stored blob
becomes a value again (``load``). A new format is one ``SaveFormat`` in ``FORMATS``.

It sits below every stage that asks it, the document's front end included (a save whose file name
takes no such value is refused with no model), so it imports none of them: a format's ``read``
is here beside its ``write``, and ``outputs/run_files.py`` reads ``run.json`` with the same
``json_file`` and refuses a damaged file with the same fix (``again``).

A featurizer's ``file_path`` is not a save and is not looked up here: it names a bundle to
load, and what it may be is decided by the loaders (``plan/featurizer_files.py`` reads a
safetensors header, ``engine/fit.load_bundle`` the tensors), which read safetensors only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from . import jsonindent
from .errors import DamagedRun, DocumentError, PlanError

# What a format's value is in memory: what ``write`` takes and ``read`` and ``load`` give back.
ROWS = "metric rows"  # a list of row objects, one per example (outputs/write.metric_rows makes them)
TENSORS = "named tensors"  # {tensor name: tensor}

# What a save's value is in the document, which decides the formats that take it.
METRIC = "metric"  # a metric a step scores
TENSOR = "tensor"  # an observe step's output, or generated ids
BUNDLE = "bundle"  # a weights step's fitted parameters: one featurizer's tensors


class UnknownFormat(DocumentError):
    """A save's file name ends in no format's suffix; ``path`` is that file name."""


@dataclass(frozen=True)
class SaveFormat:
    suffix: str  # how the file name ends
    holds: str  # ROWS or TENSORS
    noun: str  # what is saved in it, as the refusal of an unknown suffix lists it: "a metric"
    # Each kind of save value (METRIC, TENSOR, BUNDLE) it takes -> the problem said when such a
    # value is saved under another suffix ({value}: the saved name).
    takes: Mapping[str, str]
    write: Callable[..., bytes]  # (value, header) -> the file's bytes, the same for the same value
    load: Callable[[bytes], Any]  # bytes whose digest was checked (a cache blob) -> the value
    read: Callable[[Path, Path], Any]  # (file, the run's folder) -> the value; a DamagedRun if it is not one


# --- a run's files: JSON but for tensors, and refused as damaged where they do not read back ---

def again(directory: Path) -> str:
    """The one fix for a damaged run: its files are a computation's output, not a source."""
    return f"run the document again into this folder (--out {directory})"


def json_bytes(value: Any) -> bytes:
    """The JSON text every file of a run is written as (its saves, run.json, document.json)."""
    # NaN and Infinity are not JSON; a metric that produced one is a bug to see, not a file to write.
    try:
        text = jsonindent.dumps(value)  # json.dumps(indent=1, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise PlanError("results", "a value to be written is NaN or infinite",
                        "check the metric's inputs (a probability of 0 under a log, say)") from None
    return (text + "\n").encode("utf-8")


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


# --- metric rows as JSON ----------------------------------------------------------------------

def _rows_bytes(rows: list, header=()) -> bytes:
    # A header says where a tensor was read; rows carry that in each row, so there is none to write.
    return json_bytes(rows)


def read_metric_rows(path: Path, directory: Path) -> list[dict]:
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


JSON_ROWS = SaveFormat(
    suffix=".json", holds=ROWS, noun="a metric",
    takes={METRIC: "metric {value!r} saves as a JSON table"},
    write=_rows_bytes, load=json.loads, read=read_metric_rows)


# --- named tensors as safetensors -------------------------------------------------------------

def safetensors_bytes(tensors: dict, header=()) -> bytes:
    """A safetensors file's bytes, the same on every run: ``header`` as its ``__metadata__``.

    safetensors serializes its metadata from a hash map, so the same tensors and
    header come out in a different byte order on every run. The header JSON is
    rewritten here with sorted keys (and padded to 8 bytes, as the format wants);
    tensor offsets are relative to the data section, which is untouched.
    """
    from safetensors.torch import save

    raw = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    n = int.from_bytes(raw[:8], "little")
    meta = json.loads(raw[8:8 + n])
    meta.pop("__metadata__", None)
    if header:
        meta["__metadata__"] = {str(k): str(v) for k, v in header}
    text = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + raw[8 + n:]


def _tensors_of(data: bytes) -> dict:
    from safetensors.torch import load

    return dict(load(data))


def read_tensors(path: Path, directory: Path) -> dict:
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
SAFETENSORS = SaveFormat(
    suffix=".safetensors", holds=TENSORS, noun="a tensor",
    takes={TENSOR: "{value!r} is a tensor", BUNDLE: "fitted parameters save as safetensors"},
    write=safetensors_bytes, load=_tensors_of, read=read_tensors)


# --- the registry -----------------------------------------------------------------------------

FORMATS: tuple[SaveFormat, ...] = (JSON_ROWS, SAFETENSORS)


def find(file_path: str) -> Optional[SaveFormat]:
    """The format ``file_path`` is saved in, or None; the longest suffix wins (``.x.json`` over ``.json``)."""
    matches = [f for f in FORMATS if file_path.endswith(f.suffix)]
    return max(matches, key=lambda f: len(f.suffix), default=None)


def format_of(file_path: str) -> SaveFormat:
    """The format ``file_path`` is saved in; a file name no format ends it is refused, naming it."""
    found = find(file_path)
    if found is None:
        # "a metric saves as .json, a tensor as .safetensors": the verb said once, for the first.
        listed = ", ".join(f"{f.noun} {'saves ' if i == 0 else ''}as {f.suffix}" for i, f in enumerate(FORMATS))
        raise UnknownFormat(file_path, listed, _end_in(FORMATS))
    return found


def check_fits(where: str, file_path: str, kind: str, value: str) -> None:
    """Refuse, at the document path ``where``, a save of a ``kind`` value (METRIC, TENSOR, BUNDLE)
    named ``value`` whose file name picks a format that does not take it."""
    taking = [f for f in FORMATS if kind in f.takes]
    if find(file_path) not in taking:
        raise DocumentError(where, taking[0].takes[kind].format(value=value), _end_in(taking))


def _end_in(formats) -> str:
    return "end the file name in " + " or ".join(f.suffix for f in formats)

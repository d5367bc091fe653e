"""Datasets: JSONL files ``<root>/<name>/<split>.jsonl``, named in a document as ``"name/split"``.

Standard library only, so ``validate``, ``explain`` and the pytest plugin's
collection can read data without importing torch or pydantic.

A role's field is a path into a row: ``input``, ``counterfactual_inputs[0]``,
``a.b[1].c``. What a field holds is returned as it is — a string, or a list of
``{"role", "content"}`` messages for a chat — and interpreted by the compiler.

A variable anchor names text on the row (positions.md, "Anchors: which text, on
which row"): the ``<field>_variables`` sibling of the role's field first
(``counterfactual_inputs_variables[0].entity``), then a top-level column of that
name (``entity``). A name that is in neither place on any row is a misspelling,
refused by :func:`check_variable`, naming both places it looked.

Data roots are searched in order: explicit roots (``--data``), then
``CAUSALAB_DATA`` (``os.pathsep``-separated), then the nearest ``data/`` or
``documents/data/`` above the document (or the working directory).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field as _field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from . import jsontext, reading
from .errors import DataError
from .suggest import close_matches, did_you_mean, join, phrase, suggest_fix

__all__ = [
    "Dataset",
    "ENV_VAR",
    "available",
    "check_variable",
    "clear_cache",
    "column_values",
    "data_roots",
    "describe",
    "describe_json",
    "find_data_root",
    "format_field",
    "get_field",
    "load",
    "parse_field",
    "variable_text",
    "variables_field",
]

ENV_VAR = "CAUSALAB_DATA"
SUFFIX = ".jsonl"
_NO_ROOT_FIX = f"pass --data DIR or set {ENV_VAR}=DIR (a directory holding <name>/<split>{SUFFIX})"


# --------------------------------------------------------------------------- the dataset


@dataclass(frozen=True)
class Dataset:
    """One parsed split: its reference, the file it came from, and its rows (plain dicts).

    The rows are shared by every caller of :func:`load` for an unchanged file;
    treat them as read-only.
    """

    ref: str
    path: Path
    rows: tuple = _field(repr=False, hash=False)

    def __repr__(self) -> str:
        return f"Dataset({self.ref!r}, {len(self.rows)} rows, path={str(self.path)!r})"

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def name(self) -> str:
        return self.ref.split("/", 1)[0]

    @property
    def split(self) -> str:
        return self.ref.split("/", 1)[1]

    @cached_property
    def columns(self) -> tuple:
        """The sorted union of every row's top-level keys."""
        keys: set = set()
        for row in self.rows:
            keys.update(row)
        return tuple(sorted(keys))

    def example_ids(self, *, path: str = "") -> tuple:
        """The ``example_id`` column (as strings) when every row has a non-null one, else ``"0"``, ``"1"``, …

        Two rows with the same id are refused: results are keyed by it.
        """
        if self.rows and all(row.get("example_id") is not None for row in self.rows):
            ids = tuple(str(row["example_id"]) for row in self.rows)
        else:
            return tuple(str(i) for i in range(len(self.rows)))
        first: dict = {}
        dupes: dict = {}
        for i, one in enumerate(ids):
            if one in first:
                dupes.setdefault(one, [first[one]]).append(i)
            else:
                first[one] = i
        if dupes:
            shown = "; ".join(f"{one!r} on rows {', '.join(map(str, rows))}"
                              for one, rows in list(dupes.items())[:5])
            more = f" (and {len(dupes) - 5} more)" if len(dupes) > 5 else ""
            raise DataError(
                path,
                f"{self.ref} ({self.path}) has duplicate example_id values: {shown}{more}",
                "give every row its own example_id, or drop the column to number rows 0, 1, …",
            )
        return ids


# --------------------------------------------------------------------------- roots


def _holds_datasets(root: Path) -> bool:
    try:
        for child in root.iterdir():
            if child.name.startswith(".") or not child.is_dir():
                continue
            for f in child.iterdir():
                if f.suffix == SUFFIX and f.is_file():
                    return True
    except OSError:
        return False
    return False


def find_data_root(start: Union[str, Path, None]) -> Optional[Path]:
    """The nearest ``data/`` (or ``documents/data/``) at or above ``start`` that holds a dataset.

    ``start`` is a file (its directory is where the walk begins) or a directory.
    In each directory, ``data`` is tried before ``documents/data``; the first hit
    wins. ``None`` when no ancestor has one.
    """
    if start is None:
        return None
    here = Path(start).expanduser()
    try:
        here = here.resolve()
    except OSError:
        here = here.absolute()
    if not here.is_dir():
        here = here.parent
    for d in (here, *here.parents):
        for candidate in (d / "data", d / "documents" / "data"):
            if candidate.is_dir() and _holds_datasets(candidate):
                return candidate
    return None


def _split_roots(value: Union[str, Path, Iterable, None]) -> list:
    if value is None:
        return []
    if isinstance(value, (str, Path)):
        value = [value]
    out = []
    for item in value:
        if item is None:
            continue
        if isinstance(item, Path):
            out.append(item.expanduser())
            continue
        for part in str(item).split(os.pathsep):
            if part.strip():
                out.append(Path(part.strip()).expanduser())
    return out


def data_roots(explicit: Union[str, Path, Iterable, None] = None,
               document: Union[str, Path, None] = None) -> list:
    """The roots to search, in order, without duplicates.

    1. ``explicit`` (``--data``): a path, a list of paths, or an ``os.pathsep``-joined string;
    2. ``$CAUSALAB_DATA``, ``os.pathsep``-separated;
    3. :func:`find_data_root` from ``document`` — or from the working directory
       when there is no document, so running from the repository root finds
       ``documents/data``.

    Roots that do not exist are kept (``load`` names them as searched).
    """
    roots = _split_roots(explicit) + _split_roots(os.environ.get(ENV_VAR))
    found = find_data_root(document if document is not None else Path.cwd())
    if found is not None:
        roots.append(found)
    out: list = []
    seen: set = set()
    for root in roots:
        try:
            key = root.resolve()
        except OSError:
            key = root.absolute()
        if key not in seen:
            seen.add(key)
            out.append(root)
    return out


def available(roots: Iterable) -> list:
    """Every ``"name/split"`` found under ``roots``, sorted and without duplicates."""
    refs: set = set()
    for root in _split_roots(list(roots)):
        try:
            children = list(root.iterdir())
        except OSError:
            continue
        for child in children:
            if child.name.startswith(".") or not child.is_dir():
                continue
            try:
                files = list(child.iterdir())
            except OSError:
                continue
            for f in files:
                if f.suffix == SUFFIX and f.is_file() and not f.name.startswith("."):
                    refs.add(f"{child.name}/{f.name[: -len(SUFFIX)]}")
    return sorted(refs)


# --------------------------------------------------------------------------- loading

_REF = re.compile(r"^([^/\\\s]+)/([^/\\\s]+)$")
# (resolved path, ref) -> ((mtime_ns, size, inode), Dataset)
_CACHE: dict = {}


def clear_cache() -> None:
    """Forget every parsed file (tests; a long-lived process that wants fresh reads)."""
    _CACHE.clear()


def _check_ref(ref: Any, path: str) -> tuple:
    example = '"weekdays/train"'
    if not isinstance(ref, str):
        raise DataError(path, f"a dataset is named by a string \"name/split\", not {type(ref).__name__} {ref!r}",
                        f"write e.g. {example}")
    m = _REF.match(ref)
    if m is None or m.group(1) in (".", "..") or m.group(2) in (".", ".."):
        hint = f"write e.g. {example}"
        if m is None and ref.count("/") == 0 and ref.strip():
            hint = f'name the split too: "{ref.strip()}/train" (or whichever split you mean)'
        raise DataError(path, f"dataset {ref!r} is not of the form \"name/split\"", hint)
    name, split = m.groups()
    if split.endswith(SUFFIX):
        raise DataError(path, f"dataset {ref!r} names a file, not a split",
                        f'drop the extension: "{name}/{split[: -len(SUFFIX)]}"')
    return name, split


def _roots_text(roots: list) -> str:
    return ", ".join(str(r) + ("" if r.is_dir() else " (missing)") for r in roots)


def load(ref: str, roots: Iterable, *, path: str = "") -> Dataset:
    """Find ``<root>/<name>/<split>.jsonl`` in the first root that has it and parse it.

    Parsed files are cached by (resolved path, mtime, size, inode), so a sweep of
    many points reads each file once and an edited file is read again. ``path``
    is the document path of the field naming the dataset, used in refusals.
    """
    name, split = _check_ref(ref, path)
    roots = _split_roots(list(roots) if not isinstance(roots, (str, Path)) else roots)
    if not roots:
        raise DataError(path, f"no data root to find {ref!r} in: no --data, no ${ENV_VAR}, "
                              "and no data/ or documents/data/ above the document or working directory",
                        _NO_ROOT_FIX)
    for root in roots:
        file = root / name / f"{split}{SUFFIX}"
        # exists, not is_file: a FIFO or a device under the split's name is refused as what it
        # is (in _parse), rather than reported missing.
        if file.exists():
            return _load_file(file, f"{name}/{split}", path)
    here = available(roots)
    splits = [r.split("/", 1)[1] for r in here if r.split("/", 1)[0] == name]
    if splits:
        fix = f"{name} has split(s): {', '.join(splits)}; write e.g. \"{name}/{splits[0]}\""
        meant = close_matches(split, splits)
        suggestion = phrase(f"{name}/{s}" for s in meant)
    elif here:
        fix = "datasets here: " + ", ".join(here)
        # A misspelt name: the dataset it likely means, with this split where that one has it.
        meant = close_matches(name, dict.fromkeys(r.split("/", 1)[0] for r in here))
        suggestion = phrase(f"{m}/{split}" if f"{m}/{split}" in here else m for m in meant)
    else:
        fix, suggestion = f"no datasets under these roots; {_NO_ROOT_FIX}", ""
    raise DataError(path, f"dataset {ref!r} not found: no {name}/{split}{SUFFIX} in {_roots_text(roots)}",
                    join(suggestion, fix))


def _load_file(file: Path, ref: str, path: str) -> Dataset:
    try:
        resolved = file.resolve()
        st = resolved.stat()
    except OSError as exc:
        raise DataError(path, f"cannot read {file}: {exc}", "check the file's permissions") from None
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    key = (resolved, ref)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    ds = Dataset(ref=ref, path=file, rows=_parse(file, path))
    _CACHE[key] = (stamp, ds)
    return ds


# A split is read whole and every row tokenized at compile time; past these it is a corpus to
# sample from, not one experiment's rows. Each is checked before the rows it counts are parsed.
MAX_ROWS = 200_000
MAX_BYTES = 512 * 2**20
# One row is one example: a prompt, its counterfactuals, its answers. Tokenizing a row takes
# some 80 times its size in Python objects (a token id and its offsets per byte, at worst),
# so a megabyte line is a document pasted into a row, refused before it is parsed or tokenized.
MAX_LINE_BYTES = 2**20


def _parse(file: Path, path: str) -> tuple:
    try:
        # A regular file only, read to at most MAX_BYTES + 1 (reading.py: /dev/zero, a FIFO).
        raw = reading.read_bytes(file, MAX_BYTES)
        text = raw.decode("utf-8-sig")
    except reading.TooLarge as exc:
        size = f"more than {MAX_BYTES >> 20}" if exc.at_least else f"{exc.size / 2**20:.0f}"
        raise DataError(path, f"{file} is {size} MiB, over the {MAX_BYTES >> 20} MiB a split "
                        "may hold", "sample the rows an experiment needs into a split of their own") from None
    except reading.NotRegular as exc:
        raise DataError(path, f"{file} {exc}", "name a split saved as a .jsonl file") from None
    except UnicodeDecodeError as exc:
        raise DataError(path, f"{file} is not UTF-8 ({exc.reason} at byte {exc.start})",
                        "save the file as UTF-8 JSON Lines") from None
    except OSError as exc:
        raise DataError(path, f"cannot read {file}: {exc}", "check the file's permissions") from None
    # Newlines as text mode reads them (how splits were always read): "\r\n" and a lone "\r"
    # become "\n". A JSON string holds neither raw, so no value changes, only where lines end.
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    rows = []
    # Lines end at "\n" alone: str.splitlines would also cut at U+2028, U+0085 and the like,
    # which a JSON string may hold as they are.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if len(rows) == MAX_ROWS:
            raise DataError(path, f"{file} has more than {MAX_ROWS:,} rows, the most a split may hold",
                            "sample the rows an experiment needs into a split of their own")
        if len(line) > MAX_LINE_BYTES // 4 and (nbytes := len(line.encode("utf-8"))) > MAX_LINE_BYTES:
            raise DataError(path, f"{file}:{lineno}: row {len(rows)} is {nbytes:,} bytes, over the "
                            f"{MAX_LINE_BYTES >> 20} MiB a row may hold",
                            "keep a row to one example: its prompts and answers, not a corpus of text")
        try:
            row = jsontext.loads(line)
        except jsontext.Problem as exc:
            if exc.syntax is not None:
                raise DataError(path, f"{file}:{lineno}: not valid JSON ({exc.syntax.msg} at column "
                                f"{exc.syntax.colno})", "write one JSON object per line (JSON Lines)") from None
            at = f" (at {exc.where})" if exc.where else ""
            raise DataError(path, f"{file}:{lineno}: {exc.problem}{at}", exc.fix) from None
        if not isinstance(row, dict):
            raise DataError(path, f"{file}:{lineno}: row {len(rows)} is a JSON {_json_type(row)}, not an object",
                            'write one JSON object per line, e.g. {"input": "...", "label": "..."}')
        rows.append(row)
    if not rows:
        raise DataError(path, f"{file} is empty: a dataset needs at least one row",
                        "write one JSON object per line, or name another dataset")
    return tuple(rows)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


# --------------------------------------------------------------------------- field paths

_SEGMENT = re.compile(r"([^.\[\]\s]+)((?:\[\d+\])*)")
_INDEX = re.compile(r"\[(\d+)\]")
_FIELD_CACHE: dict = {}
_FIELD_FIX = 'write a column name, then [k] for list items and .key for nested keys: "input", "counterfactual_inputs[0]", "a.b[1].c"'


def parse_field(field: str, *, path: str = "") -> tuple:
    """``"counterfactual_inputs[0]"`` → ``("counterfactual_inputs", 0)``; ``"a.b[1].c"`` → ``("a", "b", 1, "c")``.

    A name is any run of characters but ``.``, ``[``, ``]`` and whitespace; an
    index is a non-negative integer. Anything else is refused.
    """
    if isinstance(field, str):
        hit = _FIELD_CACHE.get(field)
        if hit is not None:
            return hit
    else:
        raise DataError(path, f"a field is a string path into a row, not {type(field).__name__} {field!r}",
                        _FIELD_FIX)
    if not field:
        raise DataError(path, "the field is empty", _FIELD_FIX)
    parts: list = []
    for segment in field.split("."):
        m = _SEGMENT.fullmatch(segment)
        if m is None:
            problem = f"field {field!r} is malformed"
            if not segment:
                problem += " (an empty name between dots, or a leading/trailing dot)"
            elif segment.startswith("["):
                problem += f" ({segment!r} has an index with no name before it)"
            elif re.search(r"\[-\d+\]", segment):
                problem += " (indices count from 0; negative indices are not supported)"
            else:
                problem += f" (at {segment!r})"
            raise DataError(path, problem, _FIELD_FIX)
        parts.append(m.group(1))
        parts.extend(int(i) for i in _INDEX.findall(m.group(2)))
    out = tuple(parts)
    _FIELD_CACHE[field] = out
    return out


def format_field(parts: Iterable) -> str:
    """The inverse of :func:`parse_field`: ``("a", "b", 1, "c")`` → ``"a.b[1].c"``."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _row_name(row_index: Optional[int]) -> str:
    return f"row {row_index}" if row_index is not None else "the row"


def get_field(row: dict, field: str, *, path: str = "", row_index: Optional[int] = None) -> Any:
    """What ``row`` holds at ``field``, as it is (a string, a list of chat messages, anything).

    A missing key, an index out of range, or a step into something that is not
    an object/list is refused, naming the field, the row and what is there.
    """
    parts = parse_field(field, path=path)
    value: Any = row
    for depth, part in enumerate(parts):
        where = format_field(parts[:depth]) if depth else ""
        if isinstance(part, int):
            if not isinstance(value, list):
                raise DataError(path, f"{_row_name(row_index)}: {where} is a {_json_type(value)}, "
                                      f"not a list, so field {field!r} cannot index it with [{part}]",
                                f"write {where!r} without the index")
            if part >= len(value):
                raise DataError(path, f"{_row_name(row_index)}: {where} has {len(value)} item(s), "
                                      f"so field {field!r} has no [{part}]",
                                f"use an index from 0 to {len(value) - 1}" if value else
                                f"{where} is empty on this row")
            value = value[part]
        else:
            if not isinstance(value, dict):
                raise DataError(path, f"{_row_name(row_index)}: {where} is a {_json_type(value)}, "
                                      f"not an object, so field {field!r} has no key {part!r}",
                                f"write {where!r}, or index it with [k] if it is a list")
            if part not in value:
                keys = ", ".join(sorted(map(str, value))) or "none"
                if depth == 0:
                    problem = f"{_row_name(row_index)} has no column {part!r} (field {field!r}); columns: {keys}"
                else:
                    problem = f"{_row_name(row_index)}: {where} has no key {part!r} (field {field!r}); keys: {keys}"
                raise DataError(path, problem, did_you_mean(part, value) or "name one of those")
            value = value[part]
    return value


def variables_field(field: str, *, path: str = "") -> str:
    """The ``<field>_variables`` sibling: ``input`` → ``input_variables``,
    ``counterfactual_inputs[0]`` → ``counterfactual_inputs_variables[0]``,
    ``a.b[1]`` → ``a.b_variables[1]`` (the last name gets the suffix; its indices stay)."""
    parts = list(parse_field(field, path=path))
    last = max(i for i, p in enumerate(parts) if isinstance(p, str))
    parts[last] = parts[last] + "_variables"
    return format_field(parts)


_MISSING = object()


def _lenient(value: Any, parts: tuple) -> Any:
    for part in parts:
        if isinstance(part, int):
            if not isinstance(value, list) or part >= len(value):
                return _MISSING
        elif not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _lookup_variable(row: dict, field: str, variable: str) -> tuple:
    """``(where, value)``: ``where`` is "sibling", "column" or "" when the row has neither."""
    sibling = _lenient(row, parse_field(variables_field(field)))
    if isinstance(sibling, dict) and variable in sibling:
        return "sibling", sibling[variable]
    if variable in row:
        return "column", row[variable]
    return "", None


def _as_text(value: Any) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    kind = _json_type(value)
    raise TypeError(("an " if kind[0] in "ao" else "a ") + kind)


def variable_text(row: dict, field: str, variable: str, *, path: str = "",
                  row_index: Optional[int] = None) -> Optional[str]:
    """The text a variable anchor binds to on this row (positions.md, "Anchors").

    The ``<field>_variables`` sibling first (``counterfactual_inputs_variables[0].entity``),
    then a top-level column (``entity``). ``None`` when the value is null, or when
    this row has the name in neither place — a name missing on *every* row is a
    misspelling, which :func:`check_variable` refuses. Numbers come back as their
    text; a list, object or boolean is refused.
    """
    where, value = _lookup_variable(row, field, variable)
    try:
        return _as_text(value)
    except TypeError as exc:
        place = f"{variables_field(field)}.{variable}" if where == "sibling" else f"column {variable!r}"
        raise DataError(path, f"{_row_name(row_index)}: variable {variable!r} ({place}) is {exc}, "
                              "not text an anchor can search the prompt for",
                        "give the variable a string value (the text as it appears in the prompt)") from None


def check_variable(ds: Dataset, field: str, variable: str, *, path: str = "") -> None:
    """Refuse a variable that is in neither place on any row of ``ds`` (a misspelling),
    or whose value on some row is not text."""
    sib = variables_field(field, path=path)
    sib_parts = parse_field(sib)
    found = False
    sibling_keys: set = set()
    for i, row in enumerate(ds.rows):
        sibling = _lenient(row, sib_parts)
        if isinstance(sibling, dict):
            sibling_keys.update(map(str, sibling))
        where, value = _lookup_variable(row, field, variable)
        if where:
            found = True
            variable_text(row, field, variable, path=path, row_index=i)
    if found:
        return
    in_sibling = (f"in {sib} (keys there: {', '.join(sorted(sibling_keys))})" if sibling_keys
                  else f"in {sib} (no row has one)")
    problem = (f"variable {variable!r} is neither {in_sibling} nor a column of {ds.ref} "
               f"(columns: {', '.join(ds.columns)})")
    fix = suggest_fix(variable, [*sorted(sibling_keys), *ds.columns],
                      f"a variable anchor names a key of {sib} or a top-level column")
    raise DataError(path, problem, fix)


def column_values(ds: Dataset, column: str, *, path: str = "") -> tuple:
    """Each row's answer text in a top-level column; ``None`` where the row's value is null or
    absent (a null answer is an excluded measurement). A column no row has is refused, and so
    is a value that is not text or a number: a list or an object has no one spelling to score
    (``str`` would make ``"[' Friday']"`` of it)."""
    if column not in ds.columns:
        raise DataError(path, f"{ds.ref} has no column {column!r} (columns: {', '.join(ds.columns)})",
                        suggest_fix(column, ds.columns, "name one of the columns"))
    values = []
    for i, row in enumerate(ds.rows):
        try:
            values.append(_as_text(row.get(column)))
        except TypeError as exc:
            raise DataError(path, f"{ds.ref} {_row_name(i)}: column {column!r} holds {exc}, not an "
                                  "answer's text", "give each row's answer as a string (or null to "
                                  "leave the row out)") from None
    return tuple(values)


# --------------------------------------------------------------------------- describe


def _splits(ds: Dataset) -> list:
    if "split" not in ds.columns:
        return []
    values = {str(row["split"]) for row in ds.rows if row.get("split") is not None}
    return sorted(values)


def describe(ds: Dataset) -> str:
    """The text of ``causalab-mini data NAME/SPLIT``."""
    n = len(ds.rows)
    splits = _splits(ds)
    return "\n".join([
        f"{ds.ref}: {n} row{'' if n == 1 else 's'}",
        f"  columns: {', '.join(ds.columns)}",
        f"  splits:  {', '.join(splits) if splits else '-'}",
        f"  sample:  {json.dumps(ds.rows[0], sort_keys=True, ensure_ascii=False) if ds.rows else '-'}",
    ])


def describe_json(ds: Dataset) -> dict:
    """``describe`` as data, for ``--json``."""
    return {
        "ref": ds.ref,
        "rows": len(ds.rows),
        "columns": list(ds.columns),
        "splits": _splits(ds),
        "sample": ds.rows[0] if ds.rows else None,
    }

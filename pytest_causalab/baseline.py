"""Stored baselines: the numbers a point produced last time it was accepted.

One file per document, in a folder beside it (``documents/v2/baselines/patching.json``
for ``documents/v2/patching.causalab.json``; the folder's name is the
``causalab_baselines`` ini option)::

    {
     "format": "causalab-baseline/1",
     "document": "patching.causalab.json",
     "points": {
      "patching": {
       "produced_by": "<sha256 of the point's experiment>",
       "engine": "nnterp",
       "results": {"iia": {"rows": {"0": 1.0, "1": null}}}
      }
     }
    }

The metrics a document saves as ``.json`` are stored one value per row by
example id, in row order (``null`` for an ineligible row). The tensors it saves
(``.safetensors``: generated ids, a published basis, a fitted bundle) are stored
under ``"tensors"`` by file and tensor name, with shape and dtype, value by value
up to ``TENSOR_VALUES`` elements and as sums beyond; integers must match exactly. Writers take the
folder's lock file (``.causalab-lock``), read the file again, change their own
point and ``os.replace`` a temporary file into place, so xdist workers writing
different points of one document lose nothing and a reader never sees half a file.
"""
from __future__ import annotations

import json
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from causalab_mini import BaselineError, write_atomic

from .checks import Check, close, compare_rows, number

from causalab_mini import Point, stem

FORMAT = "causalab-baseline/1"
LOCK = ".causalab-lock"  # one per baselines folder, hidden and ignored by git (.gitignore)


def path_for(document: Path, folder: str = "baselines") -> Path:
    document = Path(document)
    return document.parent / folder / f"{stem(document)}.json"


REPAIR = "rerun with --causalab-update-baselines=all to write it anew, and commit it"


def load(path: Path, *, repair: bool = False) -> dict:
    """The baseline file at ``path`` ({} when there is none). A file that is not one — corrupt,
    of another format version, or valid JSON of the wrong shape — is refused naming the file,
    or, with ``repair`` (an update flag is rewriting it), read as empty so it is written anew."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        return _unreadable(path, f"not a readable baseline ({type(err).__name__}: {err})", repair)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        return _unreadable(path, f"format {found!r}, expected {FORMAT!r}", repair)
    problem = _malformed(data.get("points"))
    if problem:
        return _unreadable(path, f"{problem}, not what a baseline holds ({SHAPE})", repair)
    return data


SHAPE = ('"points": {point: {"produced_by", "results": {name: {"rows": {example_id: number or null}}}, '
         '"tensors": {file: {name: {"shape", "dtype", "values" or "sums"}}}}}')
SUMS = ("sum", "abs_sum", "square_sum")


def _malformed(points) -> str:
    """The first thing in a baseline's ``"points"`` that ``check`` and ``compare_tensor`` could not
    read (as ``points.<name>...: what is there``), or "" when it is all their shape."""
    if not isinstance(points, dict):
        return f"\"points\" is {_kind(points)}"
    for name, e in points.items():
        at = f"points.{name}"
        if not isinstance(e, dict):
            return f"{at} is {_kind(e)}"
        results, tensors = e.get("results"), e.get("tensors", {})  # every entry has results; tensors if saved
        if not isinstance(results, dict):
            return f"{at}.results is {_kind(results)}"
        for result, r in results.items():
            rows = r.get("rows") if isinstance(r, dict) else None
            if not isinstance(rows, dict):
                return f"{at}.results.{result}.rows is {_kind(rows)}"
            for example_id, value in rows.items():
                if value is not None and not _number(value):
                    return f"{at}.results.{result}.rows.{example_id} is {_kind(value)}"
        if not isinstance(tensors, dict):
            return f"{at}.tensors is {_kind(tensors)}"
        for file, named in tensors.items():
            if not isinstance(named, dict):
                return f"{at}.tensors.{file} is {_kind(named)}"
            for tensor, entry in named.items():
                problem = _tensor_malformed(entry)
                if problem:
                    return f"{at}.tensors.{file}.{tensor}{problem}"
    return ""


def _tensor_malformed(entry) -> str:
    """What ``compare_tensor`` could not read in a stored entry (``tensor_entry``'s shape), or ""."""
    if not isinstance(entry, dict):
        return f" is {_kind(entry)}"
    shape, dtype = entry.get("shape"), entry.get("dtype")
    if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        return f".shape is {_kind(shape)}, not a list of sizes"
    if not isinstance(dtype, str):
        return f".dtype is {_kind(dtype)}"
    if "values" in entry:
        values = entry["values"]
        if not (isinstance(values, list) and all(_number(v) for v in values)):
            return f".values is {_kind(values)}, not a list of numbers"
        if len(values) != math.prod(shape):  # a shorter list would compare only its prefix
            return f".values holds {len(values)} numbers for shape {shape}"
    elif "sums" in entry:
        sums = entry["sums"]
        if not (isinstance(sums, dict) and all(_number(sums.get(k)) for k in SUMS)):
            return f".sums is {_kind(sums)}, not {{{', '.join(map(repr, SUMS))}}} numbers"
    else:
        return " has neither \"values\" nor \"sums\""
    return ""


def _number(value) -> bool:
    """A JSON number (a boolean: a bool tensor's element) a float can hold: 1e400 as an integer cannot."""
    if isinstance(value, float):
        return True
    return isinstance(value, int) and abs(value) <= _FLOAT_MAX


_FLOAT_MAX = int(sys.float_info.max)


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        text = repr(value)
        return f"the number {text if len(text) <= 24 else text[:12] + '…'}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("…" if len(value) > 40 else "")
    return "an array" if isinstance(value, list) else "an object"


def _unreadable(path: Path, problem: str, repair: bool) -> dict:
    if repair:
        return {}
    raise BaselineError(str(path), problem, REPAIR)


TENSOR_VALUES = 4096  # a saved tensor up to this many elements is stored value by value


def tensor_entry(tensor) -> dict:
    t = tensor.detach().cpu()
    out = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
    if t.numel() <= TENSOR_VALUES:
        out["values"] = t.flatten().tolist()
    else:  # too many to keep: what a drift would move
        d = t.double()
        out["sums"] = {"sum": float(d.sum()), "abs_sum": float(d.abs().sum()), "square_sum": float((d * d).sum())}
    return out


def entry(point: Point) -> dict:
    out = {"produced_by": point.produced_by, "engine": point.engine,
           "results": {name: {"rows": dict(r.pairs())} for name, r in sorted(point.saved().items())}}
    tensors = point.saved_tensors()
    if tensors:
        out["tensors"] = {f: {n: tensor_entry(t) for n, t in sorted(ts.items())} for f, ts in tensors.items()}
    return out


def compare_tensor(point: str, label: str, stored: dict, tensor, rtol: float, atol: float,
                   reference: str = "baseline") -> list:
    """A saved tensor against a stored entry (``tensor_entry``): shape and dtype exactly,
    integers exactly, floats within tolerance. ``reference`` names the other side."""
    got = tensor_entry(tensor)
    if (got["shape"], got["dtype"]) != (stored["shape"], stored["dtype"]):
        return [Check(point, label, "shape", f"{reference} {stored['shape']} {stored['dtype']}",
                             f"{got['shape']} {got['dtype']}", None, False, "the saved tensor changed shape")]
    exact = not (tensor.is_floating_point() or tensor.is_complex())
    pairs = (list(zip(stored["values"], got["values"])) if "values" in stored and "values" in got
             else [(stored["sums"][k], got["sums"][k]) for k in ("sum", "abs_sum", "square_sum")]
             if "sums" in stored and "sums" in got else None)
    if pairs is None:
        return [Check(point, label, "values", "baseline stored otherwise", "—", None, False,
                             "rerun with --causalab-update-baselines=failing")]
    off = [i for i, (a, b) in enumerate(pairs) if (a != b if exact else not close(a, b, rtol, atol))]
    if not off:
        return []
    i = max(off, key=lambda j: abs(pairs[j][1] - pairs[j][0]))
    where = f"element {i}" if "values" in got else ("sum", "abs_sum", "square_sum")[i]
    ref, now = pairs[i]
    return [Check(point, label, where, f"{reference} {number(ref)}", now, now - ref, False,
                         f"{len(off)} of {len(pairs)} differ" + ("" if exact else
                         f" beyond rtol {number(rtol)}, atol {number(atol)}"))]


@contextmanager
def _locked(path: Path):
    lock = path.with_name(LOCK)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+b") as fh:
        try:
            import fcntl
        except ImportError:  # Windows: msvcrt's byte-range lock on the lock file
            import msvcrt
            fh.seek(0)
            while True:
                try:
                    msvcrt.locking(fh.fileno(), msvcrt.LK_LOCK, 1)
                    break
                except OSError:
                    time.sleep(0.05)
            try:
                yield
            finally:
                fh.seek(0)
                msvcrt.locking(fh.fileno(), msvcrt.LK_UNLCK, 1)
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def store(path: Path, document: Path, point: Point) -> None:
    """Set this point's entry in the document's baseline file: locked, re-read, replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        data = load(path, repair=True) or {"format": FORMAT, "document": Path(document).name, "points": {}}
        data["points"][point.name] = entry(point)
        data["points"] = dict(sorted(data["points"].items()))
        text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
        write_atomic(path, text.encode("utf-8"))


@dataclass
class Verdict:
    checks: list = field(default_factory=list)  # failing Check rows
    notes: list = field(default_factory=list)  # what was written, for a warning


def check(point: Point, *, folder: str, update: Optional[str], strict: bool,
          tolerance) -> Verdict:
    """Compare ``point`` with its stored baseline; write it where the rules say so.

    ``tolerance(result) -> (rtol, atol)``. ``update``: None, "failing" (rewrite what fails)
    or "all" (rewrite every point that ran). A missing baseline fails when ``strict``
    (CI), else is written with a note; a changed ``produced_by`` fails until updated.
    """
    path = path_for(point.document, folder)
    verdict = Verdict()
    shown = _rel(path)
    if update == "all":
        store(path, point.document, point)
        verdict.notes.append(f"baseline written: {shown} [{point.name}]")
        return verdict
    # Under an update flag a baseline that is not one is written anew rather than refused.
    stored = load(path, repair=update is not None).get("points", {}).get(point.name)
    saved = point.saved()
    tensors = point.saved_tensors()
    missing = stored is None or any(name not in stored.get("results", {}) for name in saved) or any(
        name not in stored.get("tensors", {}).get(f, {}) for f, ts in tensors.items() for name in ts)
    if stored is not None and stored.get("produced_by") != point.produced_by:
        if update == "failing":
            store(path, point.document, point)
            verdict.notes.append(f"baseline updated (the experiment changed): {shown} [{point.name}]")
            return verdict
        verdict.checks.append(Check(
            point.name, "experiment", "produced_by", f"baseline {str(stored.get('produced_by'))[:12]}",
            point.produced_by[:12], None, False,
            "the experiment changed since the baseline was recorded; if that is intended, rerun with "
            "--causalab-update-baselines=failing and commit the baseline"))
        return verdict
    if missing:
        if strict and update is None:
            verdict.checks.append(Check(
                point.name, ", ".join([n for n in saved if stored is None or n not in stored["results"]]
                                      + [f for f in tensors if stored is None or f not in stored.get("tensors", {})])
                or "*",
                "baseline", "stored baseline", "none", None, False,
                f"no baseline in {shown}; record it with --causalab-update-baselines=all and commit it "
                "(missing baselines fail under CI or --causalab-strict)"))
            return verdict
        store(path, point.document, point)
        verdict.notes.append(f"baseline was missing and is now written: {shown} [{point.name}]")
        return verdict
    for name, result in saved.items():
        reference = list(stored["results"][name]["rows"].items())
        rtol, atol = tolerance(name)
        verdict.checks += compare_rows(point.name, name, "baseline", reference, result.pairs(),
                                              rtol, atol)
    for file, named in tensors.items():
        rtol, atol = tolerance(file)
        for name, tensor in named.items():
            verdict.checks += compare_tensor(point.name, f"{file}:{name}", stored["tensors"][file][name],
                                              tensor, rtol, atol)
    if verdict.checks and update == "failing":
        store(path, point.document, point)
        verdict.notes.append(f"baseline updated ({len(verdict.checks)} rows had drifted): {shown} [{point.name}]")
        verdict.checks = []
    return verdict


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)

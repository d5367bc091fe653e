"""Stored baselines: the numbers a point produced last time it was accepted.

One file per document, in a folder beside it (``documents/v2/baselines/patching.json``
for ``documents/v2/patching.causalab.json``; the folder's name is the
``causalab_baselines`` ini option)::

    {
     "format": "causalab-baseline/2",
     "document": "patching.causalab.json",
     "points": {
      "patching": {
       "produced_by": "<sha256 of the point's experiment>",
       "engine": "nnterp",
       "results": {"iia": {"rows": {"0": 1.0, "1": null}}},
       "experiment": {<the point's document without its header, defaults written out>}
      }
     }
    }

The metrics a document saves as ``.json`` are stored one value per row by
example id, in row order (``null`` for an ineligible row) — or, in ``aggregates``
mode (the ``causalab_baseline_mode`` ini option, or a document matching a
``causalab_baseline_aggregates`` glob), as ``{"mean", "std", "n", "n_rows"}`` per
result: the mean is held within tolerance, ``n`` (eligible rows) and ``n_rows``
exactly. The tensors it saves (``.safetensors``: generated ids, a published basis,
a fitted bundle) are stored under ``"tensors"`` by file and tensor name, with shape
and dtype, value by value up to ``TENSOR_VALUES`` elements and as sums beyond;
integers must match exactly. ``"experiment"`` is what ``produced_by`` digests
(``Spec.canonical()``), so a changed experiment names the fields that changed;
a ``causalab-baseline/1`` file (no ``"experiment"``) is still read, and says only
that the digest changed. Entries of points no longer in the document are
*stale*: reported, and removed by an update flag.

Writers take the folder's lock file (``.causalab-lock``), read the file again, change
their own point and ``os.replace`` a temporary file into place (with the permissions
the user's umask gives), so xdist workers writing different points of one document
lose nothing and a reader never sees half a file.
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

from causalab_mini import BaselineError
from causalab_mini.files import write_atomic

from .baseline_drift import aggregates_drift, experiment_lines, rows_drift
from .checks import Check, close, number

from causalab_mini import Point
from causalab_mini.names import stem

FORMAT = "causalab-baseline/2"  # written; /1 (no "experiment", rows only) is read too
FORMATS = ("causalab-baseline/1", FORMAT)
MODES = ("rows", "aggregates")
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
    if not isinstance(data, dict) or data.get("format") not in FORMATS:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        return _unreadable(path, f"format {found!r}, expected {FORMAT!r} (or {FORMATS[0]!r})", repair)
    problem = _malformed(data.get("points"))
    if problem:
        return _unreadable(path, f"{problem}, not what a baseline holds ({SHAPE})", repair)
    return data


_PARSED: dict = {}  # path -> ((mtime_ns, size, inode), data): each version of a file parsed once


def _read(path: Path, *, repair: bool) -> dict:
    """``load`` for a caller that only reads the baseline (``check``): a document's file — every
    point's entry in one — parsed once per version of it, not once per point (which made a sweep's
    checks quadratic in its points). Any write replaces the file (a new inode), so a changed file
    is read again. The dict is shared: ``store`` and ``prune`` load their own copy to change.
    Forgotten at each session's start (``forget``): a file edited in place between two sessions of
    one process within its timestamp's resolution would keep its size, inode and mtime."""
    try:
        st = path.stat()
    except OSError:
        return load(path, repair=repair)
    key = (st.st_mtime_ns, st.st_size, st.st_ino)
    cached = _PARSED.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    data = load(path, repair=repair)
    _PARSED[path] = (key, data)
    return data


def forget() -> None:
    """Drop every parsed baseline (a session starts reading them afresh)."""
    _PARSED.clear()


SHAPE = ('"points": {point: {"produced_by", "results": {name: {"rows": {example_id: number or null}} '
         'or {"mean", "std", "n", "n_rows"}}, "tensors": {file: {name: {"shape", "dtype", "values" or "sums"}}}, '
         '"experiment": {...}}}')
AGGREGATES = ("mean", "std", "n", "n_rows")
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
        if not isinstance(e.get("experiment", {}), dict):
            return f"{at}.experiment is {_kind(e.get('experiment'))}"
        for result, r in results.items():
            if isinstance(r, dict) and "rows" not in r and "mean" in r:  # aggregates mode
                problem = _aggregates_malformed(r)
                if problem:
                    return f"{at}.results.{result}{problem}"
                continue
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


def _aggregates_malformed(r: dict) -> str:
    """What ``check`` could not read in a stored result's aggregates (``aggregates``' shape), or ""."""
    for key in ("mean", "std"):
        if r.get(key) is not None and not _number(r.get(key)):
            return f".{key} is {_kind(r.get(key))}"
    for key in ("n", "n_rows"):
        if not (type(r.get(key)) is int and r[key] >= 0):
            return f".{key} is {_kind(r.get(key))}, not a count"
    if r["n"] > r["n_rows"]:
        return f".n is {r['n']}, more than n_rows {r['n_rows']}"
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


def aggregates(result) -> dict:
    """A result as aggregates mode stores it: mean and sample std of the eligible rows (null when
    undefined), ``n`` eligible rows of ``n_rows``."""
    mean, std = result.mean(), result.std()
    return {"mean": None if math.isnan(mean) else mean, "std": None if math.isnan(std) else std,
            "n": len(result.values), "n_rows": len(result.rows)}


def entry(point: Point, *, mode: str = "rows", experiment: Optional[dict] = None,
          extensions: Optional[dict] = None) -> dict:
    out = {"produced_by": point.produced_by, "engine": point.engine}
    if extensions:
        out["extensions"] = dict(sorted(extensions.items()))  # distribution -> version that scored it
    if point.weights is not None:
        out["weights"] = point.weights
    if getattr(point, "config_digest", None) is not None:
        out["config"] = point.config_digest
    out |= {"results": {name: ({"rows": dict(r.pairs())} if mode == "rows" else aggregates(r))
                       for name, r in sorted(point.saved().items())}}
    tensors = point.saved_tensors()
    if tensors:
        out["tensors"] = {f: {n: tensor_entry(t) for n, t in sorted(ts.items())} for f, ts in tensors.items()}
    if experiment is not None:
        out["experiment"] = experiment
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


def _write(path: Path, data: dict) -> None:
    data["format"] = FORMAT  # a /1 file is upgraded whole: its other entries are valid /2 entries
    data["points"] = dict(sorted(data["points"].items()))
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    write_atomic(path, text.encode("utf-8"))  # the user's umask, as any file they write


def store(path: Path, document: Path, point: Point, *, mode: str = "rows", experiment: Optional[dict] = None,
          keep=None, extensions: Optional[dict] = None) -> list:
    """Set this point's entry in the document's baseline file: locked, re-read, replaced atomically.
    With ``keep`` (the document's point names) the entries of other points are removed: returned."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        data = load(path, repair=True) or {"format": FORMAT, "document": Path(document).name, "points": {}}
        removed = _drop_stale(data, keep, point.name)
        data["points"][point.name] = entry(point, mode=mode, experiment=experiment, extensions=extensions)
        _write(path, data)
    return removed


def prune(path: Path, keep) -> list:
    """Remove the entries of points not in ``keep`` (locked, re-read, replaced); the names removed."""
    if not path.exists():
        return []
    with _locked(path):
        data = load(path, repair=True)
        removed = _drop_stale(data, keep) if data else []
        if removed:
            _write(path, data)
    return removed


def _drop_stale(data: dict, keep, *also) -> list:
    if keep is None:
        return []
    keep = set(keep) | set(also)
    removed = sorted(n for n in data["points"] if n not in keep)
    for name in removed:
        del data["points"][name]
    return removed


# What became of one point's baseline, as the session report counts it.
WRITTEN, UPDATED, DRIFTED, CHANGED, MISSING, UNCHANGED = (
    "written", "updated", "drifted", "changed", "missing", "unchanged")


@dataclass
class Verdict:
    checks: list = field(default_factory=list)  # failing Check rows
    notes: list = field(default_factory=list)  # what was written, for a warning
    lines: list = field(default_factory=list)  # what a failure leads with: drift per result, changed fields
    status: str = UNCHANGED  # written | updated | drifted | changed (the experiment) | missing | unchanged
    stale: list = field(default_factory=list)  # entries of points no longer in the document, kept
    removed: list = field(default_factory=list)  # such entries this check removed (an update flag)


def check(point: Point, *, folder: str, update: Optional[str], strict: bool,
          tolerance, mode: str = "rows", experiment: Optional[dict] = None, points=None,
          extensions: Optional[dict] = None) -> Verdict:
    """Compare ``point`` with its stored baseline; write it where the rules say so.

    ``tolerance(result) -> (rtol, atol)``. ``update``: None, "failing" (rewrite what fails)
    or "all" (rewrite every point that ran). A missing baseline fails when ``strict``
    (CI), else is written with a note; a changed ``produced_by`` fails until updated.
    ``mode``: how results are stored and compared (rows, or aggregates). ``experiment``: the
    point's canonical experiment, stored to say which fields changed. ``points``: the document's
    point names; entries of others are stale — reported, and removed under ``update``.
    ``extensions``: {distribution: version} of the extensions whose kinds the point used; a
    baseline made with other versions says so (a note: the values decide whether it fails).
    """
    path = path_for(point.document, folder)
    verdict = Verdict()
    shown = _rel(path)
    # Under an update flag a baseline that is not one is written anew rather than refused.
    data = _read(path, repair=update is not None)
    entries = data.get("points", {})
    named = set(points) if points is not None else None
    stale = sorted(n for n in entries if n not in named) if named is not None else []
    stored = entries.get(point.name)
    made_with = (stored or {}).get("extensions") or {}
    if stored is not None and made_with != (extensions or {}):
        then = ", ".join(f"{k} {v}" for k, v in sorted(made_with.items())) or "no extension"
        now = ", ".join(f"{k} {v}" for k, v in sorted((extensions or {}).items())) or "no extension"
        verdict.notes.append(f"baseline {shown} [{point.name}] was made with {then}; this run used {now}")
    status, absent, verdict.lines, checks = _compare(point, stored, mode, tolerance, experiment,
                                                     data.get("format", FORMAT))
    write = (update == "all" or (update == "failing" and status != UNCHANGED)
             or (update is None and status == MISSING and not strict))
    keep = points if update is not None else None
    if write:
        verdict.removed = store(path, point.document, point, mode=mode, experiment=experiment, keep=keep,
                                extensions=extensions)
        verdict.status = {MISSING: WRITTEN, CHANGED: UPDATED, DRIFTED: UPDATED}.get(status, status)
        detail = "".join(f"\n  {line.strip()}" for line in verdict.lines)
        verdict.lines = []
        if update == "all":
            verdict.notes.append(f"baseline written: {shown} [{point.name}]{detail}")
        elif status == MISSING and stored is not None:
            verdict.notes.append(f"baseline lacked {', '.join(absent)} and is now written: {shown} [{point.name}]")
        elif status == MISSING:
            verdict.notes.append(f"baseline was missing and is now written: {shown} [{point.name}]")
        elif status == CHANGED:
            verdict.notes.append(f"baseline updated (the experiment changed): {shown} [{point.name}]{detail}")
        else:
            word = "row" if all(c.aggregate.startswith("row ") for c in checks) else "value"
            rows = f"{len(checks)} {word}{'s' if len(checks) != 1 else ''}"
            verdict.notes.append(f"baseline updated ({rows} had drifted): {shown} [{point.name}]{detail}")
    else:
        verdict.status = status
        if keep is not None and stale:
            verdict.removed = prune(path, keep)
        if status == MISSING:
            what = ", ".join(absent) or "*"
            stored_as = [n for n in absent if stored is not None and n in stored.get("results", {})]
            verdict.checks.append(Check(
                point.name, what, "baseline", "stored baseline", "none", None, False,
                (f"{shown} stores {', '.join(stored_as)} as aggregates, and this document's baseline mode "
                 f"is rows" if stored_as else f"no baseline in {shown}")
                + "; record it with --causalab-update-baselines=all and commit it "
                "(missing baselines fail under CI or --causalab-strict)"))
        else:
            verdict.checks = checks
    if verdict.removed:
        verdict.notes.append(f"stale baseline entries removed from {shown}: {', '.join(verdict.removed)} "
                             f"(no longer points of {Path(point.document).name})")
    verdict.stale = [] if update is not None else stale
    return verdict


def _compare(point: Point, stored: Optional[dict], mode: str, tolerance, experiment: Optional[dict],
             fmt: str) -> tuple:
    """(status, absent results, lead lines, failing checks) of a point against its stored entry."""
    saved = point.saved()
    tensors = point.saved_tensors()
    if stored is None:
        return MISSING, [*saved, *tensors], [], []
    if stored.get("produced_by") != point.produced_by:
        return CHANGED, [], experiment_lines(stored, point.produced_by, experiment, fmt), [Check(
            point.name, "experiment", "produced_by", f"baseline {str(stored.get('produced_by'))[:12]}",
            point.produced_by[:12], None, False,
            "the experiment changed since the baseline was recorded; if that is intended, rerun with "
            "--causalab-update-baselines and commit the baseline")]
    results, stored_tensors = stored.get("results", {}), stored.get("tensors", {})
    # A result stored as aggregates cannot be held row by row: in rows mode it is missing.
    absent = [n for n in saved if n not in results or (mode == "rows" and "rows" not in results[n])]
    absent += [f for f, ts in tensors.items() if any(n not in stored_tensors.get(f, {}) for n in ts)]
    if absent:
        return MISSING, absent, [], []
    lines, checks = [], []
    for name, result in saved.items():
        rtol, atol = tolerance(name)
        if mode == "rows":
            found, line = rows_drift(point, name, list(results[name]["rows"].items()), result, rtol, atol)
        else:
            found, line = aggregates_drift(point.name, name, results[name], result, rtol, atol)
        if found:
            lines.append(line)
            checks += found
    for file, named in tensors.items():
        rtol, atol = tolerance(file)
        for name, tensor in named.items():
            found = compare_tensor(point.name, f"{file}:{name}", stored_tensors[file][name], tensor, rtol, atol)
            for c in found:
                lines.append(f"{c.result}: {c.note}; worst {c.aggregate} {c.expected.removeprefix('baseline ')} "
                             f"→ {number(c.got)}")
            checks += found
    if checks:
        # What moved the numbers, said before the numbers: another checkpoint, not the code.
        for key, attribute in (("config", "config_digest"), ("weights", "weights")):
            now = getattr(point, attribute, None)
            if changed(stored.get(key), now):
                lines.insert(0, f"{key} changed: {_short(stored[key])} → {_short(now)}")
    return (DRIFTED if checks else UNCHANGED), [], lines, checks


def changed(stored: Optional[str], now: Optional[str]) -> bool:
    """Whether a baseline's recorded digest differs from what the point ran on (a baseline that
    stores none — written before it was recorded — says nothing)."""
    return stored is not None and now is not None and stored != now


def _short(digest: str) -> str:
    """``sha256:ab12cd34ef56…``: enough of a digest to tell two apart in a failure line."""
    kind, _, hexdigest = digest.partition(":")
    return f"{kind}:{hexdigest[:12]}…" if hexdigest and len(hexdigest) > 12 else digest


# --- verdicts through user_properties (xdist carries them) to baseline_report.session_report ----

STATUS = "causalab.baseline"
STALE = "causalab.baseline.stale"
REMOVED = "causalab.baseline.removed"


def record(item, verdict: Verdict) -> None:
    """The verdict as junit properties of the item: what ``baseline_report.session_report`` reads
    back from reports."""
    item.user_properties.append((STATUS, verdict.status))
    if verdict.stale:
        item.user_properties.append((STALE, json.dumps(verdict.stale)))
    if verdict.removed:
        item.user_properties.append((REMOVED, json.dumps(verdict.removed)))


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)

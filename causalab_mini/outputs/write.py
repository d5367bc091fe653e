"""A run's plan → files: the save manifest and nothing else, committed whole.

Nothing lands on disk that no step's ``saves`` asks for, besides
``document.json`` and ``run.json`` at the root and each sweep point's
``document.json``. The same plan written twice gives byte-identical files: no
time, host or absolute path is recorded.

A run's folder is committed like a transaction, with ``run.json`` as the commit
record (``write``):

1. every file's bytes are made before anything is written;
2. every file but run.json is written whole into a staging folder inside ``--out``
   (a full disk stops here, and the previous run's folder is untouched);
3. the folder is marked incomplete (``.causalab-incomplete``, listing every file of
   ours that may be in it) and the old run.json removed;
4. the staged files are moved into place (a top folder ``--out`` does not have yet — a
   sweep point's, on a first run — in one rename, whole) and the previous run's files
   that this run does not write are removed;
5. one barrier (``files.barrier``) puts all of it on the disk;
6. run.json is written, then the mark and the staging folder go.

An empty folder (a first run, a fresh point folder) has no earlier run to keep whole, so its
files skip the staging folder: the mark, every file written in place, the barrier, run.json, the
mark removed (``_commit_fresh``) — the same order of commit, a few system calls instead of dozens.

No file is flushed on its own: a kill (the process dies, the kernel keeps what it was given)
needs no flush at all, and for a crash of the machine the one barrier before run.json is what
matters — a run.json on the disk always has its data files there before it. A crash after the
barrier may lose run.json itself, and the folder then reads as incomplete, never as a result.
``durable=False`` leaves the barrier out, for a scratch folder (the pytest plugin's, under
pytest's temporary directory): a kill still leaves no folder that reads as a result.

A kill at any point leaves either the previous run, whole, or a folder that
``state`` calls incomplete — never one that reads as a result. The next write
into it removes what an interrupted run left (the staging folder, temporary
files, every file the mark lists), so a rerun after a kill gives exactly the
files a clean run gives.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from ..errors import EngineError, PlanError, WriteError
from ..files import TMP_SUFFIX, barrier, tmp_prefix, write_atomic, write_new
# json_bytes is the text of every file a run writes; callers still find it here (writer.json_bytes).
from ..formats import ROWS, TENSORS, format_of, json_bytes
from ..plan.plan import Fit, Observe, Plan, SaveSpec, Weights

RUN = "run.json"  # the commit record: its presence, without the mark, makes the folder a result
INCOMPLETE = ".causalab-incomplete"  # the mark of a folder being written: JSON {"files": [...]}
STAGING = ".causalab-staging"  # where a run's files are written whole before they move into place


def metric_rows(step: Observe, name: str, produced_by: str) -> list[dict]:
    """One object per row of the step's data, excluded rows included (``value: null``).

    Every point of a sweep makes these (its ``Result`` and its saved file), so what does not
    change from row to row is looked up once, and a scored row's reason is its position's."""
    metric = next(m for m in step.metrics if m.name == name)
    results = step.results
    values = iter(results[name].tolist())
    eligible = results.get("eligible", {}).get(name, metric.column_eligible)
    recorded = results.get("positions", {})
    positions = recorded.get(metric.of)
    # The document fixed the position on every row (no record): there is nothing to report.
    reasons = positions["reason"] if positions is not None else None
    excluded = results.get("excluded", {}).get(name)
    answers = _answers(metric) if metric.compared else None
    tail = {"unit": metric.unit, "estimand_version": metric.estimand_version, "produced_by": produced_by}
    rows = []
    for i, example_id in enumerate(step.example_ids):
        ok = bool(eligible[i])
        reason = reasons[i] if reasons is not None else ""
        if not ok:
            reason = _excluded_reason(metric, recorded, excluded, i, reason)
        row = {"example_id": example_id, "metric": name, "value": next(values) if ok else None,
               "eligible": ok}
        row["positions"] = None if positions is None else list(positions["rows"][i])
        row["reason"] = reason
        if positions is not None:
            row["tokens"] = positions["tokens"][i]
        if answers is not None:
            row["answers"] = answers[i]
        row.update(tail)
        rows.append(row)
    return rows


def _excluded_reason(metric, recorded: dict, excluded, i: int, reason: str) -> str:
    """Why an excluded row was: its position's reason; else the kind's (it left the row undefined,
    a zero denominator); else the reason of a read its kind compares it with; else the column
    half's (no answer, or two answers scoring one token)."""
    if not reason and excluded is not None and excluded[i]:
        reason = excluded[i]
    for _, other in metric.reads if not reason else ():
        # Placed in this read, not in one its kind compares it with: that read's reason.
        record = recorded.get(other)
        if record is not None and record["reason"][i]:
            reason = f"{other}: {record['reason'][i]}"
            break
    if not reason and not metric.column_eligible[i]:
        # Said even when the position half, reported above, found the position.
        reason = metric.column_reasons[i] if metric.column_reasons else "no_answer"
    return reason


def _answers(metric) -> list[dict]:
    """Per row, what was scored: each answer's text, the token it is scored by, and how many tokens
    the whole answer has (more than 1: scored on its first piece) — a new object per row."""
    labels = [label for label, _ in metric.compared]
    per_answer = [[{"column": column, "text": text, "token": token, "tokens": None if piece is None else len(piece)}
                   for text, token, piece in zip(metric.answers[k], metric.scored[k], metric.pieces[k])]
                  for k, (_, column) in enumerate(metric.compared)]
    return [dict(zip(labels, row)) for row in zip(*per_answer)]


def saved_tensors(step) -> dict[str, dict]:
    """A step's tensor saves (every save whose format holds tensors), by file path: ``{tensor name: tensor}``
    — one tensor for an output or generated ids, a bundle's tensors for a weights save."""
    source = step.evaluation if isinstance(step, Fit) else step
    results = source.results if source is not None else {}
    out = {}
    for save in step.saves:
        if format_of(save.file_path).holds != TENSORS or save.value not in results:
            continue
        out[save.file_path] = _named_tensors(results[save.value], save)
    return out


def _named_tensors(value, save: SaveSpec) -> dict:
    """A save's tensors by name: a bundle's own names, else the one tensor under the saved value's."""
    return dict(value) if isinstance(value, dict) else {save.value: value}


def _save_bytes(step, save: SaveSpec, produced_by: str) -> bytes:
    source = step.evaluation if isinstance(step, Fit) else step
    results = source.results if source is not None else {}
    if save.value not in results:
        raise PlanError(save.file_path, f"nothing called {save.value!r} was produced by this run",
                        "save a metric, an output or a generated value of this step")
    form = format_of(save.file_path)
    if form.holds == ROWS:
        return form.write(metric_rows(source, save.value, produced_by), save.header)
    return form.write(_named_tensors(results[save.value], save), save.header)


def layout(plan: Plan) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """Every file a run of ``plan`` writes except run.json, with how to make its bytes.

    The names are known from the plan alone, so a run is checked against ``--out``
    before anything is computed (``check_targets``); the bytes are made after.
    """
    yield "document.json", lambda: json_bytes(plan.document)

    def walk(p: Plan, prefix: str):
        for name, step in p.steps.items():
            if isinstance(step, Plan):
                yield f"{prefix}{name}/document.json", lambda step=step: json_bytes(step.document)
                yield from walk(step, f"{prefix}{name}/")
            elif isinstance(step, (Observe, Fit, Weights)):
                for save in step.saves:
                    yield f"{prefix}{save.file_path}", lambda s=save, st=step: _save_bytes(st, s, p.produced_by)

    yield from walk(plan, "")


def planned_files(plan: Plan) -> list[str]:
    """The relative paths a run of ``plan`` writes, in the order ``write`` returns them (document.json,
    run.json, then every point's files); two steps saving one file refused."""
    names: list[str] = []
    seen: set[str] = set()
    for rel, _ in layout(plan):
        if rel in seen:
            raise PlanError(rel, "two steps save to the same file", "give each save its own file_path")
        seen.add(rel)
        names.append(rel)
    return [names[0], RUN, *names[1:]]


def manifest(plan: Plan, run_record: dict, made: Optional[dict] = None) -> dict[str, bytes]:
    """Every file of a run, relative path → bytes, made before anything is written, in the
    order ``planned_files`` gives them.

    ``made``: files whose bytes the caller already has — a point's folder prefix → relative
    path → bytes (a point served by the cache, or one computed in another walk); every other
    file is made from the (executed) ``plan``. run.json lists the run's other files
    (``files``), so the next run into the same directory knows which of what is there this
    project wrote (see ``write``).
    """
    files = {prefix + rel: data for prefix, have in (made or {}).items() for rel, data in have.items()}
    for rel, make in layout(plan):
        if rel not in files:
            files[rel] = make()
    files[RUN] = json_bytes({**run_record, "files": sorted(files)})
    return {rel: files[rel] for rel in planned_files(plan)}


def state(out: Path) -> str:
    """``"complete"`` (a run's result), ``"incomplete"`` (a write that did not finish: never a
    result), or ``"empty"`` (no run of ours)."""
    out = Path(out)
    if (out / INCOMPLETE).exists() or (out / STAGING).exists() and not (out / RUN).exists():
        return "incomplete"
    return "complete" if (out / RUN).is_file() else "empty"


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that cannot take a run, before anything is computed: a file, or a
    folder that cannot be written. Tried for real — a folder of a unique name made and removed in
    ``out``, or in its nearest existing parent — since permission bits do not say what a file
    system takes (``/proc``, a read-only mount, root's access to everything). Nothing of the
    user's is made or removed: another run may be making the same ``out`` at the same moment."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise EngineError("--out", f"{out} is a file, and a run writes a folder", "name a folder")
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    try:
        if existing is None or not existing.is_dir():
            raise NotADirectoryError(f"{existing or out} is not a folder")
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".causalab-probe-"))
    except OSError as err:
        raise EngineError("--out", f"{out} cannot be written into ({err.strerror or err})",
                          "name a folder you can write") from None


def _listed(path: Path) -> list[str]:
    try:
        listed = json.loads(path.read_text(encoding="utf-8")).get("files", [])
    except (OSError, ValueError, AttributeError, RecursionError):
        return []
    # A record or mark damaged to hold anything but a list of names ({"files": 5}, a string) lists nothing.
    return [f for f in listed if isinstance(f, str)] if isinstance(listed, list) else []


def _previous_files(out: Path) -> set[str]:
    """Every file an earlier run into ``out`` wrote or may have written: what its run.json lists,
    and what an interrupted write's mark lists."""
    return set(_listed(out / RUN)) | set(_listed(out / INCOMPLETE))


def _inside(out: Path, rel: str) -> Path | None:
    try:
        root, target = out.resolve(), (out / rel).resolve()
    except (OSError, ValueError, RuntimeError):  # a name no file has ("a\0b"), a symbolic link that loops
        return None
    return target if root in target.parents else None


def _remove(out: Path, rels) -> None:
    """Delete files of ours (listed paths, only inside ``out``) and the folders that empties.

    A file a person put there is never touched. A stale ``iia.json`` beside a rerun's files
    would be read as this run's result.
    """
    root = out.resolve()
    for rel in sorted(rels):
        target = _inside(out, rel)
        if target is None or not target.is_file():
            continue
        target.unlink()
        for folder in target.parents:
            if folder == root or any(folder.iterdir()):
                break
            folder.rmdir()


def _clean_orphans(out: Path, names) -> None:
    """What an interrupted write left: the staging folder, and temporary files of our files."""
    stage = out / STAGING
    if stage.is_symlink() or stage.exists() and not stage.is_dir():
        # Our name, as a file or a link: a link would send the staged files wherever it points.
        stage.unlink()
    shutil.rmtree(stage, ignore_errors=True)
    by_folder: dict[str, set[str]] = {}
    for rel in names:
        folder, _, name = rel.rpartition("/")
        by_folder.setdefault(folder, set()).add(name)
    for folder, here in by_folder.items():  # each folder listed once, however many files it holds
        if folder and not os.path.isdir(os.path.join(out, folder)):
            continue  # nothing there to clean (a first run's folders): no need to resolve its path
        where = _inside(out, f"{folder}/{next(iter(here))}" if folder else next(iter(here)))
        if where is None or not where.parent.is_dir():
            continue
        prefixes = tuple(tmp_prefix(name) for name in here)
        with os.scandir(where.parent) as entries:
            for entry in entries:
                # A name is matched as written: a listed "*" matches only a file called "*".
                if entry.name.endswith(TMP_SUFFIX) and entry.name.startswith(prefixes) and not entry.is_dir(
                        follow_symlinks=False):
                    os.unlink(entry.path)


def check_targets(out: Path, files) -> None:
    """Refuse, before anything is written, a file whose place is a folder, whose folder is a file,
    or whose folder is a symbolic link (which would send the run's files outside ``out``); and a
    folder where the run puts its mark (no write of ours makes one, so it is not ours to remove,
    and the mark could never be written over it nor the folder ever read as a result)."""
    mark = out / INCOMPLETE
    if mark.is_dir() and not mark.is_symlink():
        raise PlanError(INCOMPLETE, f"{mark} is a folder, and a run marks the folder it is writing with a "
                        "file of that name", f"remove {mark} (no run makes it a folder), then run again")
    checked: set[Path] = set()  # folders already held to both rules (a sweep's files share them)
    absent: set[Path] = set()  # folders found missing: no file in one can be a folder
    folders: dict[str, Path] = {}  # a file's folder as its path spells it -> that folder, held to both rules
    for rel in files:
        spelled, _, name = rel.rpartition("/")
        parent = folders.get(spelled) if name not in ("", ".", "..") else None
        if parent is not None:  # its folder held already: only the file's own place is left to ask
            if parent not in absent and (parent / name).is_dir():
                raise PlanError(rel, f"{parent / name} is a folder, and the run writes a file there",
                                "move that folder away, or save to another file_path")
            continue
        target = out / rel
        for folder in target.parents:
            if folder == out or folder in checked:
                break
            if folder.is_symlink():
                raise PlanError(rel, f"{folder} is a symbolic link, and the run's files would land where it "
                                "points, outside the run's folder", "remove the link, or write elsewhere with --out")
        if target.is_dir():
            raise PlanError(rel, f"{target} is a folder, and the run writes a file there",
                            "move that folder away, or save to another file_path")
        for folder in target.parents:
            if folder == out.parent or folder in checked:
                break
            kind = _folder_kind(folder)
            if kind == "other":
                raise PlanError(rel, f"{folder} is a file, and the run needs a folder there",
                                "move that file away, or save to another file_path")
            if kind == "absent":
                absent.add(folder)
            checked.add(folder)
        folders[spelled] = target.parent


def _folder_kind(path: Path) -> str:
    """``"folder"``, ``"absent"`` or ``"other"`` (there, and not a folder) — asked with one ``stat``: a
    run committing into the same folder may remove an emptied folder between an ``exists`` and an
    ``is_dir``, which would read as a file that is not there."""
    try:
        return "folder" if stat.S_ISDIR(os.stat(path).st_mode) else "other"
    except (FileNotFoundError, NotADirectoryError):
        return "absent"


def _left(out: Path) -> str:
    """What a failed write left in ``out``, said for the refusal."""
    return {"complete": "the previous run there is as it was",
            "incomplete": f"the folder is marked incomplete ({INCOMPLETE}) and is not a result",
            "empty": "no run is there"}[state(out)]


def _commit(out: Path, stage: Path, files: dict, previous: set, ours: set, durable: bool) -> None:
    """Steps 3 to 6: mark, move into place, remove what this run no longer writes, the barrier,
    run.json last."""
    write_atomic(out / INCOMPLETE, (json.dumps({"files": sorted(ours - {INCOMPLETE})}) + "\n").encode(),
                 durable=False)
    (out / RUN).unlink(missing_ok=True)
    _move_into_place(out, stage, [rel for rel in files if rel != RUN])
    _remove(out, previous - set(files))
    if durable:
        barrier(out, [out / rel for rel in files if rel != RUN])
    write_atomic(out / RUN, files[RUN], durable=False)
    (out / INCOMPLETE).unlink()
    shutil.rmtree(stage, ignore_errors=True)


def _move_into_place(out: Path, stage: Path, rels: list[str]) -> None:
    """Every staged file to its place in ``out``. A top folder ``out`` does not have yet (a sweep
    point's, on a first run) moves whole, in one rename: the staging folder holds exactly this
    run's files, so its folder is exactly the files that land there. Any other file moves alone,
    its folder made once."""
    root, staged = os.fspath(out), os.fspath(stage)
    made: set[str] = {""}
    for top, names in _by_top_folder(rels).items():
        if top and not os.path.lexists(os.path.join(root, top)):
            os.replace(os.path.join(staged, top), os.path.join(root, top))
            continue
        for rel in names:
            folder = os.path.dirname(rel)
            if folder not in made:
                os.makedirs(os.path.join(root, folder), exist_ok=True)
                made.add(folder)
            os.replace(os.path.join(staged, rel), os.path.join(root, rel))


def _by_top_folder(rels: list[str]) -> dict[str, list[str]]:
    """The relative paths by their first folder, in order; "" for a file at the top and for a path
    spelled with ``.``, ``..`` or an empty part (its first folder may not be where it lands)."""
    grouped: dict[str, list[str]] = {}
    for rel in rels:
        top, sep, _ = rel.partition("/")
        plain = sep and all(part not in ("", ".", "..") for part in rel.split("/"))
        grouped.setdefault(top if plain else "", []).append(rel)
    return grouped


def write(plan: Plan, out: Path, run_record: dict) -> list[Path]:
    """Commit the run into ``out`` whole (see the module's docstring); returns the paths written,
    in manifest order. Files an earlier run wrote that this one does not are removed."""
    return commit(out, manifest(plan, run_record))


def commit(out: Path, files: dict[str, bytes], *, durable: bool = True) -> list[Path]:
    """Commit ``files`` (relative path -> bytes, run.json among them) into ``out`` whole: staged,
    marked, moved into place, run.json last (see the module's docstring); returns the paths in
    ``files``' order. Files an earlier run wrote that these do not are removed. ``durable``: the
    files reach the disk (one barrier) before run.json does."""
    out = Path(out)
    if os.path.lexists(out):  # a folder to be made is probed by making it, just below
        check_out(out)
    check_targets(out, files)
    try:
        out.mkdir(parents=True, exist_ok=True)  # exist_ok: another run may make it at the same moment
    except OSError as err:
        raise EngineError("--out", f"{out} cannot be made ({err.strerror or err})", "name a folder you can "
                          "write") from None
    with _owned(out):
        if _empty(out):  # asked under the lock: another run may have committed here a moment ago
            return _commit_fresh(out, files, durable)
        return _commit_owned(out, files, durable)


def _empty(out: Path) -> bool:
    with os.scandir(out) as entries:
        return next(entries, None) is None


def _commit_fresh(out: Path, files: dict[str, bytes], durable: bool) -> list[Path]:
    """Commit into an empty folder: nothing of an earlier run to keep, replace or clean, so no
    staging — the mark (listing every file), each file written in place, the barrier, run.json,
    the mark removed. A kill leaves the mark: the folder is incomplete, and the next write removes
    every file it lists. A failed write (a full disk) removes what it wrote: the folder is empty."""
    rels = [rel for rel in files if rel != RUN]
    made: set[str] = {""}
    rel = INCOMPLETE
    try:
        write_new(out / INCOMPLETE, (json.dumps({"files": sorted(files)}) + "\n").encode())
        for rel in rels:
            folder = os.path.dirname(rel)
            if folder not in made:
                os.makedirs(os.path.join(out, folder), exist_ok=True)
                made.add(folder)
            write_new(out / rel, files[rel])
        if durable:
            barrier(out, [out / rel for rel in rels])
        rel = RUN
        write_atomic(out / RUN, files[RUN], durable=False)
    except OSError as err:
        _remove(out, files)
        (out / INCOMPLETE).unlink(missing_ok=True)
        raise WriteError(str(out / rel), f"{err.strerror or err} while writing the run; {_left(out)}",
                         "free space (or permissions) and run again, or write elsewhere with --out") from None
    (out / INCOMPLETE).unlink()
    return [out / rel for rel in files]


@contextmanager
def _owned(out: Path):
    """Hold ``out`` for one commit: another run committing into it waits here until this one has
    finished, so a finished folder is always exactly one run. An exclusive ``flock`` on the
    folder itself — no lock file to leave behind — released by the kernel if the process dies."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; runs into one folder must not overlap there
        yield
        return
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _commit_owned(out: Path, files: dict[str, bytes], durable: bool) -> list[Path]:
    previous = _previous_files(out)
    ours = previous | set(files) | {INCOMPLETE}
    _clean_orphans(out, ours)
    stage = out / STAGING
    rel = None
    made: set[str] = set()  # the staging folders made so far: each made once, however many files it holds
    try:
        for rel, data in files.items():
            if rel != RUN:
                folder = os.path.dirname(rel)
                if folder not in made:
                    os.makedirs(os.path.join(stage, folder), exist_ok=True)
                    made.add(folder)
                write_new(stage / rel, data)
    except OSError as err:
        shutil.rmtree(stage, ignore_errors=True)
        raise WriteError(str(out / rel), f"{err.strerror or err} while staging the run; {_left(out)}",
                         "free space (or permissions) and run again, or write elsewhere with --out") from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    try:
        _commit(out, stage, files, previous, ours, durable)
    except OSError as err:
        if state(out) != "incomplete":
            shutil.rmtree(stage, ignore_errors=True)
        raise WriteError(str(out), f"{err.strerror or err} while moving the run into place; {_left(out)}",
                         "free space (or permissions) and run again: the rerun cleans up") from None
    return [out / rel for rel in files]

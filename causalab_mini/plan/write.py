"""A run's plan → files: the save manifest and nothing else.

Nothing lands on disk that no step's ``saves`` asks for, besides
``document.json`` and ``run.json`` at the root and each sweep point's
``document.json``. Every file's bytes are made before the first one is written,
and each is written to a temporary name and renamed into place, so a failing
run leaves no half-written file. The same plan written twice gives
byte-identical files: no time, host or absolute path is recorded.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import PlanError
from .plan import Fit, Observe, Plan, Weights


def _json(value: Any) -> bytes:
    # NaN and Infinity are not JSON; a metric that produced one is a bug to see, not a file to write.
    try:
        text = json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise PlanError("results", "a value to be written is NaN or infinite",
                        "check the metric's inputs (a probability of 0 under a log, say)") from None
    return (text + "\n").encode("utf-8")


def metric_rows(step: Observe, name: str, produced_by: str) -> list[dict]:
    """One object per row of the step's data, excluded rows included (``value: null``)."""
    metric = next(m for m in step.metrics if m.name == name)
    values = step.results[name].tolist()
    eligible = step.results.get("eligible", {}).get(name, metric.column_eligible)
    positions = step.results.get("positions", {}).get(metric.of)
    rows, it = [], iter(values)
    for i, example_id in enumerate(step.example_ids):
        ok = bool(eligible[i])
        row = {"example_id": example_id, "metric": name, "value": next(it) if ok else None,
               "eligible": ok}
        if positions is not None:
            row["positions"] = list(positions["rows"][i])
            row["reason"] = positions["reason"][i]
            row["tokens"] = positions["tokens"][i]
        else:
            # The document fixed the position on every row; there is nothing to report.
            row["positions"] = None
            row["reason"] = ""
        if not ok and not row["reason"] and not metric.column_eligible[i]:
            # The column half excluded it (the data had no answer) — say so even when the
            # position half, reported above, found the position.
            row["reason"] = "no_answer"
        row.update(unit=metric.unit, estimand_version=metric.estimand_version, produced_by=produced_by)
        rows.append(row)
    return rows


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


def saved_tensors(step) -> dict[str, dict]:
    """A step's tensor saves (every save not ending ``.json``), by file path: ``{tensor name: tensor}``
    — one tensor for an output or generated ids, a bundle's tensors for a weights save."""
    source = step.evaluation if isinstance(step, Fit) else step
    results = source.results if source is not None else {}
    out = {}
    for save in step.saves:
        if save.file_path.endswith(".json") or save.value not in results:
            continue
        value = results[save.value]
        out[save.file_path] = dict(value) if isinstance(value, dict) else {save.value: value}
    return out


def _step_files(step, produced_by: str) -> dict[str, bytes]:
    source = step.evaluation if isinstance(step, Fit) else step
    results = source.results if source is not None else {}
    tensors = saved_tensors(step)
    files: dict[str, bytes] = {}
    for save in step.saves:
        if save.value not in results:
            raise PlanError(save.file_path, f"nothing called {save.value!r} was produced by this run",
                            "save a metric, an output or a generated value of this step")
        if save.file_path.endswith(".json"):
            files[save.file_path] = _json(metric_rows(source, save.value, produced_by))
        else:
            files[save.file_path] = safetensors_bytes(tensors[save.file_path], save.header)
    return files


def manifest(plan: Plan, run_record: dict) -> dict[str, bytes]:
    """Every file of a run, relative path → bytes, made before anything is written.

    run.json lists the run's other files (``files``), so the next run into the same
    directory knows which of what is there this project wrote (see ``write``).
    """
    files: dict[str, bytes] = {"document.json": _json(plan.document), "run.json": b""}

    def add(p: Plan, prefix: str) -> None:
        for name, step in p.steps.items():
            if isinstance(step, Plan):
                files[f"{prefix}{name}/document.json"] = _json(step.document)
                add(step, f"{prefix}{name}/")
            elif isinstance(step, (Observe, Fit, Weights)):
                for rel, data in _step_files(step, p.produced_by).items():
                    if f"{prefix}{rel}" in files:
                        raise PlanError(rel, "two steps save to the same file",
                                        "give each save its own file_path")
                    files[f"{prefix}{rel}"] = data

    add(plan, "")
    files["run.json"] = _json({**run_record, "files": sorted(f for f in files if f != "run.json")})
    return files


def _previous_files(out: Path) -> list[str]:
    """The files an earlier run wrote into ``out``, as its run.json lists them ([] if none)."""
    try:
        listed = json.loads((out / "run.json").read_text(encoding="utf-8")).get("files", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [f for f in listed if isinstance(f, str)]


def _remove_stale(out: Path, stale: list[str]) -> None:
    """Delete files a previous run wrote that this one did not, and the folders that empties.

    Only paths the previous run.json listed, and only inside ``out``: a file a person
    put there is never touched. A stale ``iia.json`` beside a rerun's files would be
    read as this run's result.
    """
    root = out.resolve()
    for rel in stale:
        target = (out / rel).resolve()
        if root not in target.parents or not target.is_file():
            continue
        target.unlink()
        for folder in target.parents:
            if folder == root or any(folder.iterdir()):
                break
            folder.rmdir()


def write(plan: Plan, out: Path, run_record: dict) -> list[Path]:
    """Write the run into ``out``; returns the paths written, in manifest order.

    Files an earlier run wrote into ``out`` that this one does not (a save since
    removed, a sweep point no longer in the document) are deleted afterwards.
    """
    files = manifest(plan, run_record)
    out = Path(out)
    stale = [f for f in _previous_files(out) if f not in files]
    written = []
    for rel, data in files.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        written.append(target)
    _remove_stale(out, stale)
    return written

"""How many times a loaded engine's model is called, and what a run folder holds: the two facts the
forward-sharing, at_once and cache tests compare."""
from __future__ import annotations

import json

import contextlib


@contextlib.contextmanager
def counting_calls(loaded):
    """The number of times the model itself is called, by a pre-hook on the transformers model
    (removed afterwards: the engine may be the session's shared one)."""
    model = getattr(loaded.model, "_model", loaded.model)  # nnterp wraps the transformers model
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


def folder_bytes(folder) -> dict:
    """Every file under ``folder``: relative path -> bytes, sorted by path — a run.json without
    its ``timing``, the one part of a run's files that a rerun changes (seconds measured)."""
    return {p.relative_to(folder).as_posix(): untimed(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def untimed(path) -> bytes:
    """A file's bytes; a run.json's with its ``timing`` left out (``untimed_bytes``)."""
    return untimed_bytes(path.name, path.read_bytes())


def untimed_bytes(name: str, data: bytes) -> bytes:
    """``data``, the bytes of file ``name``; a run.json's parsed, its ``timing`` dropped and written
    back as the writer writes it, so everything else in it is compared byte for byte."""
    from causalab_mini.outputs.write import RUN, json_bytes

    if name.rsplit("/", 1)[-1] != RUN:
        return data
    record = json.loads(data)
    record.pop("timing", None)
    return json_bytes(record)


def untimed_record(record: dict) -> dict:
    """A run's record less its ``timing`` (seconds measured, which a rerun changes)."""
    return {k: v for k, v in record.items() if k != "timing"}

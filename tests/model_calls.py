"""How many times a loaded engine's model is called, and what a run folder holds: the two facts the
forward-sharing, at_once and cache tests compare."""
from __future__ import annotations

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
    """Every file under ``folder``: relative path -> bytes, sorted by path."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

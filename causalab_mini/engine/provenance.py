"""What ran: the record ``run.json`` holds, the same for both engines.

The engine's class, whether it ran remotely, the batch size, the versions of
the packages whose code decides what a block does, a digest of this package's
own source, and the dtype the model was served in. No hostname, no timestamp,
no absolute path: a record has to be byte-identical across machines to be worth
comparing.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

PACKAGES = ("torch", "transformers", "nnsight", "nnterp", "pydantic")
_ROOT = Path(__file__).resolve().parents[1]  # the causalab_mini package directory


def versions() -> dict[str, Optional[str]]:
    """Installed version of each package in ``PACKAGES`` (None where one is not installed)."""
    return dict(_versions())


@lru_cache(maxsize=1)
def _versions() -> tuple[tuple[str, Optional[str]], ...]:
    # Once per process: importlib.metadata parses a METADATA file per package, ~4 ms each,
    # which was half the time of a small run.
    found = []
    for name in PACKAGES:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            found.append((name, None))
    return tuple(found)


@lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over every ``.py`` file under ``causalab_mini/``: sorted relative path, then bytes."""
    outer = hashlib.sha256()
    for path in sorted(_ROOT.rglob("*.py"), key=lambda p: p.relative_to(_ROOT).as_posix()):
        rel = path.relative_to(_ROOT).as_posix()
        outer.update(rel.encode() + b"\0")
        outer.update(hashlib.sha256(path.read_bytes()).digest())
    return outer.hexdigest()


def identity() -> dict:
    """This process's causalab-mini: its version and the digest of its source."""
    try:
        version = metadata.version("causalab-mini")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        version = None
    return {"version": version, "source": source_digest()}


def check_server(client: dict) -> dict:
    """Run first in a session sent to a server: the server's own causalab-mini (what it imports the
    walk's code from) against the client's ``identity()``; a different version or source is refused
    by name before the walk computes anything — a function whose body changed would otherwise run
    silently. Returns the server's identity, for the run's record."""
    from ..errors import EngineError

    here = identity()
    if here != client:
        raise EngineError("server", f"the server runs causalab-mini {here['version']} (source "
                          f"{str(here['source'])[:12]}…) and this client {client['version']} (source "
                          f"{str(client['source'])[:12]}…): the walk's code is imported from the server's copy",
                          "install the client's causalab-mini on the server (the same version and source), "
                          "or run with the server's version here")
    return here


def served_dtype(model: Any) -> str:
    """``str`` of the unembedding weight's dtype: what the model was actually served in.

    ``model`` is either engine's: nnterp's wrapper (its torch model under ``_model``)
    or a plain Hugging Face model.
    """
    torch_model = getattr(model, "_model", model)
    head = torch_model.get_output_embeddings() if hasattr(torch_model, "get_output_embeddings") else None
    if head is None:
        head = getattr(torch_model, "lm_head")
    return str(head.weight.dtype)


def attention_implementation(model: Any) -> Optional[str]:
    """The attention implementation the model was served with (``sdpa``, ``eager``, or ``causalab``:
    the seam that reaches inside attention — the registered function, engine/attention.py, or on
    GPT-Neo and BLOOM the family routine, engine/attention_families.py)."""
    inner = getattr(model, "_model", model)  # nnterp's StandardizedTransformer wraps the HF model
    return getattr(getattr(inner, "config", None), "_attn_implementation", None)


def model_record(engine: Any) -> dict:
    """Which model ran, recorded whether or not the document pins a revision, so a result always
    says what it was computed on: the document's key; ``revision``, a local checkpoint's digest over
    its weights, config and tokenizer files (as ``causalab-mini revision`` prints it and a document
    pins it) or the hub commit the document names; and, to say which part changed when a revision
    does, ``weights`` (the safetensors files' digest) and ``config`` (config.json's sha256). The
    last two are null where no weight file was read here (a hub id, an NDIF shell)."""
    facts = getattr(engine, "_facts", None)
    return {"key": getattr(facts, "key", None), "revision": getattr(facts, "revision", None),
            "weights": getattr(facts, "weights", None), "config": getattr(facts, "config_digest", None)}


def record(engine: Any, remote: Any, batch_size: Optional[int], at_once: int = 1) -> dict:
    """The run record of a run by ``engine`` (a loaded engine instance). ``at_once`` is recorded
    only when points were stacked (> 1): a stacked batch is another shape for the kernels."""
    found = {
        "engine": type(engine).__name__,
        # A backend the session was sent to (a stand-in server) is recorded as what it simulates.
        "remote": remote if isinstance(remote, (bool, str)) else getattr(remote, "records_as", type(remote).__name__),
        "batch_size": batch_size,
        "versions": versions(),
        "causalab_mini": source_digest(),
        "served_dtype": served_dtype(engine.model),
        "model": model_record(engine),
        "attention": attention_implementation(engine.model),
    }
    if at_once > 1:
        found["at_once"] = at_once
    return found

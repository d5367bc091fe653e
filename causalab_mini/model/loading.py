"""Model resolution and loading.

Resolution turns a document's ``model.key`` into something ``from_pretrained``
accepts, in this order: a directory relative to the document; a directory under
each entry of the model search path (``--models``, ``CAUSALAB_MODELS``, else a
``models/`` or ``documents/models/`` folder found walking up from the document);
otherwise a hub id at ``revision``. Documents hold no absolute paths.

A local model's revision is ``sha256:<hex>`` over its weights, config and tokenizer files
(``revision_digest``), so a document pinned to a checkpoint notices when anything that decides
its numbers changes under that name.

Only ``load_weights`` touches tensors; everything else reads config, tokenizer
and file bytes, which is what lets ``explain`` compile without weights.
"""
from __future__ import annotations

import hashlib
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

from ..errors import HubUnreachable, ModelError
from ..reading import NotRegular, check_regular
from ..suggest import close_matches, join

ENV_MODELS = "CAUSALAB_MODELS"


@dataclass(frozen=True)
class ResolvedModel:
    key: str  # as the document wrote it
    source: str  # what from_pretrained gets: a local directory or a hub id
    revision: Optional[str]  # hub commit, or the local checkpoint's revision_digest
    local: bool
    # The digest of the weights this resolution hashed (a local checkpoint's, whether or not the
    # document pins it); None where no weight file was read (a hub id, an ndif shell).
    weights: Optional[str] = None
    # The digest of its config.json, which decides the numbers as much as the weights do (norm eps,
    # rope theta, softcapping); recorded beside the weights, None where the weights were not hashed.
    config: Optional[str] = None


def _split(value: Union[str, Sequence, None]) -> list[Path]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        value = [p for p in str(value).split(os.pathsep) if p]
    return [Path(p) for p in value]


def find_models_root(start: Optional[Path]) -> Optional[Path]:
    """The nearest ``models/`` (or ``documents/models/``) folder walking up from ``start``."""
    if start is None:
        return None
    start = Path(start).resolve()
    for folder in [start if start.is_dir() else start.parent, *start.parents]:
        for candidate in (folder / "models", folder / "documents" / "models"):
            if candidate.is_dir():
                return candidate
    return None


def model_roots(explicit=None, document: Optional[Path] = None) -> list[Path]:
    roots = _split(explicit) + _split(os.environ.get(ENV_MODELS))
    found = find_models_root(document)
    return roots + ([found] if found else [])


# What a local checkpoint's revision covers: every file transformers' model, config, tokenizer
# and processor loaders read from the folder's top level — weights and shard index, config.json
# and generation_config.json (norm eps, rope theta, softcapping decide the numbers as much as the
# weights do), the tokenizer's files (they decide the token ids) and a chat template. A README or
# licence is not among them, so editing one does not re-pin the documents that name the model.
REVISION_SUFFIXES = (".safetensors", ".json", ".txt", ".model", ".jinja", ".tiktoken")


def weights_digest(directory: Path) -> str:
    """``sha256:<hex>`` over the names and bytes of every weight file the loader may read.

    Both engines load safetensors only (``use_safetensors=True``: a pickled ``.bin`` is never
    read), so that is every ``*.safetensors`` file and a sharded checkpoint's index, which
    says which of them hold what. Recorded in run.json beside the revision; the revision
    (``revision_digest``) covers these files and the rest that decide the numbers.
    """
    files = sorted([*Path(directory).glob("*.safetensors"), *Path(directory).glob("*.safetensors.index.json")])
    if not files:
        raise ModelError("model.key", f"{directory} has no .safetensors weights",
                         "save the model with save_pretrained(..., safe_serialization=True)")
    return _digest_of(files)


def revision_digest(directory: Path) -> str:
    """A local checkpoint's revision, what a document pins and ``causalab-mini revision`` prints:
    ``sha256:<hex>`` over the names and bytes of its weights, config and tokenizer files
    (``REVISION_SUFFIXES``), the local counterpart of a hub commit."""
    directory = Path(directory)
    weights_digest(directory)  # a folder without safetensors weights is refused by that name
    files = sorted(p for p in directory.iterdir()
                   if not p.name.startswith(".") and p.name.endswith(REVISION_SUFFIXES))
    return _digest_of(files)


def _digest_of(files: list) -> str:
    outer = hashlib.sha256()
    for f in files:
        try:
            check_regular(f)  # a FIFO would block the hash, /dev/zero never end it
            outer.update(f.name.encode() + b"\0" + file_digest(f))
        except NotRegular as err:
            raise ModelError("model.key", f"{f} {err}", "a checkpoint's files are regular files: "
                             "restore the checkpoint") from None
        except OSError as err:  # a symlink to nothing, a file this user cannot read
            raise ModelError("model.key", f"{f} cannot be read ({err.strerror or err})",
                             "a checkpoint's files are regular files you can read: restore the "
                             "checkpoint") from None
    return "sha256:" + outer.hexdigest()


# (resolved path, size, mtime in ns) → sha256 of the bytes. Hashing a local 7B checkpoint takes
# tens of seconds, and every document, point and plugin item naming the model resolves it; a
# file rewritten in place changes its mtime (and almost always its size), so it is hashed again.
_FILE_DIGESTS: dict[tuple[str, int, int], bytes] = {}


def config_digest(directory: Path) -> Optional[str]:
    """``sha256:<hex>`` of a model directory's config.json bytes (None without one: refused later)."""
    path = Path(directory) / "config.json"
    try:
        check_regular(path)
    except (OSError, NotRegular):
        return None
    return "sha256:" + file_digest(path).hex()


def file_digest(path: Path) -> bytes:
    """sha256 of a file's bytes, cached by (path, size, mtime)."""
    path = Path(path).resolve()
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _FILE_DIGESTS:
        inner = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                inner.update(chunk)
        _FILE_DIGESTS[key] = inner.digest()
    return _FILE_DIGESTS[key]


def _is_model_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def resolve(key: str, revision: Optional[str], *, document: Optional[Path] = None,
            roots=None, check_revision: bool = True, hash_weights: bool = True) -> ResolvedModel:
    """Where the document's model is. A local model's digest is checked against ``revision``;
    ``hash_weights=False`` (a shell, whose weights are the server's) reads no weight file's bytes,
    and the revision is the one the document names."""
    searched: list[Path] = []
    candidates = []
    if document is not None:
        candidates.append(Path(document).resolve().parent / key)
    candidates += [root / key for root in model_roots(roots, document)]
    for candidate in candidates:
        searched.append(candidate)
        if _is_model_dir(candidate):
            if not hash_weights:
                return ResolvedModel(key, str(candidate), revision, True)
            digest = revision_digest(candidate)
            weights = weights_digest(candidate)
            if check_revision and revision is not None and revision != digest:
                raise _not_the_pinned(key, digest, weights, revision)
            return ResolvedModel(key, str(candidate), digest, True, weights=weights,
                                 config=config_digest(candidate))
    if key.startswith((".", "/")) or key.count("/") > 1:
        raise ModelError("model.key", f"{key!r} is not a model directory (searched: "
                         f"{', '.join(map(str, searched)) or 'nowhere'})",
                         join(local_suggestion(key, model_roots(roots, document)),
                              f"pass --models DIR or set {ENV_MODELS} to the folder that holds it"))
    return ResolvedModel(key, key, revision, False)


def _not_the_pinned(key: str, digest: str, weights: str, revision: str) -> ModelError:
    if revision == weights:
        # A pin written before the revision covered config and tokenizer: the weights are the
        # pinned ones, but what else decides the numbers was never checked.
        return ModelError("model.revision", f"{revision} is the digest of the weights at {key!r} alone; "
                          "a revision covers the weights, config and tokenizer files together",
                          f"check the checkpoint's config and tokenizer are the ones you meant, then "
                          f"write \"revision\": \"{digest}\"")
    return ModelError("model.revision",
                      f"the checkpoint at {key!r} (weights, config and tokenizer files) is {digest}, "
                      f"and the document names {revision}",
                      "the checkpoint changed since the document was written: rerun the experiment "
                      f"on purpose by writing \"revision\": \"{digest}\", or restore its files")


def local_models(roots) -> dict[str, Path]:
    """Every model directory under the search roots, by the key that names it (``tiny-llama``,
    ``org/name``), the first root's where two roots hold one key."""
    found: dict[str, Path] = {}
    for root in _split(roots):
        try:
            children = sorted(root.iterdir())
        except OSError:
            continue
        for child in children:
            if child.name.startswith("."):
                continue
            if _is_model_dir(child):
                found.setdefault(child.name, root)
                continue
            try:
                inner = sorted(child.iterdir()) if child.is_dir() else []
            except OSError:
                continue
            for grand in inner:
                if not grand.name.startswith(".") and _is_model_dir(grand):
                    found.setdefault(f"{child.name}/{grand.name}", root)
    return found


def local_suggestion(key: str, roots) -> str:
    """``did you mean 'tiny-llama' (a local model in <root>)?`` for a key that is not a local
    model directory, or ``""`` when no local model's key is close to it."""
    here = local_models(roots)
    meant = close_matches(key, here)
    if not meant:
        return ""
    return "did you mean " + " or ".join(f"{m!r} (a local model in {here[m]})" for m in meant) + "?"


def _hub_failure(resolved: ResolvedModel, err: Exception, searched_roots) -> ModelError:
    if resolved.local:
        first = str(err).splitlines()[0] if str(err) else ""
        return ModelError("model.key", f"the model directory for {resolved.key!r} could not be loaded "
                          f"({type(err).__name__}: {first})",
                          "check its config, tokenizer and .safetensors weights (save_pretrained writes all three)")
    return ModelError(
        "model.key",
        f"{resolved.key!r} is not a local model directory and could not be fetched as a hub id "
        f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})",
        join(local_suggestion(resolved.key, searched_roots),
             "put it under a model search path (--models DIR, " + ENV_MODELS + ") or check the id; "
             f"searched: {', '.join(map(str, searched_roots)) or 'no model roots'}"))


def _hub_unreachable(timeout: float = 3.0) -> Optional[str]:
    """Why the hub cannot be reached from here, or None: offline mode, or no connection in ``timeout``.

    Asked once, quickly, before a hub fetch: huggingface_hub retries a failed connection
    with backoff for ~25 s per file, which is not how a missing model should be reported.
    """
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return f"cannot connect to {host}:{port}: {err.strerror or err}"
    return None


# Files whose ``auto_map`` names Python code of the model directory's own, which from_pretrained
# would import (after asking on a terminal) if trust_remote_code were not False.
CODE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def custom_code(directory: Path) -> Optional[str]:
    """Where a local model directory names code of its own (``file: auto_map``), or None."""
    import json

    for name in CODE_FILES:
        path = Path(directory) / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # from_pretrained reports a broken file itself
        if isinstance(data, dict) and data.get("auto_map"):
            return f"{name} has an auto_map ({', '.join(sorted(map(str, data['auto_map'])))})"
    return None


def _code_refusal(key: str, where: str) -> ModelError:
    return ModelError("model.key", f"{key!r} ships Python code of its own ({where}), and causalab-mini runs "
                      "no code from a model directory or hub repository unless told to",
                      "read that code, then pass --trust-remote-code to run it")


def check_code(resolved: ResolvedModel, trust_remote_code: bool) -> None:
    """Refuse a local model directory that names its own code, unless the caller trusts it."""
    if resolved.local and not trust_remote_code:
        where = custom_code(Path(resolved.source))
        if where:
            raise _code_refusal(resolved.key, where)


def _asks_for_code(err: Exception) -> bool:
    return "trust_remote_code" in str(err)


def _from_hub(loader, resolved: ResolvedModel, roots, trust_remote_code: bool = False):
    """``loader.from_pretrained`` for a local directory, the hub cache, then the hub itself.

    ``trust_remote_code`` is always passed, explicitly: left unset, transformers asks on a
    terminal whether to run a directory's own code, and a "y" runs it.
    """
    check_code(resolved, trust_remote_code)
    if resolved.local:  # sizes bounded before transformers builds anything from them
        from .checkpoint import check_config, unreadable

        check_config(Path(resolved.source))
    revision = None if resolved.local else resolved.revision
    options = {"trust_remote_code": bool(trust_remote_code)}
    if resolved.local:
        from huggingface_hub.errors import StrictDataclassError

        try:
            return loader.from_pretrained(resolved.source, **options)
        except StrictDataclassError as err:  # a config field of the wrong type, sizes that do not fit
            raise unreadable(Path(resolved.source), err) from None
        except (OSError, ValueError) as err:
            raise _hub_failure(resolved, err, roots) from None
        except Exception as err:  # noqa: BLE001 - a local folder whose config passed check_config: its files'
            raise unreadable(Path(resolved.source), err) from None  # fault (a quantization_config that is a list)
    try:  # already in the Hugging Face cache: no network needed
        return loader.from_pretrained(resolved.source, revision=revision, local_files_only=True, **options)
    except (OSError, ValueError) as err:
        if _asks_for_code(err):
            raise _code_refusal(resolved.key, "its config names code the repository ships") from None
    reason = _hub_unreachable()
    if reason:
        raise HubUnreachable(
            "model.key",
            f"{resolved.key!r} is not a local model directory, not in the Hugging Face cache, "
            f"and the hub cannot be reached to fetch it ({reason})",
            join(local_suggestion(resolved.key, roots),
                 "put it under a model search path (--models DIR, " + ENV_MODELS + ") or run where the "
                 f"hub is reachable; searched: {', '.join(map(str, roots)) or 'no model roots'}"))
    try:
        return loader.from_pretrained(resolved.source, revision=revision, **options)
    except (OSError, ValueError) as err:
        if _asks_for_code(err):
            raise _code_refusal(resolved.key, "its config names code the repository ships") from None
        raise _hub_failure(resolved, err, roots) from None


def load_config(resolved: ResolvedModel, roots=(), *, trust_remote_code: bool = False):
    from transformers import AutoConfig

    return _from_hub(AutoConfig, resolved, roots, trust_remote_code)


def load_tokenizer(resolved: ResolvedModel, roots=(), *, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return _from_hub(AutoTokenizer, resolved, roots, trust_remote_code)


# --- shared by both engines' ``load``: the document's model reference, its dtype, the freeze ---

def model_ref(ref):
    """A document's ``model`` section as a ``ModelRef`` (a dict is validated into one)."""
    from ..document.spec import ModelRef

    return ref if isinstance(ref, ModelRef) else ModelRef.model_validate(ref)


def torch_dtype(ref):
    """The torch dtype a document's ``model.dtype`` ("fp32", "fp16", "bf16") asks for."""
    import torch

    return getattr(torch, model_ref(ref).torch_dtype)


def hub_revision(resolved: ResolvedModel) -> Optional[str]:
    """What ``from_pretrained(revision=...)`` gets: the hub commit, or None for a local directory."""
    return None if resolved.local else resolved.revision


def freeze(model):
    """The model as an instrument, not a parameter: ``eval()`` and ``requires_grad_(False)``."""
    model.eval()
    model.requires_grad_(False)
    return model


@contextmanager
def quiet_library_logs():
    """Library logging held to errors that end the load, while a model loads.

    nnterp checks its renaming by tracing a dummy input on the meta device and falls back
    to a real trace when that fails; on a mixture-of-experts model the meta kernel for
    grouped matmuls refuses fp32, and torch logs the whole traceback (about 100 lines) at
    ERROR before nnterp's fallback succeeds. None of it is the user's business: a load
    that really fails raises.
    """
    with held_logs(("nnterp", "torch._subclasses.fake_tensor"), logging.CRITICAL):
        yield


@contextmanager
def held_logs(names, level: int):
    """The named loggers held to ``level`` inside the block, as they were after it."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, before in zip(loggers, levels):
            lg.setLevel(before)


def quiet_loading() -> None:
    """No "Loading weights" bar from transformers: stderr belongs to the run's own progress and refusals."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

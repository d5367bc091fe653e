"""What the compiler reads from a featurizer bundle: tensor shapes, from the safetensors header.

The header is JSON after an 8-byte length, so shapes are known without loading
(or even importing) a tensor library.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

from .. import jsontext, reading
from ..errors import CompileError
from ..vocab import FEATURIZERS


MAX_HEADER_BYTES = 100_000_000  # safetensors' own bound on a header


def header(path: Path) -> dict:
    """The header of a safetensors file, checked to be one before its declared length is trusted:
    a renamed pickle or any other file would have its first 8 bytes read as a length to allocate."""
    with reading.open_regular(path) as fh:  # not a FIFO or a device, whatever the name says
        size = os.fstat(fh.fileno()).st_size
        (length,) = struct.unpack("<Q", fh.read(8))
        if length > min(size - 8, MAX_HEADER_BYTES):
            raise ValueError(f"its first 8 bytes declare a {length}-byte header in a {size}-byte file")
        text = fh.read(length).decode("utf-8")
    try:  # held to what documents are: a repeated key, NaN, deep nesting refused, not last-wins
        meta = jsontext.loads(text)
    except jsontext.Problem as err:
        raise ValueError(f"its header: {err.where + ': ' if err.where else ''}{err.problem}") from None
    if not isinstance(meta, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("shape"), list) for k, v in meta.items() if k != "__metadata__"):
        raise ValueError("its header is not a map of tensor names to dtype, shape and offsets")
    return meta


# What a bundle's header must agree with the loading document on, when it says at all.
CHECKED = ("model", "revision", "kind", "component", "layer", "d", "k")


def bundle_header(model, address, kind: str, d: int, k, **more) -> tuple[tuple[str, str], ...]:
    """The ``__metadata__`` of a tensor file: model key and revision, site, kind, k, d (all strings)."""
    pairs = {"model": model.key, "revision": model.revision or "", "kind": kind,
             "component": address.component, "layer": "" if address.layer is None else str(address.layer),
             "d": str(d), "k": "" if k is None else str(k)}
    pairs.update({key: str(value) for key, value in more.items()})
    return tuple(pairs.items())


def check_header(recorded: dict, expected: dict, path: Path, doc_path: str) -> None:
    """Refuse a bundle whose header disagrees with the document, naming the key.

    Only keys both sides state are compared: a bundle from elsewhere (an SAE
    trained outside this project) may carry no header, and then its shapes are
    all there is to check.
    """
    for key in CHECKED:
        have, want = recorded.get(key, ""), expected.get(key, "")
        if have and want and have != want:
            raise CompileError(f"{doc_path}.file_path", f"{path.name}'s header records {key}={have!r} and "
                               f"this document's featurizer has {key}={want!r}",
                               "load the bundle fitted for this model, site and kind, or refit it")


def space_width(feat, path: Path, d: int, doc_path: str, expected: dict = None) -> int:
    """The width of a loaded featurizer's space, its d and header checked against the document's."""
    try:
        meta = header(path)
    except (OSError, ValueError, struct.error) as err:
        raise CompileError(f"{doc_path}.file_path", f"{path.name} is not a safetensors file ({err})",
                           "point at a bundle a weights step saved") from None
    tensors = {k: v for k, v in meta.items() if k != "__metadata__"}
    kind = FEATURIZERS[feat.kind]
    name = kind.tensor  # the one whose shape says (d, k), or (d,) for a mask over units
    if kind.lone_tensor and name not in tensors and len(tensors) == 1:
        name = next(iter(tensors))  # what a ``reduce: pca`` output saves: one (d, k) tensor
    recorded = dict(meta.get("__metadata__") or {})
    if expected:
        # A pca bundle is what reduce: pca wrote, whatever it was called there.
        check_header(recorded, {**expected, "kind": feat.kind}, path, doc_path)
    if name not in meta:
        raise CompileError(f"{doc_path}.file_path", f"{path.name} has no {name!r} tensor, which a "
                           f"{feat.kind} bundle holds", f"tensors there: {sorted(k for k in meta if k != '__metadata__')}")
    shape = meta[name]["shape"]
    if shape[0] != d:
        raise CompileError(f"{doc_path}.file_path", f"{path.name} is for a {shape[0]}-wide site and "
                           f"site {feat.site!r} is {d} wide", "load the bundle fitted at this site")
    if kind.space == "units":
        return d
    k = shape[1]
    if feat.k is not None and feat.k != k:
        raise CompileError(f"{doc_path}.k", f"k={feat.k} and the bundle holds k={k}",
                           f"write \"k\": {k} or omit k")
    return k

"""What the compiler reads from a featurizer bundle: tensor shapes, from the safetensors header.

The header is JSON after an 8-byte length, so shapes are known without loading
(or even importing) a tensor library.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from ..errors import CompileError

# The tensor whose shape says (d, k) for each kind (SAELens names for sae/linear).
BASIS_TENSOR = {"subspace": "weight", "pca": "Q", "sae": "W_enc", "linear": "W_enc", "gate": "theta"}


def header(path: Path) -> dict:
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(length))


def space_width(feat, path: Path, d: int, doc_path: str) -> int:
    """The width of a loaded featurizer's space, its d checked against the site's."""
    try:
        meta = header(path)
    except (OSError, ValueError, struct.error) as err:
        raise CompileError(f"{doc_path}.file_path", f"{path.name} is not a safetensors file ({err})",
                           "point at a bundle a weights step saved") from None
    name = BASIS_TENSOR[feat.kind]
    if name not in meta:
        raise CompileError(f"{doc_path}.file_path", f"{path.name} has no {name!r} tensor, which a "
                           f"{feat.kind} bundle holds", f"tensors there: {sorted(k for k in meta if k != '__metadata__')}")
    shape = meta[name]["shape"]
    if shape[0] != d:
        raise CompileError(f"{doc_path}.file_path", f"{path.name} is for a {shape[0]}-wide site and "
                           f"site {feat.site!r} is {d} wide", "load the bundle fitted at this site")
    if feat.kind == "gate":
        return d
    k = shape[1]
    if feat.k is not None and feat.k != k:
        raise CompileError(f"{doc_path}.k", f"k={feat.k} and the bundle holds k={k}",
                           f"write \"k\": {k} or omit k")
    return k

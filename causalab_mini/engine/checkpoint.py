"""A local checkpoint's files checked before anything is built from them.

A model directory is input like a document: its ``config.json`` decides how much memory the
model takes (``num_hidden_layers: 10**12`` builds forever), and a safetensors file's header
says where each tensor's bytes are (a header length of 10**15, a file cut short). Both are
checked here, reading only the config and the headers, before transformers builds the model
or maps a byte of weights:

* every file read is a regular file (a FIFO blocks, ``/dev/zero`` never ends);
* the config's sizes are within bounds no released model comes near;
* each safetensors header is a bounded JSON object whose tensors lie inside the file, each
  exactly as long as its dtype and shape say;
* the model the config describes, built on the meta device (no memory), asks for no more
  parameters than the files hold — a config and weights that disagree are refused before the
  allocation, not after.
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from ..errors import ModelError
from ..reading import NotRegular, TooLarge, open_regular, read_bytes

CONFIG_LIMIT = 1 << 20  # bytes of config.json
HEADER_LIMIT = 100 << 20  # bytes of one safetensors header (safetensors' own reader caps it there)

# Generous bounds on what a config may ask for: no released language model is within a factor of
# four of any of them, and past them a model cannot be built on this kind of machine anyway.
BOUNDS = {
    "num_hidden_layers": 1024, "n_layer": 1024, "num_layers": 1024,
    "hidden_size": 1 << 17, "n_embd": 1 << 17, "d_model": 1 << 17,
    "intermediate_size": 1 << 19, "n_inner": 1 << 19, "ffn_dim": 1 << 19,
    "num_attention_heads": 4096, "n_head": 4096, "num_key_value_heads": 4096,
    "vocab_size": 1 << 22,
    "max_position_embeddings": 1 << 24, "n_positions": 1 << 24,
    "num_local_experts": 4096, "num_experts": 4096,
}

_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
                "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
SLACK = 1 << 20  # parameters a config may ask for beyond twice the weights before the allocation is refused
FIX = "restore the checkpoint as save_pretrained wrote it, or point model.key at another one"


def _refuse(path: Path, problem: str, fix: str = FIX) -> ModelError:
    return ModelError("model.key", f"{path}: {problem}", fix)


def check_config(directory: Path) -> dict:
    """``config.json`` read as a regular file of bounded size, its sizes within ``BOUNDS``."""
    path = Path(directory) / "config.json"
    try:
        raw = read_bytes(path, CONFIG_LIMIT)
        config = json.loads(raw)
    except NotRegular as err:
        raise _refuse(path, str(err)) from None
    except TooLarge as err:
        raise _refuse(path, f"holds {err}, more than a config's {CONFIG_LIMIT} bytes") from None
    except (OSError, ValueError, RecursionError) as err:
        raise _refuse(path, f"cannot be read as JSON ({type(err).__name__}: {err})") from None
    if not isinstance(config, dict):
        raise _refuse(path, "is not a JSON object")
    _check_sizes(path, config, "")
    return config


def _check_sizes(path: Path, config: dict, prefix: str) -> None:
    for key, value in config.items():
        if isinstance(value, dict) and key.endswith("config"):  # text_config, vision_config, ...
            _check_sizes(path, value, f"{prefix}{key}.")
            continue
        bound = BOUNDS.get(key)
        if bound is None or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _refuse(path, f"{prefix}{key} is {value!r}, not a size", "use the config.json saved with "
                          "these weights")
        if value > bound:
            raise _refuse(path, f"{prefix}{key} is {value}, beyond any model this project builds (at most "
                          f"{bound})", "use the config.json saved with these weights")


def check_weight_files(directory: Path) -> int:
    """Every ``*.safetensors`` file's header checked; the number of elements they hold in all."""
    total = 0
    for path in sorted(Path(directory).glob("*.safetensors")):
        total += sum(math.prod(shape) for shape in _header(path).values())
    return total


def _header(path: Path) -> dict[str, list]:
    """A safetensors header as {tensor: shape}, refused unless every tensor lies inside the file."""
    try:
        with open_regular(path) as fh:
            size = fh.seek(0, 2)
            fh.seek(0)
            head = fh.read(8)
            if len(head) < 8:
                raise _refuse(path, f"is {size} bytes, shorter than a safetensors header's length")
            (length,) = struct.unpack("<Q", head)
            if length > min(HEADER_LIMIT, size - 8):
                raise _refuse(path, f"says its header is {length} bytes, and the file holds {size - 8} after "
                              f"the length (a header is at most {HEADER_LIMIT})")
            header = json.loads(fh.read(length))
    except NotRegular as err:
        raise _refuse(path, str(err)) from None
    except (OSError, ValueError, RecursionError) as err:
        raise _refuse(path, f"has a header that cannot be read ({type(err).__name__}: {err})") from None
    if not isinstance(header, dict):
        raise _refuse(path, "has a header that is not a JSON object")
    data = size - 8 - length
    shapes = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shapes[name] = _checked_entry(path, name, entry, data)
    return shapes


def _checked_entry(path: Path, name: str, entry: Any, data: int) -> list:
    try:
        dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
    except (TypeError, KeyError, ValueError):
        raise _refuse(path, f"describes tensor {name} without a dtype, shape and data_offsets") from None
    if dtype not in _DTYPE_BYTES or not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise _refuse(path, f"describes tensor {name} as {dtype!r} {shape!r}, not a dtype and shape")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (start, end)) or not 0 <= start <= end <= data:
        raise _refuse(path, f"places tensor {name} at bytes {start}..{end}, outside the {data} bytes of data "
                      "it holds (a file cut short?)")
    if end - start != math.prod(shape) * _DTYPE_BYTES[dtype]:
        raise _refuse(path, f"gives tensor {name} ({dtype} {shape}) {end - start} bytes, not the "
                      f"{math.prod(shape) * _DTYPE_BYTES[dtype]} its shape takes")
    return shape


def check_fits(resolved, config, held: int) -> None:
    """Refuse a config whose model asks for more parameters than the weight files hold, measured
    on the meta device (no memory taken) before the real model is allocated."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            shell = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - a config transformers cannot build is its load's to report
        return
    wanted = sum(p.numel() for p in shell.parameters())
    # Only a gross disagreement is refused here, where the model is not yet allocated: a tensor
    # or two missing or at another shape is the load report's to name (complete.py), tensor by
    # tensor; a config asking for twice what the files hold would allocate memory for nothing.
    if wanted > 2 * held + SLACK:
        raise ModelError("model.key", f"the config.json at {resolved.key!r} describes a model of {wanted:,} "
                         f"parameters, and its weight files hold {held:,} values", "use the config.json saved "
                         "with these weights (save_pretrained writes both)")

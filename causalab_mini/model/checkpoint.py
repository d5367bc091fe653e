"""A local checkpoint's files checked before anything is built from them.

A model directory is input like a document: its ``config.json`` decides how much memory the
model takes (``num_hidden_layers: 10**12`` builds forever), and a safetensors file's header
says where each tensor's bytes are (a header length of 10**15, a file cut short). Both are
checked here, reading only the config and the headers, before transformers builds the model
or maps a byte of weights:

* every file read is a regular file (a FIFO blocks, ``/dev/zero`` never ends);
* the config's sizes are within bounds no released model comes near (and its ``model_type`` a name);
* each safetensors header is a bounded JSON object whose tensors lie inside the file, each
  exactly as long as its dtype and shape say, end to end from the first byte of data to the
  last — the header read as safetensors' own reader reads it, so a file that passes here is one
  it opens;
* a shard index that transformers would follow (there is no ``model.safetensors``) names, for
  each tensor, a ``.safetensors`` file beside it — never a pickled ``.bin``, which transformers
  would unpickle, nor a file elsewhere;
* the model the config describes, built on the meta device (no memory), can be built, and asks
  for no more parameters than the files hold — a config and weights that disagree are refused
  before the allocation, not after.
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
HEADER_LIMIT = 100_000_000  # bytes of one safetensors header (safetensors' own reader caps it there)
USIZE = 1 << 64  # safetensors reads every dimension and offset as a 64-bit unsigned integer

# Generous bounds on what a config may ask for: no released language model is within a factor of
# four of any of them, and past them a model cannot be built on this kind of machine anyway.
BOUNDS = {
    "num_hidden_layers": 1024, "n_layer": 1024, "num_layers": 1024,
    "hidden_size": 1 << 17, "n_embd": 1 << 17, "d_model": 1 << 17, "head_dim": 1 << 17,
    "intermediate_size": 1 << 19, "n_inner": 1 << 19, "ffn_dim": 1 << 19,
    "num_attention_heads": 4096, "n_head": 4096, "num_key_value_heads": 4096,
    "vocab_size": 1 << 22,
    "max_position_embeddings": 1 << 24, "n_positions": 1 << 24, "n_ctx": 1 << 24,
    "num_local_experts": 4096, "num_experts": 4096,
}

# A size a model has at least one of: a count of zero divides by zero when transformers reads the config.
POSITIVE = {"num_attention_heads", "n_head", "num_key_value_heads"}

_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
                "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
SLACK = 1 << 20  # parameters a config may ask for beyond twice the weights before the allocation is refused
FIX = "restore the checkpoint as save_pretrained wrote it, or point model.key at another one"
INDEX = "model.safetensors.index.json"  # a sharded checkpoint's map of tensor -> shard file
INDEX_LIMIT = 64 << 20  # bytes of a shard index (a 400B model's is well under 1 MiB)


def _refuse(path: Path, problem: str, fix: str = FIX) -> ModelError:
    return ModelError("model.key", f"{path}: {problem}", fix)


def unreadable(directory: Path, err: Exception) -> ModelError:
    """transformers failing to read a local model directory whose config passed ``check_config`` — a
    field of a type it does not expect (a ``quantization_config`` that is a list), sizes that do not fit
    together (a hidden size no multiple of the heads) — as a refusal naming the folder and the reason,
    not a traceback."""
    from huggingface_hub.errors import StrictDataclassError

    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if isinstance(err, StrictDataclassError) and lines:  # "Validation error for field 'x':" then the reason
        reason = lines[-1]
    else:
        reason = f"{type(err).__name__}: {lines[0] if lines else 'no message'}"
    if len(reason) > 300:
        reason = reason[:297] + "..."
    return _refuse(Path(directory), f"cannot be read by transformers ({reason})", "use the config.json (and "
                   "tokenizer files) saved with these weights: save_pretrained writes them")


def _json_file(path: Path, limit: int, what: str):
    """A small JSON file of the checkpoint's, read as a regular file of at most ``limit`` bytes."""
    try:
        return json.loads(read_bytes(path, limit))
    except NotRegular as err:
        raise _refuse(path, str(err)) from None
    except TooLarge as err:
        raise _refuse(path, f"holds {err}, more than {what}'s {limit} bytes") from None
    except (OSError, ValueError, RecursionError) as err:
        raise _refuse(path, f"cannot be read as JSON ({type(err).__name__}: {err})") from None


def check_config(directory: Path) -> dict:
    """``config.json`` read as a regular file of bounded size, its sizes within ``BOUNDS``."""
    path = Path(directory) / "config.json"
    config = _json_file(path, CONFIG_LIMIT, "a config")
    if not isinstance(config, dict):
        raise _refuse(path, "is not a JSON object")
    _check_sizes(path, config, "")
    return config


def _check_sizes(path: Path, config: dict, prefix: str) -> None:
    for key, value in config.items():
        if isinstance(value, dict) and key.endswith("config"):  # text_config, vision_config, ...
            _check_sizes(path, value, f"{prefix}{key}.")
            continue
        if key == "model_type" and not isinstance(value, str):  # transformers looks it up by name
            raise _refuse(path, f"{prefix}model_type is {_short(value)}, not the name of a model type",
                          "use the config.json saved with these weights")
        bound = BOUNDS.get(key)
        if bound is None or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _refuse(path, f"{prefix}{key} is {_short(value)}, not a size", "use the config.json saved with "
                          "these weights")
        if value == 0 and key in POSITIVE:
            raise _refuse(path, f"{prefix}{key} is 0, and a model has at least one", "use the config.json saved "
                          "with these weights")
        if value > bound:
            raise _refuse(path, f"{prefix}{key} is {value}, beyond any model this project builds (at most "
                          f"{bound})", "use the config.json saved with these weights")


def check_weight_files(directory: Path) -> int:
    """Every ``*.safetensors`` file's header checked, and the shard index transformers would follow;
    the number of elements the files hold in all."""
    total = 0
    files = sorted(Path(directory).glob("*.safetensors"))
    for path in files:
        total += sum(math.prod(shape) for shape in _header(path).values())
    _check_index(Path(directory), {p.name for p in files})
    return total


def _check_index(directory: Path, held: set) -> None:
    """Where there is no ``model.safetensors``, transformers loads the shards ``model.safetensors.index.json``
    names, whatever they are: a ``pytorch_model.bin`` named there would be unpickled, and a file the
    revision does not cover read. Each must be one of the ``.safetensors`` files beside the index
    (``held``, their headers checked), and the index what transformers reads it as."""
    path = directory / INDEX
    if (directory / "model.safetensors").is_file() or not (path.exists() or path.is_symlink()):
        return  # one file, or no index: transformers reads no index
    index = _json_file(path, INDEX_LIMIT, "a shard index")
    if not (isinstance(index, dict) and isinstance(index.get("weight_map"), dict)
            and isinstance(index.get("metadata"), dict)):
        raise _refuse(path, "is not a shard index (an object with a metadata object and a weight_map of "
                      "tensor -> file)")
    for name, shard in index["weight_map"].items():
        if not isinstance(shard, str) or shard not in held:
            raise _refuse(path, f"places tensor {_short(name)} in {_short(shard)}, which is not a .safetensors "
                          "file beside it (weights are read from the model folder's safetensors files only)")


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
            header = _parsed(fh.read(length))
    except NotRegular as err:
        raise _refuse(path, str(err)) from None
    except (OSError, ValueError, RecursionError) as err:
        raise _refuse(path, f"has a header that cannot be read ({type(err).__name__}: {err})") from None
    if not isinstance(header, dict):
        raise _refuse(path, "has a header that is not a JSON object")
    metadata = header.get("__metadata__")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise _refuse(path, f"has a __metadata__ of {_short(metadata)}, not strings by name")
    data = size - 8 - length
    shapes, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shapes[name], span = _checked_entry(path, name, entry, data)
        spans.append((span, name))
    # safetensors' reader takes the tensors in the order of their offsets, each starting where the one
    # before it ended, the last ending where the file does: a gap, an overlap or a tail is refused there.
    end = 0
    for (start, stop), name in sorted(spans):
        if start != end:
            raise _refuse(path, f"places tensor {name} at bytes {start}..{stop}, and the tensors before it end "
                          f"at byte {end} (each tensor's bytes follow the last one's, once: a gap, an overlap, "
                          "or two tensors over the same bytes?)")
        end = stop
    if end != data:
        raise _refuse(path, f"holds {data} bytes of data, and its tensors end at byte {end} (a file cut short "
                      "or given a tail?)")
    return shapes


def _parsed(raw: bytes) -> Any:
    """A header's JSON as safetensors' reader (serde_json) parses it: UTF-8 and nothing else, no NaN or
    Infinity, no string with a lone surrogate, and ``-0`` not an integer. Python's ``json`` accepts
    all four, so a header that relied on one would pass here and fail in transformers' load."""
    def not_json(constant: str):
        raise ValueError(f"{constant} is not JSON")

    header = json.loads(raw.decode("utf-8"), parse_constant=not_json,
                        parse_int=lambda digits: -0.0 if digits == "-0" else int(digits))
    json.dumps(header, ensure_ascii=False).encode("utf-8")  # a lone surrogate ("\ud800") raises here
    return header


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _checked_entry(path: Path, name: str, entry: Any, data: int) -> tuple[list, tuple[int, int]]:
    """A tensor's shape and byte span, refused unless safetensors' reader would take them as they are."""
    try:
        dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
    except (TypeError, KeyError, ValueError):
        raise _refuse(path, f"describes tensor {name} without a dtype, shape and data_offsets") from None
    if not isinstance(dtype, str) or dtype not in _DTYPE_BYTES or not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n < USIZE for n in shape):
        raise _refuse(path, f"describes tensor {name} as {_short(dtype)} {_short(shape)}, not a dtype and shape")
    count = 1
    for n in shape:  # multiplied as the reader multiplies them, in order, in 64 bits
        count *= n
        if count * _DTYPE_BYTES[dtype] * 8 >= USIZE:
            raise _refuse(path, f"describes tensor {name} as {dtype} {_short(shape)}, more elements than "
                          "64 bits count")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (start, end)) or not 0 <= start <= end <= data:
        raise _refuse(path, f"places tensor {name} at bytes {_short(start)}..{_short(end)}, outside the {data} "
                      "bytes of data it holds (a file cut short?)")
    if end - start != count * _DTYPE_BYTES[dtype]:
        raise _refuse(path, f"gives tensor {name} ({dtype} {shape}) {end - start} bytes, not the "
                      f"{count * _DTYPE_BYTES[dtype]} its shape takes")
    return shape, (start, end)


def check_fits(resolved, config, held: int) -> None:
    """Refuse a config whose model cannot be built, asks for more parameters than the weight files
    hold, or has a tensor of a name the files hold at another shape: measured on the meta device (no
    memory taken) before the real model is allocated."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            shell = AutoModelForCausalLM.from_config(config)
    except Exception as err:  # noqa: BLE001 - whatever building the model raises, from_pretrained raises too
        if getattr(config, "auto_map", None):  # the directory's own code, built only as trusted: its load's to report
            return
        # from_pretrained builds the model on the meta device as well, and would fail the same way, with a
        # traceback: a pad_token_id past the vocabulary, a head_dim of 0, a text_config not a config.
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise ModelError("model.key", f"the config.json at {resolved.key!r} describes a model transformers cannot "
                         f"build ({type(err).__name__}: {lines[0] if lines else 'no message'})",
                         "use the config.json saved with these weights (save_pretrained writes both)") from None
    wanted = sum(p.numel() for p in shell.parameters())
    # Only a gross disagreement is refused here, where the model is not yet allocated: a tensor
    # or two missing or at another shape is the load report's to name (complete.py), tensor by
    # tensor; a config asking for twice what the files hold would allocate memory for nothing.
    if wanted > 2 * held + SLACK:
        raise ModelError("model.key", f"the config.json at {resolved.key!r} describes a model of {wanted:,} "
                         f"parameters, and its weight files hold {held:,} values", "use the config.json saved "
                         "with these weights (save_pretrained writes both)")
    _check_shapes(Path(resolved.source), {name: list(t.shape) for name, t in shell.state_dict().items()})


def _check_shapes(directory: Path, wanted: dict) -> None:
    """Refuse a tensor the weight files transformers reads hold under one of the model's own names at
    another shape. The load report would name it too (complete.py, in the same words), but transformers,
    told to ignore mismatched sizes so that its report names them, leaves such a tensor unloaded on the
    meta device, and where the config ties it to another (``tie_word_embeddings``) it compares the two
    there and fails with a ``NotImplementedError`` before any report is made."""
    mismatched = []
    for path in _loaded_files(directory):
        for name, shape in _header(path).items():
            if name in wanted and list(shape) != wanted[name]:
                mismatched.append((name, path.name, list(shape), wanted[name]))
    if mismatched:
        name, file, found, asked = sorted(mismatched)[0]
        raise ModelError("model.key", f"{file} holds {name} with shape {found}, and the model's config.json "
                         f"asks for {asked}" + (f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""),
                         "use the config.json saved with these weights (save_pretrained writes both)")


def _loaded_files(directory: Path) -> list[Path]:
    """The weight files transformers reads: model.safetensors, else the shards its index names."""
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
    try:
        weight_map = json.loads(read_bytes(directory / INDEX, INDEX_LIMIT))["weight_map"]
        return [directory / shard for shard in sorted(set(weight_map.values()))]
    except (OSError, ValueError, RecursionError, TypeError, KeyError):  # no index: transformers reports none
        return []

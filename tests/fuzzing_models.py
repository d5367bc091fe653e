"""Mutated model directories, and the two properties a model directory is held to (tests/test_fuzz_inputs.py
and scripts/fuzz_models.py share them).

``mutated_model()`` draws a copy of tiny-llama (documents/models/tiny-llama) changed one to three times:

* config.json: a size (``hidden_size``, ``num_hidden_layers``, …) made negative, huge, a float, a
  string, a bool or null; a key deleted or given arbitrary JSON; sizes nested in a ``text_config``;
  another ``model_type``; tied embeddings; or the file's bytes cut, not UTF-8, not an object, past
  the 1 MiB a config may hold;
* model.safetensors, through its parsed header (written back with a consistent length): a tensor's
  dtype string, shape or data_offsets replaced, a tensor renamed, dropped, added, reshaped to the
  same number of elements, two tensors' bytes swapped, ``__metadata__`` replaced; or its data bytes
  overwritten;
* model.safetensors, as bytes: the 8-byte little-endian header length replaced, bytes of the JSON
  header flipped, inserted or deleted, the file cut at a random offset or given a tail;
* the files themselves: a weight file or the config missing, a folder, a FIFO, a symlink to
  ``/dev/zero`` or to nothing; a second ``.safetensors`` file; a shard index (the weights moved to a
  shard, or not) naming files that are or are not there, a pickled ``pytorch_model.bin``, a file
  outside the folder.

``preflight(folder)`` runs the checks a load makes before anything is allocated, in the loader's
order — ``loading.weights_digest`` (resolution), ``checkpoint.check_config`` and the config read by
transformers (``loading.load_config``), ``checkpoint.check_weight_files``, ``checkpoint.check_fits`` —
and returns None (passed) or the ``CausalabError`` raised; any other exception propagates.
``loaded_whole(folder)`` loads the folder on the hooks engine and holds every parameter to the tensor
of that name in the weight files transformers reads, bit for bit (in the model's dtype): returns the
engine, or the ``CausalabError`` the load raised.
``deadline(seconds)`` raises ``Hang`` (a ``BaseException``, which no ``except Exception`` swallows)
from a call still running after ``seconds``.
"""
from __future__ import annotations

import copy
import json
import os
import signal
import struct
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

from causalab_mini.errors import CausalabError
from fuzzing import JSON, MODELS, Blob

SOURCE = MODELS / "tiny-llama"
KEY = "my-llama"  # the folder's name in each example's model root: HooksEngine.load({"key": KEY}, models=[root])
ORIGINAL = {p.name: p.read_bytes() for p in sorted(SOURCE.iterdir()) if p.is_file()}
CONFIG = json.loads(ORIGINAL["config.json"])
WEIGHTS = ORIGINAL["model.safetensors"]
_LENGTH = struct.unpack("<Q", WEIGHTS[:8])[0]
HEADER = json.loads(WEIGHTS[8:8 + _LENGTH])
DATA_BYTES = WEIGHTS[8 + _LENGTH:]
TENSORS = sorted(k for k in HEADER if k != "__metadata__")


def _pickled() -> bytes:
    """tiny-llama's tensors as ``torch.save`` writes them: a pickled ``pytorch_model.bin``."""
    import io

    import torch
    from safetensors.torch import load

    buffer = io.BytesIO()
    torch.save(load(WEIGHTS), buffer)
    return buffer.getvalue()


PICKLED = _pickled()

# Config keys that are sizes (the checked BOUNDS and the ones the model's shapes follow from).
SIZES = sorted({"num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings", "head_dim", "n_layer",
                "n_embd", "n_head", "num_local_experts", "pad_token_id", "bos_token_id", "eos_token_id"})
ODD_SIZES = [-1, -2 ** 63, 0, 1, 2, 3, 31, 33, 64, 1024, 1025, 2 ** 17, 2 ** 17 + 1, 2 ** 22, 2 ** 31, 2 ** 63,
             2 ** 64, 10 ** 12, 10 ** 400, 1.5, 32.0, -0.0, float("inf"), float("nan"), "32", "", True, False,
             None, [], [32], {}, {"value": 32}]
DTYPES = ["F16", "BF16", "F64", "I32", "I64", "U8", "I8", "U16", "U32", "U64", "BOOL", "F8_E4M3", "F8_E5M2",
          "F8_E8M0", "F4", "C64", "f32", "F32 ", "float32", "", None, 3, ["F32"]]
SHAPES = [[], [0], [-1], [1], [2 ** 62, 0], [2 ** 64], [2 ** 32, 2 ** 32], [1.5], ["32"], [True], [None],
          [[32]], None, "32", 32, {}]
OFFSETS = [[0, 0], [-1, 0], [0, -1], [0, 2 ** 64], [2 ** 63, 2 ** 63], [1.5, 2], ["0", "4"], [0], [0, 4, 8],
           None, "0", [True, 4], [None, None], []]
METADATA = [{"format": "pt"}, {"format": "tf"}, {"format": "np"}, {"format": 1}, {"format": None}, {},
            {"x": {"y": 1}}, {"x": [1]}, None, [], "pt", 3]
NAMES = ["model.layers.2.mlp.up_proj.weight", "model.embed_tokens.bias", "lm_head.bias", "model.norm.bias",
         "transformer.wte.weight", "lm_head.weight", "model.embed_tokens.weight", "", ".", "__metadata__ ",
         "model.layers.0.self_attn.rotary_emb.inv_freq", "model.layers.-1.mlp.up_proj.weight"]
TENSOR_KINDS = ["missing", "folder", "fifo", "/dev/zero", "dangling"]


@dataclass
class ModelCase:
    """One mutated directory: what was done (``steps``) and the files, each bytes or a kind of non-file."""

    steps: list = field(default_factory=list)
    config: object = None  # parsed config (serialized at the end) unless ``files`` holds its bytes
    header: object = None  # parsed header, written back with a consistent length, unless bytes took over
    data: bytearray = None
    files: dict = field(default_factory=dict)  # name -> Blob | a TENSOR_KINDS word (overrides the parsed)

    def __repr__(self) -> str:
        return f"ModelCase({'; '.join(self.steps) or 'unchanged'})"

    def _repr_pretty_(self, printer, cycle) -> None:  # how hypothesis shows a failing example: the steps
        printer.text(repr(self))

    def weights(self) -> bytes:
        text = json.dumps(self.header, separators=(",", ":"), allow_nan=True).encode("utf-8", "surrogatepass")
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text + bytes(self.data)

    def materialize(self, folder: Path) -> Path:
        """The directory written under ``folder / KEY`` (``folder`` is the example's model root)."""
        target = Path(folder) / KEY
        target.mkdir(parents=True)
        files = {name: data for name, data in ORIGINAL.items()}
        if self.config is not None:
            files["config.json"] = json.dumps(self.config, indent=2, allow_nan=True).encode("utf-8", "surrogatepass")
        if self.header is not None:
            files["model.safetensors"] = self.weights()
        files.update(self.files)
        for name, data in files.items():
            path = target / name
            if isinstance(data, bytes):
                path.write_bytes(data)
            elif data == "folder":
                path.mkdir()
            elif data == "fifo":
                os.mkfifo(path)
            elif data == "/dev/zero":
                path.symlink_to("/dev/zero")
            elif data == "dangling":
                path.symlink_to(target / "nowhere")
            # "missing": not written
        return target


def _pick(draw, values):
    return copy.deepcopy(draw(st.sampled_from(values)))


def _config_step(draw, case: ModelCase) -> None:
    config = case.config
    action = draw(st.sampled_from(["size", "size", "size", "delete", "replace", "nest", "type", "tie", "bytes"]))
    if action == "size":
        key = draw(st.sampled_from(SIZES))
        old = config.get(key, 32)
        value = draw(st.sampled_from(ODD_SIZES) | st.sampled_from(
            [old * 2 if isinstance(old, int) else 0, old // 2 if isinstance(old, int) else 0, old]) | st.integers())
        config[key] = value
        case.steps.append(f"config {key} = {value!r}")
    elif action == "delete" and config:
        key = draw(st.sampled_from(sorted(config)))
        del config[key]
        case.steps.append(f"config without {key}")
    elif action == "replace" and config:
        key = draw(st.sampled_from(sorted(config) + ["rope_parameters", "text_config", "quantization_config"]))
        config[key] = draw(JSON)
        case.steps.append(f"config {key} = {config[key]!r}")
    elif action == "nest":  # sizes (odd or the config's own) nested as a multimodal config nests them
        inner = {key: (draw(st.sampled_from(ODD_SIZES)) if draw(st.booleans()) else config.get(key, 8))
                 for key in draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=3, unique=True))}
        name = draw(st.sampled_from(["text_config", "vision_config", "text_config"]))
        if draw(st.booleans()):
            inner = {**config, **inner}
        config[name] = inner
        case.steps.append(f"config {name} = {inner!r}")
    elif action == "type":
        key = draw(st.sampled_from(["model_type", "architectures"]))
        config[key] = _pick(draw, ["gpt2", "gemma2", "mistral", "qwen2", "bert", "t5", "", "foo", None, 3,
                                   ["LlamaForCausalLM"], ["GPT2LMHeadModel"], ["Foo"], [], "LlamaForCausalLM"])
        case.steps.append(f"config {key} = {config[key]!r}")
    elif action == "tie":
        config["tie_word_embeddings"] = _pick(draw, [True, False, None, "yes", 1])
        case.steps.append(f"config tie_word_embeddings = {config['tie_word_embeddings']!r}")
    elif action == "bytes":
        text = json.dumps(config, indent=2).encode()
        how = draw(st.sampled_from(["cut", "not utf-8", "array", "empty", "huge", "nan", "deep"]))
        case.files["config.json"] = Blob({
            "cut": text[: draw(st.integers(0, max(len(text) - 1, 0)))],
            "not utf-8": b"\xff\xfe" + text,
            "array": json.dumps([config]).encode(),
            "empty": b"",
            "huge": b'{"hidden_size": 32, "pad": "' + b"x" * (1 << 20) + b'"}',
            "nan": text.replace(b'"initializer_range": 0.02', b'"initializer_range": NaN'),
            "deep": b'{"text_config": ' * 200 + b"{}" + b"}" * 200,
        }[how])
        case.steps.append(f"config.json {how}")


def _header_step(draw, case: ModelCase) -> None:
    header = case.header
    names = sorted(k for k in header if k != "__metadata__")
    action = draw(st.sampled_from(["dtype", "shape", "offsets", "rename", "drop", "add", "reshape", "swap",
                                   "metadata", "data"]))
    if not names and action not in ("add", "metadata", "data"):
        return
    name = draw(st.sampled_from(names)) if names else None
    entry = header.get(name)
    if action in ("dtype", "shape", "offsets") and not isinstance(entry, dict):
        return
    if action == "dtype":
        entry["dtype"] = _pick(draw, DTYPES)
        case.steps.append(f"header {name} dtype {entry['dtype']!r}")
    elif action == "shape":
        shape = entry.get("shape") if isinstance(entry.get("shape"), list) else []
        entry["shape"] = _pick(draw, SHAPES + [shape[::-1], shape + [1], [1] + shape, shape[:-1],
                                               [n + 1 if isinstance(n, int) else n for n in shape]])
        case.steps.append(f"header {name} shape {entry['shape']!r}")
    elif action == "offsets":
        offsets = entry.get("data_offsets")
        start, end = offsets if isinstance(offsets, list) and len(offsets) == 2 and all(
            type(n) is int for n in offsets) else (0, 0)
        entry["data_offsets"] = _pick(draw, OFFSETS + [[end, start], [start, end + 1], [start + 4, end + 4],
                                                       [start - 4, end - 4], [start, len(case.data)],
                                                       [start, end - 1], [0, end - start]])
        case.steps.append(f"header {name} data_offsets {entry['data_offsets']!r}")
    elif action == "rename":
        new = draw(st.sampled_from(NAMES + names) | st.text(max_size=12))
        header[new] = header.pop(name)
        case.steps.append(f"header {name} renamed {new!r}")
    elif action == "drop":
        del header[name]
        if draw(st.booleans()) and isinstance(entry, dict):  # its bytes gone too: the others shifted
            case.steps.append(f"header without {name}, its bytes cut out")
            _cut_bytes(case, entry)
        else:
            case.steps.append(f"header without {name}")
    elif action == "add":
        new = draw(st.sampled_from(NAMES) | st.text(max_size=12))
        if draw(st.booleans()) and isinstance(entry, dict):  # over another tensor's bytes
            header[new] = copy.deepcopy(entry)
            case.steps.append(f"header {new!r} added over {name}'s bytes")
        else:  # bytes of its own, appended
            shape = _pick(draw, [[32], [170, 32], [2, 2], [0], []])
            size = 4 * _prod(shape)
            header[new] = {"dtype": "F32", "shape": shape, "data_offsets": [len(case.data), len(case.data) + size]}
            case.data += bytes(draw(st.binary(min_size=size, max_size=size))) if size <= 64 else b"\x00" * size
            case.steps.append(f"header {new!r} added, F32 {shape}, appended")
    elif action == "reshape":  # the same number of elements in another shape
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
            n = _prod(shape)
            options = [[n], [1, n], [n, 1], shape[::-1]] + [[d, n // d] for d in (2, 4, 8, 16, 64) if n % d == 0]
            entry["shape"] = _pick(draw, options)
            case.steps.append(f"header {name} reshaped {shape} -> {entry['shape']}")
    elif action == "swap":  # two tensors' bytes exchanged (sizes equal or not)
        other = draw(st.sampled_from(names))
        if other != name and isinstance(header.get(other), dict) and isinstance(entry, dict):
            entry["data_offsets"], header[other]["data_offsets"] = header[other].get("data_offsets"), entry.get(
                "data_offsets")
            case.steps.append(f"header {name} and {other} swap data_offsets")
    elif action == "metadata":
        if draw(st.booleans()):
            header["__metadata__"] = _pick(draw, METADATA)
            case.steps.append(f"header __metadata__ = {header['__metadata__']!r}")
        else:
            header.pop("__metadata__", None)
            case.steps.append("header without __metadata__")
    else:  # data bytes overwritten: loads, with other values (NaN, inf, subnormals possible)
        at = draw(st.integers(0, max(len(case.data) - 1, 0)))
        junk = draw(st.binary(min_size=1, max_size=16))
        case.data[at:at + len(junk)] = junk
        case.steps.append(f"data bytes {at}..{at + len(junk)} overwritten")


def _cut_bytes(case: ModelCase, entry: dict) -> None:
    offsets = entry.get("data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)):
        return
    start, end = offsets
    if not 0 <= start <= end <= len(case.data):
        return
    del case.data[start:end]
    for other in case.header.values():
        if isinstance(other, dict) and isinstance(other.get("data_offsets"), list):
            o = other["data_offsets"]
            if len(o) == 2 and all(type(n) is int for n in o) and o[0] >= end:
                other["data_offsets"] = [o[0] - (end - start), o[1] - (end - start)]


def _prod(shape) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def _bytes_step(draw, case: ModelCase) -> None:
    if not isinstance(case.files.get("model.safetensors", b""), bytes):
        return
    data = bytearray(case.files["model.safetensors"] if "model.safetensors" in case.files else case.weights())
    length = struct.unpack("<Q", bytes(data[:8]))[0] if len(data) >= 8 else 0
    action = draw(st.sampled_from(["length", "header", "header", "truncate", "truncate", "append"]))
    if action == "length" and len(data) >= 8:
        value = draw(st.sampled_from([0, 1, 2, 7, 8, length - 1, length + 1, length + 8, len(data) - 8,
                                      len(data) - 7, len(data), 2 ** 31, 2 ** 32, 100 << 20, (100 << 20) + 1,
                                      10 ** 15, 2 ** 63, 2 ** 64 - 1]) | st.integers(0, 2 ** 64 - 1))
        data[:8] = struct.pack("<Q", max(value, 0) % 2 ** 64)
        case.steps.append(f"header length {value}")
    elif action == "header" and length and 8 + length <= len(data):
        at = draw(st.integers(8, 8 + length - 1))
        how = draw(st.sampled_from(["set", "insert", "delete"]))
        junk = draw(st.binary(min_size=1, max_size=4) | st.sampled_from(
            [b'"', b"{", b"}", b",", b":", b"[", b"]", b"0", b"-", b"9" * 30, b"\\", b"\x00", b"\xff", b"e999",
             b" ", b"n", b"\xc3"]))
        if how == "set":
            data[at:at + len(junk)] = junk
        elif how == "insert":
            data[at:at] = junk
        else:
            del data[at:at + len(junk)]
        case.steps.append(f"header byte {at} {how} {junk!r}")
    elif action == "truncate":
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        del data[at:]
        case.steps.append(f"weights cut at {at}")
    else:
        junk = draw(st.binary(max_size=64) | st.sampled_from([b"\x00" * 4096, b" " * 8]))
        data += junk
        case.steps.append(f"weights + {len(junk)} bytes")
    case.files["model.safetensors"] = Blob(bytes(data))


def _files_step(draw, case: ModelCase) -> None:
    action = draw(st.sampled_from(["kind", "shard", "index"]))
    if action == "kind":
        name = draw(st.sampled_from(["model.safetensors", "model.safetensors", "config.json"]))
        case.files[name] = draw(st.sampled_from(TENSOR_KINDS))
        case.steps.append(f"{name} is {case.files[name]}")
    elif action == "shard":  # a second weight file, no index naming it
        name = draw(st.sampled_from(["model-00002-of-00002.safetensors", "extra.safetensors", ".safetensors"]))
        what = draw(st.sampled_from(["copy", "empty", "header", "kind"]))
        case.files[name] = {"copy": Blob(case.weights()), "empty": Blob(b""),
                            "header": Blob(struct.pack("<Q", 2) + b"{}"),
                            "kind": draw(st.sampled_from(TENSOR_KINDS[1:]))}[what]
        case.steps.append(f"{name} ({what})")
    else:  # a shard index: transformers follows it where there is no model.safetensors
        shard = "model-00001-of-00002.safetensors"
        if draw(st.booleans()):  # the weights moved to a shard, so the index is followed
            moved = case.files.pop("model.safetensors", None)
            case.files[shard] = moved if moved is not None else Blob(case.weights())
            case.files["model.safetensors"] = "missing"
            case.steps.append(f"model.safetensors moved to {shard}")
        maps = {
            "whole": {t: shard for t in TENSORS},
            "partial": {t: shard for t in TENSORS[: len(TENSORS) // 2]},
            "missing shard": {t: "model-00002-of-00002.safetensors" for t in TENSORS},
            "outside": {t: "../../etc/passwd" for t in TENSORS},
            "subfolder": {t: f"sub/{shard}" for t in TENSORS},
            "config": {t: "config.json" for t in TENSORS},
            "pickle": {t: "pytorch_model.bin" for t in TENSORS},
            "odd": {t: draw(JSON) for t in TENSORS[:2]},
        }
        which = draw(st.sampled_from(sorted(maps) + ["not json", "list", "no map", "no metadata", "odd metadata"]))
        metadata = {"total_size": len(DATA_BYTES)}
        if which == "not json":
            text = b"{"
        elif which == "list":
            text = b"[]"
        elif which == "no map":
            text = json.dumps({"metadata": metadata}).encode()
        elif which in ("no metadata", "odd metadata"):
            index = {"weight_map": maps["whole"]}
            if which == "odd metadata":
                index["metadata"] = draw(st.sampled_from([None, [], 1, "x"]))
            text = json.dumps(index).encode()
        else:
            text = json.dumps({"metadata": metadata, "weight_map": maps[which]}, allow_nan=True).encode()
        if which == "pickle":  # what the index names, pickled: never to be read
            case.files["pytorch_model.bin"] = Blob(PICKLED)
        case.files["model.safetensors.index.json"] = Blob(text)
        case.steps.append(f"index {which}")


@st.composite
def mutated_model(draw, rounds=(1, 3)):
    """A tiny-llama directory changed ``rounds`` times (a ``ModelCase``; ``materialize`` writes it)."""
    case = ModelCase(config=copy.deepcopy(CONFIG), header=copy.deepcopy(HEADER), data=bytearray(DATA_BYTES))
    # Byte-level changes come last: they act on the serialized file, which later parsed changes would rewrite.
    order = ["config", "header", "bytes", "files"]
    kinds = sorted(draw(st.lists(st.sampled_from(["config", "header", "header", "bytes", "files"]),
                                 min_size=rounds[0], max_size=rounds[1])), key=order.index)
    for kind in kinds:
        {"config": _config_step, "header": _header_step, "bytes": _bytes_step, "files": _files_step}[kind](draw, case)
    return case


class Hang(BaseException):
    """A call still running past its deadline (a BaseException: no ``except Exception`` swallows it)."""


@contextmanager
def deadline(seconds: float):
    """Raise ``Hang`` in the block once ``seconds`` of wall time have passed (SIGALRM: the main thread)."""
    def fire(_signum, _frame):
        raise Hang(f"still running after {seconds} s")

    before = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def preflight(folder: Path):
    """The checks a load makes before the model is allocated (see the module's docstring): None when
    every one passes, else the ``CausalabError`` raised."""
    from causalab_mini.model import checkpoint, loading

    folder = Path(folder)
    try:
        digest = loading.weights_digest(folder)  # what resolution hashes first
        resolved = loading.ResolvedModel(KEY, str(folder), digest, True, weights=digest)
        # checkpoint.check_config, then transformers' own reading of the config, refused typed
        config = loading.load_config(resolved, [folder.parent])
        held = checkpoint.check_weight_files(folder)  # load_causal_lm's checks
        checkpoint.check_fits(resolved, config, held)
    except CausalabError as err:
        return err
    return None


def file_tensors(folder: Path) -> dict:
    """Every tensor transformers may read from ``folder``, by name (a list: two shards may hold one name):
    model.safetensors where there is one, else each shard file the index names, whole."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return {name: [tensor] for name, tensor in load_file(folder / "model.safetensors").items()}
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    out: dict = {}
    for shard in sorted(set(weight_map.values())):  # each shard read whole
        for name, tensor in load_file(folder / shard).items():
            out.setdefault(name, []).append(tensor)
    return out


def loaded_whole(folder: Path):
    """``HooksEngine.load`` of ``folder``: the engine, every parameter equal (bit for bit, in the model's
    dtype) to the tensor of its name in the weight files; or the ``CausalabError`` the load raised."""
    import torch

    from causalab_mini.engine.hooks import HooksEngine

    folder = Path(folder)
    try:
        engine = HooksEngine.load({"key": KEY}, models=[folder.parent])
    except CausalabError as err:
        return err
    stored = file_tensors(folder)
    for name, param in engine.model.named_parameters(remove_duplicate=False):
        assert name in stored, f"{name} was loaded, and no weight file holds it: initialised, not read"
        got = param.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        shapes = [list(t.shape) for t in stored[name]]
        assert list(param.shape) in shapes, f"{name}: {list(param.shape)} loaded, {shapes} stored"
        assert any(torch.equal(got, t.to(param.dtype).contiguous().reshape(-1).view(torch.uint8))
                   for t in stored[name] if list(t.shape) == list(param.shape)), \
            f"{name} holds other values than the weight file's"
    return engine

"""A model directory is input too: its config and its weight files' headers are checked before
anything is built from them. Each case is a real copy of tiny-llama with one file changed; each is
refused by the CLI with exit 2, no traceback, the file named, within a bounded time — config-only
cases already by ``explain``, which reads no weights.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess

import pytest
from paths import DATA, MODELS, V2
from safetensors.torch import load_file
from samples import cli_command


def _model_dir(tmp_path, edit) -> str:
    folder = tmp_path / "my-llama"
    shutil.copytree(MODELS / "tiny-llama", folder)
    edit(folder)
    doc = json.loads((V2 / "patching.causalab.json").read_text())
    doc["model"] = {"key": "my-llama"}
    path = tmp_path / "doc.causalab.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _config(**changes):
    def edit(folder):
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))
    return edit


def _truncated(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _header_length(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 10 ** 15) + weights.read_bytes()[8:])


def _fifo_weights(folder):
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")


CONFIG_CASES = {
    "layers": (_config(num_hidden_layers=10 ** 12), "num_hidden_layers is 1000000000000, beyond any model"),
    "hidden": (_config(hidden_size=10 ** 6), "hidden_size is 1000000, beyond any model"),
    "negative": (_config(vocab_size=-5), "vocab_size is -5, not a size"),
}
WEIGHT_CASES = {
    "truncated": (_truncated, "outside the"),
    "header": (_header_length, "says its header is 1000000000000000 bytes"),
    "fifo": (_fifo_weights, "is a FIFO (named pipe), not a regular file"),
    # A config that disagrees with the weights: grossly (refused before the model is allocated),
    # or a little (refused by the load report, naming the tensor and both shapes).
    "vocab_gross": (_config(vocab_size=100_000), "parameters, and its weight files hold {held:,} values"),
    "vocab": (_config(vocab_size=4096), "model.safetensors holds lm_head.weight with shape [170, 32], and the "
                                        "model's config.json asks for [4096, 32]"),
}


def _cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _refused(done, said: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ModelError: model.key: ") and said in last, last


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_config_out_of_bounds_is_refused_before_anything_is_built(tmp_path, case):
    edit, said = CONFIG_CASES[case]
    doc = _model_dir(tmp_path, edit)
    _refused(_cli("explain", doc, "--data", DATA), said)
    _refused(_cli("run", doc, "--engine", "hooks", "--data", DATA, "--out", tmp_path / "out", timeout=300), said)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
@pytest.mark.parametrize("case", list(WEIGHT_CASES))
def test_a_weight_file_that_does_not_hold_what_it_says_is_refused(tmp_path, case, engine):
    edit, said = WEIGHT_CASES[case]
    said = said.format(held=sum(t.numel() for t in load_file(str(MODELS / "tiny-llama" / "model.safetensors")).values()))
    doc = _model_dir(tmp_path, edit)
    _refused(_cli("run", doc, "--engine", engine, "--data", DATA, "--out", tmp_path / "out", timeout=300), said)
    assert not (tmp_path / "out").exists()

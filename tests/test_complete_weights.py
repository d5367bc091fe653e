"""A checkpoint that is not whole is refused by name, never run on tensors transformers made up.

Each case is a real copy of tiny-llama with its safetensors file rewritten: a tensor removed, a
tensor at another shape, a tensor the model has no place for. transformers would load the first
two with random values (the run's numbers then change from load to load); both engines refuse
all three before any forward, naming the file and the tensor.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch
from paths import DATA, MODELS, V2
from safetensors.torch import load_file, save_file
from samples import cli_command

import causalab_mini as cm

TENSOR = "model.layers.0.mlp.down_proj.weight"


def _checkpoint(tmp_path, edit) -> str:
    folder = tmp_path / "my-llama"
    shutil.copytree(MODELS / "tiny-llama", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    doc = json.loads((V2 / "patching.causalab.json").read_text())
    doc["model"] = {"key": "my-llama"}
    path = tmp_path / "doc.causalab.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _without(tensors):
    del tensors[TENSOR]


def _transposed(tensors):
    tensors[TENSOR] = tensors[TENSOR].T.contiguous()


def _extra(tensors):
    tensors["model.layers.7.mlp.down_proj.weight"] = torch.zeros(2, 2)


CASES = {
    "missing": (_without, f"the weights at 'my-llama' (model.safetensors) lack {TENSOR}, which transformers "
                          "would initialise at random"),
    "mismatched": (_transposed, f"model.safetensors holds {TENSOR} with shape [64, 32], and the model's "
                                "config.json asks for [32, 64]"),
    "unexpected": (_extra, "model.safetensors holds model.layers.7.mlp.down_proj.weight, which the model its "
                           "config.json describes has no place for"),
}


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_not_whole_is_refused_naming_the_file_and_tensor(tmp_path, engine, case):
    edit, said = CASES[case]
    doc = _checkpoint(tmp_path, edit)
    with pytest.raises(cm.ModelError) as refused:
        cm.run(doc, engine=engine, data=DATA, out=tmp_path / "out")
    assert refused.value.path == "model.key"
    assert said in str(refused.value)
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_cli_refuses_a_missing_tensor_without_a_traceback(tmp_path):
    doc = _checkpoint(tmp_path, _without)
    done = subprocess.run([*cli_command(), "run", doc, "--engine", "hooks", "--data", str(DATA),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ModelError: model.key: ") and TENSOR in done.stderr
    assert "Traceback" not in done.stderr and "newly initialized" not in done.stderr
    assert not (tmp_path / "out").exists()

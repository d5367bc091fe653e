"""No code from a model directory, and no pickle, on either engine.

A hostile directory is the shipped tiny-llama with a payload beside it: Python code its
config or tokenizer config names through ``auto_map`` (the payload only writes a marker
file when imported), or pickled weights that differ from the safetensors ones. Without
``--trust-remote-code`` the payload never runs — not on ``explain``, not on ``run``, not
when a terminal would answer transformers' "run the custom code? [y/N]" with "y" — and
the refusal says why. Weights load from safetensors only, so a ``.bin`` beside them
changes nothing, and a directory holding only pickled weights is refused by name.
"""
from __future__ import annotations

import json
import os
import pty
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

import causalab_mini as cm
from causalab_mini.model import loading
from paths import DATA, MODELS
from samples import cli_command, patching_document


ENGINES = ("nnterp", "hooks")
PAYLOAD = '''from pathlib import Path
Path({marker!r}).write_text("the model directory's code ran")
from transformers import LlamaConfig as EvilConfig, LlamaForCausalLM as EvilModel  # noqa: E402
'''


def _hostile(tmp_path: Path, where: str) -> tuple[Path, Path]:
    """(models root, marker): tiny-llama whose ``where`` file names a payload in an auto_map."""
    root = tmp_path / "models"
    folder = root / "tiny-llama"
    shutil.copytree(MODELS / "tiny-llama", folder)
    marker = tmp_path / "payload-ran"
    (folder / "evil.py").write_text(PAYLOAD.format(marker=str(marker)))
    config = json.loads((folder / where).read_text())
    config["auto_map"] = ({"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
                          if where == "config.json" else {"AutoTokenizer": ["evil.EvilTokenizer", None]})
    (folder / where).write_text(json.dumps(config))
    return root, marker


def _document(tmp_path: Path) -> Path:
    doc = tmp_path / "doc.causalab.json"
    doc.write_text(json.dumps(patching_document()))
    return doc


def _cli(*args, cwd=None):
    return subprocess.run([*cli_command(), *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_a_directorys_own_code_is_refused_without_the_flag(tmp_path, where):
    root, marker = _hostile(tmp_path, where)
    doc = _document(tmp_path)
    runs = [("explain", doc, "--models", root, "--data", DATA)]
    runs += [("run", doc, "--engine", e, "--models", root, "--data", DATA, "--out", tmp_path / e) for e in ENGINES]
    for args in runs:
        done = _cli(*args)
        assert done.returncode == 2, done.stderr
        assert "error: ModelError: model.key:" in done.stderr and "auto_map" in done.stderr, done.stderr
        assert "--trust-remote-code" in done.stderr and "Traceback" not in done.stderr
        assert not marker.exists(), f"{args[0]} ran the directory's code"


def test_a_terminal_answering_yes_runs_nothing(tmp_path):
    """transformers asks "run the custom code? [y/N]" only when trust_remote_code is left unset;
    it is always passed, so a terminal that would answer "y" is never asked."""
    root, marker = _hostile(tmp_path, "config.json")
    doc = _document(tmp_path)
    for engine in ENGINES:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the CLI on a terminal
            command = cli_command()
            os.execv(command[0], [*command, "run", str(doc), "--engine", engine, "--models", str(root),
                                  "--data", str(DATA), "--out", str(tmp_path / engine)])
        output, deadline = b"", time.monotonic() + 120
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                output += chunk
                if b"[y/N]" in chunk:
                    os.write(fd, b"y\n")
        _, status = os.waitpid(pid, 0)
        os.close(fd)
        assert os.WEXITSTATUS(status) == 2, output.decode(errors="replace")
        assert b"auto_map" in output and b"[y/N]" not in output
        assert not marker.exists()


def test_the_flag_is_what_allows_it(tmp_path):
    """With --trust-remote-code the directory's code is the user's choice, and it does run."""
    root, marker = _hostile(tmp_path, "config.json")
    done = _cli("explain", _document(tmp_path), "--models", root, "--data", DATA, "--trust-remote-code")
    assert done.returncode == 0, done.stderr
    assert marker.exists()


def _with_pickle(tmp_path: Path, keep_safetensors: bool) -> Path:
    """tiny-llama plus a pytorch_model.bin whose lm_head is negated (and, or else, its safetensors
    renamed so from_pretrained finds none by the standard name)."""
    from transformers import AutoModelForCausalLM

    root = tmp_path / "models"
    folder = root / "tiny-llama"
    shutil.copytree(MODELS / "tiny-llama", folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["lm_head.weight"] = -state["lm_head.weight"]
    torch.save(state, folder / "pytorch_model.bin")
    if not keep_safetensors:
        (folder / "model.safetensors").rename(folder / "other.safetensors")
    return root


def test_pickled_weights_are_never_read(tmp_path):
    """A .bin beside the safetensors changes no number on either engine; the revision is unmoved."""
    root = _with_pickle(tmp_path, keep_safetensors=True)
    assert loading.weights_digest(root / "tiny-llama") == loading.weights_digest(MODELS / "tiny-llama")
    doc = cm.read(patching_document(), path=_document(tmp_path))
    for engine in ENGINES:
        got = []
        for models in (MODELS, root):
            loaded = cm.load(doc, engine=engine, models=[models])
            got.append(cm.run(doc, loaded=loaded, data=[DATA]).plan.steps["score"].results)
        assert torch.equal(got[0]["logit_diff"], got[1]["logit_diff"]), engine


def test_a_directory_with_only_pickled_weights_under_the_standard_name_is_refused(tmp_path):
    from causalab_mini.errors import ModelError

    root = _with_pickle(tmp_path, keep_safetensors=False)
    doc = cm.read(patching_document(), path=_document(tmp_path))
    for engine in ENGINES:
        with pytest.raises(ModelError) as caught:
            cm.load(doc, engine=engine, models=[root])
        assert str(caught.value).startswith("model.key:") and "safetensors" in str(caught.value)

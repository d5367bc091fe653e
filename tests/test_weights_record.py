"""Which weights a run ran on: recorded in run.json and in a baseline whether or not the document
pins a revision, and a baseline that drifts because the weights changed says so first.

The digest is checked against an independent sha256 of the checkpoint's files (names and bytes),
never against the project's own ``weights_digest``.
"""
from __future__ import annotations

import copy
import hashlib
import json
import shlex
import shutil
from pathlib import Path

import pytest
from paths import DATA, MODELS, V2
from safetensors.torch import load_file, save_file

import causalab_mini as cm

pytest_plugins = ["pytester"]


def sha256_of(directory: Path) -> str:
    """What a checkpoint's weights are, computed here by hand: sha256 over each safetensors file's
    name and the sha256 of its bytes, in name order."""
    outer = hashlib.sha256()
    for f in sorted(directory.glob("*.safetensors")):
        outer.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return "sha256:" + outer.hexdigest()


REVISION_SUFFIXES = (".safetensors", ".json", ".txt", ".model", ".jinja", ".tiktoken")


def revision_of(directory: Path) -> str:
    """What a checkpoint's revision is, computed here by hand: the same construction over every
    top-level file the model, config and tokenizer loaders read (weights, config, tokenizer, chat
    template), in name order."""
    outer = hashlib.sha256()
    for f in sorted(p for p in directory.iterdir()
                    if not p.name.startswith(".") and p.name.endswith(REVISION_SUFFIXES)):
        outer.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return "sha256:" + outer.hexdigest()


def unpinned(model_key: str) -> dict:
    doc = json.loads((V2 / "patching.causalab.json").read_text())
    doc["header"]["expect"] = []
    doc["model"] = {"key": model_key, "dtype": "fp32"}
    return doc


def own_checkpoint(folder: Path) -> Path:
    """A copy of tiny-llama that a test may change."""
    return Path(shutil.copytree(MODELS / "tiny-llama", folder / "my-llama"))


def nudge(checkpoint: Path) -> None:
    """Other weights: the unembedding scaled, so every logit (and every logit_diff) moves."""
    path = checkpoint / "model.safetensors"
    tensors = load_file(str(path))
    name = next(n for n in tensors if "embed_tokens" in n or "lm_head" in n)
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_run_json_records_the_weights_digest_of_an_unpinned_document(tmp_path):
    checkpoint = own_checkpoint(tmp_path)
    doc_path = tmp_path / "unpinned.causalab.json"
    doc_path.write_text(json.dumps(unpinned("my-llama")))
    ran = cm.run(doc_path, engine="hooks", out=tmp_path / "out", data=DATA)
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    config = "sha256:" + hashlib.sha256((checkpoint / "config.json").read_bytes()).hexdigest()
    assert record["model"] == {"key": "my-llama", "revision": revision_of(checkpoint),
                               "weights": sha256_of(checkpoint), "config": config}
    assert ran.point().weights == sha256_of(checkpoint)
    assert cm.open(tmp_path / "out").point().weights == sha256_of(checkpoint)


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
def test_a_pinned_document_records_the_same_digest_on_both_engines(tmp_path, engine):
    cm.run(V2 / "patching.causalab.json", engine=engine, out=tmp_path)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["model"]["weights"] == sha256_of(MODELS / "tiny-llama")
    assert record["model"]["revision"] == revision_of(MODELS / "tiny-llama")
    assert record["model"]["revision"] == cm.read(V2 / "patching.causalab.json").model.revision


def test_a_drift_from_an_edited_config_says_so_first(tester):
    """config.json decides the numbers too (here the norm's epsilon): a baseline records its digest,
    and a drift on another config leads with it."""
    checkpoint = own_checkpoint(tester.path)
    (tester.path / "mine.causalab.json").write_text(json.dumps(unpinned("my-llama")))
    tester.runpytest().assert_outcomes(passed=1, warnings=2)
    path = checkpoint / "config.json"
    old = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert json.loads((tester.path / "baselines" / "mine.json").read_text())["points"]["mine"]["config"] == old
    config = json.loads(path.read_text())
    config["rms_norm_eps"] = 0.5
    path.write_text(json.dumps(config))
    new = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    drifted = tester.runpytest()
    drifted.assert_outcomes(failed=1)
    drifted.stdout.fnmatch_lines([f"config changed: sha256:{old[7:19]}… → sha256:{new[7:19]}…"])
    assert "weights changed" not in drifted.stdout.str()


def test_new_weights_are_a_new_digest(tmp_path):
    checkpoint = own_checkpoint(tmp_path)
    before = sha256_of(checkpoint)
    nudge(checkpoint)
    doc_path = tmp_path / "unpinned.causalab.json"
    doc_path.write_text(json.dumps(unpinned("my-llama")))
    ran = cm.run(doc_path, engine="hooks", data=DATA)
    assert ran.point().weights == sha256_of(checkpoint) != before


# --- in the pytest plugin -----------------------------------------------------------------------

def test_a_baseline_stores_the_weights_and_a_drift_from_new_weights_says_so_first(tester):
    checkpoint = own_checkpoint(tester.path)
    (tester.path / "mine.causalab.json").write_text(json.dumps(unpinned("my-llama")))
    first = tester.runpytest("-W", "default")
    first.assert_outcomes(passed=1, warnings=2)  # the baseline written; the revision unpinned
    old, pin = sha256_of(checkpoint), revision_of(checkpoint)
    first.stdout.fnmatch_lines([f"*mine.causalab.json pins no model.revision; it ran on {pin}: pin that "
                                f"checkpoint with \"revision\": \"{pin}\" in its model section*"])
    stored = json.loads((tester.path / "baselines" / "mine.json").read_text())
    assert stored["points"]["mine"]["weights"] == old

    nudge(checkpoint)
    new = sha256_of(checkpoint)
    drifted = tester.runpytest()
    drifted.assert_outcomes(failed=1)
    text = drifted.stdout.str()
    lead = f"weights changed: sha256:{old[7:19]}… → sha256:{new[7:19]}…"
    assert lead in text
    assert text.index(lead) < text.index("logit_diff: mean")  # before the numbers that moved
    accept = "pytest mine.causalab.json::mine --causalab-engine=nnterp --causalab-update-baselines=failing"
    drifted.stdout.fnmatch_lines([f"to accept this as the new baseline: {accept}"])

    # The command it names accepts it: run as written (less the program's name), then a plain run passes.
    tester.runpytest(*shlex.split(accept)[1:]).assert_outcomes(passed=1, warnings=2)
    assert json.loads((tester.path / "baselines" / "mine.json").read_text())["points"]["mine"]["weights"] == new
    tester.runpytest().assert_outcomes(passed=1, warnings=1)


def test_every_baseline_failure_ends_with_the_command_that_accepts_it(tester, monkeypatch):
    doc = json.loads((V2 / "patching.causalab.json").read_text())
    doc["header"]["expect"] = []
    (tester.path / "p.causalab.json").write_text(json.dumps(doc))
    accept = ("to accept this as the new baseline: pytest p.causalab.json::p --causalab-engine=hooks "
              "--causalab-update-baselines=failing")
    # Missing under CI.
    monkeypatch.setenv("CI", "1")
    missing = tester.runpytest("--causalab-engine=hooks")
    missing.assert_outcomes(failed=1)
    assert _ends_failure(missing, accept)
    monkeypatch.delenv("CI")
    tester.runpytest("--causalab-engine=hooks").assert_outcomes(passed=1, warnings=1)
    # A value drift.
    path = tester.path / "baselines" / "p.json"
    stored = json.loads(path.read_text())
    rows = stored["points"]["p"]["results"]["logit_diff"]["rows"]
    first = next(iter(rows))
    rows[first] += 1.0
    path.write_text(json.dumps(stored))
    moved = tester.runpytest("--causalab-engine=hooks")
    moved.assert_outcomes(failed=1)
    assert _ends_failure(moved, accept)
    # A changed experiment.
    edited = copy.deepcopy(doc)
    edited["interventions"]["patching"]["reads"]["v_cf"]["pos"] = -2
    edited["interventions"]["patching"]["writes"]["patch"]["pos"] = -2
    (tester.path / "p.causalab.json").write_text(json.dumps(edited))
    changed = tester.runpytest("--causalab-engine=hooks")
    changed.assert_outcomes(failed=1)
    assert _ends_failure(changed, accept)
    # And it is accepted by exactly that command.
    tester.runpytest(*shlex.split(accept.split(": ", 1)[1])[1:]).assert_outcomes(passed=1, warnings=1)
    tester.runpytest("--causalab-engine=hooks").assert_outcomes(passed=1)


def _ends_failure(result, line: str) -> bool:
    """Whether ``line`` is the last line of the failure's text (a section rule or nothing follows)."""
    lines = result.stdout.lines
    at = lines.index(line)
    return at + 1 == len(lines) or lines[at + 1].startswith(("-", "=")) or not lines[at + 1].strip()

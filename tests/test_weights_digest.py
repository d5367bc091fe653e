"""The revision digest of a local checkpoint: computed from the bytes, cached by (path, size, mtime).

Every document, point and plugin item naming a model resolves it, and hashing a local 7B
checkpoint takes tens of seconds; the cache must never hand back a stale digest for a file
that changed.
"""
from __future__ import annotations

import hashlib
import os

import pytest

from causalab_mini.model import loading
from causalab_mini.errors import ModelError


def _digest_by_hand(directory) -> str:
    outer = hashlib.sha256()
    for f in sorted(directory.glob("*.safetensors")):
        outer.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return "sha256:" + outer.hexdigest()


@pytest.fixture
def checkpoint(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"a" * 64)
    return tmp_path


def test_the_digest_is_sha256_of_names_and_bytes(checkpoint):
    assert loading.weights_digest(checkpoint) == _digest_by_hand(checkpoint)


def test_a_second_digest_reads_no_bytes(checkpoint, monkeypatch):
    first = loading.weights_digest(checkpoint)
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    assert loading.weights_digest(checkpoint) == first
    assert opened == []


def test_a_rewritten_file_is_hashed_again(checkpoint):
    path = checkpoint / "model.safetensors"
    before = loading.weights_digest(checkpoint)
    stat = path.stat()
    path.write_bytes(b"b" * 64)  # the same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    after = loading.weights_digest(checkpoint)
    assert after != before and after == _digest_by_hand(checkpoint)
    path.write_bytes(b"b" * 65)  # another size
    assert loading.weights_digest(checkpoint) == _digest_by_hand(checkpoint)


# --- the revision: everything in the folder that decides the numbers -----------------------------

def _revision_by_hand(directory) -> str:
    """The same construction over the weights, config, tokenizer and chat-template files (not hidden)."""
    outer = hashlib.sha256()
    for f in sorted(directory.iterdir()):
        if not f.name.startswith(".") and f.name.endswith((".safetensors", ".json", ".txt", ".model",
                                                           ".jinja", ".tiktoken")):
            outer.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return "sha256:" + outer.hexdigest()


@pytest.fixture
def whole(checkpoint):
    for name, text in [("config.json", '{"model_type": "llama"}'), ("tokenizer.json", "{}"),
                       ("merges.txt", "a b"), ("chat_template.jinja", "{{ messages }}"),
                       ("README.md", "# a model"), (".hidden.json", "{}")]:
        (checkpoint / name).write_text(text)
    return checkpoint


def test_the_revision_covers_weights_config_and_tokenizer_files(whole):
    assert loading.revision_digest(whole) == _revision_by_hand(whole) != loading.weights_digest(whole)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "merges.txt", "chat_template.jinja",
                                  "model.safetensors"])
def test_editing_a_file_that_decides_the_numbers_moves_the_revision(whole, name):
    before = loading.revision_digest(whole)
    path = whole / name
    path.write_bytes(path.read_bytes() + b" ")
    assert loading.revision_digest(whole) != before


@pytest.mark.parametrize("name", ["README.md", ".hidden.json"])
def test_a_readme_or_hidden_file_does_not(whole, name):
    before = loading.revision_digest(whole)
    (whole / name).write_text("edited")
    assert loading.revision_digest(whole) == before


def test_a_revision_file_that_is_not_regular_is_refused(whole):
    (whole / "tokenizer.json").unlink()
    os.mkfifo(whole / "tokenizer.json")
    with pytest.raises(ModelError) as info:
        loading.revision_digest(whole)  # returns at once: a FIFO is never opened
    assert "tokenizer.json" in info.value.problem

"""The revision digest of a local checkpoint: computed from the bytes, cached by (path, size, mtime).

Every document, point and plugin item naming a model resolves it, and hashing a local 7B
checkpoint takes tens of seconds; the cache must never hand back a stale digest for a file
that changed.
"""
from __future__ import annotations

import hashlib
import os

import pytest

from causalab_mini.engine import loading


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

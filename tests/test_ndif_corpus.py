"""Every corpus document on a stock NDIF server: byte for byte the local run, or refused by name.

A stock server has torch, transformers and nnsight — nothing of causalab-mini's or nnterp's
(``cm.stand_in(..., stock=True)`` takes them out of ``sys.modules`` and blocks their import while the
request is read and run, against a plain ``LanguageModel`` over the checkpoint). An ndif shell's
default request carries the kernel and a program (``engine/request.py``): every document a remote
model can serve writes, through it, the files the local nnterp run writes, byte for byte (run.json
aside: it says which engine ran). A document it cannot serve is refused at compile time, at the
field that needs what a stock server lacks, with how to run it instead — and only those.
"""
from __future__ import annotations

import pytest
from paths import DATA, MODELS, V2

import causalab_mini as cm

pytestmark = pytest.mark.usefixtures("one_thread")

DOCUMENTS = sorted(V2.glob("*.causalab.json"))
# What a stock server's request cannot carry, by document: the field refused and a word of why.
REFUSED = {
    "attribution_patching": ("steps.score.estimate", "gradients are taken in this process"),
    "das": ("steps.fit", "a fit trains through the model"),
    "das_wrong_site": ("steps.fit", "a fit trains through the model"),
    "dbm": ("steps.fit", "a fit trains through the model"),
}
_SERVERS: dict = {}


def _stock_server(doc):
    """One stock stand-in per model (and attention implementation), loaded once for the module."""
    key = (doc.model.key, doc.attention_probs)
    if key not in _SERVERS:
        _SERVERS[key] = cm.stand_in(doc, models=[MODELS], stock=True)
    return _SERVERS[key]


def _files(folder) -> dict:
    """Every file a run wrote but run.json, by path relative to the run's folder: its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "run.json"}


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name.split(".")[0])
def test_a_stock_server_runs_the_document_as_the_local_engine_does(path, tmp_path):
    name = path.name.split(".")[0]
    doc = cm.read(path)
    if name in REFUSED:
        field, why = REFUSED[name]
        with pytest.raises(cm.CompileError) as refused:
            cm.compile(doc, engine="ndif", models=[MODELS], data=[DATA])
        assert refused.value.path == field and why in refused.value.problem
        assert refused.value.fix
        return
    server = _stock_server(doc)
    shell = cm.load(doc, engine="ndif", models=[MODELS])
    shell.server = server
    before = server.requests
    there = cm.run(doc, loaded=shell, data=[DATA], out=tmp_path / "there")
    assert server.requests == before + 1  # the whole walk, every point, in one request
    here = cm.run(doc, engine="nnterp", models=[MODELS], data=[DATA], out=tmp_path / "here")
    written = _files(tmp_path / "here")
    assert written and _files(tmp_path / "there") == written
    assert there.record["request"]["kind"] == "kernel" and there.record["wire"] == server.wire
    assert here.record["served_dtype"] == there.record["served_dtype"]

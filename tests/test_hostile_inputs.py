"""Hostile inputs refused where they are read, naming the field or the file (README "Limits").

Four kinds, each of which Python's ``json`` or a plain ``read_bytes`` lets through to fail
later and far away: numbers that are not finite (``NaN``, ``Infinity``, ``1e400``), an
object that writes one key twice (``json`` keeps the last), a file that is not a regular
file (a FIFO blocks a read forever, ``/dev/zero`` never ends), and a model key that climbs
out of its folder with ``..``. Everything here is a real file in ``tmp_path``; whatever
could hang or fill memory before the fix runs in a subprocess with a timeout and a cap on
its address space, so a regression fails the test instead of stalling the suite.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import causalab_mini as cm
from causalab_mini import data as data_mod
from causalab_mini import reading
from causalab_mini.document import read as front
from causalab_mini.errors import CompileError, DataError, DocumentError, MissingArtifact
from paths import DATA, MODELS, V2
from samples import cli_command, patching_document

MARK = 0.123456789  # a finite stand-in, replaced in the document's text by the literal under test
NOT_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"]


def _patch(doc: dict) -> dict:
    return doc["interventions"]["patching"]["writes"]["patch"]


def _gate_fit(doc: dict) -> dict:
    """A gate trained by a fit step that anneals it: lr, objective weights, start and anneal all written."""
    doc["featurizers"] = {"mask": {"kind": "gate", "site": "target", "start": 0.5}}
    doc["interventions"]["patching"]["reads"]["v_cf"]["featurizer"] = "mask"
    _patch(doc)["featurizer"] = "mask"
    doc["steps"] = {"fit": {"kind": "fit", "interventions": "patching",
                            "rows": {"base": "weekdays/train", "counterfactual": "weekdays/train"},
                            "params": ["mask"], "objective": [[-1.0, "logit_diff"], [0.01, "mask.mask"]],
                            "lr": 0.01, "anneal": {"mask": {"start": 1.0, "end": 0.1}}},
                    **doc["steps"]}
    return doc


def _threshold(doc):
    doc["header"]["expect"] = [{"result": "iia", "mean": {">": MARK}}]


def _operand(doc):
    _patch(doc).update(mechanism="add_scaled", operand=MARK)


def _clamp(doc):
    _patch(doc).update(mechanism="clamp", params={"max": MARK})
    del _patch(doc)["operand"]


def _fit_field(*path):
    def mutate(doc):
        _gate_fit(doc)
        target = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = MARK
    return mutate


def _swept_lr(doc):
    _gate_fit(doc)
    doc["steps"]["fit"]["lr"] = {"sweep": [0.01, MARK]}


# Every number field the issue names, at the path a refusal must name.
FIELDS = {
    "header.expect.0.mean.>": _threshold,
    "interventions.patching.writes.patch.operand": _operand,
    "interventions.patching.writes.patch.params.max": _clamp,
    "steps.fit.lr": _fit_field("steps", "fit", "lr"),
    "steps.fit.objective.0.0": lambda d: (_gate_fit(d), d["steps"]["fit"]["objective"][0].__setitem__(0, MARK)),
    "featurizers.mask.start": _fit_field("featurizers", "mask", "start"),
    "steps.fit.anneal.mask.start": _fit_field("steps", "fit", "anneal", "mask", "start"),
    "steps.fit.anneal.mask.end": _fit_field("steps", "fit", "anneal", "mask", "end"),
    "steps.fit.lr.sweep.1": _swept_lr,
}


def _document_text(mutate) -> str:
    doc = patching_document()
    mutate(doc)
    return json.dumps(doc, indent=1)


def _child(args: list, timeout: int = 60, capped: bool = True) -> subprocess.CompletedProcess:
    """A subprocess held to ``timeout`` seconds and (``capped``) 2 GiB of address space: a read
    that blocks or never ends fails the test rather than stalling or swapping the machine.
    (Uncapped for a ``run``: torch maps more address space than that just by being imported.)"""
    def cap():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=cap if capped else None)


def _refused_by_cli(done: subprocess.CompletedProcess, *words: str, after_load: bool = False) -> str:
    """Exit 2, one ``error: `` line naming ``words``, no traceback. ``after_load``: a ``run``
    loads the model before it compiles, and transformers may say something first."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    said = done.stderr.strip().splitlines()[-1] if after_load else done.stderr
    assert said.startswith("error: ") and "Traceback" not in done.stderr, done.stderr[-2000:]
    for word in words:
        assert word in said, (word, done.stderr)
    return said


# --- 1. numbers that are not finite ------------------------------------------------------------


@pytest.mark.parametrize("field", FIELDS)
def test_a_finite_value_in_each_field_is_accepted(tmp_path, field):
    """The control: each document below is valid as written, so its refusal is the literal's."""
    path = tmp_path / "d.causalab.json"
    path.write_text(_document_text(FIELDS[field]))
    assert cm.read(path).points


@pytest.mark.parametrize("literal", NOT_FINITE)
@pytest.mark.parametrize("field", FIELDS)
def test_a_non_finite_number_is_refused_at_read_naming_its_field(tmp_path, field, literal):
    text = _document_text(FIELDS[field])
    assert text.count(repr(MARK)) == 1
    path = tmp_path / "d.causalab.json"
    path.write_text(text.replace(repr(MARK), literal))
    with pytest.raises(DocumentError) as caught:
        cm.read(path)
    assert caught.value.path == field
    word = "NaN" if literal == "NaN" else "minus infinity" if literal.startswith("-") else "infinity"
    assert word in caught.value.problem and "finite number" in caught.value.fix


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_number_in_a_python_dict_is_refused_too(value):
    """``cm.read(dict)``: no JSON parser saw these, and the same refusal holds."""
    doc = patching_document()
    _gate_fit(doc)
    doc["steps"]["fit"]["lr"] = value
    with pytest.raises(DocumentError) as caught:
        cm.read(doc)
    assert caught.value.path == "steps.fit.lr"


def test_the_cli_refuses_a_non_finite_number_naming_the_field(tmp_path):
    path = tmp_path / "d.causalab.json"
    path.write_text(_document_text(FIELDS["steps.fit.lr"]).replace(repr(MARK), "Infinity"))
    _refused_by_cli(_child([*cli_command(), "validate", str(path)]),
                    "error: DocumentError: steps.fit.lr: the number is infinity")


def _split(tmp_path: Path, *lines: str) -> Path:
    folder = tmp_path / "data" / "set"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(line + "\n" for line in lines))
    return tmp_path / "data"


@pytest.mark.parametrize("literal", NOT_FINITE)
def test_a_non_finite_number_in_a_data_row_is_refused_naming_the_row_and_field(tmp_path, literal):
    root = _split(tmp_path, '{"input": "a", "label": 1.5}', '{"input": "b", "meta": {"score": %s}}' % literal)
    with pytest.raises(DataError) as caught:
        data_mod.load("set/train", [root], path="steps.score.rows.base")
    err = caught.value
    assert err.path == "steps.score.rows.base"
    assert "train.jsonl:2:" in err.problem and "(at meta.score)" in err.problem
    assert ("NaN" if literal == "NaN" else "infinity") in err.problem


# --- 2. a key written twice ----------------------------------------------------------------------


def test_a_key_written_twice_is_refused_naming_the_object_and_the_key(tmp_path):
    text = _document_text(lambda d: None)
    # steps.score says "kind" twice; json.loads would keep the second and say nothing.
    twice = text.replace('"kind": "observe"', '"kind": "fit",\n   "kind": "observe"', 1)
    assert twice != text and json.loads(twice) == json.loads(text)
    path = tmp_path / "d.causalab.json"
    path.write_text(twice)
    with pytest.raises(DocumentError) as caught:
        cm.read(path)
    assert caught.value.path == "steps.score"
    assert "'kind' twice" in caught.value.problem


def test_a_top_level_key_written_twice_is_refused_naming_the_file(tmp_path):
    text = _document_text(lambda d: None)
    twice = text[:-1].rstrip() + ',\n "model": {"key": "tiny-gpt2"}\n}'
    path = tmp_path / "d.causalab.json"
    path.write_text(twice)
    with pytest.raises(DocumentError) as caught:
        cm.read(path)
    assert caught.value.path == str(path)
    assert "top-level object writes the key 'model' twice" in caught.value.problem
    _refused_by_cli(_child([*cli_command(), "validate", str(path)]), "'model' twice")


def test_a_data_row_with_a_key_written_twice_is_refused(tmp_path):
    root = _split(tmp_path, '{"input": "a"}', '{"input": "b", "input": "c"}')
    with pytest.raises(DataError) as caught:
        data_mod.load("set/train", [root], path="steps.score.rows.base")
    assert "train.jsonl:2:" in caught.value.problem and "'input' twice" in caught.value.problem


def _pca_document(tmp_path: Path, file_path: str) -> Path:
    doc = patching_document()
    doc["featurizers"] = {"basis": {"kind": "pca", "site": "target", "file_path": file_path}}
    doc["interventions"]["patching"]["reads"]["v_cf"]["featurizer"] = "basis"
    _patch(doc)["featurizer"] = "basis"
    path = tmp_path / "pca.causalab.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def _bundle(path: Path, header_text: str, nbytes: int) -> Path:
    raw = header_text.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(nbytes))
    return path


def test_a_featurizer_bundle_whose_header_repeats_a_tensor_is_refused(tmp_path):
    """A safetensors header is JSON too: "Q" twice is two claims about one tensor, refused by name
    rather than resolved to whichever came last (here, the shape that would have compiled)."""
    q = '"Q": {"dtype": "F32", "shape": [32, %d], "data_offsets": [0, %d]}'
    _bundle(tmp_path / "ok.safetensors", "{" + q % (4, 512) + "}", 512)
    _bundle(tmp_path / "twice.safetensors", "{" + q % (2, 256) + ", " + q % (4, 512) + "}", 512)
    plan = cm.compile(_pca_document(tmp_path, "ok.safetensors"), models=[MODELS], data=[DATA])
    assert plan.points  # the control: the one-Q header compiles
    with pytest.raises(CompileError) as caught:
        cm.compile(_pca_document(tmp_path, "twice.safetensors"), models=[MODELS], data=[DATA])
    assert caught.value.path == "featurizers.basis.file_path"
    assert "'Q' twice" in caught.value.problem


# --- 3. files that are not regular files ---------------------------------------------------------


def _special(tmp_path: Path, kind: str, name: str) -> Path:
    """A FIFO, a symlink to /dev/zero, or a directory, at ``tmp_path / name``."""
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        if not os.path.exists("/dev/zero"):
            pytest.skip("no /dev/zero here")
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    return path


SAID = {"fifo": "is a FIFO (named pipe), not a regular file",
        "dev-zero": "is a symlink to /dev/zero, a character device, not a regular file",
        "dir": "is a directory, not a regular file"}
KINDS = list(SAID)

_READ = """
import json, sys
import causalab_mini as cm
from causalab_mini.errors import CausalabError
try:
    cm.read(sys.argv[1])
except CausalabError as err:
    print(json.dumps({"type": type(err).__name__, "path": err.path, "problem": err.problem}))
"""


@pytest.mark.parametrize("kind", KINDS)
def test_a_document_that_is_not_a_regular_file_is_refused_by_read(tmp_path, kind):
    path = _special(tmp_path, kind, "d.causalab.json")
    done = _child([sys.executable, "-c", _READ, str(path)])
    assert done.returncode == 0, done.stderr[-2000:]
    refusal = json.loads(done.stdout)
    # Named as the user wrote it (a symlink too, with where it leads), as the CLI names it.
    assert refusal["type"] == "DocumentError" and refusal["path"] == str(path)
    assert refusal["problem"] == f"the document {SAID[kind]}"


@pytest.mark.parametrize("kind", KINDS)
def test_the_cli_refuses_a_document_that_is_not_a_regular_file(tmp_path, kind):
    path = _special(tmp_path, kind, "d.causalab.json")
    _refused_by_cli(_child([*cli_command(), "validate", str(path)]), str(path), SAID[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_a_split_that_is_not_a_regular_file_is_refused_naming_the_file(tmp_path, kind):
    (tmp_path / "data" / "set").mkdir(parents=True)
    file = _special(tmp_path / "data" / "set", kind, "train.jsonl")
    done = _child([*cli_command(), "data", "set/train", "--data", str(tmp_path / "data")])
    _refused_by_cli(done, f"{file} {SAID[kind]}")
    with pytest.raises(DataError, match="not a regular file") as caught:  # and in process
        data_mod.load("set/train", [tmp_path / "data"], path="steps.score.rows.base")
    assert caught.value.path == "steps.score.rows.base" and str(file) in caught.value.problem


@pytest.mark.parametrize("kind", KINDS)
def test_a_featurizer_file_that_is_not_a_regular_file_is_refused_at_compile(tmp_path, kind):
    _special(tmp_path, kind, "basis.safetensors")
    doc = _pca_document(tmp_path, "basis.safetensors")
    with pytest.raises(CompileError) as caught:
        cm.compile(doc, models=[MODELS], data=[DATA])
    assert not isinstance(caught.value, MissingArtifact)  # it is there; it is the wrong kind of file
    assert caught.value.path == "featurizers.basis.file_path" and SAID[kind] in caught.value.problem
    done = _child([*cli_command(), "explain", str(doc), "--models", str(MODELS), "--data", str(DATA)])
    _refused_by_cli(done, "featurizers.basis.file_path", SAID[kind])


def test_run_refuses_a_featurizer_file_linked_to_dev_zero(tmp_path):
    _special(tmp_path, "dev-zero", "basis.safetensors")
    doc = _pca_document(tmp_path, "basis.safetensors")
    done = _child([*cli_command(), "run", str(doc), "--engine", "hooks", "--out", str(tmp_path / "out"),
                   "--models", str(MODELS), "--data", str(DATA)], timeout=300, capped=False)
    _refused_by_cli(done, "featurizers.basis.file_path", SAID["dev-zero"], after_load=True)


def test_a_file_that_reports_less_than_it_holds_is_read_to_the_limit_only():
    """/proc files report a size of 0 and hold more: the read itself is bounded, not the stat."""
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("no /proc here")
    assert os.stat("/proc/self/maps").st_size == 0
    with pytest.raises(reading.TooLarge) as caught:
        reading.read_bytes("/proc/self/maps", 16)
    assert caught.value.at_least and str(caught.value) == "more than 16 bytes"
    assert len(reading.read_bytes("/proc/self/maps", 1 << 20)) > 16


# --- 4. paths that climb out of their folder -----------------------------------------------------


@pytest.mark.parametrize("key", ["../models/tiny-llama", "..", "models/../../elsewhere", "org/.."])
def test_a_model_key_with_dot_dot_is_refused(key):
    doc = patching_document()
    doc["model"]["key"] = key
    with pytest.raises(DocumentError) as caught:
        cm.read(doc)
    assert caught.value.path == "model.key" and "'..'" in caught.value.problem


@pytest.mark.parametrize("key", ["org/name", "tiny-llama", "models/tiny-llama", "org/name..v2"])
def test_a_hub_id_or_a_relative_model_key_is_still_accepted(key):
    doc = patching_document()
    doc["model"]["key"] = key
    assert cm.read(doc).points[0].spec.model.key == key


def test_a_protocol_document_refuses_a_dot_dot_model_key():
    from paths import DOCUMENTS

    raw = front.read(DOCUMENTS / "protocol" / "pos_sweep.causalab.json")
    raw["model"]["key"] = "../../tiny-llama"
    with pytest.raises(DocumentError) as caught:
        cm.read(raw)
    assert caught.value.path == "model.key"


@pytest.mark.parametrize("where, value", [
    ("steps.score.rows.base", "../weekdays"),
    ("steps.score.rows.base", "weekdays/.."),
    ("steps.score.saves.0.file_path", "a/../../iia.json"),
])
def test_dataset_references_and_saves_with_dot_dot_stay_refused(where, value):
    doc = patching_document()
    parts = [int(p) if p.isdigit() else p for p in where.split(".")]
    target = doc
    for part in parts[:-1]:
        target = target[part]
    target[parts[-1]] = value
    with pytest.raises(DocumentError) as caught:
        cm.read(doc)
    assert caught.value.path == where and "no .." in caught.value.problem


@pytest.mark.parametrize("value", ["../artifacts/rot.safetensors", "a/../../rot.safetensors",
                                   "artifacts/../../rot.safetensors"])
def test_a_featurizer_bundle_outside_the_documents_folder_is_refused(tmp_path, value):
    """A featurizer's file_path stays inside the document's folder, like every other path a
    document names; the refusal comes at read, before any file is opened, with the form to write."""
    doc = json.loads((V2 / "das_apply.causalab.json").read_text())
    doc["featurizers"]["rot"]["file_path"] = value
    with pytest.raises(DocumentError) as caught:
        cm.read(doc)
    assert caught.value.path == "featurizers.rot.file_path"
    assert "outside the document's folder" in caught.value.problem
    assert '"artifacts/rot.safetensors"' in caught.value.fix
    path = tmp_path / "d.causalab.json"
    path.write_text(json.dumps(doc))
    _refused_by_cli(_child([*cli_command(), "validate", str(path)]),
                    "error: DocumentError: featurizers.rot.file_path:")


def test_the_cli_refuses_a_dot_dot_model_key(tmp_path):
    doc = patching_document()
    doc["model"]["key"] = "../../../../tiny-llama"
    path = tmp_path / "d.causalab.json"
    path.write_text(json.dumps(doc))
    _refused_by_cli(_child([*cli_command(), "validate", str(path)]), "error: DocumentError: model.key:")

"""The save formats: one record each (``formats.py``), and no other module deciding one by a suffix.

Every format's bytes are read back two ways — by its own ``read`` and ``load``, and by a reader
written here without the project (``json.loads``, ``safetensors.torch.load``) — and both must
give the value written. A file name no format ends is refused naming it, and a scan of the
source holds every other module to asking the registry.
"""
from __future__ import annotations

import json
import re

import pytest
import torch
from paths import REPO

from causalab_mini import formats
from causalab_mini.errors import DamagedRun, DocumentError

ROWS = [{"example_id": "a", "metric": "iia", "value": 1.0, "eligible": True, "positions": None, "reason": ""},
        {"example_id": "b", "metric": "iia", "value": None, "eligible": False, "positions": [3],
         "reason": "no_answer", "unit": "fraction", "text": "café"}]
TENSORS = {"mean": torch.arange(6, dtype=torch.float32).reshape(2, 3), "ids": torch.tensor([1, 2, 3])}
HEADER = (("model", "tiny"), ("layer", "2"))


def _independent_rows(data: bytes):
    return json.loads(data.decode("utf-8"))


def _independent_tensors(data: bytes):
    from safetensors.torch import load

    return dict(load(data))


# By what a format holds: a value to write, and a reader of its bytes that is not the project's.
SAMPLES = {formats.ROWS: (ROWS, _independent_rows), formats.TENSORS: (TENSORS, _independent_tensors)}


def _same(a, b) -> bool:
    if isinstance(a, dict) and a and all(isinstance(v, torch.Tensor) for v in a.values()):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    return a == b


@pytest.mark.parametrize("form", formats.FORMATS, ids=lambda f: f.suffix)
def test_round_trip(form, tmp_path):
    value, independent = SAMPLES[form.holds]
    data = form.write(value, HEADER)
    assert form.write(value, HEADER) == data, "the same value gives the same bytes"
    assert _same(independent(data), value)
    assert _same(form.load(data), value)
    path = tmp_path / f"saved{form.suffix}"
    path.write_bytes(data)
    assert _same(form.read(path, tmp_path), value)
    assert formats.format_of(path.name) is form


def test_safetensors_header_is_the_metadata():
    data = formats.SAFETENSORS.write(TENSORS, HEADER)
    n = int.from_bytes(data[:8], "little")
    assert json.loads(data[8:8 + n])["__metadata__"] == dict(HEADER)
    assert n % 8 == 0  # the data section starts aligned, as safetensors wants


@pytest.mark.parametrize("form", formats.FORMATS, ids=lambda f: f.suffix)
def test_a_damaged_file_is_refused_by_its_read(form, tmp_path):
    value, _ = SAMPLES[form.holds]
    path = tmp_path / f"cut{form.suffix}"
    path.write_bytes(form.write(value, HEADER)[:-7])
    with pytest.raises(DamagedRun) as refused:
        form.read(path, tmp_path)
    assert refused.value.path == str(path)


@pytest.mark.parametrize("name", ["iia.csv", "iia.JSON", "mean.pt", "iia", "iia.json.txt"])
def test_an_unknown_suffix_is_refused_naming_the_save(name):
    assert formats.find(name) is None
    with pytest.raises(formats.UnknownFormat) as refused:
        formats.format_of(name)
    assert isinstance(refused.value, DocumentError)
    assert refused.value.path == name
    assert refused.value.problem == "a metric saves as .json, a tensor as .safetensors"
    assert refused.value.fix == "end the file name in .json or .safetensors"


def test_the_longest_suffix_wins():
    assert formats.format_of("pos=-1/iia.causalab.json") is formats.JSON_ROWS
    assert formats.format_of("a.json.safetensors") is formats.SAFETENSORS


@pytest.mark.parametrize("kind, name, problem, fix", [
    (formats.METRIC, "iia.safetensors", "metric 'iia' saves as a JSON table", "end the file name in .json"),
    (formats.TENSOR, "mean.json", "'mean' is a tensor", "end the file name in .safetensors"),
    (formats.BUNDLE, "rot.json", "fitted parameters save as safetensors", "end the file name in .safetensors"),
])
def test_a_value_in_a_format_that_does_not_take_it_is_refused(kind, name, problem, fix):
    value = name.split(".")[0]
    with pytest.raises(DocumentError) as refused:
        formats.check_fits("steps.s.saves.0.file_path", name, kind, value)
    assert (refused.value.path, refused.value.problem, refused.value.fix) == (
        "steps.s.saves.0.file_path", problem, fix)
    right = next(f for f in formats.FORMATS if kind in f.takes)
    formats.check_fits("steps.s.saves.0.file_path", f"{value}{right.suffix}", kind, value)


def test_every_kind_of_save_value_has_a_format():
    for kind in (formats.METRIC, formats.TENSOR, formats.BUNDLE):
        assert any(kind in f.takes for f in formats.FORMATS), kind
    assert len({f.suffix for f in formats.FORMATS}) == len(formats.FORMATS)


# --- no other module decides a save's format by its suffix ----------------------------------

# endswith(...) given a literal naming a save format's suffix, alone or in a tuple.
SUFFIX_TEST = re.compile(r"""endswith\(\s*\(?[^)]*["'][^"']*\.(json|safetensors)["']""")

# Modules allowed such a test, each with how many it has and why it is not a save's format.
NOT_A_SAVE = {
    # A featurizer's file_path: a bundle to load, not a file a run writes. What it may be is the
    # loaders' to decide (featurizer_files.header, engine.fit.load_bundle read safetensors only,
    # never pickle); a new save format would not make a bundle loadable.
    "causalab_mini/document/spec.py": 1,
}


def _suffix_tests(path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if SUFFIX_TEST.search(line)]


def test_the_scan_finds_a_suffix_test():
    assert SUFFIX_TEST.search('if save.file_path.endswith(".json"):')
    assert SUFFIX_TEST.search("if not path.endswith(('.json', '.safetensors')):")
    assert not SUFFIX_TEST.search("if name.endswith(SUFFIX):")


def test_no_module_but_the_registry_tests_a_save_suffix():
    found = {}
    for path in sorted((REPO / "causalab_mini").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        hits = _suffix_tests(path)
        if rel != "causalab_mini/formats.py" and len(hits) > NOT_A_SAVE.get(rel, 0):
            found[rel] = hits
    assert not found, "decide a save's format with formats.format_of(path), not its suffix:\n" + "\n".join(
        f"  {rel}: {hit}" for rel, hits in found.items() for hit in hits)

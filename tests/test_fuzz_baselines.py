"""Fuzzing the stored baselines: a mutated baseline file is read, held to a real point, or refused, typed.

Three real points are run once per module on the hooks engine (tiny-llama): ``patching``
(metric rows), ``chat_turn`` (rows and a float tensor) and ``generate_probe`` at
``index=0`` (rows and an integer tensor), each wrapped as the plugin wraps it
(``causalab_mini.Point``). Each example takes the committed baseline of that
document (documents/v2/baselines/), gives it the point's ``produced_by`` (most of the time,
so the comparison is reached), and mutates it: keys deleted or renamed, values replaced
with arbitrary JSON, wrong types where rows, values, tensors, shape and dtype go, another
format string; or its bytes are cut, made not UTF-8 or not JSON. Written beside a copy of
the document, it is then

* read: ``baseline.load`` returns it or raises ``BaselineError``;
* held to the point as ``PointItem.runtest`` holds it (``baseline.check``, with or without
  an update flag, strict or not): the verdict's checks are failing ``expect.Check`` rows the
  plugin renders as its failure table, or a ``BaselineError`` — never another exception,
  which the plugin would report as an internal error;
* after an update flag, or a missing baseline written, the file reads back as a baseline.

``CAUSALAB_FUZZ_EXAMPLES`` sets the count, as for tests/test_fuzz.py.
"""
from __future__ import annotations

import copy
import json
import math
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import causalab_mini as cm
from causalab_mini.document import read as front
from causalab_mini.errors import BaselineError
from causalab_mini.plan import compile as compiler
from pytest_causalab import checks as expect
from fuzzing import DATA, EXAMPLES, JSON, MODELS, ROOT, Blob, mutate, paths
from pytest_causalab import baseline
from causalab_mini import Point

pytest.importorskip("transformers")

V2 = ROOT / "documents" / "v2"
POINTS = [("patching", None), ("chat_turn", None), ("generate_probe", "index=0")]
STORED = {stem: json.loads((V2 / "baselines" / f"{stem}.json").read_text()) for stem, _ in POINTS}


@pytest.fixture(scope="module")
def ran() -> dict:
    """Each point run once on the hooks engine, as the plugin's session runs it: {stem: Point}."""
    engine = None
    out = {}
    for stem, name in POINTS:
        document = V2 / f"{stem}.causalab.json"
        raw = front.read(document)
        if engine is None:
            engine = cm.load(cm.read(raw, path=document), engine="hooks", models=[MODELS])
        plan = compiler.compile_plan(raw, document=document, data=[DATA], facts=engine)
        sub = plan.steps[name] if name is not None else plan
        engine.execute(sub)
        coords = next(p.coords for p in front.points(raw) if p.name == name)
        out[stem] = Point.from_plan(document, name or stem, coords, "hooks", sub)
        assert out[stem].saved(), stem  # a point with results to hold to a baseline
    return out


# Values of the wrong type for what a baseline holds: rows, a row's value, a tensor entry and its fields.
WRONG = [None, True, 0, -1, 1.5, float("nan"), float("inf"), 10 ** 400, 2 ** 70, "", "1.0", [], [1.0], {},
         {"rows": {}}, {"values": []}]


@st.composite
def mutated_baseline(draw):
    """(stem, point name, the baseline file's bytes)."""
    stem, name = draw(st.sampled_from(POINTS))
    data = copy.deepcopy(STORED[stem])
    name = name or stem
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["mutate", "wrong", "wrong", "format", "tensor", "drift", "drift"]))
        if action == "drift":  # a number moved, or a row made null: a baseline that reads, and differs
            numbers = [p for p, v in paths(data) if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if numbers:
                _set(data, draw(st.sampled_from(numbers)),
                     draw(st.none() | st.floats() | st.integers(-2 ** 70, 2 ** 70) | st.sampled_from([0, 1, -1])))
        elif action == "mutate":
            mutate(draw, data, rounds=(1, 1))
        elif action == "wrong":  # a wrong type where a baseline holds something
            targets = [p for p, _ in paths(data) if p and (p[0] != "points" or len(p) > 2)]
            if targets:
                _set(data, draw(st.sampled_from(targets)), copy.deepcopy(draw(st.sampled_from(WRONG) | JSON)))
        elif action == "format":
            data["format"] = draw(st.sampled_from(["causalab-baseline/0", "causalab-baseline/2", None, 1,
                                                   ["causalab-baseline/1"]]) | st.text(max_size=20))
        else:  # a tensor entry made inconsistent: values against shape, sums against values
            entries = [p for p, v in paths(data) if len(p) == 5 and p[2] == "tensors" and isinstance(v, dict)]
            if entries:
                entry = _get(data, draw(st.sampled_from(entries)))
                field = draw(st.sampled_from(["shape", "dtype", "values", "sums"]))
                values = entry.get("values") if isinstance(entry.get("values"), list) else []
                entry[field] = copy.deepcopy(draw(st.sampled_from(
                    [[], [0], [3], [4, 3, 1], [-1], [2 ** 40], "float32", "int64", "bfloat16",
                     list(range(5)), ["1"], {"sum": 0.0}, {"sum": 0, "abs_sum": 0, "square_sum": "x"},
                     values[:-1], values + [0]])))
    # produced_by set to the point's (filled in at the test, where the point is): most of the time.
    keep = draw(st.booleans()) and draw(st.booleans())
    text = Blob(json.dumps(data, allow_nan=True).encode())
    spoil = draw(st.sampled_from(["none"] * 10 + ["truncate", "not utf-8", "not json", "deep", "digits"]))
    return stem, name, keep, text, spoil, draw(st.integers(0, max(len(text) - 1, 0)))


def _get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _set(doc, path, value):
    _get(doc, path[:-1])[path[-1]] = value


def _spoiled(text: bytes, spoil: str, at: int) -> bytes:
    if spoil == "truncate":
        return text[:at]
    if spoil == "not utf-8":
        return text[:at] + b"\xff\xfe" + text[at:]
    if spoil == "not json":
        return text[:at] + b"}{" + text[at:]
    if spoil == "deep":
        return b"[" * 100_000 + b"]" * 100_000
    if spoil == "digits":
        return b'{"format": "causalab-baseline/1", "points": ' + b"9" * 5000 + b"}"
    return text


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzzed-baselines")


def _tolerance(name: str):
    return (1e-4, 1e-5)


@settings(max_examples=EXAMPLES, deadline=5_000, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated_baseline(), update=st.sampled_from([None, None, None, "failing", "all"]), strict=st.booleans())
def test_a_mutated_baseline_is_read_and_checked_or_refused_typed(ran, folder, case, update, strict):
    stem, name, keep, text, spoil, at = case
    text = bytes(text)
    here = Path(tempfile.mkdtemp(dir=folder))
    try:
        point = replace(ran[stem], document=here / f"{stem}.causalab.json")
        if not keep:  # the point's own experiment, so the rows and tensors are compared
            text = text.replace(STORED[stem]["points"][name]["produced_by"].encode(), point.produced_by.encode())
        path = baseline.path_for(point.document)
        path.parent.mkdir()
        path.write_bytes(_spoiled(text, spoil, at))
        try:
            loaded = baseline.load(path)
        except BaselineError as err:
            loaded = err
        assert isinstance(loaded, (dict, BaselineError))
        try:
            verdict = baseline.check(point, folder="baselines", update=update, strict=strict, tolerance=_tolerance)
        except BaselineError as err:
            # Refused only where the file is not a baseline and no update flag rewrites it.
            assert update is None and isinstance(loaded, BaselineError), err
            assert str(path) in str(err)
            event("refused")
            return
        assert all(isinstance(c, expect.Check) and not c.ok for c in verdict.checks)
        expect.render(verdict.checks)  # the failure table PointItem.repr_failure shows
        event("written" if verdict.notes else "failing checks" if verdict.checks else "held")
        if update is not None or verdict.notes:  # written, or could have been: it reads back
            again = baseline.load(path)
            if verdict.notes:
                assert again["points"][point.name] == json.loads(json.dumps(baseline.entry(point)))
    finally:
        shutil.rmtree(here)


def test_the_points_agree_with_their_committed_baselines(ran):
    """The fuzz starts from real agreement: each point, held to its committed baseline with the
    point's produced_by, fails no row (hooks against the nnterp-recorded numbers, at 1e-4)."""
    for stem, point in ran.items():
        stored = STORED[stem]["points"][point.name]
        for result, rows in point.saved().items():
            reference = list(stored["results"][result]["rows"].items())
            assert not expect.compare_rows(point.name, result, "baseline", reference, rows.pairs(), 1e-4, 1e-5)
        for file, named in point.saved_tensors().items():
            for tensor_name, tensor in named.items():
                entry = stored["tensors"][file][tensor_name]
                assert not baseline.compare_tensor(point.name, f"{file}:{tensor_name}", entry, tensor, 1e-4, 1e-5)
                assert math.prod(entry["shape"]) == tensor.numel()

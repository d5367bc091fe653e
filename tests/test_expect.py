"""Header expectations: the JSON they are written in, and the checks they make (no model)."""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass

import pytest

import causalab_mini as cm
from causalab_mini.document import read as front
from causalab_mini.errors import DocumentError
from paths import V2
from pytest_causalab import checks as expect  # the run-time half: evaluate, compare, render
from causalab_mini.document.expect import Comparison, Expectation

SWEEP = V2 / "pos_sweep.causalab.json"


@dataclass
class Values:
    values: tuple
    eligible: tuple
    example_ids: tuple


def values(*rows):
    """Rows as (value or None); None is an ineligible row."""
    return Values(tuple(v for v in rows if v is not None), tuple(v is not None for v in rows),
                  tuple(str(i) for i in range(len(rows))))


def check(exp: dict, result: Values, point=None, coords=()):
    return expect.evaluate([Expectation.model_validate(exp)], point, coords, {exp["result"]: result})


@pytest.mark.parametrize("raw, got, holds", [
    ({">": 0.5}, 0.6, True), ({">": 0.5}, 0.5, False), ({">=": 0.5}, 0.5, True),
    ({"<": 0}, -1e-9, True), ({"<=": 0}, 0.0, True), ({"<=": 0}, 1e-9, False),
    ({"between": [0.25, 0.75]}, 0.75, True), ({"between": [0.25, 0.75]}, 0.76, False),
    ({"approx": 0.5}, 0.5 + 1e-9, True), ({"approx": 0.5}, 0.51, False),
    ({"approx": 0.5, "atol": 0.02}, 0.51, True), (0.5, 0.5, True), ({">": 0}, math.nan, False),
])
def test_comparisons(raw, got, holds):
    assert (Comparison.model_validate(raw).miss(got) == 0) is holds


@pytest.mark.parametrize("raw, message", [
    ({">": 1, "<": 2}, "exactly one operator"),
    ({}, "exactly one operator"),
    ({"=": 1}, "extra"),
    ({">": 1, "atol": 0.1}, "rtol/atol belong to \"approx\""),
    ({"between": [2, 1]}, "is empty"),
    ({">": True}, "not a boolean"),
    ("high", "a threshold is a number or one comparison"),
])
def test_malformed_comparisons_are_refused(raw, message):
    with pytest.raises(ValueError, match=message):
        Comparison.model_validate(raw)


def test_aggregates_and_the_worst_row():
    result = values(0.0, 1.0, None, 1.0)
    checks = check({"result": "iia", "mean": {">": 0.8}, "min": 0.0, "max": {"<=": 1},
                    "all": {">": 0.5}, "eligible": 0.75}, result)
    by = {c.aggregate: c for c in checks}
    assert by["mean"].got == pytest.approx(2 / 3) and not by["mean"].ok
    assert by["min"].ok and by["max"].ok and by["eligible"].ok
    assert not by["all"].ok and by["all"].got == 0.0 and "1/3 rows miss; worst is row 0" in by["all"].note


def test_no_eligible_rows_fails_rather_than_passing_vacuously():
    (c,) = check({"result": "iia", "mean": {">=": 0}}, values(None, None))
    assert not c.ok and c.note == "no eligible rows"


def test_points_by_name_and_by_axis_value():
    exp = Expectation.model_validate({"result": "iia", "mean": 1, "points": {"layers": 1, "pos": [-1, -2]}})
    assert exp.applies("layers=1,pos=-1", (("layers", [1]), ("pos", -1)))  # [1] is spelled 1
    assert not exp.applies("layers=0,pos=-1", (("layers", [0]), ("pos", -1)))
    assert not exp.applies("layers=1,pos=-3", (("layers", [1]), ("pos", -3)))
    named = Expectation.model_validate({"result": "iia", "mean": 1, "points": ["pos=-1"]})
    assert named.applies("pos=-1", ()) and not named.applies("pos=-2", ())


def test_tolerance_the_document_sets_wins():
    exps = [Expectation.model_validate(e) for e in (
        {"result": "iia", "rtol": 0.1},
        {"result": "iia", "atol": 0.5, "points": ["pos=-2"]},
        {"result": "logit_diff", "atol": 9.0},
    )]
    assert expect.tolerance(exps, "pos=-1", (), "iia", (1e-4, 1e-5)) == (0.1, 1e-5)
    assert expect.tolerance(exps, "pos=-2", (), "iia", (1e-4, 1e-5)) == (0.1, 0.5)


def test_compare_rows():
    ref = [("0", 1.0), ("1", None), ("2", -3.0)]
    assert expect.compare_rows("p", "r", "baseline", ref, ref, 0, 0) == []
    drift = expect.compare_rows("p", "r", "baseline", ref, [("0", 1.0), ("1", 0.5), ("2", -3.1)], 0, 0.05)
    assert [c.aggregate for c in drift] == ["row 1", "row 2"]
    assert drift[1].difference == pytest.approx(-0.1)
    (other,) = expect.compare_rows("p", "r", "baseline", ref, ref[:2], 0, 0)
    assert other.aggregate == "rows" and "data changed" in other.note


def test_render_is_an_aligned_table():
    checks = check({"result": "iia", "mean": {">": 0.8}}, values(0.0, 1.0), point="pos=-1")
    lines = expect.render(checks).splitlines()
    assert lines[0].split() == ["point", "result", "aggregate", "expected/baseline", "got", "difference"]
    assert lines[2].split() == ["pos=-1", "iia", "mean", ">", "0.8", "0.5", "-0.3"]


def _sweep(expectations):
    raw = json.loads(SWEEP.read_text())
    raw["header"]["expect"] = expectations
    return raw


@pytest.mark.parametrize("expectations, path, message", [
    ([{"result": "iaa", "mean": 1}], "header.expect.0.result", "no metric named 'iaa'"),
    ([{"result": "iia", "mean": 1, "points": ["pos=-9"]}], "header.expect.0.points", "no point named"),
    ([{"result": "iia", "mean": 1, "points": {"layer": 0}}], "header.expect.0.points.layer", "no axis"),
    ([{"result": "iia", "mean": 1, "points": {"pos": [-1, -7]}}], "header.expect.0.points.pos", "no value -7"),
    ([{"result": "iia"}], "header.expect.0", "neither"),
    ([{"result": "iia", "mean": {">": 1, "<": 2}}], "header.expect.0.mean", "exactly one operator"),
])
def test_a_document_with_a_wrong_expectation_is_refused_at_its_path(expectations, path, message):
    with pytest.raises(DocumentError) as err:
        front.points(_sweep(expectations))  # runs the collection-time checks
    assert err.value.path == path and message in err.value.problem


def test_expectations_are_outside_the_digest_and_in_the_schema():
    plain = front.points(_sweep([]))
    tightened = front.points(_sweep([{"result": "iia", "mean": {">": 0.9}}]))
    assert [p.spec.produced_by for p in plain] == [p.spec.produced_by for p in tightened]
    from causalab_mini.document.spec import Spec
    schema = Spec.model_json_schema()
    assert {"result", "points", "mean", "all", "eligible"} <= set(schema["$defs"]["Expectation"]["properties"])
    assert schema["$defs"]["Comparison"]["anyOf"][0]["type"] == "number"


def test_a_sweep_points_document_keeps_its_own_expectations_and_stands_alone():
    """A point's document (what a hook changes and the plugin compiles alone, what a point's folder
    holds) carries the expectations that apply there, without "points", so it validates by itself."""
    exps = [{"result": "iia", "mean": 1, "points": ["pos=-1"]},
            {"result": "logit_diff", "all": {"<": 0}, "points": {"pos": [-2, -3]}},
            {"result": "iia", "eligible": 1}]
    for point in front.points(_sweep(exps)):
        raw = point.document["header"]["expect"]
        want = [{k: v for k, v in e.items() if k != "points"} for e in exps
                if Expectation.model_validate(e).applies(point.name, point.coords)]
        assert raw == want and [e.points for e in point.spec.header.expect] == [None] * len(want)
        (alone,) = front.points(point.document)
        assert alone.name is None and alone.spec.produced_by == point.spec.produced_by
        assert [e.result for e in alone.spec.header.expect] == [e["result"] for e in want]


def test_the_corpus_expectations_validate():
    for path in sorted(SWEEP.parent.parent.rglob("*" + cm.SUFFIX)):
        front.points(copy.deepcopy(front.read(path)))

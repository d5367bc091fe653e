"""Sweep lowering on raw JSON: axes, point names, documents, and every refusal."""
from __future__ import annotations

import copy
import json

import hypothesis
import hypothesis.strategies as st
import pytest

from causalab_mini.errors import SweepError
from causalab_mini.document.sweep import (
    Axis,
    axes,
    find_wrappers,
    is_swept,
    label,
    lower,
    refuse_unlowered,
)


def pos_sweep_document(pos=None) -> dict:
    """The spec's pos_sweep_cpu.json (trimmed to the fields that matter here)."""
    return {
        "header": {"protocol_version": "3", "description": "pos sweep"},
        "model": {"key": "hf-internal-testing/tiny-random-LlamaForCausalLM", "revision": "9fb1912", "dtype": "fp32"},
        "data": {"base": {"dataset": "weekdays/train", "field": "input"}},
        "method": {
            "sites": {"target": {"component": "block_output", "layers": [0]}, "lm_head": {"component": "lm_head"}},
            "reads": {"v_cf": {"site": "target", "pos": -1, "model": "original", "input": "counterfactual"}},
            "writes": {
                "patch": {
                    "site": "target",
                    "pos": {"sweep": [-1, -2, -3]} if pos is None else pos,
                    "do": {"swap": "v_cf"},
                }
            },
            "save": [{"value": "iia", "file_path": "iia.json"}],
        },
    }


def refusal(raw) -> str:
    with pytest.raises(SweepError) as info:
        lower(raw)
    return str(info.value)


# --- the spec's examples ---------------------------------------------------------------------


def test_pos_sweep_gives_three_points_differing_only_at_the_swept_field():
    raw = pos_sweep_document()
    points = lower(raw)
    assert [p.name for p in points] == ["pos=-1", "pos=-2", "pos=-3"]
    assert [p.coords for p in points] == [(("pos", -1),), (("pos", -2),), (("pos", -3),)]
    for point, value in zip(points, [-1, -2, -3]):
        assert point.document == pos_sweep_document(pos=value)
        # key order is the document's own
        assert json.dumps(point.document) == json.dumps(pos_sweep_document(pos=value))
    assert axes(raw) == [Axis("pos", ("method.writes.patch.pos",), (-1, -2, -3), ((-1, -2, -3),))]
    assert find_wrappers(raw) == [("method.writes.patch.pos", {"sweep": [-1, -2, -3]})]


def test_one_element_lists_collapse_in_the_name_but_not_in_the_document():
    raw = {"sites": {"attn": {"component": "attention_head", "heads": {"sweep": [[0], [1], [2], [3]]}}}}
    points = lower(raw)
    assert [p.name for p in points] == ["heads=0", "heads=1", "heads=2", "heads=3"]
    assert points[2].document["sites"]["attn"]["heads"] == [2]
    assert points[2].coords == (("heads", [2]),)


def test_longer_lists_keep_compact_json_in_the_name():
    raw = {"sites": {"mlp": {"units": {"sweep": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]}}}}
    points = lower(raw)
    assert [p.name for p in points] == ["units=[0,1,2,3]", "units=[4,5,6,7]", "units=[8,9,10,11]"]
    assert points[1].document["sites"]["mlp"]["units"] == [4, 5, 6, 7]


def test_range_is_half_open_and_replaces_the_list_element():
    raw = {"sites": {"resid": {"component": "block_output", "layers": [{"sweep": {"range": [0, 16]}}]}}}
    (axis,) = axes(raw)
    assert axis.name == "layers" and axis.paths == ("sites.resid.layers.0",)
    assert axis.values == tuple(range(16))
    points = lower(raw)
    assert len(points) == 16
    assert points[3].name == "layers=3"
    assert points[3].document["sites"]["resid"]["layers"] == [3]  # still a list, holding an int
    assert points[3].coords == (("layers", 3),)


@pytest.mark.parametrize(
    "bounds, expected",
    [([2, 11, 3], (2, 5, 8)), ([3, -1, -1], (3, 2, 1, 0)), ([10, 0, -4], (10, 6, 2))],
)
def test_range_with_a_step(bounds, expected):
    raw = {"x": {"layer": {"sweep": {"range": bounds}}}}
    assert axes(raw)[0].values == expected
    assert [p.document["x"]["layer"] for p in lower(raw)] == list(expected)


def weekdays_layer_sweep(read_pos=(-4, -1), write_pos=(-4, -1)) -> dict:
    return {
        "model": {"key": "m"},
        "interventions": {
            "patching": {
                "sites": {"resid": {"component": "block_output", "layers": [{"sweep": {"range": [0, 3]}}]}},
                "reads": {"v_cf": {"site": "resid", "pos": {"sweep": list(read_pos), "as": "pos"}}},
                "writes": {"patch": {"site": "resid", "pos": {"sweep": list(write_pos), "as": "pos"}}},
            }
        },
    }


def test_two_axes_with_a_shared_as_name_are_a_cross_product_moving_together():
    raw = weekdays_layer_sweep()
    found = axes(raw)
    assert [a.name for a in found] == ["layers", "pos"]
    assert found[1].paths == ("interventions.patching.reads.v_cf.pos", "interventions.patching.writes.patch.pos")
    points = lower(raw)
    assert len(points) == 3 * 2  # not 3 * 2 * 2: the read and write positions are one axis
    assert [p.name for p in points] == [
        "layers=0,pos=-4", "layers=0,pos=-1",
        "layers=1,pos=-4", "layers=1,pos=-1",
        "layers=2,pos=-4", "layers=2,pos=-1",
    ]
    patching = points[3].document["interventions"]["patching"]
    assert patching["sites"]["resid"]["layers"] == [1]
    assert patching["reads"]["v_cf"]["pos"] == -1 and patching["writes"]["patch"]["pos"] == -1
    assert points[3].coords == (("layers", 1), ("pos", -1))


def test_fields_on_one_axis_may_take_different_values_of_the_same_count():
    points = lower(weekdays_layer_sweep(read_pos=(-4, -1), write_pos=(-3, 0)))
    patching = points[1].document["interventions"]["patching"]
    assert (patching["reads"]["v_cf"]["pos"], patching["writes"]["patch"]["pos"]) == (-1, 0)
    assert points[1].name == "layers=0,pos=-1"  # the axis is named by its first wrapper's values


def test_independent_wrappers_are_a_cross_product_in_reading_order():
    raw = {"b": {"heads": {"sweep": [[0], [1]]}}, "a": {"layers": {"sweep": [10, 11, 12]}}}
    points = lower(raw)
    assert [p.name for p in points] == [
        "heads=0,layers=10", "heads=0,layers=11", "heads=0,layers=12",
        "heads=1,layers=10", "heads=1,layers=11", "heads=1,layers=12",
    ]


def test_two_axes_of_one_name_are_refused_naming_both_and_as_tells_them_apart():
    """``pos=-1,pos=-2`` would be a point no ``point(pos=...)`` selector can pick out."""
    raw = {"reads": {"v": {"pos": {"sweep": [-1, -2]}}}, "writes": {"p": {"pos": {"sweep": [-1, -2]}}}}
    assert refusal(raw) == (
        "writes.p.pos: this sweep and the one at reads.v.pos are two axes both named 'pos', so their points "
        'cannot be told apart by name; give this one an "as" of its own (e.g. "as": "pos_2"), or give both '
        'the same "as" to move them together')
    raw["writes"]["p"]["pos"]["as"] = "write_pos"
    assert [p.name for p in lower(raw)] == ["pos=-1,write_pos=-1", "pos=-1,write_pos=-2",
                                            "pos=-2,write_pos=-1", "pos=-2,write_pos=-2"]
    raw["reads"]["v"]["pos"]["as"] = "write_pos"  # one axis: they move together
    assert [p.name for p in lower(raw)] == ["write_pos=-1", "write_pos=-2"]
    # An "as" that takes another axis's name is the same refusal.
    raw = {"reads": {"v": {"pos": {"sweep": [-1, -2]}}}, "writes": {"p": {"layer": {"sweep": [0, 1], "as": "pos"}}}}
    assert refusal(raw).startswith("writes.p.layer: this sweep and the one at reads.v.pos are two axes both named 'pos'")


def test_a_float_weight_inside_a_list_is_named_by_its_field():
    raw = {"steps": {"fit": {"objective": [["ce", {"sweep": [0.0001, 0.01]}], ["l1", 1.0]]}}}
    (axis,) = axes(raw)
    assert axis.paths == ("steps.fit.objective.0.1",) and axis.name == "objective"
    points = lower(raw)
    assert [p.name for p in points] == ["objective=0.0001", "objective=0.01"]
    assert points[0].document["steps"]["fit"]["objective"] == [["ce", 0.0001], ["l1", 1.0]]


def test_a_wrapper_under_a_position_object_is_named_by_its_own_key():
    raw = {"interventions": {"g": {"reads": {"logits": {"pos": {"index": {"sweep": [-1, -2]}}}}}}}
    assert axes(raw)[0].name == "index"
    assert [p.name for p in lower(raw)] == ["index=-1", "index=-2"]


def test_as_names_the_axis():
    raw = {"w": {"weight": {"sweep": [1, 2], "as": "lam"}}}
    assert [p.name for p in lower(raw)] == ["lam=1", "lam=2"]


@pytest.mark.parametrize(
    "value, spelling",
    [
        (-1, "-1"), (0.0001, "0.0001"), (4.0, "4.0"), (True, "true"), (False, "false"), (None, "null"),
        ("mean", "mean"), ([7], "7"), ([[7]], "7"), (["a"], "a"), ([0, 1], "[0,1]"),
        ({"k": 1, "a": [2]}, '{"k":1,"a":[2]}'), ([{"k": 1}], '{"k":1}'), ([], "[]"),
    ],
)
def test_label(value, spelling):
    assert label(value) == spelling


def test_unswept_document_is_one_unnamed_point_with_a_copy():
    raw = pos_sweep_document(pos=-1)
    (point,) = lower(raw)
    assert point.name is None and point.coords == ()
    assert point.document == raw and point.document is not raw
    assert point.document["method"] is not raw["method"]
    assert not is_swept(raw) and axes(raw) == [] and find_wrappers(raw) == []


def test_lowering_does_not_mutate_the_input_and_points_share_nothing():
    raw = weekdays_layer_sweep()
    before = copy.deepcopy(raw)
    points = lower(raw)
    assert raw == before
    points[0].document["model"]["key"] = "changed"
    assert points[1].document["model"]["key"] == "m" and raw["model"]["key"] == "m"


def test_heads_values_are_not_shared_between_points_or_with_the_input():
    raw = {"s": {"heads": {"sweep": [[0], [1]]}}}
    points = lower(raw)
    points[0].document["s"]["heads"].append(9)
    assert raw["s"]["heads"]["sweep"][0] == [0] and lower(raw)[0].document["s"]["heads"] == [0]


def test_an_object_with_sweep_beside_another_key_is_not_a_wrapper():
    raw = {"x": {"sweep": [1], "other": 2}, "y": {"as": "z"}}
    assert not is_swept(raw) and find_wrappers(raw) == []
    (point,) = lower(raw)
    assert point.name is None and point.document == raw


def test_wrappers_inside_an_ordinary_sweep_field_are_still_found():
    raw = {"x": {"sweep": {"n": {"sweep": [1, 2]}}, "other": 2}}
    assert find_wrappers(raw) == [("x.sweep.n", {"sweep": [1, 2]})]
    assert [p.name for p in lower(raw)] == ["n=1", "n=2"]


def test_is_swept():
    assert is_swept(pos_sweep_document()) and is_swept([{"a": {"sweep": [1]}}])


# --- refusals ---------------------------------------------------------------------------------


def test_mismatched_axis_lengths_are_refused_naming_both_paths():
    message = refusal(weekdays_layer_sweep(read_pos=(-4, -1), write_pos=(-4, -2, -1)))
    assert message == (
        "interventions.patching.writes.patch.pos: axis 'pos' has 2 values at "
        "interventions.patching.reads.v_cf.pos and 3 here; fields that move together need a value each per point"
    )


@pytest.mark.parametrize("where", ["key", "revision", "dtype"])
def test_a_swept_model_is_refused(where):
    raw = pos_sweep_document(pos=-1)
    raw["model"][where] = {"sweep": ["a", "b"]}
    with pytest.raises(SweepError) as info:
        lower(raw)
    assert info.value.path == f"model.{where}"
    assert "a point may not ask for a different model" in str(info.value)
    assert "separate" in info.value.fix or "one document per model" in info.value.fix


def test_sweeping_the_whole_model_object_is_refused():
    raw = {"model": {"sweep": [{"key": "a"}, {"key": "b"}]}}
    assert refusal(raw).startswith("model: a point may not ask for a different model")


def test_a_field_called_model_elsewhere_may_be_swept():
    raw = {"reads": {"v": {"model": {"sweep": ["original", "patched"]}}}}
    assert [p.name for p in lower(raw)] == ["model=original", "model=patched"]


@pytest.mark.parametrize("option", ["at_once", "cohorts"])
def test_protocol_sweep_options_are_refused_by_name(option):
    raw = {"a": {"pos": {"sweep": [1, 2], option: True}}}
    message = refusal(raw)
    if option == "cohorts":
        assert message.startswith("a.pos: 'cohorts' is a protocol sweep option causalab-mini does not implement;")
    else:  # a run option here, not a document's: the refusal says where to give it
        assert message.startswith("a.pos: 'at_once' is how many points a run stacks into one model call")
        assert "--at-once N" in message and "--causalab-at-once=N" in message
    with pytest.raises(SweepError, match=option):
        is_swept(raw)
    with pytest.raises(SweepError, match=option):
        find_wrappers({"b": [{"sweep": [1], "as": "x", option: 2}]})
    # inside a sweep value it is still refused, at its full path
    with pytest.raises(SweepError) as info:
        lower({"a": {"pos": {"sweep": [1, {"sweep": [2], option: 1}]}}})
    assert info.value.path == "a.pos.sweep.1" and option in info.value.problem


@pytest.mark.parametrize(
    "wrapper, where",
    [
        ({"sweep": [1, {"sweep": [2, 3]}]}, "sweep.1"),
        ({"sweep": [[0], {"deep": [{"sweep": [1]}]}]}, "sweep.1.deep.0"),
        ({"sweep": {"sweep": [1, 2]}}, None),
    ],
)
def test_a_wrapper_inside_a_sweep_value_is_refused(wrapper, where):
    message = refusal({"x": {"pos": wrapper}})
    assert message.startswith("x.pos: ") and "do not nest" in message
    if where:
        assert f"(at {where})" in message


@pytest.mark.parametrize(
    "wrapper, problem",
    [
        ({"sweep": []}, "sweep has no values"),
        ({"sweep": {"range": [3, 3]}}, "range [3, 3] is empty"),
        ({"sweep": {"range": [0, 5, -1]}}, "range [0, 5, -1] is empty"),
        ({"sweep": {"range": [0, 16.0]}}, "is not [start, stop] or [start, stop, step] in integers"),
        ({"sweep": {"range": [0, True]}}, "in integers"),
        ({"sweep": {"range": ["0", 4]}}, "in integers"),
        ({"sweep": {"range": [0, 1, 2, 3]}}, "range [0, 1, 2, 3] is not"),
        ({"sweep": {"range": [5]}}, "range [5] is not"),
        ({"sweep": {"range": 16}}, "range 16 is not"),
        ({"sweep": {"range": [0, 4, 0]}}, "range step is 0"),
        ({"sweep": {"range": [0, 4], "step": 2}}, "sweep must be a list of values"),
        ({"sweep": 3}, "sweep must be a list of values"),
        ({"sweep": "abc"}, "sweep must be a list of values"),
        ({"sweep": [1, 2], "as": ""}, '"as" must be a non-empty string'),
        ({"sweep": [1, 2], "as": 3}, '"as" must be a non-empty string'),
        ({"sweep": [1, 2], "as": "a=b"}, "contains '='"),
        ({"sweep": [1, 2], "as": "a/b"}, "contains '/'"),
    ],
)
def test_malformed_wrappers_are_refused_at_their_path(wrapper, problem):
    with pytest.raises(SweepError) as info:
        lower({"x": {"pos": wrapper}})
    assert info.value.path == "x.pos"
    assert problem in info.value.problem
    assert info.value.fix  # every refusal says what to write instead


@pytest.mark.parametrize("value, bad", [("weekdays/train", "/"), ("a\\b", "\\"), ("a\0b", "\0"), (["x/y", 1], "/")])
def test_a_label_that_cannot_be_a_directory_name_is_refused(value, bad):
    with pytest.raises(SweepError) as info:
        lower({"data": {"dataset": {"sweep": ["ok", value]}}})
    assert info.value.path == "data.dataset"
    assert f"contains {bad!r}" in info.value.problem


def test_an_overlong_point_name_is_refused():
    message = refusal({"s": {"units": {"sweep": [list(range(100))]}}})
    assert message.startswith("s.units: point name") and "over a directory name's 255" in message


@pytest.mark.parametrize("values", [[1, 1], [1, "1"], [[0], 0], [["a"], "a"]])
def test_two_values_spelled_alike_on_one_axis_are_refused(values):
    message = refusal({"s": {"heads": {"sweep": values}}})
    assert message.startswith("s.heads: values 0 and 1 are both named 'heads=")


def test_two_axes_sharing_a_label_whose_point_names_collide_are_refused():
    # Labels that hold the name's own separators can make two combinations spell alike.
    raw = {"p": {"a": {"sweep": ["1,b=2", "1"]}}, "q": {"b": {"sweep": ["3", "2,b=3"]}}}
    message = refusal(raw)
    assert "two points are both named 'a=1,b=2,b=3'" in message
    assert message.endswith('give one of the axes its own name with "as"')
    raw["q"]["b"]["sweep"] = ["3", "4"]
    assert len(lower(raw)) == 4


def test_a_document_that_is_itself_a_wrapper_is_refused():
    assert "the document itself is a sweep wrapper" in refusal({"sweep": [{"a": 1}, {"a": 2}]})


def test_refuse_unlowered():
    refuse_unlowered(pos_sweep_document(pos=-1), "Spec")  # one point: fine
    with pytest.raises(SweepError) as info:
        refuse_unlowered(pos_sweep_document(), "Document")
    assert info.value.path == "method.writes.patch.pos"
    assert "Document got a sweep wrapper; a document and a plan are each one point" in str(info.value)
    # even a wrapper that could never lower is still a wrapper the front end must not validate
    with pytest.raises(SweepError, match="x.y: Spec got a sweep wrapper"):
        refuse_unlowered({"x": {"y": {"sweep": []}}}, "Spec")
    for point in lower(weekdays_layer_sweep()):
        refuse_unlowered(point.document, "Spec")


# --- property ---------------------------------------------------------------------------------

@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    st.lists(
        st.lists(st.one_of(st.integers(-50, 50), st.lists(st.integers(0, 9), min_size=1, max_size=3)),
                 min_size=1, max_size=4, unique_by=label),
        min_size=0, max_size=4,
    )
)
def test_points_are_the_product_of_axis_lengths_with_unique_names(value_lists):
    raw = {"model": {"key": "m"}, "fields": [{f"f{i}": {"sweep": values}} for i, values in enumerate(value_lists)]}
    points = lower(raw)
    expected = 1
    for values in value_lists:
        expected *= len(values)
    assert len(points) == expected
    assert len({p.name for p in points}) == len(points)
    for point in points:
        assert not is_swept(point.document)
        got = [entry[f"f{i}"] for i, entry in enumerate(point.document["fields"])]
        assert got == [value for _, value in point.coords]
    if not value_lists:
        assert points[0].name is None

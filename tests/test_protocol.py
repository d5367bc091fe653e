"""The protocol-shaped front end (document/protocol.py): lowering to a Spec, and refusals at protocol paths."""
from __future__ import annotations

import copy

import pytest

from causalab_mini.document import sweep
from causalab_mini.errors import DocumentError, SweepError
from causalab_mini.document.protocol import (INTERVENTION, STEP, is_protocol, lower, protocol_path,
                                             validate_document, validate_point)
from causalab_mini.document.spec import validate_spec


def at_a_glance() -> dict:
    """sweeps.md "At a glance", with the model key "tiny-llama" and no revision."""
    return {
        "header": {
            "protocol_version": "3",
            "description": "minimal_cpu.json with the patched position swept: the same interchange at the "
                           "last token, the one before it, and the one before that.",
        },
        "model": {"key": "tiny-llama", "dtype": "fp32"},
        "data": {
            "base": {"dataset": "weekdays/train", "field": "input"},
            "counterfactual": {"dataset": "weekdays/train", "field": "counterfactual_inputs[0]"},
        },
        "method": {
            "sites": {
                "target": {"component": "block_output", "layers": [0]},
                "lm_head": {"component": "lm_head"},
            },
            "reads": {
                "v_cf": {"site": "target", "pos": -1, "model": "original", "input": "counterfactual"},
                "logits": {"site": "lm_head", "pos": -1, "model": "patched", "input": "base"},
            },
            "writes": {"patch": {"site": "target", "pos": {"sweep": [-1, -2, -3]}, "do": {"swap": "v_cf"}}},
            "intervened_models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {
                "iia": {"kind": "match", "of": "logits", "expected": "cf_answer", "token_form": "space_prefixed"},
                "logit_diff": {"kind": "logit_diff", "of": "logits", "a": "cf_answer", "b": "base_answer",
                               "token_form": "space_prefixed"},
            },
            "save": [
                {"value": "iia", "model": "patched", "input": "base", "file_path": "iia.json"},
                {"value": "logit_diff", "model": "patched", "input": "base", "file_path": "logit_diff.json"},
            ],
        },
    }


def plan_shaped(pos: int, *, intervention: str = "patching", step: str = "score") -> dict:
    """The same experiment written by hand in the plan shape, with the point's position."""
    return {
        "header": {"description": "hand-written"},
        "model": {"key": "tiny-llama"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"component": "block_output", "layers": [0]}, "lm_head": {"component": "lm_head"}},
        "interventions": {intervention: {
            "reads": {
                "v_cf": {"site": "target", "pos": -1, "input": "counterfactual"},
                "logits": {"site": "lm_head", "pos": {"index": -1}, "model": "patched", "input": "base"},
            },
            "writes": {"patch": {"site": "target", "pos": pos, "mechanism": "swap", "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {
                "iia": {"kind": "match", "of": "logits", "expected": "cf_answer"},
                "logit_diff": {"kind": "logit_diff", "of": "logits", "a": "cf_answer", "b": "base_answer"},
            },
        }},
        "steps": {step: {
            "kind": "observe",
            "interventions": intervention,
            "rows": {"base": "weekdays/train", "counterfactual": "weekdays/train"},
            "saves": [{"value": "iia", "file_path": "iia.json"},
                      {"value": "logit_diff", "file_path": "logit_diff.json"}],
        }},
    }


def _renamed(canonical: dict, intervention: str, step: str) -> dict:
    """A canonical Spec with its one intervention and one step given the protocol's names."""
    out = copy.deepcopy(canonical)
    out["interventions"] = {INTERVENTION: out["interventions"].pop(intervention)}
    (only,) = out["steps"].values()
    only["interventions"] = INTERVENTION
    out["steps"] = {STEP: only}
    return out


def _points():
    return sweep.lower(at_a_glance())


def test_the_at_a_glance_document_is_three_points():
    points = _points()
    assert [p.name for p in points] == ["pos=-1", "pos=-2", "pos=-3"]
    assert all(is_protocol(p.document) for p in points)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_protocol_point_lowers_to_the_hand_written_plan(index):
    point = _points()[index]
    pos = [-1, -2, -3][index]
    proto = validate_document(point.document)
    hand = validate_spec(plan_shaped(pos))
    assert proto.canonical() == _renamed(hand.canonical(), "patching", "score")
    # With the protocol's own names the two are one experiment, digest and all.
    same_names = validate_spec(plan_shaped(pos, intervention=INTERVENTION, step=STEP))
    assert proto.canonical() == same_names.canonical()
    assert proto.produced_by == same_names.produced_by
    # And each point is its own experiment.
    other = validate_spec(plan_shaped(pos - 1, intervention=INTERVENTION, step=STEP))
    assert proto.produced_by != other.produced_by


def test_the_write_is_lowered_to_a_mechanism_and_an_operand():
    spec = validate_document(_points()[1].document)
    write = spec.interventions[INTERVENTION].writes["patch"]
    assert (write.mechanism, write.operand, write.params, write.pos.index) == ("swap", "v_cf", {}, -2)
    assert spec.header.protocol_version == "3"


@pytest.mark.parametrize("do,mechanism,operand,params", [
    ({"swap": "v_cf"}, "swap", "v_cf", {}),
    ({"swap": 0.0}, "swap", 0.0, {}),
    ({"add_scaled": {"operand": "v_cf", "scale": 4.0}}, "add_scaled", "v_cf", {"scale": 4.0}),
    ({"add_scaled": "v_cf"}, "add_scaled", "v_cf", {"scale": 1.0}),
    ({"lerp": {"operand": "v_cf", "t": 0.25}}, "lerp", "v_cf", {"t": 0.25}),
    ({"renormalize": {}}, "renormalize", None, {}),
    ({"clamp": {"max": 1.0}}, "clamp", None, {"min": None, "max": 1.0}),
])
def test_each_spelling_of_do(do, mechanism, operand, params):
    doc = _points()[0].document
    doc["method"]["writes"]["patch"]["do"] = do
    write = validate_document(doc).interventions[INTERVENTION].writes["patch"]
    assert (write.mechanism, write.operand, write.params) == (mechanism, operand, params)


def test_validate_point_picks_the_front_end_by_shape():
    assert validate_point(_points()[0].document).interventions.keys() == {INTERVENTION}
    assert validate_point(plan_shaped(-1)).interventions.keys() == {"patching"}


# --------------------------------------------------------------------------- refusals at protocol paths


def _refused(mutate, path, *words, error=DocumentError):
    doc = _points()[0].document
    mutate(doc["method"], doc)
    with pytest.raises(error) as info:
        validate_document(doc)
    err = info.value
    assert err.path == path, f"{err.path!r} != {path!r}: {err}"
    for word in words:
        assert word in str(err), f"{word!r} not in {str(err)!r}"
    return err


def test_an_operand_that_is_not_a_read_is_refused_at_do():
    _refused(lambda m, d: m["writes"]["patch"].update(do={"swap": "nope"}), "method.writes.patch.do",
             "'nope' is not a read of this intervention", "v_cf, logits")


def test_do_with_two_keys_is_refused():
    _refused(lambda m, d: m["writes"]["patch"].update(do={"swap": "v_cf", "lerp": {"t": 0.5}}),
             "method.writes.patch.do", "do names 2 mechanisms", 'write exactly one: {"swap": "v_cf"}')


def test_do_with_no_key_is_refused():
    _refused(lambda m, d: m["writes"]["patch"].update(do={}), "method.writes.patch.do", "do names 0 mechanisms")


def test_an_unknown_mechanism_is_refused():
    err = _refused(lambda m, d: m["writes"]["patch"].update(do={"shove": "v_cf"}), "method.writes.patch.do",
                   "unknown mechanism 'shove'")
    assert err.fix == "use one of: add_scaled, clamp, gaussian, lerp, renormalize, swap"


def test_a_mechanism_parameter_is_refused_at_do():
    _refused(lambda m, d: m["writes"]["patch"].update(do={"lerp": {"operand": "v_cf"}}),
             "method.writes.patch.do", "lerp", "'t'")
    _refused(lambda m, d: m["writes"]["patch"].update(do={"swap": {"operand": "v_cf", "scale": 2}}),
             "method.writes.patch.do", "swap", "'scale'")
    _refused(lambda m, d: m["writes"]["patch"].update(do={"renormalize": "v_cf"}),
             "method.writes.patch.do", "renormalize takes no operand")
    _refused(lambda m, d: m["writes"]["patch"].update(do={"swap": {}}),
             "method.writes.patch.do", "swap needs an operand")


def test_an_intervened_model_naming_an_unknown_write():
    _refused(lambda m, d: m["intervened_models"]["patched"].update(writes=["nope"]),
             "method.intervened_models.patched.writes.0", "write 'nope' is not declared", "declared: patch")


def test_data_refusals_come_back_under_data():
    _refused(lambda m, d: d["data"]["base"].update(dataset="weekdays"), "data.base.dataset",
             "'weekdays' is not a dataset reference", '"name/split"')
    _refused(lambda m, d: d["data"]["base"].update(split="train"), "data.base.split", "unknown key 'split'")
    _refused(lambda m, d: d["data"]["base"].pop("field"), "data.base.field", "Field required")
    _refused(lambda m, d: d["data"].pop("counterfactual"), "method.reads.v_cf.input",
             "role 'counterfactual' is not declared")


def test_method_refusals_keep_their_protocol_paths():
    _refused(lambda m, d: m.update(bogus=1), "method.bogus", "unknown key 'bogus'")
    _refused(lambda m, d: m.pop("sites"), "method.sites", "Field required")
    _refused(lambda m, d: m["sites"]["target"].update(layers=[0, 1]), "method.sites.target.layers", "one layer")
    _refused(lambda m, d: m["sites"]["target"].update(component="resid"), "method.sites.target.component")
    _refused(lambda m, d: m["writes"]["patch"].update(pos={"index": -1, "last": 2}), "method.writes.patch.pos",
             "exactly one cut")
    _refused(lambda m, d: m["reads"]["v_cf"].update(input="nope"), "method.reads.v_cf.input",
             "role 'nope' is not declared")
    _refused(lambda m, d: m["metrics"]["iia"].update(of="v_cf"), "method.metrics.iia.of",
             "read 'v_cf' is at block_output, not at logits")
    _refused(lambda m, d: m["save"][0].update(file_path="iia.csv"), "method.save.0.file_path", "'iia.csv'")
    _refused(lambda m, d: m["save"][0].update(model="original"), "method.save.0.model",
             "metric 'iia' is scored on model 'patched', not 'original'")
    _refused(lambda m, d: m["save"][1].update(value="ghost"), "method.save.1.value", "'ghost' is not a metric")
    _refused(lambda m, d: m["writes"]["patch"].update(featurizer="rot"), "method.writes.patch.featurizer",
             "featurizer 'rot' is not declared")
    _refused(lambda m, d: m["intervened_models"].update(original={"input": "base"}),
             "method.intervened_models.original", "cannot be redefined")


def test_model_and_header_refusals():
    _refused(lambda m, d: d["model"].update(key="/abs/model"), "model.key", "absolute path")
    _refused(lambda m, d: d.update(extra=1), "extra", "unknown key 'extra'")
    _refused(lambda m, d: d.pop("data"), "data", "Field required")


def test_a_sweep_wrapper_reaching_the_protocol_front_end():
    with pytest.raises(SweepError) as info:
        validate_document(at_a_glance())
    assert info.value.path == "method.writes.patch.pos"
    assert "Document got a sweep wrapper" in info.value.problem
    with pytest.raises(SweepError):
        lower(at_a_glance())


@pytest.mark.parametrize("plan,proto", [
    ("interventions.method.writes.patch.operand", "method.writes.patch.do"),
    ("interventions.method.writes.patch.params", "method.writes.patch.do"),
    ("interventions.method.writes.patch.mechanism", "method.writes.patch.do"),
    ("interventions.method.writes.patch.pos", "method.writes.patch.pos"),
    ("interventions.method.models.patched.writes.0", "method.intervened_models.patched.writes.0"),
    ("interventions.method.reads.v_cf.site", "method.reads.v_cf.site"),
    ("interventions.method", "method"),
    ("steps.observe.saves.0.file_path", "method.save.0.file_path"),
    ("steps.observe.outputs.mean", "method.outputs.mean"),
    ("steps.observe.rows.base", "data.base.dataset"),
    ("steps.observe.rows", "data"),
    ("roles.base.field", "data.base.field"),
    ("sites.target.layers", "method.sites.target.layers"),
    ("featurizers.rot.k", "method.featurizers.rot.k"),
    ("model.key", "model.key"),
])
def test_protocol_path(plan, proto):
    assert protocol_path(plan) == proto

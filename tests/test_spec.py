"""The plan-shaped document (document/spec.py, document/rules.py, shapes.py): every refusal, and the digest.

Each refusal starts from one valid document, changes one thing, and asserts the
error's type, the exact document path it names, and the words of what is wrong
and what to write instead. No model and no data are needed: all of this is
decided from the document alone.
"""
from __future__ import annotations

import copy
import json

import hypothesis
import hypothesis.strategies as st
import pytest

from causalab_mini.document.spec import Spec, validate_spec
from causalab_mini.errors import DocumentError, SweepError
from samples import patching_document


base = patching_document


def iv(doc: dict) -> dict:
    return doc["interventions"]["patching"]


def write(doc: dict) -> dict:
    return iv(doc)["writes"]["patch"]


def with_harvest(doc: dict) -> dict:
    """A first step that publishes the mean of a read as ``mean``."""
    doc["interventions"]["harvest"] = {"reads": {"acts": {"site": "target", "pos": -1, "input": "base"}}}
    doc["steps"] = {"harvest": {"kind": "observe", "interventions": "harvest",
                                "rows": {"base": "weekdays/train"},
                                "outputs": {"mean": {"read": "acts", "reduce": "mean"}}},
                    **doc["steps"]}
    return doc


def with_rot(doc: dict) -> dict:
    """The interchange through a rank-4 subspace, and a fit step training it."""
    doc["featurizers"] = {"rot": {"kind": "subspace", "site": "target", "k": 4}}
    iv(doc)["reads"]["v_cf"]["featurizer"] = "rot"
    write(doc)["featurizer"] = "rot"
    doc["steps"] = {"fit": {"kind": "fit", "interventions": "patching",
                            "rows": {"base": "weekdays/train", "counterfactual": "weekdays/train"},
                            "params": ["rot"], "objective": [[-1.0, "logit_diff"]]},
                    **doc["steps"]}
    return doc


def with_gate(doc: dict) -> dict:
    doc["featurizers"] = {"mask": {"kind": "gate", "site": "target"}}
    iv(doc)["reads"]["v_cf"]["featurizer"] = "mask"
    write(doc)["featurizer"] = "mask"
    doc["steps"] = {"fit": {"kind": "fit", "interventions": "patching",
                            "rows": {"base": "weekdays/train", "counterfactual": "weekdays/train"},
                            "params": ["mask"], "objective": [[-1.0, "logit_diff"], [0.01, "mask.mask"]]},
                    **doc["steps"]}
    return doc


def with_decode(doc: dict, n: int = 3) -> dict:
    iv(doc)["decode"] = n
    return doc


def refused(doc: dict, path: str, *words: str, error=DocumentError) -> DocumentError:
    with pytest.raises(error) as info:
        validate_spec(doc)
    err = info.value
    assert err.path == path, f"path {err.path!r}, wanted {path!r}: {err}"
    text = str(err)
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"
    assert text.startswith(path + ": ")
    return err


# --------------------------------------------------------------------------- the valid ones


def test_the_base_documents_are_valid():
    spec = validate_spec(base())
    assert isinstance(spec, Spec)
    assert spec.sites["target"].layer == 0
    assert spec.interventions["patching"].writes["patch"].pos.index == -1
    for extend in (with_harvest, with_rot, with_gate, with_decode):
        assert isinstance(validate_spec(extend(base())), Spec)


def test_generated_frame_steps_are_writable_and_any_cut_is_readable():
    doc = with_decode(base())
    write(doc)["pos"] = {"frame": "generated", "index": 2}
    iv(doc)["reads"]["logits"]["pos"] = {"frame": "generated", "index": -1}
    spec = validate_spec(doc)
    assert spec.interventions["patching"].writes["patch"].pos.is_step
    write(doc)["pos"] = {"frame": "generated", "all": True}
    assert validate_spec(doc).interventions["patching"].writes["patch"].pos.all is True


def test_mechanism_params_are_stored_with_their_defaults():
    doc = base()
    write(doc).update(mechanism="add_scaled")
    assert validate_spec(doc).interventions["patching"].writes["patch"].params == {"scale": 1.0}
    write(doc).update(mechanism="gaussian", params={"std": 2})
    del write(doc)["operand"]
    assert validate_spec(doc).interventions["patching"].writes["patch"].params == {"std": 2.0, "seed": 0}


# --------------------------------------------------------------------------- refusals

def _set(path: str, value):
    """A mutation setting one dotted path (list indices as integers) to ``value``."""
    def mutate(doc):
        parts = [int(p) if p.isdigit() else p for p in path.split(".")]
        target = doc
        for p in parts[:-1]:
            target = target[p]
        target[parts[-1]] = value
    return mutate


def _drop(path: str):
    def mutate(doc):
        parts = [int(p) if p.isdigit() else p for p in path.split(".")]
        target = doc
        for p in parts[:-1]:
            target = target[p]
        del target[parts[-1]]
    return mutate


def _chain(*mutations):
    def mutate(doc):
        for m in mutations:
            m(doc)
    return mutate


W = "interventions.patching.writes.patch"
R = "interventions.patching.reads"
M = "interventions.patching.metrics"

UNKNOWN_KEYS = [
    ("", "bogus"),
    ("header", "bogus"),
    ("model", "bogus"),
    ("roles.base", "bogus"),
    ("sites.target", "bogus"),
    ("interventions.patching", "bogus"),
    (f"{R}.v_cf", "bogus"),
    (W, "bogus"),
    ("interventions.patching.models.patched", "bogus"),
    (f"{M}.iia", "bogus"),
    ("steps.score", "bogus"),
    ("steps.score.saves.0", "bogus"),
]


@pytest.mark.parametrize("where,key", UNKNOWN_KEYS, ids=[w or "<top>" for w, _ in UNKNOWN_KEYS])
def test_an_unknown_key_anywhere_is_refused_at_its_path(where, key):
    doc = base()
    target = doc
    for p in [int(p) if p.isdigit() else p for p in where.split(".") if p]:
        target = target[p]
    target[key] = 1
    path = f"{where}.{key}" if where else key
    err = refused(doc, path, f"unknown key {key!r}")
    assert "schema" in err.fix


@pytest.mark.parametrize("field,path", [
    ("model", "model"),
    ("roles", "roles"),
    ("steps", "steps"),
    ("model.key", "model.key"),
    ("roles.base.field", "roles.base.field"),
    ("sites.target.component", "sites.target.component"),
    (f"{R}.v_cf.site", f"{R}.v_cf.site"),
    (f"{R}.v_cf.input", f"{R}.v_cf.input"),
    (f"{R}.v_cf.pos", f"{R}.v_cf.pos"),
    (f"{W}.mechanism", f"{W}.mechanism"),
    (f"{M}.iia.kind", f"{M}.iia.kind"),
    ("steps.score.rows", "steps.score.rows"),
    ("steps.score.saves.0.file_path", "steps.score.saves.0.file_path"),
])
def test_a_missing_field_is_refused_at_its_path(field, path):
    doc = base()
    _drop(field)(doc)
    err = refused(doc, path, "Field required")
    assert err.fix == "add it"


CASES = [
    # --- sites (spec.Site) ---------------------------------------------------------------
    pytest.param(_set("sites.target.component", "resid"), "sites.target.component",
                 ["block_output", "lm_head", "use one of the values listed"], id="bad-component"),
    pytest.param(_set("sites.target.layers", [0, 1]), "sites.target.layers",
                 ["one layer", "names 2", "sweep"], id="layers-two"),
    pytest.param(_drop("sites.target.layers"), "sites.target.layers",
                 ["block_output is inside a layer", '"layers": [l]'], id="layered-without-layers"),
    pytest.param(_set("sites.head.layers", [0]), "sites.head.layers",
                 ["lm_head has no layer", 'remove "layers"'], id="layers-on-unlayered"),
    pytest.param(_set("sites.target.layers", [-1]), "sites.target.layers",
                 ["counted from 0"], id="negative-layer"),
    pytest.param(_set("sites.target.heads", [0]), "sites.target.heads",
                 ['block_output takes "units", not "heads"'], id="heads-on-units-component"),
    pytest.param(_set("sites.head.units", [0]), "sites.head.units",
                 ['lm_head takes no selector, not "units"'], id="units-on-lm_head"),
    pytest.param(_set("sites.target.units", [1, 1]), "sites.target.units",
                 ["units [1, 1] repeats an index"], id="duplicate-units"),
    pytest.param(_set("sites.target.units", []), "sites.target.units",
                 ["units is empty", "omit it"], id="empty-units"),
    pytest.param(_set("sites.target.units", [-2]), "sites.target.units",
                 ["counted from 0"], id="negative-unit"),
    pytest.param(_set("sites.z", {"component": "attention_z", "layers": [0], "heads": [2, 2]}),
                 "sites.z.heads", ["heads [2, 2] repeats an index"], id="duplicate-heads"),
    # --- model ------------------------------------------------------------------------------
    pytest.param(_set("model.key", "/models/tiny-llama"), "model.key",
                 ["absolute path", "portably", "relative to the document"], id="absolute-model-key"),
    pytest.param(_set("model.key", "C:\\models\\tiny"), "model.key", ["absolute path"],
                 id="windows-absolute-model-key"),
    pytest.param(_set("model.key", "~/tiny"), "model.key", ["absolute path"], id="home-model-key"),
    pytest.param(_set("model.key", ""), "model.key", ["model key is empty"], id="empty-model-key"),
    pytest.param(_set("model.dtype", "fp64"), "model.dtype", ["fp32", "bf16"], id="bad-dtype"),
    # --- positions (shapes.Where, via spec) -------------------------------------------------
    pytest.param(_set(f"{W}.pos", {"index": -1, "last": 2}), f"{W}.pos",
                 ["exactly one cut", "has 2 (index, last)"], id="two-cuts"),
    pytest.param(_set(f"{W}.pos", {"scope": {"variable": "entity"}}), f"{W}.pos",
                 ["exactly one cut", "has 0"], id="no-cut"),
    pytest.param(_set(f"{R}.v_cf.pos", {"index": -1, "scope": {"segment": "eos"}}), f"{R}.v_cf.pos",
                 ["segment 'eos' is a run of the generated frame", "a prompt has none"], id="eos-in-prompt"),
    pytest.param(_chain(with_decode, _set(f"{R}.v_cf.pos",
                                         {"frame": "generated", "index": -1, "scope": {"segment": "user"}})),
                 f"{R}.v_cf.pos", ["segment 'user' is a chat turn of the prompt",
                                   "the generated frame has only 'eos'"], id="chat-segment-in-generated"),
    pytest.param(_set(f"{R}.v_cf.pos", {"index": -1, "scope": {"segment": "bot"}}), f"{R}.v_cf.pos",
                 ["segment 'bot'", "user[1]"], id="unknown-segment"),
    pytest.param(_set(f"{R}.v_cf.pos", {"index": -1, "scope": {}}), f"{R}.v_cf.pos",
                 ['a scope names a "variable", a "segment", or both'], id="empty-scope"),
    pytest.param(_set(f"{R}.v_cf.pos", {"index": -1, "scope": {"var": "x"}}), f"{R}.v_cf.pos",
                 ['scope is {"variable": name}'], id="scope-unknown-key"),
    pytest.param(_set(f"{W}.pos", {"index": -1, "bogus": 1}), f"{W}.pos",
                 ["unknown position key(s) ['bogus']"], id="position-unknown-key"),
    pytest.param(_set(f"{W}.pos", {"index": -1, "frame": "future"}), f"{W}.pos",
                 ["frame 'future' is not 'prompt' or 'generated'"], id="unknown-frame"),
    pytest.param(_set(f"{W}.pos", {"span": [3, 1]}), f"{W}.pos", ["span [3, 1] is empty"], id="empty-span"),
    pytest.param(_set(f"{W}.pos", {"span": [1, 2, 3]}), f"{W}.pos", ["span is [start, stop]"],
                 id="span-of-three"),
    pytest.param(_set(f"{W}.pos", {"last": 0}), f"{W}.pos", ["last 0 is not a positive"], id="last-zero"),
    pytest.param(_set(f"{W}.pos", {"all": False}), f"{W}.pos", ['"all": true'], id="all-false"),
    pytest.param(_set(f"{W}.pos", {"index": "-1"}), f"{W}.pos", ["index is an integer"], id="index-string"),
    pytest.param(_set(f"{W}.pos", 1.5), f"{W}.pos", ["an integer or an object"], id="pos-float"),
    pytest.param(_set(f"{W}.pos", True), f"{W}.pos", ["not a boolean"], id="pos-bool"),
    # --- the generated frame (rules._check_frame) --------------------------------------------
    pytest.param(_set(f"{R}.logits.pos", {"frame": "generated", "index": 0}), f"{R}.logits.pos",
                 ["the generated frame needs a decode", '"decode": N', "interventions.patching"],
                 id="generated-without-decode"),
    pytest.param(_chain(lambda d: with_decode(d, 2), _set(f"{R}.logits.pos", {"frame": "generated", "index": 2})),
                 f"{R}.logits.pos", ["decode step 2 is past the decode of 2 steps", "below 2"],
                 id="decode-step-past-the-bound"),
    pytest.param(_chain(with_decode, _set(f"{W}.pos", {"frame": "generated", "last": 2})),
                 "interventions.patching", ["write 'patch'", "{generated last:2}", "not something to write into"],
                 id="generated-write-at-a-cut"),
    # --- writes and mechanisms ----------------------------------------------------------------
    pytest.param(_set(f"{W}.mechanism", "shove"), f"{W}.mechanism", ["swap", "renormalize"],
                 id="unknown-mechanism"),
    pytest.param(_drop(f"{W}.operand"), f"{W}.operand", ["swap needs an operand", '{"ref": output}'],
                 id="swap-without-operand"),
    pytest.param(_set(f"{W}.operand", True), f"{W}.operand", ["not a boolean"], id="boolean-operand"),
    pytest.param(_set(f"{W}.params", {"scale": 2.0}), f"{W}.params", ["swap", "'scale'"],
                 id="unknown-mechanism-param"),
    pytest.param(_set(f"{W}.mechanism", "lerp"), f"{W}.params", ["lerp", "'t'"], id="lerp-without-t"),
    pytest.param(_chain(_set(f"{W}.mechanism", "clamp"), _drop(f"{W}.operand")), f"{W}.params",
                 ["clamp", "'min'", "'max'"], id="clamp-without-bounds"),
    pytest.param(_chain(_set(f"{W}.mechanism", "clamp"), _drop(f"{W}.operand"),
                        _set(f"{W}.params", {"min": 2, "max": 1})), f"{W}.params",
                 ["clamp", "min", "max"], id="clamp-min-above-max"),
    pytest.param(_chain(_set(f"{W}.mechanism", "gaussian"), _drop(f"{W}.operand"),
                        _set(f"{W}.params", {"std": 0})), f"{W}.params", ["gaussian", "std"],
                 id="gaussian-std-zero"),
    pytest.param(_chain(_set(f"{W}.mechanism", "gaussian"), _drop(f"{W}.operand"),
                        _set(f"{W}.params", {"std": -1.0})), f"{W}.params", ["gaussian", "std"],
                 id="gaussian-std-negative"),
    pytest.param(_set(f"{W}.mechanism", "renormalize"), f"{W}.operand",
                 ["renormalize takes no operand", 'remove "operand"'], id="operand-given-to-renormalize"),
    pytest.param(_set(f"{W}.features", [1, 1]), f"{W}.features", ["repeat an index", "distinct"],
                 id="duplicate-features"),
    pytest.param(_set(f"{W}.features", []), f"{W}.features", ["non-negative indices"], id="empty-features"),
    pytest.param(_set(f"{W}.site", "nowhere"), f"{W}.site", ["site 'nowhere' is not declared",
                                                            "declared: head, target"], id="write-unknown-site"),
    pytest.param(_chain(_set("sites.out", {"component": "logits"}), _set(f"{W}.site", "out")), f"{W}.site",
                 ["nothing runs after it", "write at lm_head"], id="write-at-logits"),
    # --- operands ----------------------------------------------------------------------------
    pytest.param(_set(f"{W}.operand", "nope"), f"{W}.operand",
                 ["'nope' is not a read of this intervention", '{"ref": name}', "v_cf, logits"],
                 id="operand-unknown-read"),
    pytest.param(_chain(with_harvest, _set(f"{W}.operand", "mean")), f"{W}.operand",
                 ["'mean' is an output", 'write {"ref": "mean"}'], id="operand-output-without-ref"),
    pytest.param(_chain(with_harvest, _set(f"{W}.operand", {"ref": "mean"}),
                        lambda d: d.update(steps={"score": d["steps"]["score"],
                                                  "harvest": d["steps"]["harvest"]})),
                 f"{W}.operand", ['{"ref": "mean"} is not published by a step before \'score\''],
                 id="ref-before-it-is-published"),
    pytest.param(_set(f"{W}.operand", {"ref": "never"}), f"{W}.operand",
                 ['{"ref": "never"} is not published', "earlier observe step"], id="ref-never-published"),
    pytest.param(_chain(_set(f"{R}.v_cf.view", "logits")), f"{W}.operand",
                 ["read 'v_cf' is a logits view", "without a view"], id="operand-is-a-logits-view"),
    pytest.param(_chain(_set("featurizers", {"rot": {"kind": "subspace", "site": "target", "k": 4}}),
                        _set(f"{W}.featurizer", "rot")), f"{W}.operand",
                 ["'identity'", "'rot'", "same featurizer"], id="operand-in-another-space"),
    pytest.param(_set(f"{W}.pos", {"last": 2}), f"{W}.operand",
                 ["1 position(s) wide and this write is 2"], id="operand-narrower-than-write"),
    # --- featurizers -------------------------------------------------------------------------
    pytest.param(_chain(with_rot, _set("sites.other", {"component": "block_output", "layers": [1]}),
                        _set(f"{W}.site", "other")), f"{W}.featurizer",
                 ["belongs to site 'target'", "at site 'other'", "exactly one site", "second featurizer"],
                 id="featurizer-at-two-sites"),
    pytest.param(_chain(with_rot, _set(f"{W}.featurizer", "nope"), _set(f"{R}.v_cf.featurizer", "nope")),
                 f"{R}.v_cf.featurizer", ["featurizer 'nope' is not declared", "declared: rot"],
                 id="undeclared-featurizer"),
    pytest.param(_set("featurizers", {"rot": {"kind": "subspace", "site": "nowhere", "k": 2}}),
                 "featurizers.rot.site", ["site 'nowhere' is not declared"], id="featurizer-unknown-site"),
    pytest.param(_set("featurizers", {"rot": {"kind": "subspace", "site": "target"}}), "featurizers.rot",
                 ["a subspace needs k"], id="subspace-without-k"),
    pytest.param(_set("featurizers", {"p": {"kind": "pca", "site": "target", "k": 2}}), "featurizers.p",
                 ['"file_path"'], id="pca-without-file"),
    pytest.param(_set("featurizers", {"g": {"kind": "gate", "site": "target", "k": 2}}), "featurizers.g.k",
                 ["a gate's features are the site's units; it takes no k"], id="gate-with-k"),
    pytest.param(_set("featurizers", {"r": {"kind": "subspace", "site": "target", "k": 2, "start": 1.0}}),
                 "featurizers.r.start", ["only a gate takes it"], id="start-on-a-subspace"),
    pytest.param(_set("featurizers", {"r": {"kind": "subspace", "site": "target", "k": 0}}), "featurizers.r.k",
                 ["greater than or equal to 1"], id="k-zero"),
    pytest.param(_set("featurizers", {"r": {"kind": "sae", "site": "target", "file_path": "/abs/sae.safetensors"}}),
                 "featurizers.r.file_path", ["absolute path", "relative to the document"],
                 id="featurizer-absolute-file"),
    pytest.param(_set("featurizers", {"r": {"kind": "rotation", "site": "target"}}), "featurizers.r.kind",
                 ["subspace"], id="unknown-featurizer-kind"),
    pytest.param(_chain(_set(f"{R}.v_cf.view", "logits"), _set(f"{W}.operand", 0.0),
                        _set("featurizers", {"rot": {"kind": "subspace", "site": "target", "k": 4}}),
                        _set(f"{R}.v_cf.featurizer", "rot")), f"{R}.v_cf.view",
                 ["not of a featurizer's space"], id="logits-view-through-featurizer"),
    # --- reads and models --------------------------------------------------------------------
    pytest.param(_set(f"{R}.v_cf.site", "nowhere"), f"{R}.v_cf.site", ["site 'nowhere' is not declared"],
                 id="read-unknown-site"),
    pytest.param(_set(f"{R}.v_cf.input", "other"), f"{R}.v_cf.input",
                 ["role 'other' is not declared", "base, counterfactual"], id="read-unknown-role"),
    pytest.param(_set(f"{R}.v_cf.model", "ghost"), f"{R}.v_cf.model",
                 ["model 'ghost' is not declared", "original, patched"], id="read-unknown-model"),
    pytest.param(_set(f"{R}.logits.input", "counterfactual"), f"{R}.logits.input",
                 ["model 'patched' runs on 'base', not 'counterfactual'", '"input": "base"'],
                 id="read-of-a-model-on-another-input"),
    pytest.param(_set(f"{R}.logits.view", "logits"), f"{R}.logits.view",
                 ["lm_head is not one", "block_output"], id="logits-view-of-lm_head"),
    pytest.param(_set(f"{R}.logits.view", "probs"), f"{R}.logits.view", ["'logits'"], id="unknown-view"),
    pytest.param(_set("interventions.patching.models.original", {"input": "base"}),
                 "interventions.patching.models.original", ["cannot be redefined"], id="original-redefined"),
    pytest.param(_set("interventions.patching.models.patched.writes", ["patch", "patch"]),
                 "interventions.patching.models.patched.writes", ["lists a write twice"], id="write-listed-twice"),
    pytest.param(_set("interventions.patching.models.patched.writes", ["nope"]),
                 "interventions.patching.models.patched.writes.0", ["write 'nope' is not declared"],
                 id="model-unknown-write"),
    pytest.param(_set("interventions.patching.models.patched.input", "other"),
                 "interventions.patching.models.patched.input", ["role 'other' is not declared"],
                 id="model-unknown-role"),
    pytest.param(_set("interventions.patching.decode", 0), "interventions.patching.decode",
                 ["greater than or equal to 1"], id="decode-zero"),
    # --- metrics -----------------------------------------------------------------------------
    pytest.param(_set(f"{R}.logits.pos", {"all": True}), f"{M}.iia.of",
                 ["one position per row", "{all}", "varying number of", '{"index": -1}'], id="metric-of-all"),
    pytest.param(_set(f"{R}.logits.pos", {"last": 3}), f"{M}.iia.of",
                 ["one position per row", "{last:3}", "3 positions wide"], id="metric-of-last-3"),
    pytest.param(_set(f"{M}.iia.of", "v_cf"), f"{M}.iia.of",
                 ["read 'v_cf' is at block_output, not at logits", '"view": "logits"'], id="metric-of-non-logits"),
    pytest.param(_set(f"{M}.iia.of", "ghost"), f"{M}.iia.of", ["read 'ghost' is not declared"],
                 id="metric-of-unknown-read"),
    pytest.param(_drop(f"{M}.iia.expected"), f"{M}.iia.expected",
                 ["match names the column(s) ['expected']", "missing 'expected'"], id="metric-missing-column"),
    pytest.param(_set(f"{M}.iia.token", "cf_answer"), f"{M}.iia.token",
                 ["'token' belongs to token_logit, token_prob"], id="metric-column-of-another-kind"),
    pytest.param(_set(f"{M}.iia.kind", "accuracy"), f"{M}.iia.kind", ["match", "logit_diff"],
                 id="unknown-metric-kind"),
    pytest.param(_set(f"{M}.iia.token_form", "bare"), f"{M}.iia.token_form", ["space_prefixed"],
                 id="unknown-token-form"),
    pytest.param(_set("interventions.patching.writes.v_cf", {"site": "target", "pos": -1, "mechanism": "swap",
                                                               "operand": 0.0}),
                 "interventions.patching.writes.v_cf", ["'v_cf' names both a read and a write"],
                 id="write-named-like-a-read"),
    pytest.param(_set(f"{M}.v_cf", {"kind": "match", "of": "logits", "expected": "cf_answer"}), f"{M}.v_cf",
                 ["'v_cf' names both a read and a metric"], id="metric-named-like-a-read"),
    pytest.param(_chain(_set(f"{R}.v_cf.featurizer", "rot"), _set(f"{W}.featurizer", "rot"),
                        _set("featurizers", {"rot": {"kind": "subspace", "site": "head", "k": 2}}),
                        _set(f"{R}.v_cf.site", "head"), _set(f"{W}.site", "head"),
                        _set(f"{M}.iia.of", "v_cf"), _set(f"{R}.v_cf.pos", -1)),
                 f"{M}.iia.of", ["goes through featurizer 'rot'", "drop the featurizer"], id="metric-through-featurizer"),
    # --- steps, rows, outputs, saves ---------------------------------------------------------
    pytest.param(_set("steps.score.kind", "train"), "steps.score",
                 ["'train'", 'a step\'s "kind" is "observe", "fit" or "weights"'], id="unknown-step-kind"),
    pytest.param(_set("steps.score.interventions", "ghost"), "steps.score.interventions",
                 ["intervention 'ghost' is not declared"], id="step-unknown-intervention"),
    pytest.param(_drop("steps.score.rows.counterfactual"), "steps.score.rows",
                 ["runs on role 'counterfactual' and no rows are given", '"counterfactual": "<dataset>/<split>"'],
                 id="rows-missing-a-role"),
    pytest.param(_set("steps.score.rows.other", "weekdays/train"), "steps.score.rows.other",
                 ["role 'other' is not declared"], id="rows-for-an-unknown-role"),
    pytest.param(_set("steps.score.rows.base", "weekdays"), "steps.score.rows.base",
                 ["'weekdays' is not a dataset reference", '"name/split"'], id="rows-not-name-split"),
    pytest.param(_chain(with_harvest, lambda d: d["steps"].update(again=copy.deepcopy(d["steps"]["harvest"]))),
                 "steps.again.outputs.mean", ["'mean' is already published by step 'harvest'"],
                 id="output-published-twice"),
    pytest.param(_chain(with_harvest, _set("steps.harvest.outputs", {"v_cf": "acts"})),
                 "steps.harvest.outputs.v_cf", ["'v_cf' is also a read's name", "rename the output"],
                 id="output-named-like-a-read"),
    pytest.param(_chain(with_harvest, _set("steps.harvest.outputs", {"m": {"read": "ghost"}})),
                 "steps.harvest.outputs.m.read", ["read 'ghost' is not declared"], id="output-of-unknown-read"),
    pytest.param(_chain(with_harvest, _set("steps.harvest.outputs", {"m": {"read": "acts", "reduce": "pca"}})),
                 "steps.harvest.outputs.m", ["pca needs it"], id="pca-output-without-k"),
    pytest.param(_chain(with_harvest, _set("steps.harvest.outputs", {"m": {"read": "acts", "k": 2}})),
                 "steps.harvest.outputs.m", ["k is for reduce"], id="k-without-pca"),
    pytest.param(_set("steps.score.saves.0.file_path", "iia.csv"), "steps.score.saves.0.file_path",
                 ["'iia.csv'", ".json", ".safetensors"], id="save-with-wrong-extension"),
    pytest.param(_set("steps.score.saves.0.file_path", "iia.safetensors"), "steps.score.saves.0.file_path",
                 ["metric 'iia' saves as a JSON table", "end the file name in .json"], id="metric-saved-as-tensor"),
    pytest.param(_set("steps.score.saves.0.file_path", "../iia.json"), "steps.score.saves.0.file_path",
                 ["relative path inside the run's directory"], id="save-outside-the-run"),
    pytest.param(_set("steps.score.saves.0.value", "ghost"), "steps.score.saves.0.value",
                 ["'ghost' is not a metric or output", "iia, logit_diff"], id="save-of-nothing"),
    pytest.param(_set("steps.score.saves.1.file_path", "iia.json"), "steps.score.saves.0.file_path",
                 ["'iia.json' is written twice"], id="save-file-twice"),
    pytest.param(_set("steps.score.saves.0.model", "original"), "steps.score.saves.0.model",
                 ["metric 'iia' is scored on model 'patched', not 'original'"], id="save-of-another-model"),
    pytest.param(_chain(with_harvest, lambda d: d["steps"]["harvest"].update(
        saves=[{"value": "mean", "file_path": "mean.json"}])), "steps.harvest.saves.0.file_path",
                 ["'mean' is a tensor", ".safetensors"], id="output-saved-as-json"),
    pytest.param(_set("steps.w", {"kind": "weights", "names": ["ghost"]}), "steps.w.names.0",
                 ["featurizer 'ghost' is not declared"], id="weights-of-unknown-featurizer"),
    pytest.param(_chain(with_rot, _set("steps.w", {"kind": "weights", "names": ["rot"],
                                                    "saves": [{"value": "rot", "file_path": "rot.json"}]})),
                 "steps.w.saves.0.file_path", ["safetensors"], id="weights-saved-as-json"),
    pytest.param(_chain(with_rot, _set("steps.w", {"kind": "weights", "names": ["rot"],
                                                    "saves": [{"value": "x", "file_path": "x.safetensors"}]})),
                 "steps.w.saves.0.value", ["weights name 'x' is not declared"], id="weights-save-of-unknown"),
    # --- fit ---------------------------------------------------------------------------------
    pytest.param(_chain(with_rot, _set("steps.fit.objective", [[1.0, "iia"]])), "steps.fit.objective.0.1",
                 ["metric 'iia' is a match, which has no gradient", "cross_entropy or logit_diff"],
                 id="match-in-fit-objective"),
    pytest.param(_chain(with_rot, _set("steps.fit.objective", [])), "steps.fit.objective",
                 ["a fit needs an objective"], id="empty-objective"),
    pytest.param(_chain(with_rot, _set("steps.fit.objective", [[1.0, "ghost"]])), "steps.fit.objective.0.1",
                 ["metric 'ghost' is not declared"], id="objective-of-unknown-metric"),
    pytest.param(_chain(with_rot, _set("steps.fit.objective", [[1.0, "rot.mask"]])), "steps.fit.objective.0.1",
                 ["'rot.mask' is the mask of a gate this fit trains", "'rot' is not one"], id="mask-of-a-subspace"),
    pytest.param(_chain(with_rot, _set("steps.fit.params", ["ghost"])), "steps.fit.params.0",
                 ["featurizer 'ghost' is not declared"], id="fit-unknown-param"),
    pytest.param(_chain(with_rot, _set("steps.fit.early_stop", {"metric": "iia"})), "steps.fit.early_stop",
                 ["watches the held-out pass", "held_out"], id="early-stop-without-held-out"),
    pytest.param(_chain(with_rot, _set("steps.fit.held_out", {"base": "weekdays/test",
                                                               "counterfactual": "weekdays/test"}),
                        _set("steps.fit.early_stop", {"metric": "ghost"})), "steps.fit.early_stop.metric",
                 ["metric 'ghost' is not declared"], id="early-stop-unknown-metric"),
    pytest.param(_chain(with_rot, _set("steps.fit.anneal", {"rot": {"start": 1.0, "end": 0.1}})),
                 "steps.fit.anneal.rot", ["'rot' is not a gate this fit trains"], id="anneal-a-subspace"),
    pytest.param(_chain(with_gate, _set("steps.fit.anneal", {"mask": {"start": 0, "end": 0.1}})),
                 "steps.fit.anneal.mask.start", ["greater than 0"], id="anneal-from-zero"),
    pytest.param(_chain(with_rot, _set("steps.fit.epochs", 0)), "steps.fit.epochs",
                 ["greater than or equal to 1"], id="zero-epochs"),
    pytest.param(_chain(with_rot, _set("steps.fit.lr", 0)), "steps.fit.lr", ["greater than 0"], id="zero-lr"),
    pytest.param(_chain(with_rot, _set("steps.fit.held_out", {"base": "weekdays/test"})), "steps.fit.held_out",
                 ["no rows are given for it"], id="held-out-missing-a-role"),
    pytest.param(_chain(with_rot, lambda d: d["featurizers"].update(
        p={"kind": "pca", "site": "head", "file_path": "pca.safetensors"}), _set("steps.fit.params", ["rot", "p"])),
                 "steps.fit.params.1", ["'p' is a pca", "never trained"], id="fit-a-pca"),
]


@pytest.mark.parametrize("mutate,path,words", CASES)
def test_refusal(mutate, path, words):
    doc = base()
    mutate(doc)
    refused(doc, path, *words)


def test_a_step_called_like_a_union_member_keeps_its_name_in_the_path():
    # pydantic names the member of the steps union it tried ("observe", "fit"); a step
    # the document itself calls "fit" or "observe" must still be in the path.
    for name in ("observe", "fit", "weights"):
        doc = base()
        doc["steps"] = {name: doc["steps"]["score"]}
        doc["steps"][name]["saves"][0]["file_path"] = "iia.csv"
        refused(doc, f"steps.{name}.saves.0.file_path", "'iia.csv'")


def test_the_generated_frame_write_refusal_is_the_spec_text():
    """generation.md's steering document with its write moved to {"frame": "generated", "index": -1}."""
    doc = {
        "model": {"key": "tiny-llama"},
        "roles": {"base": {"field": "input"}},
        "sites": {"target": {"component": "block_output", "layers": [0]}, "head": {"component": "lm_head"}},
        "interventions": {"steer": {
            "reads": {"v_last": {"site": "target", "pos": -1, "model": "original", "input": "base"},
                      "steered_logits": {"site": "head", "pos": {"frame": "generated", "index": 0},
                                         "model": "steered", "input": "base"}},
            "writes": {"push": {"site": "target", "pos": {"frame": "generated", "index": -1},
                                "mechanism": "add_scaled", "operand": "v_last", "params": {"scale": 4.0}}},
            "models": {"steered": {"input": "base", "writes": ["push"]}},
            "metrics": {"p_steered": {"kind": "token_prob", "of": "steered_logits", "token": "cf_answer"}},
            "decode": 3,
        }},
        "steps": {"score": {"kind": "observe", "interventions": "steer", "rows": {"base": "weekdays/train"}}},
    }
    with pytest.raises(DocumentError) as info:
        validate_spec(doc)
    assert info.value.path == "interventions.steer"
    assert str(info.value) == (
        "interventions.steer: write 'push': a write in the continuation frame is at a step the decode has "
        "reached — {'index': k} with k >= 0, or {'all': true}. {generated index:-1} names a cut of the "
        "finished continuation, which is something to read and not something to write into; write at a "
        "step: \"pos\": {\"frame\": \"generated\", \"index\": 0}, or read this cut instead")
    # The same write at {"all": true} (what the spec's document does) is accepted.
    doc["interventions"]["steer"]["writes"]["push"]["pos"] = {"frame": "generated", "all": True}
    assert validate_spec(doc).interventions["steer"].writes["push"].pos.all is True


def test_a_sweep_wrapper_reaching_validate_spec_is_refused_unlowered():
    doc = base()
    write(doc)["pos"] = {"sweep": [-1, -2]}
    err = refused(doc, f"{W}.pos", "Spec got a sweep wrapper", "one point", error=SweepError)
    assert "lower the sweep first" in err.fix
    assert isinstance(err, DocumentError)  # a SweepError is a document refusal


def test_not_an_object_is_refused():
    with pytest.raises(DocumentError) as info:
        validate_spec([base()])
    assert "a document is a JSON object" in info.value.problem


def test_several_errors_are_reported_under_the_first_path():
    doc = base()
    doc["bogus"] = 1
    doc["sites"]["target"]["units"] = [1, 1]
    with pytest.raises(DocumentError) as info:
        validate_spec(doc)
    text = str(info.value)
    assert "also" in text and "repeats an index" in text and "unknown key 'bogus'" in text


# --------------------------------------------------------------------------- the digest


def _reorder(value, *, top: bool = True):
    """Every mapping with its keys reversed, except the steps' own order: it is the run order."""
    if isinstance(value, dict):
        out = {}
        for k, v in reversed(list(value.items())):
            if top and k == "steps":
                out[k] = {sk: _reorder(sv, top=False) for sk, sv in v.items()}
            else:
                out[k] = _reorder(v, top=False)
        return out
    if isinstance(value, list):
        return [_reorder(v, top=False) for v in value]
    return value


def _spelled_out(doc: dict) -> dict:
    """The same experiment with every default written and every sugar expanded."""
    doc = copy.deepcopy(doc)
    doc["header"] = {"description": "another description entirely", "protocol_version": "3",
                     "expect": [{"result": "iia", "mean": 0.5}]}
    doc["model"]["dtype"] = "fp32"
    doc["model"]["revision"] = None
    doc["featurizers"] = {}
    for name, site in doc["sites"].items():
        site.setdefault("heads", None)
        site.setdefault("units", None)
    i = iv(doc)
    i["decode"] = None
    for read in i["reads"].values():
        read.setdefault("model", "original")
        read.setdefault("view", None)
        read.setdefault("featurizer", None)
        if isinstance(read["pos"], int):
            read["pos"] = {"index": read["pos"], "frame": "prompt"}
    for w in i["writes"].values():
        if isinstance(w["pos"], int):
            w["pos"] = {"index": w["pos"]}
        w.setdefault("params", {})
        w.setdefault("featurizer", None)
        w.setdefault("features", None)
        if isinstance(w.get("operand"), int):
            w["operand"] = float(w["operand"])
    for m in i["metrics"].values():
        m.setdefault("token_form", "space_prefixed")
    step = doc["steps"]["score"]
    step["outputs"] = {}
    for save in step["saves"]:
        save.setdefault("model", "patched")
        save.setdefault("input", "base")
    return doc


def test_the_digest_ignores_spelling_header_and_key_order():
    a = validate_spec(base())
    b = validate_spec(_spelled_out(base()))
    c = validate_spec(_reorder(_spelled_out(base())))
    assert a.canonical() == b.canonical()
    assert a.produced_by == b.produced_by == c.produced_by
    assert len(a.produced_by) == 64 and int(a.produced_by, 16) >= 0


def test_the_digest_ignores_written_out_mechanism_defaults():
    one, two = base(), base()
    write(one).update(mechanism="add_scaled", operand=2)
    write(two).update(mechanism="add_scaled", operand=2.0, params={"scale": 1})
    assert validate_spec(one).produced_by == validate_spec(two).produced_by


def test_the_digest_ignores_output_shorthand():
    one, two = with_harvest(base()), with_harvest(base())
    one["steps"]["harvest"]["outputs"] = {"kept": "acts"}
    two["steps"]["harvest"]["outputs"] = {"kept": {"read": "acts", "reduce": None, "k": None}}
    assert validate_spec(one).produced_by == validate_spec(two).produced_by


def _swap_steps(doc):
    doc = with_rot(doc)
    doc["steps"] = {"score": doc["steps"]["score"], "fit": doc["steps"]["fit"]}
    return doc


CHANGES = [
    pytest.param(_set("sites.target.layers", [1]), id="layer"),
    pytest.param(_set("sites.target.units", [0, 1]), id="units"),
    pytest.param(_set(f"{W}.pos", -2), id="write-position"),
    pytest.param(_set(f"{R}.v_cf.pos", {"index": -1, "scope": {"variable": "entity"}}), id="read-scope"),
    pytest.param(_set(f"{R}.v_cf.input", "base"), id="read-input"),
    pytest.param(_chain(_set(f"{W}.mechanism", "lerp"), _set(f"{W}.params", {"t": 0.5})), id="mechanism"),
    pytest.param(_set(f"{W}.operand", 0.0), id="operand"),
    pytest.param(_set(f"{M}.iia.expected", "label"), id="metric-column"),
    pytest.param(_set(f"{M}.iia", {"kind": "token_prob", "of": "logits", "token": "cf_answer"}), id="metric-kind"),
    pytest.param(_set("roles.counterfactual.field", "input"), id="role-field"),
    pytest.param(_set("steps.score.rows.base", "weekdays/test"), id="rows"),
    pytest.param(_set("model.key", "tiny-gpt2"), id="model-key"),
    pytest.param(_set("model.revision", "sha256:" + "1" * 64), id="model-revision"),
    pytest.param(_set("model.dtype", "bf16"), id="dtype"),
    pytest.param(_set("steps.score.saves.0.file_path", "match.json"), id="save-path"),
    pytest.param(_drop("steps.score.saves.1"), id="one-save-fewer"),
    pytest.param(with_decode, id="decode"),
    pytest.param(with_rot, id="a-fit-step"),
    pytest.param(_swap_steps, id="step-order"),
    pytest.param(_set("sites.target.component", "mlp_output"), id="component"),
    pytest.param(_set(f"{W}.features", [0]), id="features"),
]


@pytest.mark.parametrize("change", CHANGES)
def test_the_digest_changes_with_the_experiment(change):
    before = validate_spec(base()).produced_by
    doc = base()
    out = change(doc)
    doc = out if isinstance(out, dict) else doc
    assert validate_spec(doc).produced_by != before


def test_rot_documents_in_either_step_order_differ():
    assert validate_spec(with_rot(base())).produced_by != validate_spec(_swap_steps(base())).produced_by


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(st.integers(-8, 8).filter(bool), st.integers(-8, 8).filter(bool),
                  st.floats(-4, 4, allow_nan=False), st.floats(-4, 4, allow_nan=False),
                  st.booleans())
def test_the_digest_is_a_function_of_the_experiment(pos_a, pos_b, scale_a, scale_b, long_form):
    def doc(pos, scale, spelled):
        d = base()
        write(d).update(pos={"index": pos} if spelled else pos, mechanism="add_scaled",
                        params={"scale": scale})
        iv(d)["reads"]["v_cf"]["pos"] = pos
        return d

    a = validate_spec(doc(pos_a, scale_a, False)).produced_by
    b = validate_spec(doc(pos_b, scale_b, long_form)).produced_by
    assert (a == b) == (pos_a == pos_b and float(scale_a) == float(scale_b))


def test_canonical_is_plain_json():
    canonical = validate_spec(_spelled_out(base())).canonical()
    assert "header" not in canonical
    assert json.loads(json.dumps(canonical)) == canonical
    assert canonical["interventions"]["patching"]["writes"]["patch"]["pos"] == -1

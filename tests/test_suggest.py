""""Did you mean …?": the helper (causalab_mini/suggest.py), and every refusal of a name using it.

The helper is held to real typos — a swap of two letters, a letter missing or doubled, a
case difference — and to words close to nothing. Then each kind of name a document writes
is misspelt once in a copy of documents/v2/patching.causalab.json and run through the CLI
(``causalab_mini.cli.main``, in process): the refusal keeps its path (the misspelt field's)
and its problem, and its fix starts with the word meant.
"""
from __future__ import annotations

import copy
import json
import re

import pytest
from paths import DATA, MODELS, V2

from causalab_mini import suggest
from causalab_mini.suggest import CUTOFF, HintedValueError, close_matches, did_you_mean, suggest_fix
from causalab_mini.vocab import COMPONENTS, FEATURIZER_KINDS, MECHANISMS, METRICS

TOP_LEVEL = ("header", "model", "roles", "sites", "featurizers", "interventions", "steps")
MODELS_HERE = ("tiny-gemma2", "tiny-gpt2", "tiny-llama")

# --------------------------------------------------------------------------- the helper


@pytest.mark.parametrize("word,choices,meant", [
    # a swap of two neighbouring letters
    ("block_outptu", COMPONENTS, "block_output"),
    ("swpa", MECHANISMS, "swap"),
    ("iai", ("iia", "logit_diff"), "iia"),
    ("v_fc", ("v_cf", "logits"), "v_cf"),
    ("weekdays/trian", ("weekdays/train", "weekdays/test", "weekdays/chat"), "weekdays/train"),
    # difflib scores steps and sites alike (0.8); the swap is one edit, sites two
    ("stpes", TOP_LEVEL, "steps"),
    # a letter missing
    ("tiny-lama", MODELS_HERE, "tiny-llama"),
    ("subspce", FEATURIZER_KINDS, "subspace"),
    ("mach", METRICS, "match"),
    ("idex", ("frame", "scope", "index", "span", "last", "all"), "index"),
    ("blockoutput", COMPONENTS, "block_output"),
    # a letter too many
    ("featurizerss", TOP_LEVEL, "featurizers"),
    ("pcaa", FEATURIZER_KINDS, "pca"),
    # case: matched case-insensitively, suggested in the choice's own spelling
    ("Block_Output", COMPONENTS, "block_output"),
    ("IIA", ("iia", "logit_diff"), "iia"),
    ("LOGIT_DIFF", METRICS, "logit_diff"),
])
def test_a_typo_suggests_the_word_meant(word, choices, meant):
    assert close_matches(word, choices) == [meant]
    assert did_you_mean(word, choices) == f"did you mean {meant!r}?"


@pytest.mark.parametrize("word,choices", [
    ("resid", COMPONENTS),  # another library's name, not a misspelling of one of ours
    ("bogus", TOP_LEVEL),
    ("split", ("dataset", "field")),
    ("xyz", MECHANISMS),
    ("", COMPONENTS),
    ("block_output", ()),  # nothing to choose from
])
def test_a_word_close_to_nothing_suggests_nothing(word, choices):
    assert close_matches(word, choices) == []
    assert did_you_mean(word, choices) == ""
    assert suggest_fix(word, choices, "use one of the values listed") == "use one of the values listed"


def test_the_cutoff_is_difflibs_default_and_sits_between_a_short_typo_and_an_unrelated_name():
    import difflib

    assert CUTOFF == 0.6
    # Kept: a swap in a three-letter name scores 0.67.
    assert difflib.SequenceMatcher(None, "iai", "iia").ratio() >= CUTOFF
    # Dropped: two names of one length sharing a couple of letters score 0.57.
    assert difflib.SequenceMatcher(None, "mean", "min").ratio() < CUTOFF
    assert did_you_mean("mean", ["min"]) == ""


def test_equally_close_choices_are_all_named_best_first():
    # mlp_out is three edits from mlp_output and from mlp_input
    assert did_you_mean("mlp_out", COMPONENTS) == "did you mean 'mlp_output' or 'mlp_input'?"
    assert len(close_matches("a", ["ab", "ba", "ac", "ad"])) == suggest.MAX


def test_a_swap_counts_as_one_edit():
    assert suggest._edits("stpes", "steps") == 1
    assert suggest._edits("stpes", "sites") == 2
    assert suggest._edits("", "abc") == 3
    assert suggest._edits("kitten", "sitting") == 3


def test_the_fix_follows_the_suggestion():
    assert suggest_fix("stpes", TOP_LEVEL, "remove it") == "did you mean 'steps'? remove it"
    assert suggest_fix("stpes", TOP_LEVEL) == "did you mean 'steps'?"
    assert suggest.phrase([]) == ""
    assert suggest.phrase(["a", "b"], " (local)") == "did you mean 'a' (local) or 'b' (local)?"


def test_a_hinted_value_error_reads_as_its_problem_alone():
    err = HintedValueError("frame 'promt' is not 'prompt' or 'generated'", "did you mean 'prompt'?")
    assert isinstance(err, ValueError)
    assert str(err) == "frame 'promt' is not 'prompt' or 'generated'"
    assert err.fix == "did you mean 'prompt'?"


# --------------------------------------------------------------------------- end to end

IV = "interventions.patching"
REFUSAL = re.compile(r"^error: (\w+): (\S+): (.*)$", re.S)


def _base() -> dict:
    return json.loads((V2 / "patching.causalab.json").read_text())


def _at(doc: dict, dotted: str):
    parts = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    for p in parts[:-1]:
        doc = doc[p]
    return doc, parts[-1]


def _set(dotted: str, value):
    def edit(doc):
        parent, key = _at(doc, dotted)
        parent[key] = value
    return edit


def _rename(dotted: str, new: str):
    def edit(doc):
        parent, key = _at(doc, dotted)
        parent[new] = parent.pop(key)
    return edit


def _add_featurizer(kind: str):
    def edit(doc):
        doc["featurizers"] = {"rot": {"kind": kind, "site": "target", "k": 2}}
    return edit


def refusal(tmp_path, capsys, edit, command="validate"):
    """The CLI's refusal of the patching document with ``edit`` applied: (type, path, rest)."""
    from causalab_mini.cli import main

    doc = copy.deepcopy(_base())
    edit(doc)
    path = tmp_path / "typo.causalab.json"
    path.write_text(json.dumps(doc))
    code = main([command, str(path), "--models", str(MODELS), "--data", str(DATA)])
    err = capsys.readouterr().err
    assert code == 2, err
    match = REFUSAL.match(err.strip())
    assert match, err
    return match.groups()


E2E = [
    # (edit, command, path, the problem kept, the fix: the suggestion and then the fix it had)
    pytest.param(_set("sites.target.component", "block_outptu"), "validate", "sites.target.component",
                 "Input should be 'embeddings'", "did you mean 'block_output'? use one of the values listed",
                 id="component"),
    pytest.param(_set(f"{IV}.writes.patch.mechanism", "swpa"), "validate", f"{IV}.writes.patch.mechanism",
                 "unknown mechanism 'swpa'; one of ", "did you mean 'swap'?", id="mechanism"),
    pytest.param(_set(f"{IV}.metrics.iia.kind", "mach"), "validate", f"{IV}.metrics.iia.kind",
                 "unknown metric kind 'mach'; one of ", "did you mean 'match'?", id="metric-kind"),
    pytest.param(_add_featurizer("subspce"), "validate", "featurizers.rot.kind",
                 "unknown featurizer kind 'subspce'; one of ", "did you mean 'subspace'?",
                 id="featurizer-kind"),
    pytest.param(_set(f"{IV}.reads.v_cf.pos", {"idex": -1}), "validate", f"{IV}.reads.v_cf.pos",
                 "unknown position key(s) ['idex']", "did you mean 'index'?", id="position-cut"),
    pytest.param(_set(f"{IV}.reads.v_cf.pos", {"index": -1, "frame": "promt"}), "validate",
                 f"{IV}.reads.v_cf.pos", "frame 'promt' is not 'prompt' or 'generated'",
                 "did you mean 'prompt'?", id="position-frame"),
    pytest.param(_rename("steps", "stpes"), "validate", "stpes", "unknown key 'stpes'",
                 "did you mean 'steps'? remove it, or check its spelling", id="top-level-key"),
    pytest.param(_rename(f"{IV}.reads.v_cf.input", "inptu"), "validate", f"{IV}.reads.v_cf.inptu",
                 "unknown key 'inptu'", "did you mean 'input'? remove it, or check its spelling", id="nested-key"),
    pytest.param(_rename("steps.score.saves.0.file_path", "filepath"), "validate", "steps.score.saves.0.filepath",
                 "unknown key 'filepath'", "did you mean 'file_path'? remove it", id="key-inside-a-step"),
    pytest.param(_set("steps.score.kind", "obsreve"), "validate", "steps.score",
                 "Input tag 'obsreve'", "did you mean 'observe'? a step's \"kind\"", id="step-kind"),
    pytest.param(_set(f"{IV}.writes.patch.operand", "v_fc"), "validate", f"{IV}.writes.patch.operand",
                 "'v_fc' is not a read of this intervention", "did you mean 'v_cf'? a value from an earlier step",
                 id="operand-read"),
    pytest.param(_set(f"{IV}.reads.v_cf.site", "targte"), "validate", f"{IV}.reads.v_cf.site",
                 "site 'targte' is not declared", "did you mean 'target'? declared: head, target", id="site-ref"),
    pytest.param(_set("header.expect.0.result", "iai"), "validate", "header.expect.0.result",
                 "no metric named 'iai'", "did you mean 'iia'? metrics here:", id="expectation-metric"),
    pytest.param(_set("steps.score.rows.base", "weekday/train"), "explain", "steps.score.rows.base",
                 "dataset 'weekday/train' not found", "did you mean 'weekdays/train'? datasets here:",
                 id="dataset-name"),
    pytest.param(_set("steps.score.rows.base", "weekdays/trian"), "explain", "steps.score.rows.base",
                 "dataset 'weekdays/trian' not found", "did you mean 'weekdays/train'? weekdays has split(s)",
                 id="dataset-split"),
]


@pytest.mark.parametrize("edit,command,path,problem,fix", E2E)
def test_a_misspelt_name_is_refused_at_its_field_with_the_word_meant(tmp_path, capsys, edit, command,
                                                                     path, problem, fix):
    kind, got_path, rest = refusal(tmp_path, capsys, edit, command)
    assert got_path == path, rest
    assert problem in rest, rest
    assert "; " + fix in rest, rest
    assert rest.count("did you mean") == 1, rest  # one suggestion, of one word
    # the suggestion leads the fix: nothing of the fix comes before it
    assert rest.index(problem) < rest.index("did you mean")


def test_a_misspelt_local_model_key_names_the_local_model_before_the_hub(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no network: the refusal is immediate
    kind, path, rest = refusal(tmp_path, capsys, _set("model.key", "tiny-lama"), "explain")
    assert (kind, path) == ("HubUnreachable", "model.key")
    assert rest.startswith("'tiny-lama' is not a local model directory, not in the Hugging Face cache"), rest
    suggestion = f"did you mean 'tiny-llama' (a local model in {MODELS})? put it under a model search path"
    assert "; " + suggestion in rest, rest
    assert rest.index(suggestion) < rest.index("run where the hub is reachable")
    assert f"searched: {MODELS}" in rest  # the information it had is kept


def test_a_model_key_close_to_no_local_model_gets_no_suggestion(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    kind, path, rest = refusal(tmp_path, capsys, _set("model.key", "org/unrelated-model"), "explain")
    assert path == "model.key" and "did you mean" not in rest, rest


# --------------------------------------------------------------------------- in process: the refusals' fields


def test_an_unknown_key_is_reported_before_the_required_key_it_misspells():
    from causalab_mini.document.spec import validate_spec
    from causalab_mini.errors import DocumentError

    doc = _base()
    _rename("steps", "stpes")(doc)
    with pytest.raises(DocumentError) as info:
        validate_spec(doc)
    err = info.value
    assert err.path == "stpes" and err.problem.startswith("unknown key 'stpes'")
    assert err.fix.startswith("did you mean 'steps'? ")
    assert "also steps: Field required" in err.problem  # the consequence is still reported


def test_an_unknown_key_suggests_only_keys_the_object_does_not_already_have():
    from causalab_mini.document.spec import validate_spec
    from causalab_mini.errors import DocumentError

    doc = _base()
    doc["interventions"]["patching"]["reads"]["v_cf"]["inputs"] = "base"  # beside a real "input"
    with pytest.raises(DocumentError) as info:
        validate_spec(doc)
    assert info.value.path == f"{IV}.reads.v_cf.inputs"
    assert "did you mean" not in info.value.fix


@pytest.mark.parametrize("edit,path,fix", [
    # a mechanism's parameter (vocab.check_params)
    (_set(f"{IV}.writes.patch", {"site": "target", "pos": -1, "mechanism": "add_scaled",
                                 "operand": "v_cf", "params": {"scael": 2.0}}),
     f"{IV}.writes.patch.params", "did you mean 'scale'?"),
    # a key of an expectation's comparison (aliases: ">", "between")
    (_set("header.expect.1.mean", {"betwen": [0.25, 0.75]}), "header.expect.1.mean.betwen",
     "did you mean 'between'? remove it"),
    # a scope's key and a chat segment's name
    (_set(f"{IV}.reads.v_cf.pos", {"index": -1, "scope": {"varible": "x"}}), f"{IV}.reads.v_cf.pos",
     "did you mean 'variable'?"),
    (_set(f"{IV}.reads.v_cf.pos", {"index": -1, "scope": {"segment": "usr"}}), f"{IV}.reads.v_cf.pos",
     "did you mean 'user'?"),
    # a save of a metric misspelt
    (_set("steps.score.saves.0.value", "iaa"), "steps.score.saves.0.value", "did you mean 'iia'? save one of"),
])
def test_more_names_a_document_writes(edit, path, fix):
    from causalab_mini.document.spec import validate_spec
    from causalab_mini.errors import DocumentError

    doc = _base()
    edit(doc)
    with pytest.raises(DocumentError) as info:
        validate_spec(doc)
    assert info.value.path == path, str(info.value)
    assert info.value.fix.startswith(fix), str(info.value)


def test_a_protocol_documents_mechanism_is_suggested_too(tmp_path, capsys):
    protocol = json.loads((V2.parent / "protocol" / "pos_sweep.causalab.json").read_text())
    (name, write), = protocol["method"]["writes"].items()
    (mechanism, arg), = write["do"].items()
    assert mechanism == "swap"

    def edit(doc):
        doc.clear()
        doc.update(copy.deepcopy(protocol))
        doc["method"]["writes"][name]["do"] = {"swpa": arg}

    kind, path, rest = refusal(tmp_path, capsys, edit)
    assert path == f"method.writes.{name}.do"
    assert "unknown mechanism 'swpa'; did you mean 'swap'? use one of:" in rest, rest

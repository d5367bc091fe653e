"""The compiler (plan/build.py, model/facts.py, model/loading.py) against the shipped tiny-llama.

Documents are written to ``tmp_path`` and compiled with ``compile_plan`` the way
the CLI does, with the repository's model and data folders as search roots. No
weights are loaded; every number asserted here comes from the config, the
tokenizer or the data.
"""
from __future__ import annotations

import copy
import json
import random
import socket
from pathlib import Path

import pytest

from causalab_mini.document.spec import MAX_EPOCHS
from causalab_mini.model import loading
from causalab_mini.errors import CompileError, DataError, ModelError, PlanError
from causalab_mini.plan.compile import compile_plan
from causalab_mini.plan.explain import explain
from causalab_mini.plan.plan import Fit, Observe, Plan
from paths import DATA, MODELS, REPO
from samples import patching_document

LLAMA = MODELS / "tiny-llama"


def rows(ref: str) -> list[dict]:
    name, split = ref.split("/")
    return [json.loads(line) for line in (DATA / name / f"{split}.jsonl").read_text().splitlines() if line.strip()]


base = patching_document


def iv(doc: dict) -> dict:
    return doc["interventions"]["patching"]


def compile_doc(doc: dict, tmp_path: Path, *, engine: str = "nnterp", data=None, name="doc") -> Plan:
    path = tmp_path / f"{name}.causalab.json"
    path.write_text(json.dumps(doc, indent=1))
    return compile_plan(json.loads(path.read_text()), document=path, models=[MODELS],
                        data=[*(data or []), DATA], engine=engine)


def refused(doc: dict, tmp_path: Path, error, path: str, *words: str, **kw):
    with pytest.raises(error) as info:
        compile_doc(doc, tmp_path, **kw)
    err = info.value
    assert err.path == path, f"{err.path!r} != {path!r}: {err}"
    for word in words:
        assert word in str(err), f"{word!r} not in {str(err)!r}"
    return err


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(LLAMA)


@pytest.fixture(scope="module")
def config():
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(LLAMA)


def _score(plan: Plan) -> Observe:
    return plan.step("score", Observe)


def _taps(forward) -> list[tuple[str, list[str], list[str]]]:
    return [(t.address.spelling(), [w.name for w in t.writes], [r.name for r in t.reads]) for t in forward.taps]


# --------------------------------------------------------------------------- schedule and taps


def test_patching_compiles_to_two_forwards(tmp_path):
    plan = compile_doc(base(), tmp_path)
    obs = _score(plan)
    assert [(f.model, f.input) for f in obs.forwards] == [("original", "counterfactual"), ("patched", "base")]
    assert _taps(obs.forwards[0]) == [("block_output[0]", [], ["v_cf"])]
    assert _taps(obs.forwards[1]) == [("block_output[0]", ["patch"], []), ("lm_head", [], ["logits"])]
    assert obs.example_ids == ("0", "1", "2", "3")
    assert plan.produced_by == obs.produced_by and len(plan.produced_by) == 64
    patch = obs.forwards[1].writes[0]
    assert (patch.operand.kind, patch.operand.value, patch.mechanism) == ("read", "v_cf", "swap")


def test_forwards_are_scheduled_so_every_operand_is_read_first(tmp_path):
    """Three passes in a chain, declared backwards: m2 reads patched, patched reads original."""
    doc = base()
    i = iv(doc)
    i["reads"] = {
        "final": {"site": "head", "pos": -1, "model": "m2", "input": "counterfactual"},
        "v_patched": {"site": "target", "pos": -1, "model": "patched", "input": "base"},
        "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"},
        "v_cf": {"site": "target", "pos": -1, "model": "original", "input": "counterfactual"},
    }
    i["writes"]["again"] = {"site": "target", "pos": -1, "mechanism": "swap", "operand": "v_patched"}
    i["models"] = {"m2": {"input": "counterfactual", "writes": ["again"]},
                   "patched": {"input": "base", "writes": ["patch"]}}
    obs = _score(compile_doc(doc, tmp_path))
    assert [(f.model, f.input) for f in obs.forwards] == [
        ("original", "counterfactual"), ("patched", "base"), ("m2", "counterfactual")]


def test_a_cycle_between_passes_is_refused_naming_the_models(tmp_path):
    doc = base()
    i = iv(doc)
    i["models"]["m2"] = {"input": "counterfactual", "writes": ["w2"]}
    i["reads"]["v_cf"]["model"] = "m2"
    i["reads"]["v_b"] = {"site": "target", "pos": -1, "model": "patched", "input": "base"}
    i["writes"]["w2"] = {"site": "target", "pos": -1, "mechanism": "swap", "operand": "v_b"}
    err = refused(doc, tmp_path, CompileError, "interventions.patching.models", "cycle",
                  "'m2' on 'counterfactual'", "'patched' on 'base'")
    assert '"original"' in err.fix


def test_taps_are_in_forward_order_with_writes_before_reads(tmp_path):
    doc = base()
    doc["sites"].update(
        l1={"component": "block_output", "layers": [1]},
        l1_narrow={"component": "block_output", "layers": [1], "units": [0, 1]},
        l0_mlp={"component": "mlp_output", "layers": [0]},
    )
    i = iv(doc)
    # Declared against forward order: the head first, the layer-0 read last.
    i["reads"] = {
        "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"},
        "narrow_after": {"site": "l1_narrow", "pos": -1, "model": "patched", "input": "base"},
        "after": {"site": "l1", "pos": -1, "model": "patched", "input": "base"},
        "early": {"site": "target", "pos": -1, "model": "patched", "input": "base"},
        "mlp": {"site": "l0_mlp", "pos": -1, "model": "patched", "input": "base"},
        "v_cf": {"site": "l1", "pos": -1, "model": "original", "input": "counterfactual"},
    }
    i["writes"]["patch"]["site"] = "l1"
    obs = _score(compile_doc(doc, tmp_path))
    patched = obs.forwards[1]
    assert _taps(patched) == [
        ("mlp_output[0]", [], ["mlp"]),
        ("block_output[0]", [], ["early"]),
        ("block_output[1]", ["patch"], ["after"]),  # one address: the write, then the read sees it
        ("block_output[1].units[0,1]", [], ["narrow_after"]),  # same tensor, narrower: after the write
        ("lm_head", [], ["logits"]),
    ]
    keys = [t.address.key for t in patched.taps]
    assert keys == sorted(keys)
    assert [t.address.stage for t in patched.taps] == [0, 0, 1, 1, 2]


def test_a_read_of_the_same_pass_after_its_write_is_refused(tmp_path):
    doc = base()
    i = iv(doc)
    doc["sites"]["l1"] = {"component": "block_output", "layers": [1]}
    i["reads"]["late"] = {"site": "l1", "pos": -1, "model": "patched", "input": "base"}
    i["writes"]["patch"]["operand"] = "late"
    refused(doc, tmp_path, CompileError, "interventions.patching.writes.patch.operand",
            "read 'late' is in the same pass and not before the write")


# --------------------------------------------------------------------------- tokens


def _expected_ids(tok, texts: list[str]):
    encoded = [tok(t)["input_ids"] for t in texts]
    width = max(len(e) for e in encoded)
    pad = tok.pad_token_id
    assert pad is not None
    ids = tuple(tuple([pad] * (width - len(e)) + list(e)) for e in encoded)
    mask = tuple(tuple([0] * (width - len(e)) + [1] * len(e)) for e in encoded)
    return ids, mask, encoded


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_token_ids_are_an_independent_encoding_left_padded(tmp_path, model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODELS / model)
    doc = base()
    doc["model"]["key"] = model
    # Prompts of different lengths, so the padding is real.
    doc["steps"]["score"]["rows"] = {"base": "weekday_arithmetic/train", "counterfactual": "weekday_arithmetic/train"}
    doc["roles"]["counterfactual"]["field"] = "input"
    obs = _score(compile_doc(doc, tmp_path))
    texts = [r["input"] for r in rows("weekday_arithmetic/train")]
    ids, mask, encoded = _expected_ids(tok, texts)
    assert len({len(e) for e in encoded}) > 1, "the fixture prompts should differ in length"
    for forward in obs.forwards:
        assert forward.ids == ids
        assert forward.mask == mask
        assert forward.texts == tuple(texts)
        assert forward.sample == tok.decode(encoded[0])
        assert (forward.rows, forward.tokens) == (len(texts), max(len(e) for e in encoded))
    # What the tokenizer puts before every prompt is at the start of each row's real tokens.
    prefix = tok("")["input_ids"]
    for row, m in zip(obs.forwards[0].ids, obs.forwards[0].mask):
        first = m.index(1)
        assert list(row[first:first + len(prefix)]) == list(prefix)


def test_metric_token_ids_are_what_the_model_predicts_after_a_word(tmp_path, tok):
    obs = _score(compile_doc(base(), tmp_path))
    data = rows("weekdays/train")
    (iia,) = [m for m in obs.metrics if m.name == "iia"]
    (expected,) = iia.token_ids
    assert (iia.kind, iia.of, iia.model, iia.input, iia.unit) == ("match", "logits", "patched", "base", "fraction")
    assert iia.estimand_version == "match/v2"
    assert iia.column_eligible == (True, True, True, True)
    head = tok("x", add_special_tokens=False)["input_ids"]
    for row, token_id in zip(data, expected):
        word = row["cf_answer"].strip()
        piece = tok.decode([token_id]).strip()
        assert piece and word.startswith(piece), (word, piece)
        full = tok("x " + word, add_special_tokens=False)["input_ids"]
        assert full[:len(head)] == head
        assert token_id == full[len(head)]
    assert data[0]["cf_answer"] == " Sunday"
    (ld,) = [m for m in obs.metrics if m.name == "logit_diff"]
    assert ld.token_ids[0] == expected  # a = cf_answer
    assert ld.token_ids[1][0] == tok("x " + data[0]["base_answer"].strip(),
                                     add_special_tokens=False)["input_ids"][len(head)]


def _dataset(root: Path, ref: str, rows_: list[dict]) -> Path:
    name, split = ref.split("/")
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_))
    return root


def test_a_null_answer_makes_its_row_column_ineligible(tmp_path):
    data = copy.deepcopy(rows("weekdays/train"))
    data[2]["cf_answer"] = None
    root = _dataset(tmp_path / "data", "nulls/train", data)
    doc = base()
    doc["steps"]["score"]["rows"] = {"base": "nulls/train", "counterfactual": "nulls/train"}
    obs = _score(compile_doc(doc, tmp_path, data=[root]))
    for metric in obs.metrics:
        assert metric.column_eligible == (True, True, False, True)
        assert metric.token_ids[0][2] is None
        assert all(t is not None for i, t in enumerate(metric.token_ids[0]) if i != 2)


def test_a_metric_with_no_answer_on_any_row_is_refused(tmp_path):
    data = copy.deepcopy(rows("weekdays/train"))
    for row in data:
        row["cf_answer"] = None
    root = _dataset(tmp_path / "data", "nulls/train", data)
    doc = base()
    doc["steps"]["score"]["rows"] = {"base": "nulls/train", "counterfactual": "nulls/train"}
    refused(doc, tmp_path, CompileError, "interventions.patching.metrics.iia", "no row has a value",
            "cf_answer", "a metric of nothing has no mean", data=[root])


def test_a_metric_column_the_data_lacks_is_refused(tmp_path):
    doc = base()
    iv(doc)["metrics"]["iia"]["expected"] = "answr"
    refused(doc, tmp_path, DataError, "interventions.patching.metrics.iia.expected", "no column 'answr'")


# --------------------------------------------------------------------------- bounds and widths


@pytest.mark.parametrize("site,path,words", [
    ({"component": "block_output", "layers": [2]}, "sites.target.layers", ["layer 2 is past the end", "2 layers"]),
    ({"component": "attention_z", "layers": [0], "heads": [4]}, "sites.target.heads",
     ["head(s) [4] past the end", "4 heads"]),
    ({"component": "attention_key", "layers": [0], "heads": [0, 7]}, "sites.target.heads", ["head(s) [7]"]),
    ({"component": "block_output", "layers": [0], "units": [0, 32]}, "sites.target.units",
     ["unit(s) [32] past the end", "32 wide"]),
    ({"component": "mlp_hidden", "layers": [0], "units": [64]}, "sites.target.units", ["unit(s) [64]", "64 wide"]),
])
def test_bounds_are_checked_against_the_config(tmp_path, config, site, path, words):
    assert (config.num_hidden_layers, config.num_attention_heads, config.hidden_size,
            config.intermediate_size) == (2, 4, 32, 64)
    doc = base()
    doc["sites"]["target"] = site
    iv(doc)["writes"]["patch"]["operand"] = 0.0
    refused(doc, tmp_path, CompileError, path, *words)


def test_widths_come_from_the_config(tmp_path, config):
    doc = base()
    doc["sites"].update(
        z={"component": "attention_z", "layers": [1], "heads": [1, 3]},
        hidden={"component": "mlp_hidden", "layers": [0], "units": [5, 6, 7]},
        resid={"component": "block_input", "layers": [1]},
    )
    iv(doc)["reads"].update(
        z={"site": "z", "pos": -1, "input": "base"},
        hidden={"site": "hidden", "pos": -1, "input": "base"},
        resid={"site": "resid", "pos": -1, "input": "base"},
        lens={"site": "resid", "pos": -1, "input": "base", "view": "logits"},
    )
    obs = _score(compile_doc(doc, tmp_path))
    reads = {r.name: r for f in obs.forwards for r in f.reads}
    head_dim = config.hidden_size // config.num_attention_heads
    assert reads["z"].width == 2 * head_dim
    assert reads["z"].address.columns == tuple(h * head_dim + i for h in (1, 3) for i in range(head_dim))
    assert reads["hidden"].width == 3 and reads["hidden"].address.full_width == config.intermediate_size
    assert reads["resid"].width == config.hidden_size
    assert reads["lens"].width == reads["logits"].width == config.vocab_size


def test_a_fixed_cut_past_every_prompt_is_refused(tmp_path):
    doc = base()
    iv(doc)["writes"]["patch"]["pos"] = {"index": 40}
    iv(doc)["reads"]["v_cf"]["pos"] = {"index": 40}
    err = refused(doc, tmp_path, CompileError, "interventions.patching.reads.v_cf.pos",
                  "'v_cf' at {index:40} does not fit row(s) [0, 1, 2, 3]")
    assert "cut inside the shortest prompt" in err.fix
    doc = base()
    iv(doc)["writes"]["patch"]["pos"] = {"index": 40}
    refused(doc, tmp_path, CompileError, "interventions.patching.writes.patch.pos",
            "'patch' at {index:40} does not fit row(s) [0, 1, 2, 3]")


def test_an_operand_as_wide_as_another_site_is_refused(tmp_path):
    doc = base()
    doc["sites"].update(two={"component": "block_output", "layers": [0], "units": [0, 1]},
                        three={"component": "block_output", "layers": [0], "units": [0, 1, 2]})
    iv(doc)["reads"]["v_cf"]["site"] = "two"
    iv(doc)["writes"]["patch"]["site"] = "three"
    refused(doc, tmp_path, CompileError, "interventions.patching.writes.patch.operand",
            "the operand is 2 wide and the write acts on 3")
    # The same units on both sides compile.
    iv(doc)["reads"]["v_cf"]["site"] = "three"
    obs = _score(compile_doc(doc, tmp_path))
    assert obs.forwards[1].writes[0].address.width == 3


def test_an_interior_compiles_on_both_engines(tmp_path):
    # Inside attention: the nnterp engine through nnsight, the hooks engine through the attention
    # function transformers calls (engine/attention.py); the same address and width on both.
    doc = base()
    doc["sites"]["q"] = {"component": "attention_query", "layers": [0], "heads": [0]}
    iv(doc)["reads"]["q"] = {"site": "q", "pos": -1, "input": "base"}
    for engine in ("nnterp", "hooks"):
        obs = _score(compile_doc(doc, tmp_path, engine=engine))
        (q,) = [r for f in obs.forwards for r in f.reads if r.name == "q"]
        assert q.address.spelling() == "attention_query[0].heads[0]" and q.width == 8


# --------------------------------------------------------------------------- model and data


def test_the_revision_digest_is_checked(tmp_path):
    digest = loading.revision_digest(LLAMA)
    doc = base()
    doc["model"]["revision"] = digest
    assert compile_doc(doc, tmp_path).produced_by
    wrong = "sha256:" + "0" * 64
    doc["model"]["revision"] = wrong
    err = refused(doc, tmp_path, ModelError, "model.revision", digest, wrong)
    assert f'"revision": "{digest}"' in err.fix


def _own_llama(tmp_path: Path) -> Path:
    import shutil
    return Path(shutil.copytree(LLAMA, tmp_path / "models" / "my-llama"))


@pytest.mark.parametrize("edit", ["config.json", "tokenizer.json", "chat_template.jinja"])
def test_the_revision_pin_covers_config_and_tokenizer(tmp_path, edit):
    """What decides the numbers besides the weights — the config (a norm's epsilon), the tokenizer
    (the ids), the chat template — is under the pin: editing one refuses the pinned document
    before any weight loads, naming the checkpoint's new revision."""
    checkpoint = _own_llama(tmp_path)
    doc = base()
    doc["model"] = {"key": "my-llama", "revision": loading.revision_digest(checkpoint), "dtype": "fp32"}
    path = tmp_path / "doc.causalab.json"
    path.write_text(json.dumps(doc))
    compile_plan(doc, document=path, models=[tmp_path / "models"], data=[DATA])
    target = checkpoint / edit
    if edit == "config.json":
        config = json.loads(target.read_text())
        config["rms_norm_eps"] = 0.5
        target.write_text(json.dumps(config))
    else:
        target.write_text(target.read_text() + "\n")
    new = loading.revision_digest(checkpoint)
    with pytest.raises(ModelError) as info:
        compile_plan(doc, document=path, models=[tmp_path / "models"], data=[DATA])
    assert info.value.path == "model.revision" and new in str(info.value)
    assert f'"revision": "{new}"' in info.value.fix


def test_a_weights_only_pin_is_refused_with_what_the_revision_covers_now(tmp_path):
    """A pin that is the weights' digest alone (the form earlier versions wrote) checked nothing of
    the config or tokenizer: refused, saying so, with the revision to write after checking them."""
    doc = base()
    doc["model"]["revision"] = loading.weights_digest(LLAMA)
    err = refused(doc, tmp_path, ModelError, "model.revision", "weights", "config and tokenizer")
    assert f'"revision": "{loading.revision_digest(LLAMA)}"' in err.fix


def test_an_unknown_model_key_is_refused(tmp_path):
    doc = base()
    doc["model"]["key"] = "no-such-org/no-such-model"
    err = refused(doc, tmp_path, ModelError, "model.key", "'no-such-org/no-such-model'")
    assert "--models" in err.fix and str(MODELS) in err.fix


def test_with_no_network_an_unknown_model_fails_at_once(tmp_path, monkeypatch):
    """No connection: one quick probe, then a refusal, and no networked from_pretrained at all."""
    import transformers

    def no_network(*args, **kwargs):
        raise OSError(101, "Network is unreachable")

    calls = []
    real = transformers.AutoConfig.from_pretrained

    def spy(source, *args, **kwargs):
        calls.append(kwargs.get("local_files_only", False))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", spy)
    doc = base()
    doc["model"]["key"] = "no-such-model"
    err = refused(doc, tmp_path, ModelError, "model.key", "'no-such-model'", "not in the Hugging Face cache",
                  "the hub cannot be reached", "Network is unreachable")
    assert "--models" in err.fix
    assert calls == [True]  # the cache was asked; the hub never was


def test_a_missing_dataset_is_refused(tmp_path):
    doc = base()
    doc["steps"]["score"]["rows"]["base"] = "weekdays/nope"
    refused(doc, tmp_path, DataError, "steps.score.rows.base", "'weekdays/nope' not found", "train")


def test_roles_with_different_row_counts_are_refused(tmp_path):
    doc = base()
    doc["steps"]["score"]["rows"]["base"] = "weekdays/test"
    err = refused(doc, tmp_path, CompileError, "steps.score.rows", "different numbers of rows",
                  "'base': 3", "'counterfactual': 4")
    assert "row for row" in err.fix


def test_a_missing_row_field_is_refused(tmp_path):
    doc = base()
    doc["roles"]["counterfactual"]["field"] = "counterfactual_inputs[3]"
    with pytest.raises(DataError) as info:
        compile_doc(doc, tmp_path)
    assert info.value.path == "roles.counterfactual.field"


# --------------------------------------------------------------------------- fit and sweeps


def fit_doc(seed: int = 7) -> dict:
    doc = base()
    doc["featurizers"] = {"rot": {"kind": "subspace", "site": "target", "k": 4}}
    iv(doc)["reads"]["v_cf"]["featurizer"] = "rot"
    iv(doc)["writes"]["patch"]["featurizer"] = "rot"
    doc["steps"] = {
        "fit": {"kind": "fit", "interventions": "patching",
                "rows": {"base": "weekdays_full/train", "counterfactual": "weekdays_full/train"},
                "held_out": {"base": "weekdays_full/test", "counterfactual": "weekdays_full/test"},
                "params": ["rot"], "objective": [[-1.0, "logit_diff"]],
                "epochs": 3, "batch_size": 8, "seed": seed, "lr": 0.01,
                "early_stop": {"metric": "iia", "patience": 2},
                "saves": [{"value": "iia", "file_path": "held_out_iia.json"}]},
        "score": doc["steps"]["score"],
    }
    return doc


def _seed_batches(n: int, epochs: int, batch_size: int, seed: int) -> list[list[tuple[int, ...]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(epochs):
        order = list(range(n))
        rng.shuffle(order)
        out.append([tuple(sorted(order[i:i + batch_size])) for i in range(0, n, batch_size)])
    return out


def test_a_fit_compiles_its_updates_in_the_seeds_order(tmp_path, tok):
    plan = compile_doc(fit_doc(), tmp_path)
    fit = plan.step("fit", Fit)
    n = len(rows("weekdays_full/train"))
    assert n == 30
    expected = _seed_batches(n, 3, 8, 7)
    assert [[u.example_ids for u in epoch] for epoch in fit.epochs] == [
        [tuple(str(i) for i in batch) for batch in epoch] for epoch in expected]
    assert [len(e) for e in fit.epochs] == [4, 4, 4]
    # Every epoch covers every row exactly once, and epochs differ (the rng moves on).
    for epoch in fit.epochs:
        assert sorted(int(i) for u in epoch for i in u.example_ids) == list(range(n))
    assert fit.epochs[0] != fit.epochs[1]
    # An update tokenizes only its own rows.
    data = rows("weekdays_full/train")
    update = fit.epochs[1][2]
    texts = [data[i]["input"] for i in expected[1][2]]
    ids, _, _ = _expected_ids(tok, texts)
    (patched,) = [f for f in update.forwards if f.model == "patched"]
    assert patched.ids == ids
    # The rest of the fit.
    assert (fit.lr, fit.objective, fit.params, fit.seed) == (0.01, ((-1.0, "logit_diff"),), ("rot",), 7)
    assert fit.early_stop == ("iia", "max", 2)
    assert fit.evaluation is not None and fit.evaluation.rows == len(rows("weekdays_full/test"))
    feats = plan.step("featurizers")
    (rot,) = feats.specs
    assert (rot.kind, rot.k, rot.d, rot.trained) == ("subspace", 4, 32, True)
    (v_cf,) = [r for f in fit.epochs[0][0].forwards for r in f.reads if r.name == "v_cf"]
    assert v_cf.width == 4
    text = explain(plan)
    assert "fit: Fit  3 epochs x 4 updates" in text
    assert "… 11 more updates" in text


def test_another_seed_is_another_order(tmp_path):
    one = compile_doc(fit_doc(7), tmp_path, name="one").step("fit", Fit)
    two = compile_doc(fit_doc(8), tmp_path, name="two").step("fit", Fit)
    assert [[u.example_ids for u in e] for e in one.epochs] != [[u.example_ids for u in e] for e in two.epochs]
    assert [[u.example_ids for u in e] for e in two.epochs] == [
        [tuple(str(i) for i in b) for b in e] for e in _seed_batches(30, 3, 8, 8)]


def test_a_fit_is_compiled_as_a_count_and_a_schedule_not_n_copies(tmp_path, monkeypatch):
    """Compiling a fit of the most epochs tokenizes exactly what a one-epoch fit does (epoch 0,
    to check every row); a later epoch is compiled when asked for, in the seed's order."""
    import causalab_mini.plan.build as build

    calls = []
    real = build.tokenize_rows
    monkeypatch.setattr(build, "tokenize_rows", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    one = fit_doc()
    one["steps"]["fit"]["epochs"] = 1
    compile_doc(one, tmp_path, name="one")
    per_epoch, calls[:] = len(calls), []
    many = fit_doc()
    many["steps"]["fit"]["epochs"] = MAX_EPOCHS
    plan = compile_doc(many, tmp_path, name="many")
    fit = plan.step("fit", Fit)
    assert len(calls) == per_epoch
    assert len(fit.epochs) == MAX_EPOCHS and fit.epochs.updates == 4
    text = explain(plan)
    assert f"fit: Fit  {MAX_EPOCHS} epochs x 4 updates" in text and f"… {MAX_EPOCHS * 4 - 1} more updates" in text
    # Epoch 41, asked for out of order, is the seed's 41st shuffle; asking backwards replays it.
    expected = _seed_batches(30, 42, 8, 7)
    for e in (41, 3, 41):
        assert [u.example_ids for u in fit.epochs[e]] == [tuple(str(i) for i in b) for b in expected[e]]
    assert fit.epochs[41] is fit.epochs[41], "the epoch an engine is on keeps the results written on it"


def test_a_subspace_wider_than_its_site_is_refused(tmp_path):
    doc = fit_doc()
    doc["featurizers"]["rot"]["k"] = 33
    refused(doc, tmp_path, CompileError, "featurizers.rot.k", "k=33 is more directions than the site's 32")


def test_a_swept_plan_refuses_an_ambiguous_result(tmp_path):
    doc = base()
    iv(doc)["writes"]["patch"]["pos"] = {"sweep": [-1, -2]}
    root = compile_doc(doc, tmp_path)
    assert root.produced_by is None
    assert list(root.steps) == ["shared", "pos=-1", "pos=-2"]  # their counterfactual pass, run once
    assert [p.name for p in root.points] == ["pos=-1", "pos=-2"]
    digests = {p.produced_by for p in root.points}
    assert len(digests) == 2
    for value, point in enumerate(root.points):
        assert point.steps["score"].forwards[-1].writes[0].where.index == -1 - value
        point.steps["score"].results["iia"] = float(value)
    with pytest.raises(PlanError) as info:
        root.result("iia")
    assert info.value.path == "result 'iia'"
    assert info.value.problem == "2 in this plan"
    assert "'iia'" in info.value.fix and "pos=-1" in info.value.fix
    assert root.steps["pos=-2"].result("iia") == 1.0
    with pytest.raises(PlanError) as info:
        root.result("nope")
    assert info.value.problem == "not in this plan" and "iia" in info.value.fix


# --------------------------------------------------------------------------- no weights

_GUARDED = r'''
import json, sys, io, contextlib
from pathlib import Path
mode, document, models, data = sys.argv[1:5]
opened = []

if mode == "no-torch":
    # torch cannot be imported at all: transformers falls back to tokenizers/config only.
    sys.modules["torch"] = None
    sys.modules["safetensors.torch"] = None
else:
    # torch is there, and every way of turning weights into tensors raises.
    import torch, safetensors, safetensors.torch, transformers
    from transformers import modeling_utils

    def forbidden(what):
        def trap(*args, **kwargs):
            raise AssertionError(f"weights touched: {what}")
        return trap

    safetensors.safe_open = forbidden("safetensors.safe_open")
    safetensors.torch.safe_open = forbidden("safetensors.torch.safe_open")
    safetensors.torch.load_file = forbidden("safetensors.torch.load_file")
    safetensors.torch.load = forbidden("safetensors.torch.load")
    torch.load = forbidden("torch.load")
    torch.nn.Module.__init__ = forbidden("torch.nn.Module.__init__")
    for name in ("safe_open", "load_state_dict", "_safe_load_bytes"):  # names modeling_utils bound at import
        if hasattr(modeling_utils, name):
            setattr(modeling_utils, name, forbidden(f"modeling_utils.{name}"))
    modeling_utils.PreTrainedModel.from_pretrained = classmethod(forbidden("PreTrainedModel.from_pretrained"))
    transformers.AutoModelForCausalLM.from_pretrained = forbidden("AutoModelForCausalLM.from_pretrained")
    transformers.AutoModelForCausalLM.from_config = forbidden("AutoModelForCausalLM.from_config")

    def audit(event, args):
        # Every Python-level open of a weights file, with the functions that asked for it.
        if event == "open" and isinstance(args[0], (str, bytes)) and str(args[0]).endswith(".safetensors"):
            frame, names = sys._getframe(1), []
            while frame is not None:
                names.append(frame.f_code.co_filename.rsplit("/", 1)[-1] + ":" + frame.f_code.co_name)
                frame = frame.f_back
            opened.append({"path": str(args[0]), "mode": str(args[1]), "by": names})
    sys.addaudithook(audit)
    if mode == "control":  # the guards are live: loading the model the usual way must trip one
        transformers.AutoModelForCausalLM.from_pretrained(Path(models) / "tiny-llama")

from causalab_mini import cli
from causalab_mini.document.read import read
from causalab_mini.plan.compile import compile_plan
from causalab_mini.plan.explain import explain

raw = read(document)
plan = compile_plan(raw, document=Path(document), models=[models], data=[data])
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = cli.main(["explain", document, "--models", models, "--data", data])
loaded = sorted(m for m, v in sys.modules.items() if v is not None and m.split(".")[0] in ("torch", "nnsight", "nnterp"))
print(json.dumps({"repr": repr(plan), "explain": explain(plan), "cli": out.getvalue(), "rc": rc,
                  "opened": opened, "loaded": loaded}))
'''


def _pca_bundle(path: Path, d: int = 32, k: int = 4) -> Path:
    import torch
    from safetensors.torch import save_file

    q, _ = torch.linalg.qr(torch.randn(d, k, generator=torch.Generator().manual_seed(0)))
    save_file({"Q": q.contiguous()}, str(path))
    return path


def _guarded(mode: str, document: Path):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", _GUARDED, mode, str(document), str(MODELS), str(DATA)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def _guarded_run(mode: str, document: Path) -> dict:
    done = _guarded(mode, document)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_weight_guards_are_live(weights_document):
    done = _guarded("control", weights_document)
    assert done.returncode != 0
    assert "weights touched:" in done.stderr


@pytest.fixture(scope="module")
def weights_document(tmp_path_factory) -> Path:
    """Patching through a loaded pca bundle, plus a fit: every kind of compile work, one document."""
    tmp = tmp_path_factory.mktemp("weights")
    _pca_bundle(tmp / "pca.safetensors")
    doc = fit_doc()
    doc["featurizers"]["basis"] = {"kind": "pca", "site": "target", "file_path": "pca.safetensors"}
    doc["interventions"]["scored"] = copy.deepcopy(iv(doc))
    scored = doc["interventions"]["scored"]
    scored["reads"]["v_cf"]["featurizer"] = "basis"
    scored["writes"]["patch"]["featurizer"] = "basis"
    doc["steps"]["score"]["interventions"] = "scored"
    path = tmp / "weights.causalab.json"
    path.write_text(json.dumps(doc))
    return path


def test_compiling_needs_no_torch_at_all(weights_document):
    """With torch unimportable the compiler produces the very same plan: it cannot have made a tensor."""
    here = compile_plan(json.loads(weights_document.read_text()), document=weights_document,
                        models=[MODELS], data=[DATA])
    there = _guarded_run("no-torch", weights_document)
    assert there["loaded"] == []
    assert there["repr"] == repr(here)
    assert there["explain"] == explain(here)
    assert there["rc"] == 0 and there["cli"].strip() == explain(here)
    assert "basis: pca k=4 d=32" in there["explain"]


def test_compiling_with_torch_loads_no_weights(weights_document):
    """With torch importable, no loader runs, no module is built, and a weights file is opened only to hash it
    (model/loading.revision_digest) or to read its JSON header (plan/featurizer_files.header)."""
    result = _guarded_run("guarded", weights_document)
    assert result["rc"] == 0 and "fit: Fit  3 epochs x 4 updates" in result["cli"]
    assert "nnsight" not in result["loaded"] and "nnterp" not in result["loaded"]
    openers = [(Path(o["path"]).name, o["mode"], o["by"]) for o in result["opened"]]
    assert openers, "the audit hook saw nothing: the revision digest should have opened the weights"
    by = {"loading.py:revision_digest", "featurizer_files.py:header"}
    for name, mode, stack in openers:
        assert set(mode) <= set("rb"), (name, mode)  # read, never written
        assert by & set(stack), (name, stack[:6])
    assert {n for n, _, s in openers if "loading.py:revision_digest" in s} == {"model.safetensors"}
    assert {n for n, _, s in openers if "featurizer_files.py:header" in s} == {"pca.safetensors"}


def _pca_harvest(pos, k: int) -> dict:
    doc = base()
    iv(doc)["reads"]["acts"] = {"site": "target", "pos": pos, "input": "base"}
    doc["steps"] = {"harvest": {"kind": "observe", "interventions": "patching",
                                "rows": {"base": "weekdays/train", "counterfactual": "weekdays/train"},
                                "outputs": {"basis": {"read": "acts", "reduce": "pca", "k": k}}}}
    return doc


def test_a_pca_over_too_few_vectors_is_refused_at_compile_time(tmp_path):
    # Four rows read at one position each are four vectors: no rank-4 PCA (it needs five).
    n = len(rows("weekdays/train"))
    refused(_pca_harvest(-1, n), tmp_path, CompileError, "steps.harvest.outputs.basis.k",
            f"{n} vectors", f"rank-{n}")
    compile_doc(_pca_harvest(-1, n - 1), tmp_path)  # k+1 vectors is enough
    compile_doc(_pca_harvest({"all": True}, n), tmp_path)  # every token: plenty


def test_a_pca_wider_than_its_read_is_refused(tmp_path, config):
    refused(_pca_harvest({"all": True}, config.hidden_size + 1), tmp_path, CompileError,
            "steps.harvest.outputs.basis.k", "more directions")

"""The document corpus: every ``*.causalab.json`` under documents/ validates, is pinned to the
weights it was written against, and compiles; a few plans are checked against facts computed
here, independently of the compiler (line counts, the tokenizer, the model's config).

Documents that load a featurizer bundle from documents/v2/artifacts/ compile only once the
document that makes the bundle has run. Until then their compile test asserts the refusal
is the clear "does not exist" one, and ``test_compiles_with_stand_in_artifacts`` compiles them
against stand-in bundles of the right shape in a temporary directory.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import pytest

import causalab_mini as cm
from causalab_mini.document import read as front
from causalab_mini.model import loading
from causalab_mini.errors import MissingArtifact
from causalab_mini.plan import compile as compiler
from causalab_mini.plan.plan import Fit, Observe, Operand, Plan, Weights, WriteOp
from paths import CORPUS, DATA, DOCUMENTS, MODELS, V2


def _id(path: Path) -> str:
    return str(path.relative_to(DOCUMENTS))


def _v2(name: str) -> Path:
    return V2 / f"{name}{cm.SUFFIX}"


# --- independent facts: the data files, the tokenizer, the config ---------------------------

def _rows(ref: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / f"{ref}.jsonl").read_text().splitlines() if line.strip()]


@lru_cache(maxsize=None)
def _tokenizer(key: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(MODELS / key))


@lru_cache(maxsize=None)
def _config(key: str):
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(str(MODELS / key))
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _n_ids(key: str, text: str) -> int:
    return len(_tokenizer(key)(text)["input_ids"])


def _featurizer_files(raw: dict, path: Path) -> list[Path]:
    """Every featurizer bundle a document (any point of it) loads, resolved against the document."""
    files = []
    for point in front.points(raw):
        for feat in point.spec.featurizers.values():
            if feat.file_path:
                files.append((path.parent / feat.file_path).resolve())
    return sorted(set(files))


@lru_cache(maxsize=None)
def _compiled(path: Path) -> Plan:
    """The plan with every point running its own forwards (``share=False``): each point as it
    would run alone. tests/test_share.py holds the shared plans to these."""
    return compiler.compile_plan(front.read(path), document=path, share=False)


def _ops(forward) -> list[tuple[str, str]]:
    """A forward's ops in the order the engine meets them."""
    return [(("write" if i < len(t.writes) else "read"), op.name)
            for t in forward.taps for i, op in enumerate((*t.writes, *t.reads))]


def _op(forward, name: str):
    for tap in forward.taps:
        for op in (*tap.writes, *tap.reads):
            if op.name == name:
                return op
    raise KeyError(name)


def _points(plan: Plan) -> dict:
    return {p.name: p for p in plan.points}


# --- every document ---------------------------------------------------------------------------

def test_corpus_is_there():
    names = {p.name.removesuffix(cm.SUFFIX) for p in V2.glob("*" + cm.SUFFIX)}
    missing = set(EXPECTED_POINTS) - names
    assert not missing, f"corpus documents missing: {sorted(missing)}"
    assert (DOCUMENTS / "protocol" / f"pos_sweep{cm.SUFFIX}").is_file()


@pytest.mark.parametrize("path", CORPUS, ids=_id)
def test_validates(path):
    raw = front.read(path)
    points = front.points(raw)
    assert points
    for point in points:
        assert point.spec.header.description.strip(), "every corpus document explains itself"
    if path.parent.name == "protocol":
        assert front.shape(raw) == "protocol"


EXPECTED_POINTS = {
    "patching": [None],
    "patching_gpt2": [None],
    "entity_patch": [None],
    "arithmetic_patch": [None],
    "chat_turn": [None],
    "zero_ablation": [None],
    "mean_ablation": [None],
    "steer_renormalize": [None],
    "das": [None],
    "das_apply": [None],
    "pca_harvest": [None],
    "pca_control": [None],
    "random_subspace_control": [None],
    "generated_answer": [None],
    "pos_sweep": ["pos=-1", "pos=-2", "pos=-3"],
    "head_patching": ["heads=0", "heads=1", "heads=2", "heads=3"],
    "head_patching_gemma2": ["heads=0", "heads=1", "heads=2", "heads=3"],
    "neuron_patching": ["units=[0,1,2,3]", "units=[4,5,6,7]", "units=[8,9,10,11]"],
    "logit_lens": ["layers=0", "layers=1"],
    "effect_metrics": ["layers=0", "layers=1"],
    "whole_answer": ["layers=0", "layers=1"],
    "pattern_patching": ["heads=0", "heads=1", "heads=2", "heads=3"],
    "logit_lens_gemma2": ["layers=0", "layers=1"],
    "attribution_patching": [f"layers={layer},pos={pos}" for layer in (0, 1) for pos in range(-6, 0)],
    "layer_pos_sweep": ["layers=0,pos=-4", "layers=0,pos=-3", "layers=0,pos=-1",
                        "layers=1,pos=-4", "layers=1,pos=-3", "layers=1,pos=-1"],
    "das_wrong_site": [None],
    "dbm": ["objective=0.01", "objective=0.3", "objective=1.0", "objective=3.0"],
    "sae_feature_ablation": ["features=0", "features=1", "features=2", "features=3"],
    "generate_probe": ["index=0", "index=1", "index=2"],
    "generate_steer": ["step=0", "step=1", "step=2"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_POINTS))
def test_point_names(name):
    points = front.points(front.read(_v2(name)))
    assert [p.name for p in points] == EXPECTED_POINTS[name]


def test_protocol_point_names():
    points = front.points(front.read(DOCUMENTS / "protocol" / f"pos_sweep{cm.SUFFIX}"))
    assert [p.name for p in points] == ["pos=-1", "pos=-2", "pos=-3"]


@pytest.mark.parametrize("path", CORPUS, ids=_id)
def test_revision_is_current(path):
    """A stale pin fails here, loudly, naming the digest to write (or the weights to restore)."""
    raw = front.read(path)
    model = front.points(raw)[0].spec.model
    assert model.revision, f"{_id(path)} does not pin its model's revision"
    resolved = loading.resolve(model.key, None, document=path)
    assert resolved.local and Path(resolved.source).resolve().parent == MODELS.resolve(), \
        f"{model.key!r} should be one of the shipped models under documents/models"
    digest = loading.revision_digest(Path(resolved.source))
    assert model.revision == digest, (
        f"{_id(path)} pins {model.key} at {model.revision}, and the checkpoint there is now {digest}: "
        "rewrite the document's revision if the change is intended")


@pytest.mark.parametrize("path", CORPUS, ids=_id)
def test_compiles(path):
    raw = front.read(path)
    missing = [f for f in _featurizer_files(raw, path) if not f.is_file()]
    if missing:
        with pytest.raises(MissingArtifact, match="does not exist"):
            compiler.compile_plan(raw, document=path)
        return
    plan = _compiled(path)
    assert isinstance(plan, Plan)
    points = plan.points
    assert len(points) == len(front.points(raw))
    for point in points:
        assert point.steps
        for _, step in point.walk():
            if isinstance(step, Observe):
                assert step.rows > 0
                for forward in step.forwards:
                    keys = [t.address.key for t in forward.taps]
                    assert keys == sorted(keys), "taps are in forward order"
                    # at one site a pass's writes come before its reads, so the reads see them
                    seq = [(isinstance(op, WriteOp), op.address.site_key)
                           for t in forward.taps for op in (*t.writes, *t.reads)]
                    for i, (is_write, site) in enumerate(seq):
                        if is_write:
                            assert not any(not w and s == site for w, s in seq[:i]), \
                                f"a read at {site} precedes a write there"


# --- stand-in bundles for the documents that wait on artifacts -------------------------------

def _stand_in(kind: str, d: int, k: int) -> dict:
    import torch
    gen = torch.Generator().manual_seed(0)
    if kind == "subspace":
        return {"weight": torch.randn(d, k, generator=gen)}
    if kind == "pca":
        q, _ = torch.linalg.qr(torch.randn(d, k, generator=gen))
        return {"Q": q.contiguous()}
    if kind in ("sae", "linear"):
        return {"W_enc": torch.randn(d, k, generator=gen), "W_dec": torch.randn(k, d, generator=gen),
                "b_enc": torch.zeros(k), "b_dec": torch.zeros(d)}
    raise AssertionError(kind)


WAITING = ["das_apply", "pca_control", "sae_feature_ablation"]


@pytest.mark.parametrize("name", WAITING)
def test_compiles_with_stand_in_artifacts(name, tmp_path):
    """The artifact-loading documents compile once their bundles exist (shapes as the makers save them)."""
    from safetensors.torch import save_file

    src = _v2(name)
    raw = front.read(src)
    (tmp_path / "v2" / "artifacts").mkdir(parents=True)
    doc = tmp_path / "v2" / src.name
    doc.write_text(src.read_text())
    spec = front.points(raw)[0].spec
    d = _config(spec.model.key).hidden_size
    ks = {}
    for fname, feat in spec.featurizers.items():
        assert feat.file_path and feat.file_path.startswith("artifacts/")
        k = feat.k or (16 if feat.kind == "sae" else 4)
        ks[fname] = k
        save_file(_stand_in(feat.kind, d, k), str((doc.parent / feat.file_path).resolve()))
    plan = compiler.compile_plan(raw, document=doc, models=[MODELS], data=[DATA])
    for point in plan.points:
        specs = {s.name: s for s in point.steps["featurizers"].specs}
        assert {n: (s.d, s.k, s.trained) for n, s in specs.items()} == {n: (d, k, False) for n, k in ks.items()}


# --- concrete plan facts, computed independently ----------------------------------------------

def _check_left_padded(forward, key: str, texts: list[str]):
    tok = _tokenizer(key)
    assert forward.tokens == max(_n_ids(key, t) for t in texts)
    for row, text in enumerate(texts):
        ids = tok(text)["input_ids"]
        assert sum(forward.mask[row]) == len(ids)
        assert list(forward.ids[row][forward.tokens - len(ids):]) == ids
        assert forward.mask[row][-1] == 1


def _check_answer_tokens(metric, key: str, rows: list[dict]):
    """One in-vocabulary id per column per row, and each decodes to the start of that row's answer."""
    from causalab_mini.vocab import METRICS
    tok = _tokenizer(key)
    fields = METRICS[metric.kind].columns
    assert len(metric.token_ids) == len(fields)
    for ids in metric.token_ids:
        assert len(ids) == len(rows)
        assert all(i is not None and 0 <= i < _config(key).vocab_size for i in ids)
        for token_id, row in zip(ids, rows):
            piece = tok.decode([token_id]).strip()
            assert piece and any(str(v).strip().startswith(piece) for v in row.values() if isinstance(v, str))


@pytest.mark.parametrize("name,key", [("patching", "tiny-llama"), ("patching_gpt2", "tiny-gpt2")])
def test_patching_plan(name, key):
    plan = _compiled(_v2(name))
    assert list(plan.steps) == ["score"]
    score = plan.steps["score"]
    rows = _rows("weekdays/train")
    assert score.rows == len(rows) == len((DATA / "weekdays/train.jsonl").read_text().splitlines())
    assert [(f.model, f.input) for f in score.forwards] == [("original", "counterfactual"), ("patched", "base")]
    cf, patched = score.forwards
    _check_left_padded(cf, key, [r["counterfactual_inputs"][0] for r in rows])
    _check_left_padded(patched, key, [r["input"] for r in rows])
    assert _ops(cf) == [("read", "v_cf")]
    assert _ops(patched) == [("write", "patch"), ("read", "logits")]
    d = _config(key).hidden_size
    v_cf, patch = _op(cf, "v_cf"), _op(patched, "patch")
    assert (v_cf.address.component, v_cf.address.layer, v_cf.width) == ("block_output", 0, d)
    assert patch.operand == Operand("read", "v_cf") and patch.where.index == -1
    logits = _op(patched, "logits")
    assert logits.width == _config(key).vocab_size
    tok = _tokenizer(key)
    iia = next(m for m in score.metrics if m.name == "iia")
    for token_id, row in zip(iia.token_ids[0], rows):
        piece = tok.decode([token_id]).strip()
        assert piece and row["cf_answer"].strip().startswith(piece)
    for m in score.metrics:
        _check_answer_tokens(m, key, rows)
    assert [s.file_path for s in score.saves] == ["iia.json", "logit_diff.json"]


@pytest.mark.parametrize("path", [_v2("pos_sweep"), DOCUMENTS / "protocol" / f"pos_sweep{cm.SUFFIX}"],
                         ids=["plan-shaped", "protocol"])
def test_pos_sweep_plan(path):
    points = _points(_compiled(path))
    assert list(points) == ["pos=-1", "pos=-2", "pos=-3"]
    for name, point in points.items():
        (step,) = point.steps.values()
        cf, patched = step.forwards
        assert (cf.model, cf.input, patched.model, patched.input) == ("original", "counterfactual", "patched", "base")
        assert _op(cf, "v_cf").where.index == -1, "only the write moves"
        assert _op(patched, "patch").where.index == int(name.split("=")[1])
        assert _op(patched, "logits").where.index == -1
        assert _ops(patched) == [("write", "patch"), ("read", "logits")]


def test_protocol_and_plan_shapes_compile_alike():
    plan = _points(_compiled(_v2("pos_sweep")))
    proto = _points(_compiled(DOCUMENTS / "protocol" / f"pos_sweep{cm.SUFFIX}"))

    def shape(point):
        (step,) = point.steps.values()
        return [(f.model, f.input, f.ids, f.mask,
                 [(op.name, op.address.spelling(), op.where.to_json(), getattr(op, "operand", None))
                  for t in f.taps for op in (*t.writes, *t.reads)]) for f in step.forwards]

    assert list(plan) == list(proto)
    for name in plan:
        assert shape(plan[name]) == shape(proto[name])


def test_head_patching_plan():
    config = _config("tiny-llama")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for h, (name, point) in enumerate(_points(_compiled(_v2("head_patching"))).items()):
        assert name == f"heads={h}"
        cf, patched = point.steps["score"].forwards
        for op in (_op(cf, "v_cf"), _op(patched, "patch")):
            a = op.address
            assert (a.component, a.layer, a.heads) == ("attention_z", 1, (h,))
            assert a.columns == tuple(range(h * head_dim, (h + 1) * head_dim))
            assert a.full_width == config.num_attention_heads * head_dim
        assert _op(cf, "v_cf").width == head_dim


def test_neuron_patching_plan():
    d_mlp = _config("tiny-llama").intermediate_size
    for point in _compiled(_v2("neuron_patching")).points:
        units = json.loads(point.name.split("=", 1)[1])
        cf, patched = point.steps["score"].forwards
        a = _op(patched, "patch").address
        assert (a.component, a.layer, a.units, a.columns, a.width, a.full_width) == \
            ("mlp_hidden", 0, tuple(units), tuple(units), 4, d_mlp)
        assert _op(cf, "v_cf").width == 4


def test_layer_pos_sweep_plan():
    points = _points(_compiled(_v2("layer_pos_sweep")))
    for name, point in points.items():
        layer, pos = (int(part.split("=")[1]) for part in name.split(","))
        cf, patched = point.steps["score"].forwards
        for op in (_op(cf, "v_cf"), _op(patched, "patch")):
            assert (op.address.layer, op.where.index) == (layer, pos), "read and write move together"


def test_entity_patch_anchors():
    rows = _rows("weekdays/train")
    cf, patched = _compiled(_v2("entity_patch")).steps["score"].forwards
    assert _op(cf, "v_cf").anchors == tuple(r["counterfactual_inputs_variables"][0]["entity"] for r in rows)
    assert _op(patched, "patch").anchors == tuple(r["entity"] for r in rows)
    for forward, field in ((cf, "counterfactual"), (patched, "base")):
        for text, anchor in zip(forward.texts, _op(forward, "v_cf" if field == "counterfactual" else "patch").anchors):
            assert text.count(anchor) == 1


def test_arithmetic_patch_anchors():
    rows = _rows("weekday_arithmetic/train")
    cf, patched = _compiled(_v2("arithmetic_patch")).steps["score"].forwards
    assert cf.rows == len(rows)
    assert _ops(patched) == [("write", "patch_number"), ("write", "patch_day"), ("read", "logits")]
    assert _op(patched, "patch_number").anchors == tuple(r["number"] for r in rows)
    assert _op(patched, "patch_day").anchors == tuple(r["day"] for r in rows)
    assert _op(cf, "v_number").anchors == tuple(r["counterfactual_inputs_variables"][0]["number"] for r in rows)
    _check_left_padded(patched, "tiny-llama", [r["input"] for r in rows])


def test_chat_turn_segments():
    rows = _rows("weekdays/chat")
    step = _compiled(_v2("chat_turn")).steps["score"]
    assert [(f.model, f.input) for f in step.forwards] == \
        [("original", "counterfactual"), ("original", "base"), ("patched", "base")]
    for forward in step.forwards:
        messages = [r["input"] if forward.input == "base" else r["counterfactual_inputs"][0] for r in rows]
        for text, segments, chat in zip(forward.texts, forward.segments, messages):
            start, end = segments["user[1]"]
            assert text[start:end] == chat[2]["content"]
            assert "user" not in segments, "a role that spoke twice has no bare name"
            assert text[slice(*segments["assistant"])] == chat[1]["content"]
    patched = step.forwards[-1]
    anchors = _op(patched, "patch").anchors
    assert anchors == tuple(r["entity"] for r in rows)
    for text, segments, anchor in zip(patched.texts, patched.segments, anchors):
        assert text.count(anchor) == 2, "the weekday is said twice: the scope is what makes it one"
        assert text[slice(*segments["user[1]"])].count(anchor) == 1


def test_das_plan():
    plan = _compiled(_v2("das"))
    assert list(plan.steps) == ["featurizers", "fit", "score", "weights"]
    (rot,) = plan.steps["featurizers"].specs
    assert (rot.name, rot.kind, rot.d, rot.k, rot.trained, rot.file_path) == \
        ("rot", "subspace", _config("tiny-llama").hidden_size, 4, True, None)
    fit = plan.steps["fit"]
    assert isinstance(fit, Fit)
    train, test = _rows("weekdays_full/train"), _rows("weekdays_full/test")
    assert len(fit.epochs) == 10
    for epoch in fit.epochs:
        assert len(epoch) == math.ceil(len(train) / 8)
        ids = [i for update in epoch for i in update.example_ids]
        assert len(ids) == len(set(ids)) == len(train), "each epoch is every training row once"
        assert all(update.rows <= 8 for update in epoch)
    assert fit.evaluation.rows == len(test)
    assert fit.objective == ((1.0, "ce"),) and fit.params == ("rot",)
    assert fit.early_stop == ("iia", "max", 3)
    assert plan.steps["score"].rows == len(test)
    weights = plan.steps["weights"]
    assert isinstance(weights, Weights) and weights.names == ("rot",)
    assert [s.file_path for s in weights.saves] == ["rot.safetensors"]
    for forward in fit.epochs[0][0].forwards:
        for tap in forward.taps:
            for op in (*tap.writes, *tap.reads):
                if op.address.component == "block_output":
                    assert op.featurizer == "rot"


def test_dbm_plan():
    for point in _compiled(_v2("dbm")).points:
        weight = float(point.name.split("=")[1])
        (mask,) = point.steps["featurizers"].specs
        assert (mask.kind, mask.k, mask.d, mask.trained) == ("gate", None, _config("tiny-llama").hidden_size, True)
        fit = point.steps["fit"]
        assert fit.objective == ((1.0, "ce"), (weight, "mask.mask"))
        assert fit.anneal == (("mask", 1.0, 0.1),)


def test_random_subspace_control_is_untrained():
    (rot,) = _compiled(_v2("random_subspace_control")).steps["featurizers"].specs
    das = front.points(front.read(_v2("das")))[0].spec.featurizers["rot"]
    assert (rot.kind, rot.k, rot.trained, rot.file_path) == ("subspace", das.k, False, None)
    assert rot.seed != das.seed


def test_mean_ablation_plan():
    plan = _compiled(_v2("mean_ablation"))
    assert list(plan.steps) == ["harvest", "clean", "ablated"]
    harvest = plan.steps["harvest"]
    assert [(o.name, o.read, o.reduce) for o in harvest.outputs] == [("mean", "acts", "mean")]
    (ablated,) = plan.steps["ablated"].forwards
    assert _op(ablated, "ablate").operand == Operand("ref", "mean")
    assert _ops(ablated) == [("write", "ablate"), ("read", "logits")]


def test_zero_ablation_operand_is_a_number():
    (zeroed,) = _compiled(_v2("zero_ablation")).steps["zeroed"].forwards
    assert _op(zeroed, "zero").operand == Operand("number", 0.0)


def test_steer_renormalize_plan():
    plan = _compiled(_v2("steer_renormalize"))
    (harvest,) = plan.steps["harvest"].forwards
    assert (harvest.model, harvest.input) == ("original", "counterfactual")
    steer = plan.steps["steer"]
    assert [(f.model, f.input) for f in steer.forwards] == \
        [("original", "base"), ("steered", "base"), ("steered_renormed", "base")]
    renormed = steer.forwards[2]
    assert _ops(renormed) == [("write", "steer"), ("write", "restore"), ("read", "after"), ("read", "logits")]
    assert dict(_op(renormed, "steer").params) == {"scale": 4.0}
    assert _op(renormed, "steer").operand == Operand("ref", "direction")


def test_pca_harvest_plan():
    (step,) = _compiled(_v2("pca_harvest")).steps.values()
    assert [(o.name, o.read, o.reduce, o.k) for o in step.outputs] == [("basis", "acts", "pca", 4)]
    (forward,) = step.forwards
    assert _op(forward, "acts").where.all
    # every token of every prompt: enough vectors for a rank-4 basis
    assert sum(sum(m) for m in forward.mask) > 4 + 1


def test_logit_lens_gemma2_plan():
    config = _config("tiny-gemma2")
    assert config.final_logit_softcapping, "the point of this document is Gemma-2's softcap"
    for layer, point in enumerate(_compiled(_v2("logit_lens_gemma2")).points):
        (forward,) = point.steps["lens"].forwards
        lens = _op(forward, "lens")
        assert (lens.view, lens.address.layer, lens.width) == ("logits", layer, config.vocab_size)
        assert _op(forward, "final_logits").address.component == "logits"
        assert _op(forward, "head_logits").address.component == "lm_head"
        _check_left_padded(forward, "tiny-gemma2", [r["input"] for r in _rows("weekdays/train")])


def test_generate_probe_plan():
    for k, point in enumerate(_compiled(_v2("generate_probe")).points):
        forwards = point.steps["score"].forwards
        assert [f.decode for f in forwards] == [3, 3]
        logits = _op(forwards[1], "logits")
        assert (logits.where.frame, logits.step) == ("generated", k)
        assert _op(forwards[1], "patch").step is None, "the write is at the prefill"


def test_generate_steer_plan():
    for k, point in enumerate(_compiled(_v2("generate_steer")).points):
        original, steered = point.steps["score"].forwards
        assert _op(steered, "push").step == "all"
        assert _op(original, "clean_logits").step == _op(steered, "steered_logits").step == k


def test_generated_answer_plan():
    (forward,) = _compiled(_v2("generated_answer")).steps["score"].forwards
    assert forward.decode == 6
    assert _op(forward, "at_said").step == _op(forward, "at_stop").step == "stack"
    assert _op(forward, "at_said").anchors == tuple(r["said"] for r in _rows("weekdays/said"))

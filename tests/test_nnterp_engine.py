"""The nnterp engine against an independent computation.

Every number here is compared with one computed in this file from a plain
``AutoModelForCausalLM`` and hand-written ``register_forward_hook`` /
``register_forward_pre_hook`` calls — not with anything in ``causalab_mini.ops``
— on the same hand-padded batch, to 1e-6.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import socket
from contextlib import contextmanager
from importlib import metadata

import pytest

from paths import DATA, MODELS, V2
from run_values import same_results
from reference import answer_id, padded
import torch

pytest.importorskip("nnterp")

from causalab_mini.engine import base, provenance, steps  # noqa: E402
from causalab_mini.engine.nnterp import NNterpEngine  # noqa: E402
from causalab_mini.errors import EngineError  # noqa: E402
from causalab_mini.plan.compile import compile_plan  # noqa: E402

FAMILIES = ("tiny-llama", "tiny-gpt2", "tiny-gemma2")
ATOL = 1e-6

# Module paths in each family's own spelling, written out by hand.
PATHS = {
    "tiny-llama": dict(embed="model.embed_tokens", layers="model.layers", attn="self_attn",
                       o="self_attn.o_proj", mlp="mlp", down="mlp.down_proj", norm="model.norm"),
    "tiny-gpt2": dict(embed="transformer.wte", layers="transformer.h", attn="attn",
                      o="attn.c_proj", mlp="mlp", down="mlp.c_proj", norm="transformer.ln_f"),
}
PATHS["tiny-gemma2"] = PATHS["tiny-llama"]


# --- fixtures: each model loaded once per session ------------------------------------

class Loaded:
    """One family: the engine, and the same checkpoint as a plain HF model for the reference
    (both the session's shared loads: ``hooked`` removes every hook it registers)."""

    def __init__(self, family: str, engine, hf, tok):
        self.family = family
        self.engine, self.hf, self.tok = engine, hf, tok
        rows = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines()]
        self.rows = rows
        self.base = self.batch([r["input"] for r in rows])
        self.cf = self.batch([r["counterfactual_inputs"][0] for r in rows])
        self.cf_answer = torch.tensor([self.answer(r["cf_answer"]) for r in rows])
        self.base_answer = torch.tensor([self.answer(r["base_answer"]) for r in rows])

    def batch(self, texts):
        return padded(self.tok, texts)[:2]

    def answer(self, word: str) -> int:
        return answer_id(self.tok, word)

    def module(self, name: str, layer=None):
        path = PATHS[self.family]
        if layer is None:
            return self.hf.get_submodule(path[name])
        block = self.hf.get_submodule(path["layers"])[layer]
        return block if name == "layer" else block.get_submodule(path[name])

    def logits(self, batch, *hooks):
        """The lm_head output (what the documents read) on ``batch``, with ``hooks`` = (module, fn, pre)."""
        store = {}
        self.output(batch, *hooks, (self.hf.lm_head, lambda t: store.setdefault("head", t), False))
        return store["head"]

    def output(self, batch, *hooks):
        """The model's own returned logits (Gemma-2: after its final softcap)."""
        ids, mask = batch
        positions = torch.clamp(torch.cumsum(mask, dim=1) - 1, min=0)  # each row counts from its first token
        with hooked(*hooks), torch.no_grad():
            # No cache: on Gemma-2 building one takes another mask path, 2e-6 away.
            return self.hf(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits

    def plan(self, tmp_path, sites, interventions, step_list):
        raw = {"header": {"description": "test"}, "model": {"key": self.family, "dtype": "fp32"},
               "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
               "sites": sites, "interventions": interventions, "steps": step_list}
        return compile_plan(raw, document=tmp_path / "doc.causalab.json", facts=self.engine,
                            models=[MODELS], data=[DATA])

    def diff(self, logits):
        last = logits[:, -1]
        rows = torch.arange(len(last))
        return last[rows, self.cf_answer] - last[rows, self.base_answer]


@pytest.fixture(scope="module")
def loaded(engines, hf_model):
    """family -> its Loaded."""
    return lambda family: Loaded(family, engines({"key": family, "dtype": "fp32"}, "nnterp"), *hf_model(family))


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request, loaded) -> Loaded:
    return loaded(request.param)


@pytest.fixture(scope="module")
def llama(loaded) -> Loaded:
    return loaded("tiny-llama")


@pytest.fixture(scope="module")
def gemma2(loaded) -> Loaded:
    return loaded("tiny-gemma2")


# --- hand-written hooks ----------------------------------------------------------------

@contextmanager
def hooked(*hooks):
    handles = []
    try:
        for module, fn, pre in hooks:
            if pre:
                handles.append(module.register_forward_pre_hook(
                    lambda m, args, fn=fn: _replace_first(args, fn(args[0]))))
            else:
                handles.append(module.register_forward_hook(
                    lambda m, args, out, fn=fn: _replace_first(out, fn(out[0] if isinstance(out, tuple) else out))))
        yield
    finally:
        for h in handles:
            h.remove()


def _replace_first(value, new):
    if new is None:
        return None
    return (new, *value[1:]) if isinstance(value, tuple) else new


def capture(store: dict, key: str, cols=None):
    def fn(t):
        store[key] = t[:, -1].clone() if cols is None else t[:, -1, cols].clone()
    return fn


def set_last(value, cols=None):
    def fn(t):
        t = t.clone()
        if cols is None:
            t[:, -1] = value
        else:
            t[:, -1, cols] = value
        return t
    return fn


def close(got, want):
    torch.testing.assert_close(got.detach().float(), want.detach().float(), rtol=0, atol=ATOL)


# --- documents ---------------------------------------------------------------------------

LOGIT_DIFF = {"logit_diff": {"kind": "logit_diff", "of": "logits", "a": "cf_answer", "b": "base_answer"}}
HEAD = {"component": "lm_head"}


def patching(model="patched"):
    return {
        "reads": {"v_cf": {"site": "target", "pos": -1, "model": "original", "input": "counterfactual"},
                  "logits": {"site": "head", "pos": -1, "model": model, "input": "base"}},
        "writes": {"patch": {"site": "target", "pos": -1, "mechanism": "swap", "operand": "v_cf"}},
        "models": {model: {"input": "base", "writes": ["patch"]}},
        "metrics": {**LOGIT_DIFF, "iia": {"kind": "match", "of": "logits", "expected": "cf_answer"}},
    }


def observe(intervention, rows=("base", "counterfactual"), outputs=None):
    step = {"kind": "observe", "interventions": intervention, "rows": {r: "weekdays/train" for r in rows}}
    if outputs:
        step["outputs"] = outputs
    return step


def patching_plan(f: Loaded, tmp_path, site):
    return f.plan(tmp_path, {"target": site, "head": HEAD}, {"patching": patching()},
                  {"score": observe("patching")})


# --- numbers --------------------------------------------------------------------------------

def test_residual_patching(fam, tmp_path):
    plan = fam.engine.execute(patching_plan(fam, tmp_path, {"component": "block_output", "layers": [0]}))
    got = plan.steps["score"].results
    store = {}
    fam.logits(fam.cf, (fam.module("layer", 0), capture(store, "v"), False))
    want = fam.logits(fam.base, (fam.module("layer", 0), set_last(store["v"]), False))
    close(got["logit_diff"], fam.diff(want))
    assert got["iia"].tolist() == (want[:, -1].argmax(-1) == fam.cf_answer).float().tolist()
    assert got["eligible"]["logit_diff"] == (True,) * 4


def test_zero_ablation(fam, tmp_path):
    iv = {"reads": {"logits": {"site": "head", "pos": -1, "model": "zeroed", "input": "base"}},
          "writes": {"zero": {"site": "target", "pos": -1, "mechanism": "swap", "operand": 0.0}},
          "models": {"zeroed": {"input": "base", "writes": ["zero"]}},
          "metrics": {**LOGIT_DIFF, "p": {"kind": "token_prob", "of": "logits", "token": "cf_answer"}}}
    plan = fam.plan(tmp_path, {"target": {"component": "block_output", "layers": [0]}, "head": HEAD},
                    {"zeroed": iv}, {"zeroed": observe("zeroed", rows=("base",))})
    got = fam.engine.execute(plan).steps["zeroed"].results
    want = fam.logits(fam.base, (fam.module("layer", 0), set_last(0.0), False))
    close(got["logit_diff"], fam.diff(want))
    probs = want[:, -1].softmax(-1)[torch.arange(4), fam.cf_answer]
    close(got["p"], probs)


def test_add_scaled_steering(fam, tmp_path):
    harvest = {"reads": {"resid": {"site": "target", "pos": -1, "input": "counterfactual"}}}
    steer = {"reads": {"logits": {"site": "head", "pos": -1, "model": "steered", "input": "base"}},
             "writes": {"steer": {"site": "target", "pos": -1, "mechanism": "add_scaled",
                                  "operand": {"ref": "direction"}, "params": {"scale": 4.0}}},
             "models": {"steered": {"input": "base", "writes": ["steer"]}},
             "metrics": LOGIT_DIFF}
    plan = fam.plan(tmp_path, {"target": {"component": "block_output", "layers": [0]}, "head": HEAD},
                    {"harvest": harvest, "steer": steer},
                    {"harvest": observe("harvest", rows=("counterfactual",),
                                        outputs={"direction": {"read": "resid", "reduce": "mean"}}),
                     "steer": observe("steer", rows=("base",))})
    got = fam.engine.execute(plan)
    store = {}
    fam.logits(fam.cf, (fam.module("layer", 0), capture(store, "v"), False))
    direction = store["v"].mean(0)
    close(got.steps["harvest"].results["direction"], direction)

    def add(t):
        t = t.clone()
        t[:, -1] = t[:, -1] + 4.0 * direction
        return t
    want = fam.logits(fam.base, (fam.module("layer", 0), add, False))
    close(got.steps["steer"].results["logit_diff"], fam.diff(want))


def test_logit_lens(fam, tmp_path):
    iv = {"reads": {"lens": {"site": "resid", "pos": -1, "input": "base", "view": "logits"}},
          "metrics": {"p": {"kind": "token_prob", "of": "lens", "token": "base_answer"}}}
    plan = fam.plan(tmp_path, {"resid": {"component": "block_output", "layers": [0]}}, {"lens": iv},
                    {"lens": observe("lens", rows=("base",), outputs={"lens_logits": "lens"})})
    got = fam.engine.execute(plan).steps["lens"].results
    store = {}
    fam.logits(fam.base, (fam.module("layer", 0), capture(store, "h"), False))
    with torch.no_grad():
        raw = fam.hf.lm_head(fam.module("norm")(store["h"]))
    cap = fam.hf.config.get_text_config().final_logit_softcapping if fam.family == "tiny-gemma2" else None
    want = torch.tanh(raw / cap) * cap if cap else raw
    if cap:
        assert (want - raw).abs().max() > 1e-3  # the cap is real on this checkpoint
    close(got["lens_logits"][:, 0], want)
    close(got["p"], want.softmax(-1)[torch.arange(4), fam.base_answer])


COMPONENTS = ("embeddings", "block_input", "attention_output", "mlp_input", "mlp_hidden", "mlp_output",
              "attention_z", "block_output", "ln_final")


def _reference_site(f: Loaded, component: str, layer: int):
    """(module, pre) for a component, written out per family by hand."""
    return {
        "embeddings": (f.module("embed"), False),
        "block_input": (f.module("layer", layer), True),
        "block_output": (f.module("layer", layer), False),
        "attention_output": (f.module("attn", layer), False),
        "mlp_input": (f.module("mlp", layer), True),
        "mlp_output": (f.module("mlp", layer), False),
        "attention_z": (f.module("o", layer), True),
        "mlp_hidden": (f.module("down", layer), True),
        "ln_final": (f.module("norm"), False),
    }[component]


def _site(component: str, layer: int) -> dict:
    return {"component": component, **({} if component in ("embeddings", "ln_final") else {"layers": [layer]})}


def test_every_component_reads_in_one_forward(fam, tmp_path):
    """One forward reading eleven places, in forward order; each equals the hand-hooked value."""
    sites = {c: _site(c, 1) for c in COMPONENTS} | {"head": HEAD, "logits": {"component": "logits"}}
    reads = {f"v_{name}": {"site": name, "pos": -1, "input": "base"} for name in sites}
    plan = fam.plan(tmp_path, sites, {"read": {"reads": reads}},
                    {"read": observe("read", rows=("base",), outputs={"o" + r: r for r in reads})})
    got = fam.engine.execute(plan).steps["read"].results
    store = {}
    hooks = [(*_reference_site(fam, c, 1), c) for c in COMPONENTS]
    logits = fam.output(fam.base, *[(m, capture(store, c), pre) for m, pre, c in hooks],
                        (fam.hf.lm_head, capture(store, "head"), False))
    for c in COMPONENTS:
        close(got[f"ov_{c}"][:, 0], store[c])
    close(got["ov_head"][:, 0], store["head"])
    close(got["ov_logits"][:, 0], logits[:, -1])


def test_every_component_writes(fam, tmp_path):
    """Zero at the last position of each component (layer 0), one step each, scored at lm_head."""
    sites = {c: _site(c, 0) for c in COMPONENTS} | {"head": HEAD}
    interventions = {
        c: {"reads": {"logits": {"site": "head", "pos": -1, "model": "zeroed", "input": "base"}},
            "writes": {"zero": {"site": c, "pos": -1, "mechanism": "swap", "operand": 0.0}},
            "models": {"zeroed": {"input": "base", "writes": ["zero"]}}, "metrics": LOGIT_DIFF}
        for c in COMPONENTS}
    plan = fam.plan(tmp_path, sites, interventions, {c: observe(c, rows=("base",)) for c in COMPONENTS})
    got = fam.engine.execute(plan)
    clean = fam.logits(fam.base)[:, -1]
    for c in COMPONENTS:
        module, pre = _reference_site(fam, c, 0)
        want = fam.logits(fam.base, (module, set_last(0.0), pre))
        assert (want[:, -1] - clean).abs().max() > 1e-4, c  # the write is felt
        torch.testing.assert_close(got.steps[c].results["logit_diff"], fam.diff(want), rtol=0, atol=ATOL,
                                   msg=lambda m, c=c: f"{c}: {m}")


@pytest.mark.parametrize("family", ("tiny-llama", "tiny-gpt2"))
@pytest.mark.parametrize("component,selector,columns", [
    ("attention_z", {"heads": [1, 2]}, list(range(8, 24))),
    ("mlp_hidden", {"units": [3, 7, 50]}, [3, 7, 50]),
])
def test_heads_and_units_swap(loaded, family, component, selector, columns, tmp_path):
    f = loaded(family)
    plan = f.engine.execute(patching_plan(f, tmp_path, {"component": component, "layers": [0], **selector}))
    got = plan.steps["score"].results
    module = f.module("o" if component == "attention_z" else "down", 0)
    store = {}
    f.logits(f.cf, (module, capture(store, "v", columns), True))
    want = f.logits(f.base, (module, set_last(store["v"], columns), True))
    close(got["logit_diff"], f.diff(want))


def _qkv_reference(f: Loaded, layer: int) -> dict:
    """q (rotated), k (rotated) and v at the last position, (rows, heads·head_dim), by hand."""
    attn = f.module("attn", layer)
    out = {}

    def pre(module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        if f.family == "tiny-gpt2":
            q, k, v = module.c_attn(h).split(h.shape[-1], dim=2)
        else:
            if f.family == "tiny-llama":
                from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
            else:
                from transformers.models.gemma2.modeling_gemma2 import apply_rotary_pos_emb
            shape = (*h.shape[:-1], -1, module.head_dim)
            q = module.q_proj(h).view(shape).transpose(1, 2)
            k = module.k_proj(h).view(shape).transpose(1, 2)
            v = module.v_proj(h)
            q, k = apply_rotary_pos_emb(q, k, *kwargs["position_embeddings"])
            q, k = (x.transpose(1, 2).reshape(*h.shape[:-1], -1) for x in (q, k))
        out.update(q=q[:, -1].clone(), k=k[:, -1].clone(), v=v[:, -1].clone())

    handle = attn.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        f.output(f.base)
    finally:
        handle.remove()
    return out


def test_query_key_value_reads(fam, tmp_path):
    names = {"q": "attention_query", "k": "attention_key", "v": "attention_value"}
    sites = {n: {"component": c, "layers": [1], "heads": [0, 2]} for n, c in names.items()}
    reads = {f"v_{n}": {"site": n, "pos": -1, "input": "base"} for n in names}
    plan = fam.plan(tmp_path, sites, {"read": {"reads": reads}},
                    {"read": observe("read", rows=("base",), outputs={"o" + r: r for r in reads})})
    got = fam.engine.execute(plan).steps["read"].results
    want = _qkv_reference(fam, 1)
    columns = list(range(0, 8)) + list(range(16, 24))
    for n in names:
        close(got[f"ov_{n}"][:, 0], want[n][:, columns])


def test_value_heads_swap(fam, tmp_path):
    """A write to attention_value lands where the value projection's output would carry it."""
    plan = fam.engine.execute(patching_plan(fam, tmp_path, {"component": "attention_value", "layers": [0],
                                                            "heads": [1]}))
    got = plan.steps["score"].results
    if fam.family == "tiny-gpt2":  # c_attn's output is [q | k | v], each 32 wide
        module, columns = fam.module("attn", 0).c_attn, list(range(64 + 8, 64 + 16))
    else:
        module, columns = fam.module("attn", 0).v_proj, list(range(8, 16))
    store = {}
    fam.logits(fam.cf, (module, capture(store, "v", columns), False))
    want = fam.logits(fam.base, (module, set_last(store["v"], columns), False))
    close(got["logit_diff"], fam.diff(want))


@pytest.mark.parametrize("family,capped", [("tiny-llama", False), ("tiny-gemma2", True)])
def test_logits_is_not_lm_head_on_a_capping_family(loaded, family, capped, tmp_path):
    f = loaded(family)
    sites = {"head": HEAD, "logits": {"component": "logits"}}
    reads = {"h": {"site": "head", "pos": -1, "input": "base"}, "l": {"site": "logits", "pos": -1, "input": "base"}}
    plan = f.plan(tmp_path, sites, {"read": {"reads": reads}},
                  {"read": observe("read", rows=("base",), outputs={"head": "h", "logits": "l"})})
    got = f.engine.execute(plan).steps["read"].results
    head, logits = got["head"], got["logits"]
    close(logits[:, 0], f.output(f.base)[:, -1])
    close(head[:, 0], f.logits(f.base)[:, -1])
    if capped:
        cap = f.hf.config.final_logit_softcapping
        assert (logits - head).abs().max() > 1e-3
        close(logits, torch.tanh(head / cap) * cap)
    else:
        assert torch.equal(logits, head)


def test_left_padding_does_not_move_a_row(fam, tmp_path):
    """A padded row scores what the same prompt scores alone (GPT-2's positions are absolute)."""
    iv = {"reads": {"logits": {"site": "out", "pos": -1, "input": "base"}}}
    plan = fam.plan(tmp_path, {"out": {"component": "logits"}}, {"read": iv},
                    {"read": observe("read", rows=("base",), outputs={"o": "logits"})})
    got = fam.engine.execute(plan).steps["read"].results["o"][:, 0]
    ids, mask = fam.base
    for row in range(len(ids)):
        alone = ids[row][mask[row].bool()][None]
        with torch.no_grad():
            want = fam.hf(input_ids=alone).logits[0, -1]
        torch.testing.assert_close(got[row], want, rtol=0, atol=2e-5)  # other batch shapes round differently


# --- the run ----------------------------------------------------------------------------------

def test_remote_simulation_gives_the_same_numbers(llama, tmp_path):
    site = {"component": "block_output", "layers": [0]}
    here = llama.engine.execute(patching_plan(llama, tmp_path, site))
    there = llama.engine.execute(patching_plan(llama, tmp_path, site), remote="local")
    assert there.provenance["remote"] == "local"
    assert torch.equal(there.steps["score"].results["logit_diff"], here.steps["score"].results["logit_diff"])
    assert there.steps["score"].results["eligible"] == here.steps["score"].results["eligible"]


@pytest.mark.parametrize("name", ["entity_patch", "generate_probe", "das"])
def test_remote_simulation_runs_anchors_decodes_and_fits_alike(llama, name):
    """The whole walk ships — text anchors resolved there, a generate with its step iterator,
    an optimizer stepping featurizer parameters — and the numbers that come home are the same."""
    import causalab_mini as cm

    path = V2 / f"{name}.causalab.json"
    raw = json.loads(path.read_text())
    if name == "das":
        raw["steps"]["fit"]["epochs"] = 1
    doc = cm.read(raw, path=path)
    here = cm.run(doc, loaded=llama.engine).plan
    # The engine's own contract: the same compiled plan walked as a remote session would walk it.
    there = llama.engine.execute(cm.compile(doc, loaded=llama.engine), remote="local")
    assert there.provenance["remote"] == "local"
    assert same_results(here, there)


def test_batch_size_one_agrees_with_the_whole_batch(llama, tmp_path):
    site = {"component": "block_output", "layers": [0]}
    whole = llama.engine.execute(patching_plan(llama, tmp_path, site))
    ones = llama.engine.execute(patching_plan(llama, tmp_path, site), batch_size=1)
    assert ones.provenance["batch_size"] == 1
    torch.testing.assert_close(ones.steps["score"].results["logit_diff"],
                               whole.steps["score"].results["logit_diff"], rtol=0, atol=1e-5)


def test_the_trace_keeps_the_callers_grad_mode(llama, tmp_path):
    """nnsight runs the trace body on a worker thread, where grad mode is not inherited."""
    plan = patching_plan(llama, tmp_path, {"component": "block_output", "layers": [0]})
    patched = steps.resolve(llama.engine, plan.steps["score"].forwards[1:2])[0][0]
    operand = torch.zeros(4, 1, 32, requires_grad=True)
    for grad in (False, True):
        values = {"v_cf": operand}
        with torch.set_grad_enabled(grad):
            llama.engine.forward(patched, values, {})
        assert values["logits"].requires_grad is grad


def test_the_model_is_frozen_and_is_what_runs(llama):
    model = llama.engine.model
    assert model.dispatched and model._model is model._module
    assert not model._model.training
    assert not any(p.requires_grad for p in model._model.parameters())


def test_public_names_are_the_contract():
    public = {n for k in NNterpEngine.__mro__ if k not in (base.Engine, object) for n in vars(k)
              if not n.startswith("_")}
    assert public == base.MEMBERS | {"name"}
    assert NNterpEngine.name == "nnterp"


def test_refusals(llama, tmp_path):
    plan = patching_plan(llama, tmp_path, {"component": "block_output", "layers": [0]})
    with pytest.raises(EngineError, match="local directory"):  # refused before any network call
        llama.engine.execute(plan, remote=True)
    with pytest.raises(EngineError, match="not a way to run"):
        llama.engine.execute(plan, remote="ndif")


def test_a_refusal_inside_a_trace_comes_out_as_itself(llama, tmp_path):
    plan = patching_plan(llama, tmp_path, {"component": "block_output", "layers": [0]})
    forward = steps.resolve(llama.engine, plan.steps["score"].forwards[:1])[0][0]
    past_the_end = dataclasses.replace(forward, windows=(("v_cf", ((99,),) * 4, False),))
    with pytest.raises(EngineError) as caught:
        llama.engine.forward(past_the_end, {}, {})
    assert type(caught.value) is EngineError
    assert str(caught.value).startswith("v_cf: row 0: position 99 is outside")


def test_a_write_at_lm_head_reaches_the_models_logits(gemma2, tmp_path):
    iv = {"reads": {"out": {"site": "logits", "pos": -1, "model": "zeroed", "input": "base"}},
          "writes": {"zero": {"site": "head", "pos": -1, "mechanism": "swap", "operand": 0.0}},
          "models": {"zeroed": {"input": "base", "writes": ["zero"]}}}
    plan = gemma2.plan(tmp_path, {"head": HEAD, "logits": {"component": "logits"}}, {"zeroed": iv},
                       {"zeroed": observe("zeroed", rows=("base",), outputs={"o": "out"})})
    got = gemma2.engine.execute(plan).steps["zeroed"].results["o"]
    assert torch.equal(got, torch.zeros_like(got))  # tanh(0 / cap) * cap


def test_provenance_is_portable(llama):
    record = provenance.record(llama.engine, False, None)
    assert set(record) == {"engine", "remote", "batch_size", "versions", "causalab_mini", "served_dtype", "model",
                           "attention"}
    # The attention implementation it was served with: transformers' default for this checkpoint.
    assert record["attention"] == llama.engine.model._model.config._attn_implementation in ("sdpa", "eager")
    outer = hashlib.sha256()  # the checkpoint's weights, hashed here: names and bytes of its files
    for f in sorted((MODELS / "tiny-llama").glob("*.safetensors")):
        outer.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    config = "sha256:" + hashlib.sha256((MODELS / "tiny-llama" / "config.json").read_bytes()).hexdigest()
    pinned = llama.engine._facts.revision  # the revision a document pins, checked in test_weights_record
    assert record["model"] == {"key": "tiny-llama", "revision": pinned, "weights": "sha256:" + outer.hexdigest(),
                               "config": config}
    assert record["engine"] == "NNterpEngine" and record["served_dtype"] == "torch.float32"
    assert record["versions"] == {p: metadata.version(p) for p in provenance.PACKAGES}
    assert re.fullmatch(r"[0-9a-f]{64}", record["causalab_mini"])
    text = json.dumps(record)
    assert "/" not in text and "\\" not in text  # no path of any kind
    host = socket.gethostname()
    assert len(host) < 4 or host not in text
    undigested = re.sub(r"sha256:[0-9a-f]{64}", "sha256:…", text)  # a digest may hold "56:08"
    assert not re.search(r"\d{4}-\d{2}-\d{2}|\d{2}:\d{2}", undigested)  # no date or time
    assert provenance.record(llama.engine, False, None) == record

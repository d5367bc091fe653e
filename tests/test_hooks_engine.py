"""The hooks engine against an independent computation.

Every number the engine produces is compared with one written here directly
against a separately loaded Hugging Face model and hand-written
``register_forward_hook`` / ``register_forward_pre_hook`` calls — none of
causalab_mini's ops, positions or standardization — to 1e-6. The module paths
below are spelled per family by hand for the same reason.
"""
from __future__ import annotations

import json

import pytest

from paths import DATA, MODELS, V2
from reference import answer_id, padded, hidden_of, with_hidden
import torch
from torch import nn

from causalab_mini.document import read as front
from causalab_mini.engine import base, steps
from causalab_mini.engine import standardize
from causalab_mini.engine.hooks import HooksEngine
from causalab_mini.errors import CompileError, EngineError, ModelError
from causalab_mini.plan import compile as compiler

transformers = pytest.importorskip("transformers")

ROWS = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines() if line.strip()]
BASE = [r["input"] for r in ROWS]
CF = [r["counterfactual_inputs"][0] for r in ROWS]
TOL = dict(rtol=0, atol=1e-6)

# Each family's modules, spelled by hand (not through engine/standardize.py).
LAYOUT = {
    "tiny-llama": dict(layers="model.layers", norm="model.norm", embed="model.embed_tokens",
                       attn="self_attn", o="self_attn.o_proj", mlp="mlp", down="mlp.down_proj"),
    "tiny-gpt2": dict(layers="transformer.h", norm="transformer.ln_f", embed="transformer.wte",
                      attn="attn", o="attn.c_proj", mlp="mlp", down="mlp.c_proj"),
    "tiny-gemma2": dict(layers="model.layers", norm="model.norm", embed="model.embed_tokens",
                        attn="self_attn", o="self_attn.o_proj", mlp="mlp", down="mlp.down_proj"),
}
FAMILIES = tuple(LAYOUT)


# --- fixtures: each model loaded once per session, by the engine and independently ---------

class Ref:
    """A separately loaded HF model and tokenizer (the session's shared load: ``run`` removes
    every hook it registers), and hand-written forwards over it."""

    def __init__(self, key: str, model, tok) -> None:
        self.key = key
        self.model, self.tok = model, tok
        self.layout = LAYOUT[key]
        cfg = self.model.config
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def module(self, name: str, layer: int | None = None) -> nn.Module:
        if layer is None:
            return self.model.get_submodule(self.layout[name])
        block = self.model.get_submodule(self.layout["layers"])[layer]
        return block if name == "layer" else block.get_submodule(self.layout[name])

    def answer(self, word: str) -> int:
        return answer_id(self.tok, word)

    def batch(self, texts):
        return padded(self.tok, texts)

    def run(self, texts, hooks=(), pre_hooks=(), what="lm_head"):
        """The lm_head output (or with ``what="logits"`` the model's returned logits, softcap
        included) over ``texts``, with hand hooks ``[(module, fn)]`` for the call."""
        ids, mask, pos = self.batch(texts)
        head = {}
        handles = [m.register_forward_hook(fn) for m, fn in hooks]
        handles += [m.register_forward_pre_hook(fn) for m, fn in pre_hooks]
        handles.append(self.model.lm_head.register_forward_hook(capture_output(head, "out")))
        try:
            with torch.no_grad():
                # No cache, as the engines call it: on Gemma-2 building one takes another mask
                # path whose logits are ~2e-6 away.
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                    use_cache=False).logits
            return logits if what == "logits" else head["out"]
        finally:
            for h in handles:
                h.remove()




def capture_output(store, key):
    def hook(_m, _a, output):
        store[key] = hidden_of(output).detach().clone()
    return hook


def capture_input(store, key):
    def hook(_m, args):
        store[key] = args[0].detach().clone()
    return hook


def edit_output(fn):
    def hook(_m, _a, output):
        return with_hidden(output, fn(hidden_of(output).clone()))
    return hook


def edit_input(fn):
    def hook(_m, args):
        return (fn(args[0].clone()), *args[1:])
    return hook


@pytest.fixture(scope="module")
def models(engines, hf_model):
    """key -> (HooksEngine, Ref), both on the session's shared loads."""
    return lambda key: (engines({"key": key, "dtype": "fp32"}, "hooks"), Ref(key, *hf_model(key)))


# --- documents, written here --------------------------------------------------------------

def doc(key, sites, interventions, steps_, roles=None):
    return {
        "header": {"description": "written by tests/test_hooks_engine.py"},
        "model": {"key": key, "dtype": "fp32"},
        "roles": roles or {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": sites, "interventions": interventions, "steps": steps_,
    }


def observe(intervention, outputs=(), rows=None):
    return {"kind": "observe", "interventions": intervention,
            "rows": rows or {"base": "weekdays/train", "counterfactual": "weekdays/train"},
            "outputs": {o: r for o, r in outputs}, "saves": []}


LOGIT_DIFF = {"kind": "logit_diff", "of": "logits", "a": "cf_answer", "b": "base_answer"}


def patch_doc(key, site, *, mechanism="swap", operand="v_cf", params=None, read_operand=True, extra_reads=None):
    """Read ``site`` at -1 on the counterfactual (when the operand is that read), write it into the base."""
    reads = {"logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}}
    if read_operand:
        reads["v_cf"] = {"site": "target", "pos": -1, "model": "original", "input": "counterfactual"}
    reads.update(extra_reads or {})
    write = {"site": "target", "pos": -1, "mechanism": mechanism, "operand": operand}
    if params:
        write["params"] = params
    outputs = [("out_logits", "logits")] + [(f"out_{n}", n) for n in (extra_reads or {})]
    return doc(key, {"target": site, "head": {"component": "lm_head"}},
               {"p": {"reads": reads, "writes": {"patch": write},
                      "models": {"patched": {"input": "base", "writes": ["patch"]}},
                      "metrics": {"logit_diff": LOGIT_DIFF,
                                  "iia": {"kind": "match", "of": "logits", "expected": "cf_answer"}}}},
               {"score": observe("p", outputs)})


def compile_doc(engine, tmp_path, raw):
    path = tmp_path / "test.causalab.json"
    path.write_text(json.dumps(raw, indent=1))
    return compiler.compile_plan(raw, document=path, models=[MODELS], data=[DATA], facts=engine)


def run_doc(engine, tmp_path, raw, **kw):
    plan = compile_doc(engine, tmp_path, raw)
    return engine.execute(plan, **kw)


def answers(ref):
    cf = torch.tensor([ref.answer(r["cf_answer"]) for r in ROWS])
    base_ = torch.tensor([ref.answer(r["base_answer"]) for r in ROWS])
    return cf, base_


def logit_diff(ref, last):
    cf, base_ = answers(ref)
    rows = torch.arange(len(ROWS))
    return last[rows, cf] - last[rows, base_]


# --- (1) residual patching at a position --------------------------------------------------

def hand_patch(ref, layer=0):
    got = {}
    ref.run(CF, hooks=[(ref.module("layer", layer), capture_output(got, "cf"))])
    v = got["cf"][:, -1]

    def put(t):
        t[:, -1] = v
        return t
    return ref.run(BASE, hooks=[(ref.module("layer", layer), edit_output(put))])[:, -1]


@pytest.mark.parametrize("key", FAMILIES)
def test_residual_patching_matches_hand_hook(models, tmp_path, key):
    engine, ref = models(key)
    plan = run_doc(engine, tmp_path, patch_doc(key, {"component": "block_output", "layers": [0]}))
    last = hand_patch(ref)
    torch.testing.assert_close(plan.result("out_logits")[:, 0], last, **TOL)
    torch.testing.assert_close(plan.result("logit_diff"), logit_diff(ref, last), **TOL)
    cf, _ = answers(ref)
    torch.testing.assert_close(plan.result("iia"), (last.argmax(-1) == cf).float())


def test_shipped_patching_document(models):
    """documents/v2/patching.causalab.json, as shipped (revision checked), against the hand hook."""
    path = V2 / "patching.causalab.json"
    raw = front.read(path)
    assert raw["model"]["key"] == "tiny-llama"
    loaded = HooksEngine.load(raw["model"], document=path)  # resolves and checks the revision
    plan = compiler.compile_plan(raw, document=path, facts=loaded)
    loaded.execute(plan)
    _, ref = models("tiny-llama")
    torch.testing.assert_close(plan.result("logit_diff"), logit_diff(ref, hand_patch(ref)), **TOL)


# --- (2) zero ablation --------------------------------------------------------------------

@pytest.mark.parametrize("key", FAMILIES)
def test_zero_ablation(models, tmp_path, key):
    engine, ref = models(key)
    raw = patch_doc(key, {"component": "block_output", "layers": [0]}, operand=0.0, read_operand=False)
    plan = run_doc(engine, tmp_path, raw)

    def zero(t):
        t[:, -1] = 0.0
        return t
    last = ref.run(BASE, hooks=[(ref.module("layer", 0), edit_output(zero))])[:, -1]
    torch.testing.assert_close(plan.result("out_logits")[:, 0], last, **TOL)
    torch.testing.assert_close(plan.result("logit_diff"), logit_diff(ref, last), **TOL)
    clean = ref.run(BASE)[:, -1]
    assert (clean - last).abs().max() > 1e-3  # the ablation did something


@pytest.mark.parametrize("key", ["tiny-llama", "tiny-gpt2"])
def test_zero_ablation_at_pre_hook_sites(models, tmp_path, key):
    """block_input and mlp_input are a module's input: written through a pre-hook."""
    engine, ref = models(key)
    for component, module in (("block_input", "layer"), ("mlp_input", "mlp")):
        raw = patch_doc(key, {"component": component, "layers": [1]}, operand=0.0, read_operand=False)
        plan = run_doc(engine, tmp_path, raw)

        def zero(t):
            t[:, -1] = 0.0
            return t
        last = ref.run(BASE, pre_hooks=[(ref.module(module, 1), edit_input(zero))])[:, -1]
        torch.testing.assert_close(plan.result("out_logits")[:, 0], last, **TOL, msg=component)


# --- (3) add_scaled steering --------------------------------------------------------------

@pytest.mark.parametrize("key", FAMILIES)
def test_add_scaled_with_a_number(models, tmp_path, key):
    engine, ref = models(key)
    raw = patch_doc(key, {"component": "block_output", "layers": [1]}, mechanism="add_scaled",
                    operand=0.5, params={"scale": 3.0}, read_operand=False)
    plan = run_doc(engine, tmp_path, raw)

    def add(t):
        t[:, -1] = t[:, -1] + 3.0 * 0.5
        return t
    last = ref.run(BASE, hooks=[(ref.module("layer", 1), edit_output(add))])[:, -1]
    torch.testing.assert_close(plan.result("out_logits")[:, 0], last, **TOL)
    torch.testing.assert_close(plan.result("logit_diff"), logit_diff(ref, last), **TOL)


@pytest.mark.parametrize("key", FAMILIES)
def test_add_scaled_with_a_read(models, tmp_path, key):
    engine, ref = models(key)
    raw = patch_doc(key, {"component": "block_output", "layers": [0]}, mechanism="add_scaled",
                    operand="v_cf", params={"scale": -2.0})
    plan = run_doc(engine, tmp_path, raw)
    got = {}
    ref.run(CF, hooks=[(ref.module("layer", 0), capture_output(got, "cf"))])

    def add(t):
        t[:, -1] = t[:, -1] + (-2.0) * got["cf"][:, -1]
        return t
    last = ref.run(BASE, hooks=[(ref.module("layer", 0), edit_output(add))])[:, -1]
    torch.testing.assert_close(plan.result("out_logits")[:, 0], last, **TOL)
    torch.testing.assert_close(plan.result("logit_diff"), logit_diff(ref, last), **TOL)


def test_add_scaled_with_a_published_mean(models, tmp_path):
    """A {"ref": …} operand: a mean published by an earlier step, added to every row."""
    key = "tiny-llama"
    engine, ref = models(key)
    raw = doc(key, {"target": {"component": "block_output", "layers": [0]}, "head": {"component": "lm_head"}},
              {"harvest": {"reads": {"resid": {"site": "target", "pos": -1, "input": "counterfactual"}}},
               "steer": {"reads": {"logits": {"site": "head", "pos": -1, "model": "steered", "input": "base"}},
                         "writes": {"steer": {"site": "target", "pos": -1, "mechanism": "add_scaled",
                                              "operand": {"ref": "direction"}, "params": {"scale": 4.0}}},
                         "models": {"steered": {"input": "base", "writes": ["steer"]}},
                         "metrics": {"logit_diff": LOGIT_DIFF}}},
              {"harvest": {**observe("harvest", rows={"counterfactual": "weekdays/train"}),
                           "outputs": {"direction": {"read": "resid", "reduce": "mean"}}},
               "steer": observe("steer", [("out_logits", "logits")], rows={"base": "weekdays/train"})})
    plan = run_doc(engine, tmp_path, raw)
    got = {}
    ref.run(CF, hooks=[(ref.module("layer", 0), capture_output(got, "cf"))])
    mean = got["cf"][:, -1].mean(0)

    def add(t):
        t[:, -1] = t[:, -1] + 4.0 * mean
        return t
    last = ref.run(BASE, hooks=[(ref.module("layer", 0), edit_output(add))])[:, -1]
    torch.testing.assert_close(plan.result("out_logits")[:, 0], last, **TOL)


# --- (4) the logit lens -------------------------------------------------------------------

def lens_doc(key, layer):
    return doc(key, {"resid": {"component": "block_output", "layers": [layer]}},
               {"lens": {"reads": {"lens": {"site": "resid", "pos": -1, "input": "base", "view": "logits"}},
                         "metrics": {"p": {"kind": "token_prob", "of": "lens", "token": "base_answer"}}}},
               {"lens": observe("lens", [("out_lens", "lens")], rows={"base": "weekdays/train"})},
               roles={"base": {"field": "input"}})


@pytest.mark.parametrize("key", FAMILIES)
@pytest.mark.parametrize("layer", [0, 1])
def test_logit_lens(models, tmp_path, key, layer):
    engine, ref = models(key)
    plan = run_doc(engine, tmp_path, lens_doc(key, layer))
    got = {}
    ref.run(BASE, hooks=[(ref.module("layer", layer), capture_output(got, "h"))])
    with torch.no_grad():
        raw_lens = ref.model.lm_head(ref.module("norm")(got["h"][:, -1]))
    cap = getattr(ref.model.config, "final_logit_softcapping", None)
    lens = torch.tanh(raw_lens / cap) * cap if cap else raw_lens
    torch.testing.assert_close(plan.result("out_lens")[:, 0], lens, **TOL)
    torch.testing.assert_close(plan.result("p"), lens.softmax(-1)[torch.arange(len(ROWS)),
                                                                 answers(ref)[1]], **TOL)
    if key == "tiny-gemma2":
        assert cap == 5.0
        assert (lens - raw_lens).abs().max() > 1e-2  # the cap is in the lens, and it matters
    if layer == 1:  # the lens at the last layer is the model's own last-token logits
        torch.testing.assert_close(plan.result("out_lens")[:, 0], ref.run(BASE, what="logits")[:, -1],
                                   rtol=0, atol=1e-5)


def test_logits_and_lm_head_differ_by_the_softcap_on_gemma2(models, tmp_path):
    for key in ("tiny-gemma2", "tiny-llama"):
        engine, ref = models(key)
        raw = doc(key, {"head": {"component": "lm_head"}, "final": {"component": "logits"}},
                  {"i": {"reads": {"head_logits": {"site": "head", "pos": -1, "input": "base"},
                                   "final_logits": {"site": "final", "pos": -1, "input": "base"}}}},
                  {"s": observe("i", [("h", "head_logits"), ("f", "final_logits")],
                                rows={"base": "weekdays/train"})},
                  roles={"base": {"field": "input"}})
        plan = run_doc(engine, tmp_path, raw)
        head, final = plan.result("h")[:, 0], plan.result("f")[:, 0]
        model_logits = ref.run(BASE, what="logits")[:, -1]  # the model's own output, softcap included
        torch.testing.assert_close(final, model_logits, **TOL)
        torch.testing.assert_close(head, ref.run(BASE)[:, -1], **TOL)
        if key == "tiny-gemma2":
            torch.testing.assert_close(final, torch.tanh(head / 5.0) * 5.0, **TOL)
            assert (final - head).abs().max() > 1e-2
        else:
            torch.testing.assert_close(final, head, rtol=0, atol=0)


# --- heads of attention_z, units of mlp_hidden --------------------------------------------

def _columns_test(models, tmp_path, key, component, layer, selector, chosen, module, width_of):
    engine, ref = models(key)
    site = {"component": component, "layers": [layer], selector: chosen}
    plan = compile_doc(engine, tmp_path, patch_doc(key, site))
    cols = torch.tensor([c for i in chosen for c in width_of(i)])

    # Hand: the projection's input on the counterfactual, then the base with those columns swapped.
    got = {}
    ref.run(CF, pre_hooks=[(ref.module(module, layer), capture_input(got, "cf"))])
    ref.run(BASE, pre_hooks=[(ref.module(module, layer), capture_input(got, "base"))])

    def swap(t):
        t[:, -1, cols] = got["cf"][:, -1, cols]
        return t
    last = ref.run(BASE, pre_hooks=[(ref.module(module, layer), edit_input(swap))])[:, -1]

    # What the projection in the engine's model actually took, after the engine's pre-hooks:
    # a forward hook sees the arguments as the pre-hooks left them.
    seen = []
    target = engine.model.get_submodule(_path(ref, module, layer))
    handle = target.register_forward_hook(lambda _m, args, _o: seen.append(args[0].detach().clone()))
    try:
        engine.execute(plan)
    finally:
        handle.remove()
    patched = seen[-1]  # forwards run in schedule order: original on counterfactual, then patched
    assert len(seen) == 2
    expected = got["base"].clone()
    expected[:, -1, cols] = got["cf"][:, -1, cols]
    torch.testing.assert_close(patched, expected, **TOL)
    others = torch.tensor([c for c in range(patched.shape[-1]) if c not in set(cols.tolist())])
    torch.testing.assert_close(patched[:, -1, others], got["base"][:, -1, others], **TOL)
    assert (patched[:, -1, cols] - got["base"][:, -1, cols]).abs().max() > 1e-4
    torch.testing.assert_close(plan.result("out_logits")[:, 0], last, **TOL)
    torch.testing.assert_close(plan.result("logit_diff"), logit_diff(ref, last), **TOL)


def _path(ref, module, layer):
    return f"{ref.layout['layers']}.{layer}.{ref.layout[module]}"


@pytest.mark.parametrize("key", FAMILIES)
def test_attention_z_heads_swap_only_their_columns(models, tmp_path, key):
    _, ref = models(key)
    hd = ref.head_dim
    _columns_test(models, tmp_path, key, "attention_z", 1, "heads", [1, 3], "o",
                  lambda h: range(h * hd, (h + 1) * hd))


@pytest.mark.parametrize("key", FAMILIES)
def test_mlp_hidden_units_swap_only_their_columns(models, tmp_path, key):
    _columns_test(models, tmp_path, key, "mlp_hidden", 0, "units", [0, 5, 7, 40], "down", lambda u: [u])


# --- every hooks-reachable read against a hand capture ------------------------------------

READS = {  # component -> (how the test finds it by hand, layer)
    "embeddings": ("embed", None, "out"), "block_input": ("layer", 1, "in"),
    "attention_output": ("attn", 1, "out"), "attention_z": ("o", 1, "in"),
    "mlp_input": ("mlp", 1, "in"), "mlp_hidden": ("down", 1, "in"), "mlp_output": ("mlp", 1, "out"),
    "block_output": ("layer", 1, "out"), "ln_final": ("norm", None, "out"),
}


@pytest.mark.parametrize("key", FAMILIES)
def test_every_component_reads_what_a_hand_hook_sees(models, tmp_path, key):
    engine, ref = models(key)
    sites = {c: {"component": c, **({"layers": [layer]} if layer is not None else {})}
             for c, (_, layer, _) in READS.items()}
    reads = {c: {"site": c, "pos": {"all": True}, "input": "base"} for c in READS}
    raw = doc(key, sites, {"r": {"reads": reads}},
              {"s": observe("r", [(f"out_{c}", c) for c in READS], rows={"base": "weekdays/train"})},
              roles={"base": {"field": "input"}})
    plan = run_doc(engine, tmp_path, raw)
    got, hooks, pre = {}, [], []
    for c, (name, layer, side) in READS.items():
        m = ref.module(name, layer)
        (pre if side == "in" else hooks).append((m, (capture_input if side == "in" else capture_output)(got, c)))
    ref.run(BASE, hooks=hooks, pre_hooks=pre)
    # {"all": true} is every token of the prompt's content: real tokens after the tokenizer's
    # own special prefix (Llama's and Gemma's BOS; GPT-2 has none).
    _, mask, _ = ref.batch(BASE)
    prefix = len(ref.tok("a")["input_ids"]) - len(ref.tok("a", add_special_tokens=False)["input_ids"])
    content = mask.bool().clone()
    for row in range(len(BASE)):
        first = int(mask[row].argmax())
        content[row, first:first + prefix] = False
    for c in READS:
        value = plan.result(f"out_{c}")  # ragged: every content token, rows in order
        torch.testing.assert_close(value, got[c][content], **TOL, msg=c)


# --- left padding -------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["tiny-llama", "tiny-gpt2"])
def test_left_padding_gives_the_unpadded_last_token_logits(models, tmp_path, key):
    engine, ref = models(key)
    raw = doc(key, {"head": {"component": "lm_head"}},
              {"i": {"reads": {"logits": {"site": "head", "pos": -1, "input": "base"}}}},
              {"s": observe("i", [("out", "logits")], rows={"base": "weekdays/train"})},
              roles={"base": {"field": "input"}})
    plan = run_doc(engine, tmp_path, raw)
    lengths = {len(ref.tok(t)["input_ids"]) for t in BASE}
    assert len(lengths) > 1, "the rows must pad to be a test of padding"
    alone = torch.stack([ref.run([t])[0, -1] for t in BASE])  # each row unpadded, on its own
    # measured: 4.8e-6 (Llama), 2.9e-6 (GPT-2) — reductions over a different length, not positions
    torch.testing.assert_close(plan.result("out")[:, 0], alone, rtol=0, atol=5e-5)
    if key == "tiny-gpt2":  # why the engine passes position ids: absolute positions shift otherwise
        ids, mask, _ = ref.batch(BASE)
        with torch.no_grad():
            naive = ref.model(input_ids=ids, attention_mask=mask).logits[:, -1]
        assert (naive - alone).abs().max() > 1e-2


# --- no leaks, refusals, batching, freezing, the contract ---------------------------------

def _hook_counts(model):
    return {name: (len(m._forward_hooks), len(m._forward_pre_hooks),
                   len(m._forward_hooks_with_kwargs), len(m._forward_pre_hooks_with_kwargs))
            for name, m in model.named_modules()}


def test_hooks_are_removed_when_the_forward_raises(models, tmp_path):
    key = "tiny-llama"
    engine, ref = models(key)
    raw = patch_doc(key, {"component": "block_output", "layers": [0]},
                    extra_reads={"z": {"site": "z", "pos": -1, "model": "patched", "input": "base"}})
    raw["sites"]["z"] = {"component": "attention_z", "layers": [1], "heads": [0]}
    plan = compile_doc(engine, tmp_path, raw)
    clean = engine.execute(compile_doc(engine, tmp_path, raw)).result("out_logits")
    patched = next(f for f in plan.steps["score"].forwards if f.model == "patched")
    assert len(patched.taps) == 3  # the write's layer, the attention_z read, the head read
    resolved = steps.resolve(engine, (patched,))[0][0]
    before = _hook_counts(engine.model)
    with pytest.raises(EngineError, match="operand"):
        # An operand of the wrong shape: 7 wide where the residual is 32.
        engine.forward(resolved, {"v_cf": torch.zeros(len(ROWS), 1, 7)}, {})
    assert _hook_counts(engine.model) == before
    assert all(n == (0, 0, 0, 0) for n in before.values())
    # and the next forward is not intervened on by anything left behind
    again = engine.execute(plan).result("out_logits")
    torch.testing.assert_close(again, clean, rtol=0, atol=0)


@pytest.mark.parametrize("component", ["attention_query", "attention_key", "attention_value", "attention_scores",
                                       "attention_probs"])
def test_interiors_compile_on_both_engines_where_each_reaches_them(tmp_path, component):
    # Both engines reach inside attention: the hooks engine through transformers' attention seam,
    # the nnterp engine q, k, v through nnsight and the scores through the seam; a server does not.
    raw = doc("tiny-llama", {"inside": {"component": component, "layers": [0], "heads": [0]}},
              {"r": {"reads": {"x": {"site": "inside", "pos": -1, "input": "base"}}}},
              {"s": observe("r", [("out", "x")], rows={"base": "weekdays/train"})},
              roles={"base": {"field": "input"}})
    path = tmp_path / "w.causalab.json"
    path.write_text(json.dumps(raw))
    for engine in ("hooks", "nnterp"):
        compiler.compile_plan(raw, document=path, models=[MODELS], data=[DATA], engine=engine)
    if component == "attention_scores":  # not on a server, which runs its own attention function
        with pytest.raises(CompileError, match="remote server") as err:
            compiler.compile_plan(raw, document=path, models=[MODELS], data=[DATA], engine="ndif")
        assert err.value.path == "sites.inside.component"


@pytest.mark.parametrize("remote", [True, "local", "ndif"])
def test_remote_refused(models, tmp_path, remote):
    engine, _ = models("tiny-llama")
    plan = compile_doc(engine, tmp_path, patch_doc("tiny-llama", {"component": "block_output", "layers": [0]}))
    with pytest.raises(EngineError, match="nothing to ship"):
        engine.execute(plan, remote=remote)
    assert not plan.steps["score"].results and not plan.provenance


@pytest.mark.parametrize("key", FAMILIES)
def test_batch_size_one_agrees_with_the_whole_batch(models, tmp_path, key):
    engine, _ = models(key)
    raw = patch_doc(key, {"component": "attention_z", "layers": [0], "heads": [2]})
    whole = run_doc(engine, tmp_path, raw)
    single = run_doc(engine, tmp_path, raw, batch_size=1)
    assert single.provenance["batch_size"] == 1 and whole.provenance["batch_size"] is None
    # A window of one row is also unpadded, so the attention reductions run over a different
    # length: measured up to 7e-6 on logits of magnitude ~10 (Llama, Gemma-2; GPT-2 bit-equal).
    for name in ("logit_diff", "out_logits"):
        torch.testing.assert_close(single.result(name), whole.result(name), rtol=0, atol=2e-5)


def test_provenance(models, tmp_path):
    engine, _ = models("tiny-gpt2")
    plan = run_doc(engine, tmp_path, patch_doc("tiny-gpt2", {"component": "block_output", "layers": [0]}))
    import importlib.metadata as md

    record = plan.provenance
    assert {k: record[k] for k in ("engine", "remote", "batch_size", "served_dtype")} == {
        "engine": "HooksEngine", "remote": False, "batch_size": None, "served_dtype": "torch.float32"}
    assert record["versions"] == {p: md.version(p) for p in
                                  ("torch", "transformers", "nnsight", "nnterp", "pydantic")}
    assert len(record["causalab_mini"]) == 64 and int(record["causalab_mini"], 16) >= 0


@pytest.mark.parametrize("key", FAMILIES)
def test_model_is_frozen(models, key):
    engine, _ = models(key)
    assert engine.model.training is False
    assert all(not m.training for m in engine.model.modules())
    assert not any(p.requires_grad for p in engine.model.parameters())


def test_compile_time_members(models):
    engine, ref = models("tiny-gemma2")
    cfg = ref.model.config
    assert engine.num_layers == cfg.num_hidden_layers
    assert engine.width("block_output") == cfg.hidden_size
    assert engine.width("mlp_hidden") == cfg.intermediate_size
    assert engine.width("logits") == cfg.vocab_size
    assert engine.heads("attention_z") == cfg.num_attention_heads
    assert engine.tokenizer("hello")["input_ids"] == ref.tok("hello")["input_ids"]


def test_public_names_are_the_contract():
    own = {n for k in HooksEngine.__mro__ if k not in (base.Engine, object) for n in vars(k)
           if not n.startswith("_")}
    assert own == base.MEMBERS | {"name"}
    assert HooksEngine.name == "hooks"


# --- where each component is (engine/standardize.py) ------------------------------------------

EXPECTED_PATHS = {  # (component, layer) -> (module path, side), spelled by hand from each family's code
    "tiny-llama": {("embeddings", None): ("model.embed_tokens", "output"), ("ln_final", None): ("model.norm", "output"),
                   ("lm_head", None): ("lm_head", "output"), ("logits", None): ("", "output"),
                   ("block_input", 1): ("model.layers.1", "input"),
                   ("attention_output", 1): ("model.layers.1.self_attn", "output"),
                   ("attention_z", 1): ("model.layers.1.self_attn.o_proj", "input"),
                   ("mlp_input", 1): ("model.layers.1.mlp", "input"),
                   ("mlp_hidden", 1): ("model.layers.1.mlp.down_proj", "input")},
    "tiny-gpt2": {("embeddings", None): ("transformer.wte", "output"), ("ln_final", None): ("transformer.ln_f", "output"),
                  ("lm_head", None): ("lm_head", "output"), ("block_output", 1): ("transformer.h.1", "output"),
                  ("attention_output", 1): ("transformer.h.1.attn", "output"),
                  ("attention_z", 1): ("transformer.h.1.attn.c_proj", "input"),
                  ("mlp_output", 1): ("transformer.h.1.mlp", "output"),
                  ("mlp_hidden", 1): ("transformer.h.1.mlp.c_proj", "input")},
}
EXPECTED_PATHS["tiny-gemma2"] = EXPECTED_PATHS["tiny-llama"]


@pytest.mark.parametrize("key", FAMILIES)
def test_where_finds_each_familys_modules(models, key):
    engine, _ = models(key)
    for (component, layer), expected in EXPECTED_PATHS[key].items():
        found = standardize.where(engine.model, engine._facts, component, layer, "sites.s")
        assert (found.path, found.io) == expected, component


def _tiny_llama():
    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, vocab_size=50)
    return transformers.AutoModelForCausalLM.from_config(cfg)


def _facts(model):
    from causalab_mini.model.facts import ModelFacts

    return ModelFacts.from_config(model.config, None, key="x", revision=None)


@pytest.mark.parametrize("damage, component, error, match", [
    (lambda m: setattr(m.model, "layers", nn.ModuleList([m.model.layers[0]])), "block_output",
     ModelError, "ModuleList of 1, and the config says 2 layers"),
    (lambda m: delattr(m.model, "norm"), "ln_final", CompileError, "no module 'model.norm'"),
    (lambda m: delattr(m.model.layers[1].mlp, "down_proj"), "mlp_hidden", CompileError,
     "no module 'mlp.down_proj' for mlp_hidden"),
    (lambda m: setattr(m.model.layers[1].self_attn, "o_proj", nn.Linear(8, 16)), "attention_z", ModelError,
     "takes inputs 8 wide, and the compiler addressed 16"),
])
def test_where_refuses_a_module_the_layout_does_not_find(damage, component, error, match):
    model = _tiny_llama()
    facts = _facts(model)
    standardize.where(model, facts, component, 1, "sites.s")  # intact: found
    damage(model)
    with pytest.raises(error, match=match):
        standardize.where(model, facts, component, 1, "sites.s")


def test_selections_put_the_tensor_back_where_they_found_it():
    """A module input may be positional or a keyword (Llama's attention takes hidden_states=...,
    its MLP x); an output may be a tuple; the model's own output keeps ``logits`` as a field."""
    from causalab_mini.engine import hooks

    a, b, new = torch.zeros(1), torch.ones(1), torch.full((1,), 7.0)
    hidden = hooks._Input
    assert hidden.get((a, b), {}) is a
    args, kwargs = hidden.put((a, b), {"x": 1}, new)
    assert args[0] is new and args[1] is b and kwargs == {"x": 1}
    assert hidden.get((), {"hidden_states": b}) is b and hidden.get((), {"x": b}) is b
    args, kwargs = hidden.put((), {"hidden_states": b, "y": 1}, new)
    assert args == () and kwargs["hidden_states"] is new and kwargs["y"] == 1
    with pytest.raises(ModelError, match="hidden_states"):
        hidden.get((), {})
    first = hooks._FirstIfTuple()
    assert first.get((a, b)) is a and first.put((a, b), new)[0] is new and first.put(a, new) is new
    out = transformers.modeling_outputs.CausalLMOutputWithPast(logits=a)
    field = hooks._Logits()
    assert field.get(out) is a
    assert field.put(out, new).logits is new and out["logits"] is new

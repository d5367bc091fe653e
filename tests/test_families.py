"""The family matrix: every transformer family in ``tests/families.py``, both engines, held to hand hooks.

For each family a tiny random checkpoint is built at test time from transformers' own
config (``families.build``), and one document runs residual patching, zero ablation of
``attention_output`` and ``mlp_output``, ``mlp_hidden`` unit patching, head patching at
``attention_z`` and the logit lens on both engines. Every value is checked against a
computation written here: the raw Hugging Face model, one row at a time, unpadded, with
a hand-written hook on the module the family's own code names (``REFERENCE``, spelled
out below, not read from ``causalab_mini``), to 1e-5 — and the two engines are bit-equal.
A component a family does not have is a typed refusal at compile time, with no weights.

Run the matrix alone with ``pytest -m families``. ``python scripts/family_table.py``
writes the README's family table from the same runs.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch

import families
import causalab_mini as cm
from causalab_mini.errors import CompileError
from causalab_mini.plan import compile as compiler
from paths import DATA

pytestmark = pytest.mark.families

ATOL = 1e-5
UNITS = [0, 5, 7]  # mlp_hidden units patched
HEAD = 1  # attention_z head patched, at layer 1


@dataclass(frozen=True)
class Reference:
    """Where a family's own code computes each component, by module path in the causal LM."""

    layers: str
    norm: str
    attention_output: str  # relative to a layer: the module whose output is the attention's contribution
    mlp_output: str
    mlp_hidden: Optional[str]  # the down projection, whose input is the neurons; None: a sparse MoE block
    attention_z: str  # the output projection, whose input is the heads
    mlp_input: str = "mlp"  # relative to a layer: the module whose input is the MLP's
    # components this checkpoint does not have, read off its code: each must be refused by name
    absent: tuple[str, ...] = ()
    # what the causal LM does to lm_head's output, read off each ForCausalLM.forward by hand
    logits: Callable = lambda x, config: x


def _capped(x, config):
    cap = config.get_text_config().final_logit_softcapping
    return torch.tanh(x / cap) * cap


LLAMA = Reference("model.layers", "model.norm", "self_attn", "mlp", "mlp.down_proj", "self_attn.o_proj")
MOE = Reference("model.layers", "model.norm", "self_attn", "mlp", None, "self_attn.o_proj")
GPT2 = Reference("transformer.h", "transformer.ln_f", "attn", "mlp", "mlp.c_proj", "attn.c_proj")
REFERENCE: dict[str, Reference] = {
    **{f: LLAMA for f in ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "olmo", "olmo2",
                          "stablelm", "smollm3")},
    **{f: MOE for f in ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")},
    "gemma2": Reference("model.layers", "model.norm", "self_attn", "mlp", "mlp.down_proj", "self_attn.o_proj",
                        logits=_capped),
    "gemma3_text": Reference("model.layers", "model.norm", "self_attn", "mlp", "mlp.down_proj",
                             "self_attn.o_proj", logits=_capped),
    # The multimodal forward returns lm_head's output uncapped (the cap is the text-only model's).
    "gemma3": Reference("model.language_model.layers", "model.language_model.norm", "self_attn", "mlp",
                        "mlp.down_proj", "self_attn.o_proj"),
    "cohere": Reference("model.layers", "model.norm", "self_attn", "mlp", "mlp.down_proj", "self_attn.o_proj",
                        logits=lambda x, c: x * c.logit_scale),
    "granite": Reference("model.layers", "model.norm", "self_attn", "mlp", "mlp.down_proj", "self_attn.o_proj",
                         logits=lambda x, c: x / c.logits_scaling),
    "starcoder2": Reference("model.layers", "model.norm", "self_attn", "mlp", "mlp.c_proj", "self_attn.o_proj"),
    "phi": Reference("model.layers", "model.final_layernorm", "self_attn", "mlp", "mlp.fc2", "self_attn.dense"),
    "gpt2": GPT2,
    "gpt_bigcode": GPT2,
    "gpt_neox": Reference("gpt_neox.layers", "gpt_neox.final_layer_norm", "attention", "mlp",
                          "mlp.dense_4h_to_h", "attention.dense"),
    "gptj": Reference("transformer.h", "transformer.ln_f", "attn", "mlp", "mlp.fc_out", "attn.out_proj"),
    "gpt_neo": Reference("transformer.h", "transformer.ln_f", "attn", "mlp", "mlp.c_proj",
                         "attn.attention.out_proj"),
    # OPT: fc1 -> activation -> fc2 are the layer's own children; fc2's output is the MLP's.
    "opt": Reference("model.decoder.layers", "model.decoder.final_layer_norm", "self_attn", "fc2", "fc2",
                     "self_attn.out_proj", mlp_input="fc1"),
    # BLOOM's attention and MLP return residual + contribution: the contribution is the dense output.
    "bloom": Reference("transformer.h", "transformer.ln_f", "self_attention.dense", "mlp.dense_4h_to_h",
                       "mlp.dense_4h_to_h", "self_attention.dense"),
    "falcon": Reference("transformer.h", "transformer.ln_f", "self_attention", "mlp", "mlp.dense_4h_to_h",
                        "self_attention.dense"),
}
# OPT-350m: embeddings 16 wide widened by project_in; no final norm (so no lens either).
REFERENCE["opt_350m"] = dataclasses.replace(REFERENCE["opt"], absent=("embeddings", "ln_final"))
REFERENCE["falcon_new_decoder"] = REFERENCE["falcon_alibi"] = REFERENCE["falcon"]
REFERENCE["gpt_neox_serial"] = REFERENCE["gpt_neox"]
# slow_but_exact: the dense projections' weights are multiplied slice by slice, the modules never called.
REFERENCE["bloom_slow_but_exact"] = dataclasses.replace(
    REFERENCE["bloom"], absent=("attention_output", "attention_z", "mlp_output", "mlp_hidden"))
FAMILY_NAMES = tuple(families.FAMILIES)
assert set(REFERENCE) == set(FAMILY_NAMES)

EXPERIMENTS = ("residual", "attention_zero", "mlp_zero", "mlp_units", "heads", "lens", "reads")
# Every component a forward hook can reach, read at the last token (layer 1 where layered).
READS = ("embeddings", "block_input", "attention_z", "attention_output", "mlp_input", "mlp_hidden",
         "mlp_output", "block_output", "ln_final", "lm_head", "logits")


# --- the document ------------------------------------------------------------------------------

def _observe(name):
    rows = {"base": "weekdays/train", "counterfactual": "weekdays/train"}
    return {"kind": "observe", "interventions": name, "rows": rows, "outputs": {f"{name}.logits": "logits"}}


def _patch(site, operand="cf"):
    """Swap ``site`` at the last token on the base prompt with ``operand`` (a number, or the cf's value)."""
    reads = {"logits": {"site": "logits", "pos": -1, "model": "patched", "input": "base"}}
    if operand == "cf":
        reads["cf"] = {"site": site, "pos": -1, "model": "original", "input": "counterfactual"}
    return {"reads": reads,
            "writes": {"w": {"site": site, "pos": -1, "mechanism": "swap", "operand": operand}},
            "models": {"patched": {"input": "base", "writes": ["w"]}}}


def document(family: str, experiments=EXPERIMENTS) -> dict:
    sites = {"logits": {"component": "logits"},
             "resid0": {"component": "block_output", "layers": [0]},
             "resid_last": {"component": "block_output", "layers": [families.LAYERS - 1]},
             "attn0": {"component": "attention_output", "layers": [0]},
             "mlp0": {"component": "mlp_output", "layers": [0]},
             # layer 1: in a parallel-attention family (GPT-J, Phi, Falcon, Cohere, NeoX) layer 0's MLP
             # sees only the last token itself, the same on both prompts, so a swap there is a no-op
             "units1": {"component": "mlp_hidden", "layers": [1], "units": UNITS},
             "head1": {"component": "attention_z", "layers": [1], "heads": [HEAD]}}
    interventions = {
        "residual": _patch("resid0"), "attention_zero": _patch("attn0", 0.0), "mlp_zero": _patch("mlp0", 0.0),
        "mlp_units": _patch("units1"), "heads": _patch("head1"),
        "lens": {"reads": {"lens0": {"site": "resid0", "pos": -1, "input": "base", "view": "logits"},
                           "lens_last": {"site": "resid_last", "pos": -1, "input": "base", "view": "logits"},
                           "logits": {"site": "logits", "pos": -1, "input": "base"}}},
        "reads": {"reads": {f"r_{c}": {"site": f"read_{c}", "pos": -1, "input": "base"} for c in READS
                            if c in reads_for(family)}},
    }
    for c in READS:
        layered = c not in ("embeddings", "ln_final", "lm_head", "logits")
        sites[f"read_{c}"] = {"component": c, **({"layers": [1]} if layered else {}),
                              **({"units": UNITS} if c == "mlp_hidden" else {}),
                              **({"heads": [HEAD]} if c == "attention_z" else {})}
    steps = {}
    for name in experiments:
        steps[name] = _observe(name)
        if name == "lens":
            steps[name]["outputs"] = {"lens.lens0": "lens0", "lens.lens_last": "lens_last", "lens.logits": "logits"}
        if name == "reads":
            steps[name]["outputs"] = {f"reads.{c}": f"r_{c}" for c in reads_for(family)}
    used = {s for n in experiments for r in interventions[n]["reads"].values() for s in [r["site"]]}
    used |= {w["site"] for n in experiments for w in interventions[n].get("writes", {}).values()}
    return {"header": {"description": f"the family matrix on {family}"},
            "model": {"key": family, "dtype": "fp32"},
            "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
            "sites": {k: v for k, v in sites.items() if k in used},
            "interventions": {n: interventions[n] for n in experiments}, "steps": steps}


NEEDS = {"residual": "block_output", "attention_zero": "attention_output", "mlp_zero": "mlp_output",
         "mlp_units": "mlp_hidden", "heads": "attention_z", "lens": "ln_final"}


def absent(family: str) -> frozenset:
    """The components a checkpoint does not have (a family not in REFERENCE is taken to have all)."""
    ref = REFERENCE.get(family)
    if ref is None:
        return frozenset()
    return frozenset(ref.absent) | ({"mlp_hidden"} if ref.mlp_hidden is None else set())


def reads_for(family: str) -> tuple[str, ...]:
    return tuple(c for c in READS if c not in absent(family))


def experiments_for(family: str) -> tuple[str, ...]:
    return tuple(e for e in EXPERIMENTS if NEEDS.get(e) not in absent(family))


# --- the independent side: the raw model, one unpadded row at a time ------------------------------

def _keep(store: dict, key: str):
    """A hook body that keeps the last token's value and changes nothing."""
    def fn(x):
        store[key] = _rows(x)[0, -1].clone()
    return fn


def _rows(x):
    """One row's activation as (1, seq, width): OPT hands fc1/fc2 its tokens flattened (seq, width)."""
    return x.view(1, -1, x.shape[-1])


class Hand:
    def __init__(self, folder: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(folder).eval()
        self.tok = AutoTokenizer.from_pretrained(folder)
        rows = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines()]
        self.base = [self.tok(r["input"])["input_ids"] for r in rows]
        self.cf = [self.tok(r["counterfactual_inputs"][0])["input_ids"] for r in rows]

    def module(self, ref: Reference, layer: Optional[int], rel: str):
        return self.model.get_submodule(f"{ref.layers}.{layer}.{rel}" if layer is not None else rel)

    def run(self, ids, hooks=()):
        """The model's own logits at the last token of one unpadded row, with ``hooks`` =
        [(module, "pre"|"post", fn(tensor) -> tensor or None)] registered by hand."""
        handles = []
        try:
            for module, side, fn in hooks:
                if side == "pre":
                    def pre(m, args, kwargs, fn=fn):
                        x = args[0] if args else kwargs["hidden_states"] if "hidden_states" in kwargs else kwargs["x"]
                        new = fn(x)
                        if new is None:
                            return None
                        if args:
                            return (new, *args[1:]), kwargs
                        key = "hidden_states" if "hidden_states" in kwargs else "x"
                        return args, {**kwargs, key: new}
                    handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                else:
                    def post(m, args, out, fn=fn):
                        x = out[0] if isinstance(out, tuple) else out
                        new = fn(x)
                        if new is None:
                            return None
                        return (new, *out[1:]) if isinstance(out, tuple) else new
                    handles.append(module.register_forward_hook(post))
            with torch.no_grad():
                return self.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
        finally:
            for h in handles:
                h.remove()

    def patched(self, module, side, cols=None, value=None):
        """Each base row with ``module``'s ``side`` at its last token set to ``value`` (a number) or
        to the cf row's own value there; ``cols`` narrows it to those columns."""
        out = []
        for base, cf in zip(self.base, self.cf):
            if value is None:
                store = {}
                self.run(cf, [(module, side, _keep(store, "v"))])
                v = store["v"]
            else:
                v = None

            def write(x, v=v):
                x = x.clone()
                idx = slice(None) if cols is None else cols
                _rows(x)[0, -1, idx] = value if v is None else v[idx]  # a view: writes into x
                return x
            out.append(self.run(base, [(module, side, write)]))
        return torch.stack(out)

    def reads(self, family: str) -> dict[str, torch.Tensor]:
        """Every hookable component at the last token of each base row, captured by hand."""
        ref, m = REFERENCE[family], self.model
        projection = self.module(ref, 1, ref.attention_z)
        head_dim = (getattr(projection, "in_features", None) or projection.nx) // families.HEADS
        places = {"embeddings": (m.get_input_embeddings(), "post", None),
                  "block_input": (m.get_submodule(f"{ref.layers}.1"), "pre", None),
                  "attention_z": (projection, "pre", list(range(HEAD * head_dim, (HEAD + 1) * head_dim))),
                  "attention_output": (self.module(ref, 1, ref.attention_output), "post", None),
                  "mlp_input": (self.module(ref, 1, ref.mlp_input), "pre", None),
                  "mlp_output": (self.module(ref, 1, ref.mlp_output), "post", None),
                  "block_output": (m.get_submodule(f"{ref.layers}.1"), "post", None),
                  "lm_head": (m.get_output_embeddings(), "post", None)}
        if "ln_final" not in absent(family):
            places["ln_final"] = (m.get_submodule(ref.norm), "post", None)
        if ref.mlp_hidden is not None:
            places["mlp_hidden"] = (self.module(ref, 1, ref.mlp_hidden), "pre", UNITS)
        places = {c: place for c, place in places.items() if c not in absent(family)}
        got: dict[str, list] = {c: [] for c in reads_for(family)}
        for base in self.base:
            store: dict = {}
            hooks = [(module, side, _keep(store, c)) for c, (module, side, _) in places.items()]
            got["logits"].append(self.run(base, hooks))
            for c, (_, _, cols) in places.items():
                got[c].append(store[c] if cols is None else store[c][cols])
        return {f"reads.{c}": torch.stack(v) for c, v in got.items()}

    def lens(self, ref: Reference, layer: int):
        out = []
        for base in self.base:
            store = {}
            self.run(base, [(self.model.get_submodule(f"{ref.layers}.{layer}"), "post", _keep(store, "h"))])
            with torch.no_grad():
                head = self.model.get_output_embeddings()(self.model.get_submodule(ref.norm)(store["h"]))
            out.append(ref.logits(head, self.model.config))
        return torch.stack(out)

    def expected(self, family: str, experiment: str) -> dict[str, torch.Tensor]:
        ref = REFERENCE[family]
        if experiment == "residual":
            return {"residual.logits": self.patched(self.model.get_submodule(f"{ref.layers}.0"), "post")}
        if experiment == "attention_zero":
            return {"attention_zero.logits": self.patched(self.module(ref, 0, ref.attention_output), "post",
                                                          value=0.0)}
        if experiment == "mlp_zero":
            return {"mlp_zero.logits": self.patched(self.module(ref, 0, ref.mlp_output), "post", value=0.0)}
        if experiment == "mlp_units":
            return {"mlp_units.logits": self.patched(self.module(ref, 1, ref.mlp_hidden), "pre", cols=UNITS)}
        if experiment == "heads":
            projection = self.module(ref, 1, ref.attention_z)
            width = getattr(projection, "in_features", None) or projection.nx  # Linear, or GPT-2's Conv1D
            head_dim = width // families.HEADS
            cols = list(range(HEAD * head_dim, (HEAD + 1) * head_dim))
            return {"heads.logits": self.patched(self.module(ref, 1, ref.attention_z), "pre", cols=cols)}
        if experiment == "reads":
            return self.reads(family)
        own = torch.stack([self.run(b) for b in self.base])
        return {"lens.lens0": self.lens(ref, 0), "lens.lens_last": self.lens(ref, families.LAYERS - 1),
                "lens.logits": own}


# --- fixtures: a checkpoint per family, each engine loaded once ---------------------------------

def _folder(root: Path, family: str) -> Path:
    return families.build(family, root / family)


def run_family(root: Path, family: str, engine: str):
    """The family's matrix document run on ``engine``: {output name: tensor (rows, vocab)}."""
    raw = document(family, experiments_for(family))
    path = root / f"{family}.causalab.json"
    plan = cm.run(cm.read(raw, path=path), engine=engine, models=[root], data=[DATA]).plan
    out = {}
    for step in plan.steps.values():
        for name, value in step.results.items():
            if name.endswith(".logits") or name.startswith(("lens.", "reads.")):
                out[name] = value[:, 0]  # (rows, 1, vocab) at the last token
    return out


_RUNS: dict = {}


def _runs(root: Path, family: str):
    if family not in _RUNS:
        _folder(root, family)
        # Kept for the session: logits of a few rows, and a tiny reference model, per family.
        _RUNS[family] = {engine: run_family(root, family, engine) for engine in ("nnterp", "hooks")}
        _RUNS[family]["hand"] = Hand(root / family)
    return _RUNS[family]


# --- the matrix --------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_both_engines_equal_hand_hooks(family_root, family):
    runs = _runs(family_root, family)
    nnterp, hooks, hand = runs["nnterp"], runs["hooks"], runs["hand"]
    assert set(nnterp) == set(hooks)
    for experiment in experiments_for(family):
        for name, want in hand.expected(family, experiment).items():
            torch.testing.assert_close(nnterp[name], want, rtol=0, atol=ATOL, msg=lambda m: f"{name}: {m}")
            assert torch.equal(nnterp[name], hooks[name]), f"{family} {name}: the engines differ"


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_experiment_moves_the_logits(family_root, family):
    """A check that cannot fail proves nothing: each write must change the model's answer logits."""
    runs = _runs(family_root, family)
    clean = runs["nnterp"]["reads.logits"]
    for experiment in experiments_for(family):
        if experiment not in ("lens", "reads"):  # the two that only read
            moved = (runs["nnterp"][f"{experiment}.logits"] - clean).abs().max().item()
            assert moved > 1e-4, f"{family} {experiment} changed nothing ({moved})"


@pytest.mark.parametrize("family", [f for f in FAMILY_NAMES if "lens" in experiments_for(f)])
def test_the_lens_at_the_last_layer_is_the_models_logits(family_root, family):
    runs = _runs(family_root, family)
    for engine in ("nnterp", "hooks"):
        torch.testing.assert_close(runs[engine]["lens.lens_last"], runs[engine]["lens.logits"],
                                   rtol=0, atol=ATOL)


@pytest.mark.parametrize("family", [f for f in FAMILY_NAMES if absent(f)])
def test_a_component_a_checkpoint_lacks_is_refused_at_compile_time(family_root, family):
    """Each absent component (a sparse MoE block's neurons, OPT-350m's final norm, ...) is a typed
    refusal at compile time, with no weights, naming the component and the family, and saying
    what to read instead."""
    _folder(family_root, family)
    model_type = families._config(family).model_type
    for component in sorted(absent(family)):
        raw = document(family, ("reads",))
        raw["sites"] = {"s": {"component": component, **({"layers": [1]} if component not in
                                                          ("embeddings", "ln_final") else {})}}
        raw["interventions"]["reads"]["reads"] = {"r": {"site": "s", "pos": -1, "input": "base"}}
        raw["steps"]["reads"]["outputs"] = {"out": "r"}
        with pytest.raises(CompileError) as caught:
            compiler.compile_plan(raw, document=family_root / "d.causalab.json", models=[family_root],
                                  data=[DATA])
        text = str(caught.value)
        assert text.startswith("sites.s.component:") and component in text and model_type in text, text
        assert "instead" in text, text
    if "ln_final" in absent(family):  # and a lens, which goes through the final norm
        with pytest.raises(CompileError, match="lens"):
            compiler.compile_plan(_with_lens(document(family, ("residual",))), document=family_root / "d.causalab.json",
                                  models=[family_root], data=[DATA])


def _with_lens(raw: dict) -> dict:
    raw["sites"]["resid0"] = {"component": "block_output", "layers": [0]}
    raw["interventions"]["residual"]["reads"]["lens"] = {"site": "resid0", "pos": -1, "input": "base",
                                                         "view": "logits"}
    return raw

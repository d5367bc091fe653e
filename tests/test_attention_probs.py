"""attention_probs on the nnterp engine, against an independent computation.

The reference is a plain ``AutoModelForCausalLM`` loaded with eager attention:
reads are compared with its ``output_attentions=True``; writes with the same
model re-run through a wrapper around the family's ``eager_attention_forward``
that replaces the weights and recomputes ``weights @ v`` by hand. Same
hand-padded batch, position ids from the mask, no cache, to 1e-6.

The pattern is shown to a tap as ``(rows, queries, heads·keys)``, heads-major:
head ``h`` is columns ``h·keys … h·keys + keys - 1``, ``keys`` the forward's
padded width.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from paths import DATA, MODELS
from reference import padded
import torch

pytest.importorskip("nnterp")

import causalab_mini as cm  # noqa: E402
from causalab_mini.engine.nnterp import NNterpEngine  # noqa: E402
from causalab_mini.errors import CompileError, Unsupported  # noqa: E402
from causalab_mini.plan.build import keyed  # noqa: E402
from causalab_mini.plan.compile import compile_plan  # noqa: E402

FAMILIES = ("tiny-llama", "tiny-gemma2")
MODULES = {"tiny-llama": "transformers.models.llama.modeling_llama",
           "tiny-gemma2": "transformers.models.gemma2.modeling_gemma2"}
ATOL = 1e-6


class Eager:
    """One family: the engine loaded with attention probabilities, and the eager HF reference
    (both the session's shared loads: ``run`` removes its hooks and puts the attention function back)."""

    def __init__(self, family: str, data: Path, engine, hf, tok):
        self.family = family
        self.engine, self.hf, self.tok = engine, hf, tok
        self.data = data / family  # a data root of this family's own pairs
        self.rows = _pairs(self.tok, self.data)
        self.base = self.batch([r["input"] for r in self.rows])
        self.cf = self.batch([r["counterfactual_inputs"][0] for r in self.rows])

    def batch(self, texts):
        return padded(self.tok, texts)[:2]

    def run(self, batch, replace=None):
        """(attentions per layer, block outputs per layer, logits); ``replace`` = (layer, fn of weights)."""
        ids, mask = batch
        positions = torch.clamp(torch.cumsum(mask, dim=1) - 1, min=0)
        blocks = []  # hidden_states' last entry is after the final norm: the layers' own outputs
        handles = [layer.register_forward_hook(lambda m, a, out: blocks.append(out[0] if isinstance(out, tuple)
                                                                               else out))
                   for layer in self.hf.model.layers]
        try:
            with _replaced_weights(self.family, replace), torch.no_grad():
                out = self.hf(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                              output_attentions=True)
        finally:
            for handle in handles:
                handle.remove()
        return out.attentions, blocks, out.logits

    def plan(self, tmp_path, sites, interventions, steps, dataset=None):
        raw = {"header": {"description": "test"}, "model": {"key": self.family, "dtype": "fp32"},
               "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
               "sites": sites, "interventions": interventions, "steps": steps}
        return compile_plan(raw, document=tmp_path / "doc.causalab.json", facts=self.engine, models=[MODELS],
                            data=[self.data, DATA])


def _pairs(tok, root: Path) -> list[dict]:
    """Four rows of two different padded lengths, base and counterfactual the same length row by row."""
    texts = [t for name in ("weekdays_full", "weekday_arithmetic")
             for line in (DATA / name / "train.jsonl").read_text().splitlines()
             for t in (json.loads(line)["input"], *json.loads(line).get("counterfactual_inputs", ()))]
    by_length: dict[int, list[str]] = {}
    for text in dict.fromkeys(texts):
        by_length.setdefault(len(tok(text)["input_ids"]), []).append(text)
    lengths = sorted(n for n, same in by_length.items() if len(same) >= 2)
    assert len(lengths) >= 2, by_length  # the batch must be padded for the test to mean anything
    chosen = [pair for n in (lengths[0], lengths[-1]) for a, b in [by_length[n][:2]] for pair in ((a, b), (b, a))]
    out = [{"input": a, "counterfactual_inputs": [b]} for a, b in chosen]
    # and the same rows with each base prompt against one of the other length: not key for key
    misaligned = [{"input": a["input"], "counterfactual_inputs": [b["input"]]}
                  for a, b in zip(out, out[2:] + out[:2])]
    for name, rows in (("pairs", out), ("misaligned", misaligned)):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


@contextmanager
def _replaced_weights(family: str, replace):
    """The family's eager attention with layer ``l``'s weights replaced by ``fn(weights)``, by hand."""
    if replace is None:
        yield
        return
    layer, fn = replace
    module = importlib.import_module(MODULES[family])
    original = module.eager_attention_forward

    def eager(attn, query, key, value, attention_mask, **kwargs):
        out, weights = original(attn, query, key, value, attention_mask, **kwargs)
        if attn.layer_idx != layer:
            return out, weights
        weights = fn(weights.clone())
        v = module.repeat_kv(value, attn.num_key_value_groups)
        return torch.matmul(weights, v).transpose(1, 2).contiguous(), weights

    module.eager_attention_forward = eager
    try:
        yield
    finally:
        module.eager_attention_forward = original


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request, tmp_path_factory, engines, hf_model) -> Eager:
    family = request.param
    engine = engines({"key": family, "dtype": "fp32"}, "nnterp", attention_probs=True)
    return Eager(family, tmp_path_factory.mktemp("data"), engine, *hf_model(family, attn_implementation="eager"))


def close(got, want):
    torch.testing.assert_close(got.detach().float(), want.detach().float(), rtol=0, atol=ATOL)


def observe(intervention, rows=("base",), outputs=None, dataset="pairs/train"):
    step = {"kind": "observe", "interventions": intervention, "rows": {r: dataset for r in rows}}
    if outputs:
        step["outputs"] = outputs
    return step


def _pattern_site(layer, heads=None):
    return {"component": "attention_probs", "layers": [layer], **({"heads": heads} if heads is not None else {})}


@dataclasses.dataclass
class _Site:
    component: str
    layers: list
    heads: list
    units: None = None


# --- the compiler ---------------------------------------------------------------------------

def test_columns_are_heads_major_over_the_forwards_keys(fam, tmp_path):
    plan = fam.plan(tmp_path, {"p": _pattern_site(1, [0, 2])},
                    {"read": {"reads": {"x": {"site": "p", "pos": -1, "input": "base"}}}}, {"read": observe("read")})
    read = plan.steps["read"].forwards[0].reads[0]
    keys = fam.base[0].shape[1]
    heads = fam.hf.config.num_attention_heads
    assert read.address.columns == tuple(range(0, keys)) + tuple(range(2 * keys, 3 * keys))
    assert (read.width, read.address.width, read.address.full_width) == (2 * keys, 2 * keys, heads * keys)
    site = fam.engine.locate(_Site("attention_probs", [1], [0, 2]), path="sites.p")
    assert (site.width, site.columns) == (0, None)  # the keys are a forward's, not the model's
    assert keyed(site, 5, heads) == dataclasses.replace(site, full_width=heads * 5, width=10,
                                                       columns=(0, 1, 2, 3, 4, 10, 11, 12, 13, 14))


# --- numbers ----------------------------------------------------------------------------------

def test_read_equals_output_attentions(fam, tmp_path):
    sites = {"p": _pattern_site(1, [0, 2]), "all": _pattern_site(0),
             "q": {"component": "attention_query", "layers": [1], "heads": [1]}}
    reads = {"x": {"site": "p", "pos": -1, "input": "base"}, "y": {"site": "all", "pos": -1, "input": "base"},
             "q": {"site": "q", "pos": -1, "input": "base"}}  # q/k/v are the same call's inputs
    plan = fam.plan(tmp_path, sites, {"read": {"reads": reads}},
                    {"read": observe("read", outputs={"ox": "x", "oy": "y"})})
    got = fam.engine.execute(plan).steps["read"].results
    attentions, _, _ = fam.run(fam.base)
    rows = len(fam.rows)
    close(got["ox"][:, 0], attentions[1][:, [0, 2], -1, :].reshape(rows, -1))
    close(got["oy"][:, 0], attentions[0][:, :, -1, :].reshape(rows, -1))
    ids, mask = fam.base
    assert (got["ox"][:, 0].reshape(rows, 2, -1)[mask[:, None, :].expand(-1, 2, -1) == 0] == 0).all()  # padding


def test_swap_of_another_prompts_pattern(fam, tmp_path):
    """Layer 0, heads [0, 2], last query: the counterfactual's pattern; the next layer feels it."""
    sites = {"p": _pattern_site(0, [0, 2]), "next": {"component": "block_output", "layers": [1]},
             "out": {"component": "logits"}}
    iv = {"reads": {"p_cf": {"site": "p", "pos": -1, "model": "original", "input": "counterfactual"},
                    "h": {"site": "next", "pos": -1, "model": "patched", "input": "base"},
                    "logits": {"site": "out", "pos": -1, "model": "patched", "input": "base"}},
          "writes": {"patch": {"site": "p", "pos": -1, "mechanism": "swap", "operand": "p_cf"}},
          "models": {"patched": {"input": "base", "writes": ["patch"]}}}
    plan = fam.plan(tmp_path, sites, {"swap": iv},
                    {"swap": observe("swap", rows=("base", "counterfactual"), outputs={"oh": "h", "ol": "logits"})})
    got = fam.engine.execute(plan).steps["swap"].results
    cf_attn, _, _ = fam.run(fam.cf)

    def swap(w):
        w[:, [0, 2], -1, :] = cf_attn[0][:, [0, 2], -1, :]
        return w
    _, hidden, logits = fam.run(fam.base, replace=(0, swap))
    _, clean_hidden, _ = fam.run(fam.base)
    assert (hidden[1][:, -1] - clean_hidden[1][:, -1]).abs().max() > 1e-3  # the swap is felt
    close(got["oh"][:, 0], hidden[1][:, -1])
    close(got["ol"][:, 0], logits[:, -1])


def test_windows_and_the_simulated_round_trip_agree(fam, tmp_path):
    """A window of rows keeps the padded width the columns were computed for."""
    def plan():
        return fam.plan(tmp_path, {"p": _pattern_site(1, [3])},
                        {"read": {"reads": {"x": {"site": "p", "pos": -1, "input": "base"}}}},
                        {"read": observe("read", outputs={"ox": "x"})})
    whole = fam.engine.execute(plan()).steps["read"].results["ox"]
    ones = fam.engine.execute(plan(), batch_size=1).steps["read"].results["ox"]
    there = fam.engine.execute(plan(), remote="local").steps["read"].results["ox"]
    torch.testing.assert_close(ones, whole, rtol=0, atol=1e-5)
    assert torch.equal(there, whole)


def test_zero_pattern_by_a_number(fam, tmp_path):
    sites = {"p": _pattern_site(0, [1]), "next": {"component": "block_output", "layers": [1]}}
    iv = {"reads": {"h": {"site": "next", "pos": -1, "model": "zeroed", "input": "base"}},
          "writes": {"zero": {"site": "p", "pos": -1, "mechanism": "swap", "operand": 0.0}},
          "models": {"zeroed": {"input": "base", "writes": ["zero"]}}}
    plan = fam.plan(tmp_path, sites, {"zeroed": iv}, {"zeroed": observe("zeroed", outputs={"oh": "h"})})
    got = fam.engine.execute(plan).steps["zeroed"].results

    def zero(w):
        w[:, 1, -1, :] = 0.0
        return w
    _, hidden, _ = fam.run(fam.base, replace=(0, zero))
    _, clean, _ = fam.run(fam.base)
    assert (hidden[1][:, -1] - clean[1][:, -1]).abs().max() > 1e-3  # the head's output is gone
    close(got["oh"][:, 0], hidden[1][:, -1])


def test_misaligned_prompts_are_refused(fam, tmp_path):
    """Rows whose base and counterfactual prompts differ in length cannot swap a pattern."""
    iv = {"reads": {"p_cf": {"site": "p", "pos": -1, "model": "original", "input": "counterfactual"},
                    "x": {"site": "p", "pos": -1, "model": "patched", "input": "base"}},
          "writes": {"patch": {"site": "p", "pos": -1, "mechanism": "swap", "operand": "p_cf"}},
          "models": {"patched": {"input": "base", "writes": ["patch"]}}}
    step = observe("swap", rows=("base", "counterfactual"), dataset="misaligned/train")
    with pytest.raises(CompileError, match="line up key for key") as caught:
        fam.plan(tmp_path, {"p": _pattern_site(0, [0])}, {"swap": iv}, {"swap": step})
    assert str(caught.value).startswith("interventions.swap.writes.patch.operand:")
    step = observe("swap", rows=("base", "counterfactual"))  # the aligned pairs compile
    fam.plan(tmp_path, {"p": _pattern_site(0, [0])}, {"swap": iv}, {"swap": step})


# --- refusals ---------------------------------------------------------------------------------

READ = {"read": {"reads": {"x": {"site": "p", "pos": -1, "input": "base"}}}}


def _raw(family, site):
    return {"header": {"description": "test"}, "model": {"key": family, "dtype": "fp32"},
            "roles": {"base": {"field": "input"}}, "sites": {"p": site}, "interventions": copy.deepcopy(READ),
            "steps": {"read": {"kind": "observe", "interventions": "read", "rows": {"base": "weekdays/train"}}}}


def test_an_engine_loaded_without_the_pattern_refuses_it(tmp_path):
    # The pattern is reached through nnterp's own route (eager attention, chosen at load) or the
    # attention seam (chosen at load): a model loaded with neither refuses it, saying how to load.
    plain = NNterpEngine.load({"key": "tiny-llama", "dtype": "fp32"}, models=[MODELS])
    assert plain.model._model.config._attn_implementation != "eager"  # loading stays as it was
    with pytest.raises(Unsupported, match="loaded without it") as caught:
        compile_plan(_raw("tiny-llama", _pattern_site(0, [0])), document=tmp_path / "d.causalab.json",
                     facts=plain, models=[MODELS], data=[DATA])
    assert str(caught.value).startswith("sites.p.component: attention_probs") and "attention_seam" in caught.value.fix
    assert plain.model._model.config._attn_implementation != "causalab"  # never switched under it


def test_load_asks_for_attention_probs_only_when_a_document_taps_them(tmp_path):
    doc = tmp_path / "d.causalab.json"
    tapped = cm.read(_raw("tiny-llama", _pattern_site(0, [0])), path=doc)
    assert tapped.attention_probs and tapped.attention_seam
    engine = cm.load(tapped, models=[MODELS])
    # Served with the attention seam (engine/attention.py), which reaches the pattern itself.
    assert engine.model._model.config._attn_implementation == "causalab"
    untapped = cm.read(_raw("tiny-llama", {"component": "block_output", "layers": [0]}), path=doc)
    assert not untapped.attention_probs and not untapped.attention_seam
    plain = cm.load(untapped, models=[MODELS])
    assert not plain.model.attn_probs_available
    assert plain.model._model.config._attn_implementation not in ("eager", "causalab")


def test_gpt2_is_reached_through_the_attention_seam(tmp_path):
    # nnterp 1.3.0's own route to GPT-2's pattern fails its check under transformers 5: a model
    # loaded with the attention seam reaches the pattern through it instead.
    engine = NNterpEngine.load({"key": "tiny-gpt2", "dtype": "fp32"}, models=[MODELS], attention_probs=True,
                               attention_seam=True)
    assert not engine.model.attn_probs_available
    assert engine.model._model.config._attn_implementation == "causalab"
    compile_plan(_raw("tiny-gpt2", _pattern_site(0, [0])), document=tmp_path / "d.causalab.json",
                 facts=engine, models=[MODELS], data=[DATA])


def test_a_featurizer_or_a_decode_step_on_the_pattern_is_refused(tmp_path):
    """No weights: compiled against the config, where the refusals belong."""
    raw = _raw("tiny-llama", _pattern_site(0, [0]))
    raw["featurizers"] = {"rot": {"kind": "subspace", "site": "p", "k": 2}}
    raw["interventions"]["read"]["reads"]["x"]["featurizer"] = "rot"
    with pytest.raises(CompileError, match="featurizer has one d") as caught:
        compile_plan(raw, document=tmp_path / "d.causalab.json", models=[MODELS], data=[DATA])
    assert str(caught.value).startswith("featurizers.rot.site:")
    raw = _raw("tiny-llama", _pattern_site(0, [0]))
    raw["interventions"]["read"]["decode"] = 2
    raw["interventions"]["read"]["reads"]["x"]["pos"] = {"frame": "generated", "index": 1}
    with pytest.raises(CompileError, match="gains a key at every decode step") as caught:
        compile_plan(raw, document=tmp_path / "d.causalab.json", models=[MODELS], data=[DATA])
    assert str(caught.value).startswith("interventions.read.reads.x.pos:")

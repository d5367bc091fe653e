"""Documents and an independent reference for the attribution-patching tests.

``document`` writes one attribution document per model: a layer x position sweep (both layers;
positions -1, -4 — the day's last token on every shipped tokenizer — and the last four tokens,
one write summed over four positions) over one estimated step per component, each swapping the
component with its value on the counterfactual prompt and scoring logit_diff(cf_answer,
base_answer) at the last token; plus an un-written ``clean`` step scoring the same metric, the
base metric each estimate starts from.

``Reference`` computes the same estimate without causalab_mini: the raw Hugging Face model,
one unpadded row at a time, a hand-written hook that adds a zero leaf (requires_grad) at the
module the family's own code names, ``torch.autograd.grad`` of logit_diff at the last token,
and the counterfactual activation from a plain forward. Per row: base + Σ over the write's
positions and columns of (a_cf − a_base) · ∂logit_diff/∂a, in float64.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from paths import DATA, V2

LAYERS = (0, 1)
POSITIONS = (-1, -4, {"last": 4})
HEADS, UNITS = [1], [0, 5, 7]
ROWS = "weekdays/train"  # 4 rows; every answer pair scores distinct first tokens on every tokenizer here
# step name -> (component, selection). mlp_all: every neuron, which must estimate what mlp_output does.
COMPONENTS = {"block_output": ("block_output", {}), "block_input": ("block_input", {}),
              "attention_output": ("attention_output", {}), "mlp_output": ("mlp_output", {}),
              "attention_z": ("attention_z", {"heads": HEADS}), "mlp_hidden": ("mlp_hidden", {"units": UNITS}),
              "mlp_all": ("mlp_hidden", {})}
MLP_HIDDEN = ("mlp_hidden", "mlp_all")
METRIC = {"kind": "logit_diff", "of": "logits", "a": "cf_answer", "b": "base_answer"}


def revision(model: str) -> str:
    """The shipped model's pin, as the corpus writes it."""
    source = {"tiny-llama": "layer_pos_sweep", "tiny-gpt2": "patching_gpt2", "tiny-gemma2": "head_patching_gemma2"}
    return json.loads((V2 / f"{source[model]}.causalab.json").read_text())["model"]["revision"]


def document(key: str, *, pin: Optional[str] = None, steps=tuple(COMPONENTS), verify=None, estimate: bool = True,
             positions=POSITIONS) -> dict:
    pos = {"sweep": list(positions), "as": "pos"}
    sites = {"logits": {"component": "logits"}}
    interventions = {"clean": {"reads": {"logits": {"site": "logits", "pos": -1, "input": "base"}},
                               "metrics": {"ld": dict(METRIC)}}}
    rows = {"base": ROWS, "counterfactual": ROWS}
    out = {"clean": {"kind": "observe", "interventions": "clean", "rows": {"base": ROWS}}}
    for name in steps:
        component, selection = COMPONENTS[name]
        sites[name] = {"component": component, "layers": [{"sweep": list(LAYERS), "as": "layer"}], **selection}
        interventions[name] = {
            "reads": {"cf": {"site": name, "pos": pos, "model": "original", "input": "counterfactual"},
                      "logits": {"site": "logits", "pos": -1, "model": "patched", "input": "base"}},
            "writes": {"w": {"site": name, "pos": pos, "mechanism": "swap", "operand": "cf"}},
            "models": {"patched": {"input": "base", "writes": ["w"]}},
            "metrics": {"ld": dict(METRIC)}}
        out[name] = {"kind": "observe", "interventions": name, "rows": rows}
        if estimate:
            out[name]["estimate"] = {"by": "attribution", **({"verify": verify} if verify else {})}
    return {"header": {"description": f"attribution patching on {key}"},
            "model": {"key": key, "dtype": "fp32", **({"revision": pin} if pin else {})},
            "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
            "sites": sites, "interventions": interventions, "steps": out}


def indices(pos, length: int) -> list[int]:
    """A position of the sweep on an unpadded row of ``length`` tokens."""
    if isinstance(pos, dict):
        return list(range(length - pos["last"], length))
    return [length + pos]


# --- the reference ---------------------------------------------------------------------------------

def _first(x):
    return x[0] if isinstance(x, tuple) else x


class Reference:
    """``module_of(ref, component, layer)``: where the family's code computes each component (the
    module map of test_families.REFERENCE, written there by hand from each family's modelling code)."""

    def __init__(self, folder: Path, ref):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.ref = ref
        self.data = [json.loads(line) for line in (DATA / f"{ROWS}.jsonl").read_text().splitlines()]
        self.base = [self.tok(r["input"])["input_ids"] for r in self.data]
        self.cf = [self.tok(r["counterfactual_inputs"][0])["input_ids"] for r in self.data]
        first = lambda text: self.tok(text, add_special_tokens=False)["input_ids"][0]  # noqa: E731
        self.answers = [(first(r["cf_answer"]), first(r["base_answer"])) for r in self.data]
        self._rows: Optional[list] = None

    def place(self, component: str, layer: int):
        """(module, "pre" | "post", columns or None) of a component at a layer."""
        ref, m = self.ref, self.model
        at = lambda rel: m.get_submodule(f"{ref.layers}.{layer}.{rel}")  # noqa: E731
        if component == "block_output":
            return m.get_submodule(f"{ref.layers}.{layer}"), "post"
        if component == "block_input":
            return m.get_submodule(f"{ref.layers}.{layer}"), "pre"
        if component == "attention_output":
            return at(ref.attention_output), "post"
        if component == "mlp_output":
            return at(ref.mlp_output), "post"
        if component == "attention_z":
            return at(ref.attention_z), "pre"
        return at(ref.mlp_hidden), "pre"

    def columns(self, name: str, width: int) -> Optional[list[int]]:
        _, selection = COMPONENTS[name]
        if "heads" in selection:
            head_dim = width // self.model.config.num_attention_heads
            return [c for h in selection["heads"] for c in range(h * head_dim, (h + 1) * head_dim)]
        return selection.get("units")

    def _forward(self, ids, places: dict, leaf: bool):
        """One unpadded row: each place's activation kept, and (``leaf``) a zero leaf added there."""
        kept, leaves, handles = {}, {}, []

        def changed(key, x):
            kept[key] = x.detach().clone()
            if not leaf:
                return None
            leaves[key] = torch.zeros_like(x, requires_grad=True)
            return x + leaves[key]
        try:
            for key, (module, side) in places.items():
                if side == "pre":
                    def pre(mod, args, kwargs, key=key):
                        name = None if args else next(k for k in ("hidden_states", "x", "input") if k in kwargs)
                        new = changed(key, args[0] if args else kwargs[name])
                        if new is None:
                            return None
                        return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, name: new})
                    handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                else:
                    def post(mod, args, out, key=key):
                        new = changed(key, _first(out))
                        if new is None:
                            return None
                        return (new, *out[1:]) if isinstance(out, tuple) else new
                    handles.append(module.register_forward_hook(post))
            with torch.enable_grad() if leaf else torch.no_grad():
                logits = self.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
        finally:
            for h in handles:
                h.remove()
        return logits, kept, leaves

    def rows(self, steps) -> list[dict]:
        """Per row: the base metric and, per (step, layer), (a_base, a_cf, gradient), each (seq, width)."""
        if self._rows is not None:
            return self._rows
        places = {(name, layer): self.place(COMPONENTS[name][0], layer) for name in steps for layer in LAYERS}
        out = []
        for base, cf, (a, b) in zip(self.base, self.cf, self.answers):
            logits, at_base, leaves = self._forward(base, places, leaf=True)
            metric = logits[a] - logits[b]
            keys = list(leaves)
            grads = torch.autograd.grad(metric, [leaves[k] for k in keys], allow_unused=True)
            _, at_cf, _ = self._forward(cf, places, leaf=False)
            sites = {k: (at_base[k][0].double(), at_cf[k][0].double(),
                         torch.zeros_like(at_base[k][0]).double() if g is None else g[0].double())
                     for k, g in zip(keys, grads)}
            out.append({"base": metric.item(), "sites": sites})
        self._rows = out
        return out

    def estimate(self, steps, name: str, layer: int, pos) -> list[float]:
        """Per row: the hand estimate of swapping ``name`` at ``layer``, ``pos`` with the counterfactual's."""
        values = []
        for row in self.rows(steps):
            a_base, a_cf, grad = row["sites"][(name, layer)]
            cols = self.columns(name, a_base.shape[-1])
            pb, pc = indices(pos, a_base.shape[0]), indices(pos, a_cf.shape[0])
            delta = a_cf[pc] - a_base[pb]
            g = grad[pb]
            if cols is not None:
                delta, g = delta[:, cols], g[:, cols]
            values.append(row["base"] + float((delta * g).sum()))
        return values

    def delta(self, steps, name: str, layer: int, pos) -> float:
        """The largest |a_cf − a_base| the write makes (a site whose write changes nothing proves nothing)."""
        worst = 0.0
        for row in self.rows(steps):
            a_base, a_cf, _ = row["sites"][(name, layer)]
            cols = self.columns(name, a_base.shape[-1])
            d = a_cf[indices(pos, a_cf.shape[0])] - a_base[indices(pos, a_base.shape[0])]
            worst = max(worst, float((d if cols is None else d[:, cols]).abs().max()))
        return worst

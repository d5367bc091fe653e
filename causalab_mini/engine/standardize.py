"""nnterp's spellings over a plain Hugging Face model, for the hooks engine.

nnterp renames each family's modules to one set of names; a plain
``AutoModelForCausalLM`` has the family's own. ``standardize`` finds the same
modules and returns them under nnterp's names, so the hooks engine never says
``model.transformer.h`` or ``model.model.layers``.

Three of the names are published by transformers and need no family knowledge:
the decoder (``base_model_prefix``), the head (``get_output_embeddings()``) and
the embeddings (``get_input_embeddings()``). The rest are conventions — the
layer list, the final norm, each layer's attention and MLP, and the two
projections whose inputs are the per-head result and the MLP neurons — and
every one of them raises when it finds nothing or more than one candidate,
rather than picking a first match: a wrong module is a wrong number, silently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

from torch import nn

from ..errors import ModelError

# Conventions, by the child's attribute name. Each is only a candidate list: exactly
# one child of the module must match, or standardize refuses.
ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")
MLP_NAMES = ("mlp", "feed_forward", "ffn")
OUTPUT_PROJECTION_NAMES = ("o_proj", "c_proj", "out_proj", "dense")  # llama/gemma: o_proj, gpt2: c_proj
DOWN_PROJECTION_NAMES = ("down_proj", "c_proj", "fc2", "dense_4h_to_h", "w2")  # gpt2: c_proj


@dataclass(frozen=True)
class Standardized:
    """A model's modules under nnterp's names (``layers[l]``, ``ln_final``, ``lm_head``, …)."""

    model: nn.Module  # the top-level CausalLM: its output's ``logits`` field is the ``logits`` component
    decoder: nn.Module  # under ``base_model_prefix``
    embed_tokens: nn.Module
    layers: tuple[nn.Module, ...]
    attentions: tuple[nn.Module, ...]  # layers[l].self_attn
    mlps: tuple[nn.Module, ...]  # layers[l].mlp
    o_projs: tuple[nn.Module, ...]  # the attention's output projection: its input is attention_z
    down_projs: tuple[nn.Module, ...]  # the MLP's down projection: its input is mlp_hidden
    ln_final: nn.Module
    lm_head: nn.Module

    def names(self) -> dict[str, str]:
        """Each standardized name → the module's own dotted path in the model (for messages and tests)."""
        paths = {id(m): n for n, m in self.model.named_modules()}
        out = {"decoder": paths[id(self.decoder)], "embed_tokens": paths[id(self.embed_tokens)],
               "ln_final": paths[id(self.ln_final)], "lm_head": paths[id(self.lm_head)]}
        for plural in ("layers", "attentions", "mlps", "o_projs", "down_projs"):
            for i, m in enumerate(getattr(self, plural)):
                out[f"{plural}[{i}]"] = paths[id(m)]
        return out


def _refuse(what: str, problem: str) -> ModelError:
    return ModelError("model", f"cannot standardize this model's {what}: {problem}",
                      "run it with --engine nnterp, which knows the family's layout")


def _one(what: str, where: str, found: list[tuple[str, nn.Module]]) -> nn.Module:
    distinct = {id(m): (n, m) for n, m in found}
    if len(distinct) == 1:
        return next(iter(distinct.values()))[1]
    if not distinct:
        raise _refuse(what, f"nothing under {where} matches")
    names = ", ".join(sorted(n for n, _ in distinct.values()))
    raise _refuse(what, f"{len(distinct)} candidates under {where} ({names}); refusing to guess")


def _named(module: nn.Module, names: Iterable[str]) -> list[tuple[str, nn.Module]]:
    wanted = tuple(names)
    return [(n, m) for n, m in module.named_children() if n in wanted]


def _in_width(module: nn.Module) -> Optional[int]:
    """The last-axis width a projection takes: Linear's in_features, GPT-2 Conv1D's nx."""
    for attr in ("in_features", "nx"):
        value = getattr(module, attr, None)
        if isinstance(value, int):
            return value
    return None


def _check_width(what: str, module: nn.Module, expected: Optional[int]) -> None:
    got = _in_width(module)
    if expected is not None and got is not None and got != expected:
        raise _refuse(what, f"the module found takes inputs {got} wide, and the config says {expected}")


def standardize(model: Any, facts: Any = None) -> Standardized:
    """``model``'s modules under nnterp's names; raises ``ModelError`` rather than guess.

    ``facts`` (a ``ModelFacts``), when given, checks that the two projections found take
    inputs as wide as the compiler will address: n_heads·head_dim and d_mlp.
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    prefix = getattr(model, "base_model_prefix", "") or ""
    decoder = getattr(model, prefix, None) if prefix else None
    if not isinstance(decoder, nn.Module) or decoder is model:
        raise _refuse("decoder", f"base_model_prefix {prefix!r} names no submodule")
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    if embed is None:
        raise _refuse("embeddings", "get_input_embeddings() returned None")
    if head is None:
        raise _refuse("lm_head", "get_output_embeddings() returned None (not a causal LM head?)")

    n_layers = config.num_hidden_layers
    layer_list = _one("layer list", type(decoder).__name__,
                      [(n, m) for n, m in decoder.named_children()
                       if isinstance(m, nn.ModuleList) and len(m) == n_layers])
    norms = [(n, m) for n, m in decoder.named_children()
             if m is not layer_list and "norm" in type(m).__name__.lower()]
    ln_final = _one("final norm", type(decoder).__name__, norms)

    attentions, mlps, o_projs, down_projs = [], [], [], []
    for i, layer in enumerate(layer_list):
        where = f"layers[{i}] ({type(layer).__name__})"
        attn = _one("attention", where, _named(layer, ATTENTION_NAMES))
        mlp = _one("MLP", where, _named(layer, MLP_NAMES))
        o_proj = _one("attention output projection", f"{where}.attention ({type(attn).__name__})",
                      _named(attn, OUTPUT_PROJECTION_NAMES))
        down = _one("MLP down projection", f"{where}.mlp ({type(mlp).__name__})",
                    _named(mlp, DOWN_PROJECTION_NAMES))
        if facts is not None:
            _check_width("attention output projection", o_proj, facts.n_heads * facts.head_dim)
            _check_width("MLP down projection", down, facts.d_mlp)
        attentions.append(attn)
        mlps.append(mlp)
        o_projs.append(o_proj)
        down_projs.append(down)
    return Standardized(model=model, decoder=decoder, embed_tokens=embed, layers=tuple(layer_list),
                        attentions=tuple(attentions), mlps=tuple(mlps), o_projs=tuple(o_projs),
                        down_projs=tuple(down_projs), ln_final=ln_final, lm_head=head)

"""Where each transformer family keeps the modules a component names, and what it does after them.

One table, read by the compiler (widths, refusals) and by both engines (which module
to hook, which envoy to touch, how a lens ends), so the three cannot disagree. Standard
library only: ``explain`` reads it with no torch imported.

A ``Layout`` says, for one family, with module paths as ``named_modules`` spells them:

* where the layer list and the final norm are, from the top-level causal LM;
* inside a layer, which module's input or output each layered component is. A
  component is what the family's own code computes, not a module that happens to
  have the name: BLOOM's attention and MLP add the residual inside their forward, so
  their contribution is the output of the projection before that add
  (``self_attention.dense``, ``mlp.dense_4h_to_h``); OPT has no MLP module, so its MLP
  is ``fc1``'s input to ``fc2``'s output;
* how wide the MLP is, from the config fields the family's code reads;
* what the causal LM does to ``lm_head``'s output before returning logits (Cohere
  multiplies by ``logit_scale``, Granite divides by ``logits_scaling``, Gemma-2/3 cap),
  which a logit lens must do too;
* which components the family does not have at all (a sparse MoE block has one down
  projection per expert, so no single ``mlp_hidden``), each with the sentence a
  refusal prints;
* how the attention seam (``engine/attention.py``) reaches inside its attention
  (``attention_seam``): through transformers' attention-function registry, which the
  family's attention module calls, or — GPT-Neo and BLOOM, whose attention computes
  its pattern in its own code — through the family's routine installed at load
  (``engine/attention_families.py``).

A model whose family is not in the table is refused by name unless its document's
``model.modules`` names the modules (``custom_layout``): a guessed module is a wrong
number, silently.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

# Which side of a module each component is read at is the component's own record; a layout
# says only which module. ATTENTION also keys the port of the attention module itself, whose
# forward holds the interiors.
from .components import ATTENTION, COMPONENTS, OUTPUT

# ``Layout.attention_seam``: the family's attention module hands q, k, v to the function
# transformers' AttentionInterface registry names (``config._attn_implementation``).
REGISTRY = "registry"
# The families whose attention computes its pattern in its own code, each reached by a routine of
# its own (engine/attention_families.py, keyed by these names).
ROUTINES = ("gpt_neo", "bloom")


@dataclass(frozen=True)
class Port:
    """One module's input or output, by its path relative to a layer."""

    module: str
    io: str  # INPUT or OUTPUT
    # The family hands this module its tokens flattened to (rows·seq, width) (OPT's fc1/fc2):
    # the engines see it as (rows, seq, width) and put it back flat.
    flat: bool = False

    def spelling(self) -> str:
        return f"{self.module}.{self.io}"


@dataclass(frozen=True)
class OutputTransform:
    """What the causal LM applies to ``lm_head``'s output, in its own order: scale, divide, cap.

    Each is a number read from the config at compile time (None: the family does not).
    """

    multiply: Optional[float] = None  # Cohere: logits * logit_scale
    divide: Optional[float] = None  # Granite: logits / logits_scaling
    softcap: Optional[float] = None  # Gemma-2/3: tanh(logits / c) * c


@dataclass(frozen=True)
class Layout:
    family: str  # config.model_type, or "custom" for a layout a document names
    layers: str  # the ModuleList of decoder layers, from the causal LM
    ln_final: str  # the final norm, from the causal LM
    ports: Mapping[str, Port]  # layered component (and ATTENTION) -> its module port, relative to a layer
    d_mlp_fields: tuple[str, ...] = ("intermediate_size",)  # first config field set; else 4·d_model
    multiply_field: Optional[str] = None
    divide_field: Optional[str] = None
    softcap_field: Optional[str] = None
    # component -> why this family has no such thing, and what to use instead
    absent: Mapping[str, str] = field(default_factory=dict)
    # How the attention seam reaches inside the attention module (the ATTENTION port): REGISTRY, a
    # routine's name (ROUTINES), or None — no seam (a document's own model.modules: its attention's
    # code is not known here, so nothing inside it is addressed).
    attention_seam: Optional[str] = REGISTRY
    # attention_probs: nnterp's route to the pattern passes its own load-time check here
    attention_pattern: bool = True
    # An image-text model whose text half runs text documents (loaded by its own class, handed to nnterp)
    multimodal: bool = False
    # config -> {component: (problem, fix)}: what a checkpoint's own config rules out
    # (OPT-350m has no final norm; BLOOM's slow_but_exact path never calls its projections)
    variant: Optional[Callable[[Any], dict]] = None

    @property
    def attention_call(self) -> bool:
        """Whether the seam reaches inside this family's attention at all — through the registry's
        call or the family's routine: q, k, v, the scores and the pattern on the hooks engine, and
        on the nnterp engine in this process."""
        return self.attention_seam is not None

    @property
    def attention_routine(self) -> Optional[str]:
        """The routine the seam installs (``"gpt_neo"``, ``"bloom"``), or None (the registry, or no seam)."""
        return self.attention_seam if self.attention_seam in ROUTINES else None

    def refused(self, config: Any) -> dict:
        """Every component this checkpoint does not have, with the reason and the fix."""
        return {**self.absent, **(self.variant(config) if self.variant else {})}

    def d_mlp(self, config: Any, d_model: int) -> int:
        for name in self.d_mlp_fields:
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return 4 * d_model

    def output_transform(self, config: Any) -> OutputTransform:
        def number(name: Optional[str]) -> Optional[float]:
            value = getattr(config, name, None) if name else None
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        return OutputTransform(multiply=number(self.multiply_field), divide=number(self.divide_field),
                               softcap=number(self.softcap_field) or None)

    def transform_spelling(self) -> str:
        """The output transform by the config fields it reads: ``* logit_scale``, ``softcap final_logit_softcapping``."""
        parts = [f"* {self.multiply_field}" if self.multiply_field else "",
                 f"/ {self.divide_field}" if self.divide_field else "",
                 f"softcap {self.softcap_field}" if self.softcap_field else ""]
        return ", ".join(p for p in parts if p) or "none"

    def port(self, component: str) -> Optional[Port]:
        return self.ports.get(component)


def _ports(attention: str, mlp: Optional[str], o_proj: str, down_proj: Optional[str], *,
           attention_output: Optional[str] = None, mlp_input: Optional[str] = None,
           mlp_output: Optional[str] = None, flat_mlp: bool = False) -> dict[str, Port]:
    """The five layered module components of a family, from its module names."""
    ports = {
        # The attention module itself: the interiors (q/k/v, the pattern) are inside its forward.
        ATTENTION: Port(attention, OUTPUT),
        "attention_output": _port("attention_output", attention_output or attention),
        "attention_z": _port("attention_z", f"{attention}.{o_proj}"),
        "mlp_input": _port("mlp_input", mlp_input or mlp, flat_mlp),
        "mlp_output": _port("mlp_output", mlp_output or mlp, flat_mlp),
    }
    if down_proj is not None:
        ports["mlp_hidden"] = _port("mlp_hidden", down_proj if mlp is None else f"{mlp}.{down_proj}", flat_mlp)
    return ports


def _port(component: str, module: str, flat: bool = False) -> Port:
    """``component`` at ``module``, on the side its record (components.py) reads it."""
    return Port(module, COMPONENTS[component].io, flat)


MOE_HIDDEN = ("a sparse mixture-of-experts block has one down projection per expert and routes each "
              "token to a few of them, so there is no single set of MLP neurons to address",
              "address the block's input or output (mlp_input, mlp_output) instead")

_LLAMA_PORTS = _ports("self_attn", "mlp", "o_proj", "down_proj")


def _llama_like(family: str, **extra) -> Layout:
    return Layout(family=family, layers="model.layers", ln_final="model.norm", ports=_LLAMA_PORTS, **extra)


def _moe(family: str) -> Layout:
    return Layout(family=family, layers="model.layers", ln_final="model.norm",
                  ports={k: v for k, v in _LLAMA_PORTS.items() if k != "mlp_hidden"},
                  absent={"mlp_hidden": MOE_HIDDEN})


def _opt_variant(config) -> dict:
    """OPT-350m: 512-wide embeddings widened by ``project_in``, ``project_out`` after the last
    layer, and no final norm (its layers norm after attention instead). A logit lens goes
    through ln_final, so refusing ln_final refuses the lens too."""
    out = {}
    if config.word_embed_proj_dim != config.hidden_size:
        out["embeddings"] = (f"this OPT checkpoint's embeddings are {config.word_embed_proj_dim} wide and "
                             f"project_in widens them to the residual stream's {config.hidden_size}",
                             "read block_input at layer 0, the residual stream the first layer sees, instead")
        out["ln_final"] = ("this OPT checkpoint applies project_out between its last layer and the head, "
                           "so neither the final norm nor a lens through it and lm_head is its head",
                           "read logits, or lm_head, instead")
    if not config.do_layer_norm_before or getattr(config, "_remove_final_layer_norm", False):
        out["ln_final"] = ("this OPT checkpoint has no final norm (it norms after each attention instead), "
                           "so there is no final norm for a lens to apply either",
                           "read block_output at the last layer, or logits, instead")
    return out


def _bloom_variant(config) -> dict:
    """BLOOM with ``slow_but_exact`` and ``pretraining_tp > 1`` multiplies by slices of the
    projections' weights without calling the modules, so a hook there would never fire."""
    if not (config.slow_but_exact and config.pretraining_tp > 1):
        return {}
    reason = ("this BLOOM config (slow_but_exact with pretraining_tp > 1) multiplies by slices of the "
              "dense projections' weights without calling them, so nothing at their boundary is the value",
              "load it with slow_but_exact false (the same weights) instead")
    return {c: reason for c in ("attention_output", "attention_z", "mlp_output", "mlp_hidden")}


_GPT2_PORTS = _ports("attn", "mlp", "c_proj", "c_proj")
_GEMMA_CAP = dict(softcap_field="final_logit_softcapping")

FAMILIES: dict[str, Layout] = {layout.family: layout for layout in (
    _llama_like("llama"), _llama_like("mistral"), _llama_like("qwen2"), _llama_like("qwen3"),
    _llama_like("gemma"), _llama_like("gemma2", **_GEMMA_CAP), _llama_like("gemma3_text", **_GEMMA_CAP),
    _llama_like("phi3"), _llama_like("olmo"), _llama_like("olmo2"), _llama_like("stablelm"),
    _llama_like("smollm3"),
    _llama_like("cohere", multiply_field="logit_scale"),
    _llama_like("granite", divide_field="logits_scaling"),
    Layout("starcoder2", "model.layers", "model.norm", _ports("self_attn", "mlp", "o_proj", "c_proj")),
    _moe("qwen2_moe"), _moe("qwen3_moe"), _moe("mixtral"), _moe("olmoe"),
    # Gemma-3 4b/12b/27b: a multimodal model whose text half is a Gemma-3 text model. Its
    # forward returns lm_head's output as it is: the final softcap is the text-only model's.
    Layout("gemma3", "model.language_model.layers", "model.language_model.norm", _LLAMA_PORTS,
           multimodal=True),
    Layout("phi", "model.layers", "model.final_layernorm", _ports("self_attn", "mlp", "dense", "fc2")),
    # attention_pattern=False: nnterp 1.3.0's route to the pattern (module_attn_dropout_0 on GPT-2,
    # self__attn_0 on GPT-J) is not in transformers 5's attention source, and fails its own check.
    Layout("gpt2", "transformer.h", "transformer.ln_f", _GPT2_PORTS, d_mlp_fields=("n_inner",),
           attention_pattern=False),
    Layout("gpt_bigcode", "transformer.h", "transformer.ln_f", _GPT2_PORTS, d_mlp_fields=("n_inner",)),
    Layout("gpt_neox", "gpt_neox.layers", "gpt_neox.final_layer_norm",
           _ports("attention", "mlp", "dense", "dense_4h_to_h")),
    Layout("gptj", "transformer.h", "transformer.ln_f", _ports("attn", "mlp", "out_proj", "fc_out"),
           d_mlp_fields=("n_inner",), attention_pattern=False),
    # GPT-Neo's attention module wraps the self-attention that owns the projections and computes the
    # pattern (its _attn): that inner module is the one the seam's routine and listener sit on.
    Layout("gpt_neo", "transformer.h", "transformer.ln_f",
           _ports("attn.attention", "mlp", "out_proj", "c_proj", attention_output="attn"),
           attention_seam="gpt_neo", attention_pattern=False),
    # OPT's layer has no MLP module: fc1 → activation → fc2 are the layer's own children, and
    # the layer hands them its tokens flattened to (rows·seq, width).
    Layout("opt", "model.decoder.layers", "model.decoder.final_layer_norm",
           _ports("self_attn", None, "out_proj", "fc2", mlp_input="fc1", mlp_output="fc2", flat_mlp=True),
           d_mlp_fields=("ffn_dim",), variant=_opt_variant),
    # BLOOM's attention and MLP return residual + contribution: the contribution is the output of
    # the projection before that add.
    Layout("bloom", "transformer.h", "transformer.ln_f",
           _ports("self_attention", "mlp", "dense", "dense_4h_to_h",
                  attention_output="self_attention.dense", mlp_output="mlp.dense_4h_to_h"),
           d_mlp_fields=(), attention_seam="bloom", variant=_bloom_variant),
    Layout("falcon", "transformer.h", "transformer.ln_f",
           _ports("self_attention", "mlp", "dense", "dense_4h_to_h"), d_mlp_fields=("ffn_hidden_size",)),
)}


# --- a layout a document names: the escape hatch for a family no table knows -------------------

def custom_layout(modules: Mapping[str, str], family: str) -> Layout:
    """The layout a document's ``model.modules`` names (``document.spec.Modules``, already validated).

    A custom layout takes the MLP width from ``intermediate_size`` (else 4·d_model; the
    loaded engine checks the projection's width against it) and applies no output
    transform to a lens: a family that scales its logits needs a table entry.
    """
    attention, mlp = modules["attention"], modules["mlp"]
    ports = {ATTENTION: Port(attention, OUTPUT), "attention_output": _port("attention_output", attention),
             "mlp_input": _port("mlp_input", mlp),
             "mlp_output": _port("mlp_output", mlp)}
    absent = {}
    if modules.get("attention_projection"):
        ports["attention_z"] = _port("attention_z", modules["attention_projection"])
    else:
        absent["attention_z"] = ("the document's model.modules names no attention_projection",
                                 'add "attention_projection": "<attention>.<output projection>"')
    if modules.get("mlp_projection"):
        ports["mlp_hidden"] = _port("mlp_hidden", modules["mlp_projection"])
    else:
        absent["mlp_hidden"] = ("the document's model.modules names no mlp_projection",
                                'add "mlp_projection": "<mlp>.<down projection>"')
    return Layout(family=f"{family} (model.modules)", layers=modules["layers"], ln_final=modules["ln_final"],
                  ports=ports, absent=absent, attention_seam=None, attention_pattern=False)


# The config-reading rules for a family no table knows: its MLP width is ``intermediate_size``,
# else 4·d_model. It addresses nothing: a module of an unknown family is refused by name.
UNKNOWN = Layout(family="", layers="", ln_final="", ports={})


def layout_for(model_type: str, modules: Optional[Mapping[str, str]] = None) -> Optional[Layout]:
    """The family's layout: the document's own ``model.modules`` first, then the table; None if neither."""
    if modules:
        return custom_layout(modules, model_type)
    return FAMILIES.get(model_type)

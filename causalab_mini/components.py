"""One record per component: what it is, where in the model it is read, and how wide it is.

The compiler (``model/facts.py``: widths and head counts), the engines' module finder
(``engine/standardize.py``: which module and which side of it), the family layouts
(``layouts.py``: the side each port reads) and the pytest plugin's strategies
(the widths a drawn site fits) all read this table, so a width or a side is written once.
``vocab`` re-exports it as part of the public vocabulary.

Plain data, standard library only: importing it imports no torch, transformers or pydantic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

# Which side of its module a component is read at. INSIDE: computed inside the module's
# forward, at neither boundary, so only an engine tracing through the forward reaches it.
INPUT, OUTPUT, INSIDE = "input", "output", "inside"

# The module a component is read at, by the role it plays in the model. Where each role is in a
# given model: the first three through transformers' own accessors (``get_input_embeddings``,
# ``get_output_embeddings``, the model's returned ``.logits``), the rest through the family's
# layout (``layouts.py``), which may place a component at another module of the same
# role when the family's code computes it there (BLOOM's attention output is its projection's).
INPUT_EMBEDDINGS = "input_embeddings"
OUTPUT_EMBEDDINGS = "output_embeddings"
MODEL = "model"  # the causal LM itself
LN_FINAL = "ln_final"
LAYER = "layer"  # one decoder layer of the layout's layer list
ATTENTION = "attention"  # a layer's attention module
ATTENTION_PROJECTION = "attention_projection"  # the attention's output projection
MLP = "mlp"
MLP_PROJECTION = "mlp_projection"  # the MLP's down projection

# The roles transformers publishes, which need no family layout to find.
PUBLISHED_ROLES = frozenset({INPUT_EMBEDDINGS, OUTPUT_EMBEDDINGS, MODEL})
# The projections whose input is a component: a loaded module there must take exactly its width.
PROJECTIONS = frozenset({ATTENTION_PROJECTION, MLP_PROJECTION})

# A width rule: the model size a component is as wide as. Each names an attribute of the model's
# sizes — ``ModelFacts``, or anything with the same attributes (the plugin's ``model_bounds``):
# d_model, d_mlp, vocab_size, n_heads, n_kv_heads, head_dim.
RESIDUAL, MLP_WIDTH, VOCAB = "d_model", "d_mlp", "vocab_size"
HEADS = "heads"  # the component's heads × head_dim
UNFIXED = None  # no width the model alone fixes (the pattern's keys are one forward's)


@dataclass(frozen=True)
class Component:
    name: str
    kind: str  # "module": a module's output/input; "interior": inside a module's forward; "output": the model's return
    selector: Optional[str]  # "units", "heads" or None
    layered: bool
    order: int  # forward order inside a layer (or among the non-layered ones)
    width: str  # how the width is derived, for humans
    where: str  # what it is, for humans
    module: str  # the role of the module it is read at (INPUT_EMBEDDINGS, LAYER, ATTENTION, ...)
    io: str  # INPUT or OUTPUT of that module, or INSIDE its forward
    size: Optional[str]  # its width rule: RESIDUAL, MLP_WIDTH, VOCAB, HEADS or UNFIXED
    head_count: str = "n_heads"  # the size counting its heads: n_kv_heads for grouped-query k and v
    residual: bool = False  # d_model-wide residual-stream value (a `view: "logits"` may project it)

    @property
    def hooks(self) -> bool:
        """Reachable at a module boundary, so the hooks engine (a forward hook) can tap it."""
        return self.io != INSIDE

    def heads_of(self, sizes: Any) -> int:
        """How many heads it has on a model of these sizes."""
        return getattr(sizes, self.head_count)

    def width_of(self, sizes: Any) -> Optional[int]:
        """Its last-axis width on a model of these sizes (before a units/heads selection), or None
        where the model alone does not fix it."""
        if self.size is UNFIXED:
            return None
        if self.size == HEADS:
            return self.heads_of(sizes) * sizes.head_dim
        return getattr(sizes, self.size)


_C = Component
COMPONENTS: dict[str, Component] = {c.name: c for c in (
    _C("embeddings", "module", "units", False, 0, "d_model", "token embedding output",
       INPUT_EMBEDDINGS, OUTPUT, RESIDUAL, residual=True),
    _C("block_input", "module", "units", True, 0, "d_model", "residual entering layer l",
       LAYER, INPUT, RESIDUAL, residual=True),
    _C("attention_query", "interior", "heads", True, 1, "len(heads)*head_dim",
       "per-head query after projection (rotary applied where the family does)", ATTENTION, INSIDE, HEADS),
    _C("attention_key", "interior", "heads", True, 2, "len(heads)*head_dim",
       "per-head key after projection (rotary applied where the family does)", ATTENTION, INSIDE, HEADS,
       head_count="n_kv_heads"),
    _C("attention_value", "interior", "heads", True, 3, "len(heads)*head_dim",
       "per-head value after projection", ATTENTION, INSIDE, HEADS, head_count="n_kv_heads"),
    _C("attention_scores", "interior", "heads", True, 4, "keys of the padded batch",
       "attention scores: what enters the softmax — q·k scaled, the family's softcap, the mask "
       "added (a masked key holds the dtype's lowest number; GPT-Neo's, masked twice, -inf)", ATTENTION, INSIDE, UNFIXED),
    _C("attention_probs", "interior", "heads", True, 5, "keys of the padded batch",
       "attention pattern: the softmax of the scores", ATTENTION, INSIDE, UNFIXED),
    _C("attention_z", "interior", "heads", True, 6, "len(heads)*head_dim",
       "per-head result: the input of the output projection", ATTENTION_PROJECTION, INPUT, HEADS),
    _C("attention_output", "module", "units", True, 7, "d_model",
       "attention module output, before the residual add", ATTENTION, OUTPUT, RESIDUAL, residual=True),
    _C("mlp_input", "module", "units", True, 8, "d_model", "MLP module input", MLP, INPUT, RESIDUAL,
       residual=True),
    _C("mlp_hidden", "interior", "units", True, 9, "d_mlp", "MLP neurons: the input of the down projection",
       MLP_PROJECTION, INPUT, MLP_WIDTH),
    _C("mlp_output", "module", "units", True, 10, "d_model", "MLP module output", MLP, OUTPUT, RESIDUAL,
       residual=True),
    _C("block_output", "module", "units", True, 11, "d_model", "residual leaving layer l",
       LAYER, OUTPUT, RESIDUAL, residual=True),
    _C("ln_final", "module", "units", False, 0, "d_model", "final norm output", LN_FINAL, OUTPUT, RESIDUAL),
    _C("lm_head", "module", None, False, 1, "vocab", "unembedding output", OUTPUT_EMBEDDINGS, OUTPUT, VOCAB),
    _C("logits", "output", None, False, 2, "vocab",
       "the model's returned logits (after softcapping, e.g. Gemma-2)", MODEL, OUTPUT, VOCAB),
)}

# Components with no layer that run before the first layer; the rest run after the last.
BEFORE_LAYERS = frozenset(n for n, c in COMPONENTS.items() if c.module == INPUT_EMBEDDINGS)
VOCAB_WIDE = frozenset(n for n, c in COMPONENTS.items() if c.size == VOCAB)
# Inside the attention forward (q, k, v, the scores, the pattern): the engines find the attention module.
INTERIORS = frozenset(n for n, c in COMPONENTS.items() if c.io == INSIDE)
# (rows, queries, heads·keys): a pattern's keys are one forward's padded width (plan.build keys them).
PATTERNS = frozenset({"attention_scores", "attention_probs"})


@dataclass(frozen=True)
class Address:
    """One place in the model: a component at a layer, narrowed to heads or units."""

    component: str
    layer: Optional[int]
    heads: Optional[tuple[int, ...]]
    units: Optional[tuple[int, ...]]
    stage: int  # -1 before the layers, the layer, or num_layers after them
    order: int  # forward order inside the stage
    full_width: int  # the component's last axis
    width: int  # after the heads/units selection
    columns: Optional[tuple[int, ...]]  # last-axis indices the selection takes (None: all)
    # attention_probs is (rows, queries, heads·keys), heads-major, and its keys are a forward's
    # padded width: a site's address has width 0 and no columns; the compiler gives each
    # forward's ops the address for that forward's keys (build.keyed).

    @property
    def key(self) -> tuple[int, int]:
        """Sort key in forward order; taps are visited in this order inside one forward."""
        return (self.stage, self.order)

    @property
    def site_key(self) -> tuple:
        """Identity of the tensor tapped (selection aside): writes and reads at one site share it."""
        return (self.component, self.layer)

    def spelling(self) -> str:
        text = self.component if self.layer is None else f"{self.component}[{self.layer}]"
        if self.heads is not None:
            text += f".heads{list(self.heads)}".replace(" ", "")
        if self.units is not None:
            text += f".units{list(self.units)}".replace(" ", "")
        return text

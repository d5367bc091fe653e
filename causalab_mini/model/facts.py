"""What the compiler may know about a model: its config and tokenizer, no weights.

``ModelFacts`` answers the compile-time questions — how many layers, how wide a
component is, how many heads — and turns a site into an ``Address``. Every
bound is checked here, so an index past the end is refused naming the field
rather than failing on a tensor inside a trace.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ..components import BEFORE_LAYERS, COMPONENTS, INTERIORS, PATTERNS, PUBLISHED_ROLES, Address
from ..errors import CompileError
from ..layouts import FAMILIES, UNKNOWN, Layout, OutputTransform, layout_for
from ..engines import remote_names, traced_names

TRACED = traced_names()  # the engines that trace through nnsight: nnterp's reach and refusals
REMOTE = remote_names()  # the engines whose forwards run on a server (its own attention function)
# Found through transformers' own published accessors (get_input_embeddings, get_output_embeddings,
# the output's .logits), so they need no family layout.
PUBLISHED = frozenset(n for n, c in COMPONENTS.items() if c.module in PUBLISHED_ROLES)
QKV = frozenset({"attention_query", "attention_key", "attention_value"})


# Where configs keep the positions a model was built for (GPT-2's n_positions is also
# reachable as max_position_embeddings; BLOOM's ALiBi has none, and no bound).
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length")


def _context_length(text) -> Optional[int]:
    for name in CONTEXT_FIELDS:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class ModelFacts:
    key: str
    revision: Optional[str]
    family: str  # config.model_type: llama, gpt2, gemma2, gemma3 (the multimodal one), ...
    num_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_mlp: int
    vocab_size: int
    transform: OutputTransform  # what the model does to lm_head's output before returning logits
    layout: Optional[Layout]  # where the family keeps each component; None: a family no table knows
    tokenizer: Any
    # component -> (problem, fix): what this family, or this checkpoint's config, does not have
    absent: Mapping[str, tuple] = field(default_factory=dict)
    context_length: Optional[int] = None  # positions it was built for; None: no fixed bound (ALiBi)
    # What identifies the weights that run: a local checkpoint's sha256 digest, or the hub commit
    # transformers resolved; recorded in run.json and baselines whether or not the document pins it.
    weights: Optional[str] = None
    config_digest: Optional[str] = None  # its config.json's sha256, recorded beside the weights

    @classmethod
    def from_config(cls, config, tokenizer, *, key: str, revision: Optional[str],
                    modules=None, weights: Optional[str] = None,
                    config_digest: Optional[str] = None) -> "ModelFacts":
        """``modules``: the document's ``model.modules`` (a custom layout), when it names one."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        d_model = text.hidden_size
        n_heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or d_model // n_heads
        if modules is not None and hasattr(modules, "model_dump"):
            modules = modules.model_dump()
        layout = layout_for(config.model_type, modules)
        d_mlp = (layout or UNKNOWN).d_mlp(text, d_model)
        transform = layout.output_transform(text) if layout else OutputTransform()
        return cls(
            key=key, revision=revision, family=config.model_type,
            num_layers=text.num_hidden_layers, d_model=d_model, n_heads=n_heads,
            n_kv_heads=getattr(text, "num_key_value_heads", None) or n_heads,
            head_dim=head_dim, d_mlp=d_mlp, vocab_size=text.vocab_size,
            transform=transform, layout=layout, tokenizer=tokenizer,
            absent=layout.refused(text) if layout else {},
            context_length=_context_length(text),
            weights=weights, config_digest=config_digest,
        )

    @property
    def softcap(self) -> Optional[float]:
        return self.transform.softcap

    # --- the compile-time members an engine also exposes -------------------
    def heads(self, component: str) -> int:
        """Heads a heads-selector component has (key/value heads for grouped-query k and v)."""
        return COMPONENTS[component].heads_of(self)

    def width(self, component: str) -> int:
        """The last-axis width of the whole component (before a units/heads selection): its
        record's width rule (``components.py``) on this model's sizes.

        attention_probs has none here: its last axis is heads × the keys of one forward's
        padded batch, which the compiler fixes per forward (``plan.build``), not per model.
        """
        width = COMPONENTS[component].width_of(self)
        if width is None:  # attention_probs, the one component the model alone does not size
            raise CompileError(component, "an attention pattern's width is heads x the keys of "
                               "one forward's padded batch, so the model alone does not fix it",
                               "take the width from a compiled read or write (its address is per forward)")
        return width

    def stage(self, component: str, layer: Optional[int]) -> int:
        """Where in the forward a component sits: -1 before the layers, num_layers after them."""
        if layer is not None:
            return layer
        return -1 if component in BEFORE_LAYERS else self.num_layers

    def refusal(self, component: str, engine: str) -> Optional[str]:
        """Why ``engine`` cannot reach ``component`` on this model, or None.

        The sentence names the component, the family and what to use instead.
        """
        layout = self.layout
        if layout is None and component not in PUBLISHED:
            known = ", ".join(sorted(FAMILIES))
            return (f"the model family {self.family!r} is not one causalab-mini has a verified layout "
                    f"for (known: {known}), and a guessed module would be a wrong number; name its "
                    "modules in the document's model section: \"modules\": {\"layers\": "
                    "\"model.layers\", \"ln_final\": \"model.norm\", \"attention\": \"self_attn\", "
                    "\"mlp\": \"mlp\", \"attention_projection\": \"self_attn.o_proj\", "
                    "\"mlp_projection\": \"mlp.down_proj\"}")
        if component in self.absent:
            problem, fix = self.absent[component]
            return f"{component} does not exist on {layout.family}: {problem}; {fix}"
        if layout is None:  # a published component (found by transformers' own accessors)
            return None
        seam = layout.attention_seam  # how the attention seam reaches inside: the registry, a routine, None
        if engine not in TRACED and component in INTERIORS and seam is None:
            # Inside attention, the hooks engine listens through the attention seam (engine/attention.py),
            # which knows the families of the layout table, not a document's own modules.
            return (f"{component} is inside {layout.family}'s attention, whose code this project does not "
                    "know (its modules are named by the document), so no seam reaches inside it; read "
                    "attention_z (the per-head result) instead")
        if engine in TRACED and component in QKV:
            if seam is None:
                return (f"{component} is an argument of the attention function call, and {layout.family}'s "
                        "attention is not known to make one; read attention_z (the per-head result) instead")
            if layout.attention_routine and engine in REMOTE:
                # This process's routine (engine/attention_families.py) does not run on a server, and
                # the family's own forward makes no call whose arguments nnsight could trace there.
                return (f"{component} on {layout.family} is reached through the attention routine this "
                        f"project installs on the model in this process, and a remote server runs "
                        f"{layout.family}'s own attention, which computes q, k and v with no attention "
                        "function call; read attention_z (the per-head result) instead")
        if engine in TRACED and component in PATTERNS:
            # The nnterp engine reaches the scores, and a pattern nnterp 1.3.0's own route cannot,
            # through the attention seam (engine/attention.py) — in this process: a remote engine's
            # server runs its own attention.
            here = seam is not None and engine not in REMOTE
            if component == "attention_scores" and not here:
                why = ("a remote server runs its own attention function" if engine in REMOTE else
                       f"{layout.family}'s attention is not known to call it")
                return (f"attention_scores is reached through the attention seam this project serves the "
                        f"model with, and {why}; read attention_probs or attention_z instead")
            if component == "attention_probs" and not (layout.attention_pattern or here):
                return (f"attention_probs on {layout.family} fails nnterp 1.3.0's own load-time check under "
                        "transformers 5 (its route to the pattern does not exist there)"
                        + (", and a remote server runs the family's own attention" if engine in REMOTE else
                           f", and {layout.family}'s attention is not known to the attention seam")
                        + "; read attention_z instead")
        return None

    def locate(self, site, *, path: str, engine: str) -> Address:
        """A site (component, layers, heads, units) as an Address, every bound checked."""
        comp = COMPONENTS[site.component]
        reason = self.refusal(site.component, engine)
        if reason:
            raise CompileError(f"{path}.component", f"the {engine} engine cannot reach {site.component}",
                               reason)
        layer = site.layers[0] if site.layers else None
        if layer is not None and layer >= self.num_layers:
            raise CompileError(f"{path}.layers", f"layer {layer} is past the end: {self.key} has "
                               f"{self.num_layers} layers", f"use 0..{self.num_layers - 1}")
        # attention_probs: 0 until a forward fixes the keys (plan.build gives each forward's
        # ops the address with heads × keys columns); every other width is the model's.
        keyed = site.component in PATTERNS
        full = 0 if keyed else self.width(site.component)
        columns: Optional[tuple[int, ...]] = None
        if site.heads is not None:
            n = self.heads(site.component)
            bad = [h for h in site.heads if h >= n]
            if bad:
                raise CompileError(f"{path}.heads", f"head(s) {bad} past the end: {site.component} "
                                   f"has {n} heads", f"use 0..{n - 1}")
            if not keyed:
                columns = tuple(h * self.head_dim + i for h in site.heads for i in range(self.head_dim))
        if site.units is not None:
            bad = [u for u in site.units if u >= full]
            if bad:
                raise CompileError(f"{path}.units", f"unit(s) {bad} past the end: {site.component} "
                                   f"is {full} wide", f"use 0..{full - 1}")
            columns = tuple(site.units)
        return Address(
            component=site.component, layer=layer,
            heads=tuple(site.heads) if site.heads is not None else None,
            units=tuple(site.units) if site.units is not None else None,
            stage=self.stage(site.component, layer), order=comp.order,
            full_width=full, width=0 if keyed else len(columns) if columns is not None else full,
            columns=columns,
        )


class AnswersFromFacts:
    """The compile-time members an engine answers from its model's ``ModelFacts`` (``self._facts``),
    the same on every engine: the plan compiles against a loaded engine exactly as against the
    config and tokenizer alone. ``locate`` stays each engine's own (its refusals differ)."""

    _facts: ModelFacts

    @property
    def num_layers(self) -> int:
        return self._facts.num_layers

    @property
    def context_length(self):
        return self._facts.context_length

    def width(self, component: str) -> int:
        return self._facts.width(component)

    def heads(self, component: str) -> int:
        return self._facts.heads(component)

    @property
    def tokenizer(self):
        return self._facts.tokenizer

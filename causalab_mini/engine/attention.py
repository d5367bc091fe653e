"""Inside attention through transformers' own seam: one registered attention function (and, for
the two families that bypass it, a routine of their own).

transformers 5 hands every supported family's attention — q, k and v after rotary and any q/k
norms, the 4-D mask, ``scaling=``, ``softcap=`` — to the function its ``AttentionInterface``
registry names (``config._attn_implementation``). ``attention`` below is registered there as
``"causalab"``: the standard eager arithmetic, with a listener on the module that may read and
replace q, k, v, the scores and the pattern on the way. A model served with it computes exactly
what the family's eager path computes (``benchmarks/attention_seam.py`` measures max |Δ logits| =
0 in fp32 on every family of the test matrix that dispatches, and 0 in fp32 and bf16 for the
routines below).

GPT-Neo and BLOOM compute attention in their own code and call no registered function: serving
one installs the family's routine instead (``attention_families.py``: its own arithmetic with the
same listener, chosen by ``layouts.Layout.attention_seam``), and its config names ``"causalab"``
too, so a served model says so in one place (``served``, run.json's ``"attention"``) and builds
its mask with the builder registered under that name — the eager one it built before.

The mask builder is registered under the same name: without it transformers builds no mask for an
unknown implementation, and the model would run without its causal and padding masks, silently.

Layouts the listener sees, as the nnterp engine's arguments of the attention call are seen:
q ``(rows, heads, seq, head_dim)``; k and v ``(rows, kv_heads, seq, head_dim)`` (grouped-query
heads not repeated; after the cache update, so a decoding step's keys are every key); scores and
probs ``(rows, heads, queries, keys)``. The scores are what enters the softmax, the pattern what
leaves it (before dropout). Per family:

* the registry's families: ``q·kᵀ · scaling`` (softcapped where the family caps) plus the 4-D
  mask; a masked key holds the mask's value, the dtype's lowest number. OPT hands q already
  multiplied by ``head_dim ** -0.5`` (its ``scaling`` is 1): its q is that. Falcon-ALiBi folds its
  bias into the mask, so its scores hold it at every key.
* GPT-Neo: ``q·kᵀ`` in float32 (GPT-Neo upcasts q and k, even in a bf16 model) with no
  ``head_dim ** -0.5`` — GPT-Neo does not scale — then its own causal / local-window buffer (a key
  it masks is set to float32's lowest number) and then the 4-D causal and padding mask (which adds
  that number again): a key masked by both holds −inf (the sum overflows: a future key, a padded
  key outside the window), a key masked by one the lowest number. q, k and v are in the model's
  dtype, before that upcast; the pattern is cast back to v's dtype.
* BLOOM: ``alibi + (q·kᵀ) · head_dim ** -0.5`` (one ``baddbmm``; alibi is each head's slope times
  the key's position counted over the row's real tokens) plus the 4-D mask: alibi is in the scores
  at every key, and a masked key holds the dtype's lowest number (the mask swamps the rest).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Optional

import torch

from . import taps as taps_mod

NAME = "causalab"
# What to do when a plan taps inside attention on a model loaded without the seam.
LOAD_FIX = ("load the model with this document (causalab_mini.load(doc), `causalab-mini run` and the "
            "pytest plugin do), or an engine's load(..., attention_seam=True)")
LISTENER = "_causalab_attention_listener"  # the attribute on an attention module a forward sets

_registered: list = []


def register() -> None:
    """Register ``attention`` and its mask builder with transformers (once per process)."""
    if _registered:
        return
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, eager_mask)
    _registered.append(NAME)


def _repeat(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(rows, kv_heads, seq, d) → (rows, kv_heads·groups, seq, d): each key/value head for its queries."""
    if groups == 1:
        return x
    rows, heads, seq, dim = x.shape
    return x[:, :, None].expand(rows, heads, groups, seq, dim).reshape(rows, heads * groups, seq, dim)


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
              **kwargs):
    """The eager attention of every family that dispatches through the registry, listened to.

    ``sliding_window`` (in ``kwargs``) needs nothing here: the window is already in the mask, as
    in every family's eager path. The softmax runs in float32 and is cast back, as they do.
    """
    listen: Optional[Callable] = getattr(module, LISTENER, None)
    if listen is not None:
        query, key, value = (listen(part, x) for part, x in
                             (("attention_query", query), ("attention_key", key), ("attention_value", value)))
    if scaling is None:  # the eager default (Gemma-2/3, GPT-2 pass none): head_dim ** -0.5
        scaling = query.shape[-1] ** -0.5
    groups = query.shape[1] // key.shape[1]
    keys, values = _repeat(key, groups), _repeat(value, groups)
    scores = torch.matmul(query, keys.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask
    if listen is not None:
        scores = listen("attention_scores", scores)
    probs = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if listen is not None:
        probs = listen("attention_probs", probs)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(probs, values).transpose(1, 2).contiguous()
    return out, probs


def serve(model) -> str:
    """Serve ``model`` with the seam: the registered function (every attention module of its config
    tree), or — a family whose attention computes its pattern in its own code — that family's
    routine; returns the implementation it had, for the record. Serving a served model changes nothing."""
    register()
    before = getattr(model.config, "_attn_implementation", None) or "eager"
    if before == NAME:
        return before
    routine = _routine(model)
    if routine is None:
        model.set_attn_implementation(NAME)
    else:
        from . import attention_families

        attention_families.install(model, routine, LISTENER)
        # set_attn_implementation refuses (with a warning, changing nothing) a family that does not
        # dispatch, so the config is told directly: the family reads it only to pick its mask
        # builder, and NAME's is the eager one (register) it had.
        model.config._attn_implementation = NAME
    return before


def _routine(model) -> Optional[str]:
    """The family routine ``model`` is served with (``layouts.Layout.attention_routine``), or None."""
    from ..layouts import FAMILIES

    layout = FAMILIES.get(getattr(model.config, "model_type", None))
    return layout.attention_routine if layout is not None else None


def served(model) -> bool:
    return getattr(model.config, "_attn_implementation", None) == NAME


@contextmanager
def listening(listeners: dict):
    """``{attention module: listener(part, tensor) -> tensor}`` set for the duration of one forward,
    removed however it ends."""
    for module, listen in listeners.items():
        setattr(module, LISTENER, listen)
    try:
        yield
    finally:
        for module in listeners:
            if getattr(module, LISTENER, None) is not None:
                delattr(module, LISTENER)


# --- the listener's view: a part as (rows, seq, columns), the way taps run --------------------

def as_rows(part: str, x: torch.Tensor) -> torch.Tensor:
    """q/k/v (rows, heads, seq, d) → (rows, seq, heads·d); scores/probs (rows, heads, q, k) →
    (rows, q, heads·k): heads-major columns, as the compiler's addresses count them."""
    rows, heads, seq, last = x.shape
    return x.transpose(1, 2).reshape(rows, seq, heads * last)


def from_rows(like: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``as_rows``'s inverse, to ``like``'s shape."""
    rows, heads, seq, last = like.shape
    return new.reshape(rows, seq, heads, last).transpose(1, 2)


def listener(parts: dict, forward, values: dict, featurizers: dict, step: list):
    """What the seam calls on one attention module: the taps at each part it was given
    (``{part: [taps]}``, in the forward's order), each part seen as (rows, seq, columns), the taps'
    writes and reads run, the part handed back. ``step[0]``: the decode step of the call."""
    def listen(part, x):
        if part not in parts:
            return x
        seen = new = as_rows(part, x)
        for tap in parts[part]:  # a shared forward: several points' selections of one part
            new = taps_mod.run_tap(new, tap, forward, values, featurizers, None, step[0])
        return x if new is seen else from_rows(x, new)
    return listen


def listeners(tap_list, module_of, forward, values: dict, featurizers: dict, step: list) -> dict:
    """``{attention module: listener}`` for the taps inside attention (``module_of(address)`` finds
    a tap's attention module); several taps at one part — a shared forward's points — run in order."""
    parts: dict = {}
    for tap in tap_list:
        parts.setdefault(module_of(tap.address), {}).setdefault(tap.address.component, []).append(tap)
    return {module: listener(p, forward, values, featurizers, step) for module, p in parts.items()}

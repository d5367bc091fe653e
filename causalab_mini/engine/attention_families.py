"""The attention seam for the families whose attention does not go through transformers' registry.

GPT-Neo (``GPTNeoSelfAttention._attn``) and BLOOM (``BloomAttention.forward``) compute their
attention in their own code and never call the function ``config._attn_implementation`` names, so
the registered ``attention.attention`` never sees them. For each, ``install`` swaps the class of
every such attention module for a subclass here whose method is the family's own arithmetic,
torch call for torch call in the same order — so it computes the same bits in any dtype — with the
module's listener (the attribute ``attention.LISTENER``, handed to ``install``) called where ``attention.attention`` calls it: q, k, v
as the attention gets them (after the head split and the cache update), the scores as they enter
the softmax, the pattern as it leaves it (before dropout). What the listener sees, per family, is
in ``attention.py``'s docstring.

Why the class, not an instance attribute: nnsight wraps each module's forward when it builds its
envoys, keeping the forward it found then, and ``unwrap.py`` gives a module back its class's
forward. So the nnterp engine installs the routine before it hands the model over, and the
subclass's method is what both wrap and unwrap find. An instance-level forward that accelerate's
device-map hooks put there calls the method it kept (``_old_forward``): that one is pointed at the
routine. Any other instance-level replacement of the method, and a module of another attention
class (GPT-Neo loaded with flash attention), is refused: the routine would not run, silently.

Each routine is the code of transformers 5.x's ``modeling_gpt_neo.py`` / ``modeling_bloom.py``
with the listener added; ``tests/test_attention_seam.py`` holds both to those files' own forward.
"""
from __future__ import annotations

import types

import torch
from torch import nn
from transformers.models.bloom import modeling_bloom
from transformers.models.gpt_neo import modeling_gpt_neo

from ..errors import EngineError


class SeamedGPTNeoSelfAttention(modeling_gpt_neo.GPTNeoSelfAttention):
    """GPT-Neo's self-attention with the seam's listener in ``_attn``."""

    listener = ""  # the attribute a forward's listener is set under (``install``: attention.LISTENER)

    def _attn(self, query, key, value, attention_mask=None):
        listen = getattr(self, self.listener, None)
        if listen is not None:  # in the model's dtype, before GPT-Neo's upcast of q and k
            query, key, value = (listen(part, x) for part, x in
                                 (("attention_query", query), ("attention_key", key), ("attention_value", value)))
        # GPT-Neo's own: q·kᵀ in float32, unscaled; its causal / local-window buffer, then the
        # additive (padding) mask; softmax; cast to v's dtype; dropout.
        query = query.to(torch.float32)
        key = key.to(torch.float32)
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length : key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.tensor(mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        if listen is not None:
            attn_weights = listen("attention_scores", attn_weights)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.to(value.dtype)
        if listen is not None:
            attn_weights = listen("attention_probs", attn_weights)
        attn_weights = self.attn_dropout(attn_weights)
        attn_output = torch.matmul(attn_weights, value)
        return attn_output, attn_weights


class SeamedBloomAttention(modeling_bloom.BloomAttention):
    """BLOOM's attention with the seam's listener in its forward."""

    listener = ""  # as SeamedGPTNeoSelfAttention's

    def forward(self, hidden_states, residual, alibi, attention_mask, layer_past=None, use_cache=False,
                output_attentions=False, **kwargs):
        listen = getattr(self, self.listener, None)
        batch_size, q_length, _ = hidden_states.shape
        fused_qkv = self.query_key_value(hidden_states)
        query_layer, key_layer, value_layer = self._reshape(fused_qkv)
        if layer_past is not None:
            key_layer, value_layer = layer_past.update(key_layer, value_layer, self.layer_idx)
        if listen is not None:  # (rows, heads, seq, head_dim), the cache's keys included, as the registry's
            query_layer, key_layer, value_layer = (
                listen(part, x) for part, x in (("attention_query", query_layer), ("attention_key", key_layer),
                                                ("attention_value", value_layer)))
        query_layer = query_layer.reshape(batch_size * self.num_heads, -1, self.head_dim)
        key_layer = key_layer.reshape(batch_size * self.num_heads, -1, self.head_dim).transpose(-1, -2)
        value_layer = value_layer.reshape(batch_size * self.num_heads, -1, self.head_dim)
        # BLOOM's own: alibi + (q·kᵀ)·inv_norm_factor in one baddbmm, then the additive mask.
        attention_scores = alibi.baddbmm(batch1=query_layer, batch2=key_layer, beta=self.beta,
                                         alpha=self.inv_norm_factor)
        attn_weights = attention_scores.view(batch_size, self.num_heads, q_length, -1)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        if listen is not None:
            attn_weights = listen("attention_scores", attn_weights)
        attention_probs = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_layer.dtype)
        if listen is not None:
            attention_probs = listen("attention_probs", attention_probs)
        attention_probs = self.attention_dropout(attention_probs)
        # reshape, not BLOOM's view: a pattern the listener replaced may not be contiguous (the
        # same values either way)
        attention_probs_reshaped = attention_probs.reshape(batch_size * self.num_heads, q_length, -1)
        context_layer = torch.bmm(attention_probs_reshaped, value_layer)
        context_layer = self._merge_heads(context_layer)
        if self.pretraining_tp > 1 and self.slow_but_exact:  # the tensor-parallel checkpoints' own sum
            slices = self.hidden_size / self.pretraining_tp
            output_tensor = torch.zeros_like(context_layer)
            for i in range(self.pretraining_tp):
                output_tensor = output_tensor + nn.functional.linear(
                    context_layer[:, :, int(i * slices) : int((i + 1) * slices)],
                    self.dense.weight[:, int(i * slices) : int((i + 1) * slices)],
                )
        else:
            output_tensor = self.dense(context_layer)
        output_tensor = modeling_bloom.dropout_add(output_tensor, residual, self.hidden_dropout, self.training)
        return output_tensor, attention_probs


# routine -> (the family's eager attention class, the subclass that replaces it, the method it replaces)
ROUTINES = {
    "gpt_neo": (modeling_gpt_neo.GPTNeoSelfAttention, SeamedGPTNeoSelfAttention, "_attn"),
    "bloom": (modeling_bloom.BloomAttention, SeamedBloomAttention, "forward"),
}


def _accelerate_kept(module, base, method: str) -> bool:
    """Whether ``module``'s instance-level ``method`` is accelerate's hook around the family's own
    (``add_hook_to_module`` keeps it as ``_old_forward`` and calls that by name at every call)."""
    kept = module.__dict__.get("_old_forward")
    return (method == "forward" and "_hf_hook" in module.__dict__
            and getattr(kept, "__func__", None) is getattr(base, method))


def install(model: nn.Module, routine: str, listener: str) -> int:
    """Every attention module of ``model`` that ``routine`` replaces, given its seamed class, which
    calls the listener a forward sets under the attribute ``listener``; returns how many. A module
    of the family's attention under another class (a flash-attention kernel) is refused before any
    is changed."""
    base, seamed, method = ROUTINES[routine]
    seamed.listener = listener
    found = []
    for name, module in model.named_modules():
        if type(module) in (base, seamed):
            if method in module.__dict__ and not _accelerate_kept(module, base, method):
                raise EngineError("model", f"{name}.{method} is replaced on the module itself, so the attention "
                                  f"seam's routine, which replaces {base.__name__}.{method}, would never run",
                                  "load the model without that patch")
            found.append(module)
        elif isinstance(module, base):
            raise EngineError("model", f"{name} is a {type(module).__name__}, whose forward is not "
                              f"{base.__name__}'s arithmetic, so the attention seam cannot reach inside it",
                              "load the model with eager attention")
    if not found:
        raise EngineError("model", f"this {routine} model has no {base.__name__} module for the attention "
                          "seam's routine", "read attention_z (the per-head result) instead")
    for module in found:
        module.__class__ = seamed
        if method in module.__dict__:  # accelerate's hook: it calls the method it kept
            module._old_forward = types.MethodType(getattr(seamed, method), module)
    return len(found)

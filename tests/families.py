"""Tiny random checkpoints of the transformer families researchers bring, built at test time.

Each entry is a transformers config class and the arguments that make it small
(2 layers, 32 wide, an MLP 48 wide so a width taken as 4·d_model is caught, grouped
query heads where the family has them). ``build`` writes ``save_pretrained`` output —
safetensors, config, the shipped tiny-llama tokenizer — into a folder, with a fixed
seed, so the checkpoint is loaded the way a user's is: ``from_pretrained(path)``.

Nothing here imports causalab_mini: the matrix test holds the project to these
models and to its own hand-written hooks.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from paths import MODELS

TOKENIZER = MODELS / "tiny-llama"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

D, HEADS, KV, LAYERS, MLP, POSITIONS = 32, 4, 2, 2, 48, 128
# The shipped tokenizer's own size, so every id it produces has an embedding row.
VOCAB = json.loads((TOKENIZER / "config.json").read_text())["vocab_size"]

_LLAMA_LIKE = dict(hidden_size=D, num_attention_heads=HEADS, num_key_value_heads=KV,
                   num_hidden_layers=LAYERS, intermediate_size=MLP, vocab_size=VOCAB,
                   max_position_embeddings=POSITIONS)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24)

# family name -> (config class name, arguments)
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", _LLAMA_LIKE),
    "mistral": ("MistralConfig", _LLAMA_LIKE),
    "qwen2": ("Qwen2Config", _LLAMA_LIKE),
    "qwen3": ("Qwen3Config", {**_LLAMA_LIKE, "head_dim": 8}),
    "qwen2_moe": ("Qwen2MoeConfig", {**_LLAMA_LIKE, **_MOE, "shared_expert_intermediate_size": 40,
                                      "decoder_sparse_step": 1, "mlp_only_layers": []}),
    "qwen3_moe": ("Qwen3MoeConfig", {**_LLAMA_LIKE, **_MOE, "head_dim": 8, "decoder_sparse_step": 1,
                                      "mlp_only_layers": []}),
    "mixtral": ("MixtralConfig", {**_LLAMA_LIKE, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "olmoe": ("OlmoeConfig", {**_LLAMA_LIKE, "num_experts": 4, "num_experts_per_tok": 2}),
    "gemma": ("GemmaConfig", {**_LLAMA_LIKE, "head_dim": 8}),
    "gemma2": ("Gemma2Config", {**_LLAMA_LIKE, "head_dim": 8, "final_logit_softcapping": 5.0,
                                "query_pre_attn_scalar": 8}),
    "gemma3_text": ("Gemma3TextConfig", {**_LLAMA_LIKE, "head_dim": 8, "final_logit_softcapping": 5.0,
                                         "query_pre_attn_scalar": 8, "sliding_window": 4}),
    "gemma3": ("Gemma3Config", None),  # multimodal: built in _config below
    "phi": ("PhiConfig", {**_LLAMA_LIKE}),
    "phi3": ("Phi3Config", {**_LLAMA_LIKE}),
    "gpt2": ("GPT2Config", dict(n_embd=D, n_head=HEADS, n_layer=LAYERS, n_inner=MLP, vocab_size=VOCAB,
                                n_positions=POSITIONS)),
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=D, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
                                       intermediate_size=MLP, vocab_size=VOCAB,
                                       max_position_embeddings=POSITIONS)),
    "gptj": ("GPTJConfig", dict(n_embd=D, n_head=HEADS, n_layer=LAYERS, n_inner=MLP, vocab_size=VOCAB,
                                n_positions=POSITIONS, rotary_dim=4)),
    "gpt_neo": ("GPTNeoConfig", dict(hidden_size=D, num_heads=HEADS, num_layers=LAYERS,
                                     intermediate_size=MLP, vocab_size=VOCAB,
                                     max_position_embeddings=POSITIONS,
                                     attention_types=[[["global", "local"], 1]], window_size=4)),
    "gpt_bigcode": ("GPTBigCodeConfig", dict(n_embd=D, n_head=HEADS, n_layer=LAYERS, n_inner=MLP,
                                             vocab_size=VOCAB, n_positions=POSITIONS, multi_query=True)),
    "opt": ("OPTConfig", dict(hidden_size=D, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
                              ffn_dim=MLP, vocab_size=VOCAB, max_position_embeddings=POSITIONS,
                              word_embed_proj_dim=D)),
    "bloom": ("BloomConfig", dict(hidden_size=D, n_head=HEADS, n_layer=LAYERS, vocab_size=VOCAB)),
    "falcon": ("FalconConfig", dict(hidden_size=D, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
                                    vocab_size=VOCAB, ffn_hidden_size=MLP, max_position_embeddings=POSITIONS)),
    "olmo": ("OlmoConfig", _LLAMA_LIKE),
    "olmo2": ("Olmo2Config", _LLAMA_LIKE),
    "stablelm": ("StableLmConfig", _LLAMA_LIKE),
    "starcoder2": ("Starcoder2Config", _LLAMA_LIKE),
    "cohere": ("CohereConfig", {**_LLAMA_LIKE, "logit_scale": 0.5}),
    "smollm3": ("SmolLM3Config", _LLAMA_LIKE),
    "granite": ("GraniteConfig", {**_LLAMA_LIKE, "logits_scaling": 4.0, "residual_multiplier": 0.5,
                                  "embedding_multiplier": 2.0, "attention_multiplier": 0.3}),
}
# Checkpoints whose config changes the family's structure: OPT-350m (narrow embeddings, no final
# norm), Falcon-40B/180B (new decoder architecture), Falcon-RW (ALiBi, serial attention), a serial
# GPT-NeoX, and BLOOM's slow-but-exact tensor-parallel path.
VARIANTS: dict[str, tuple[str, dict]] = {
    "opt_350m": ("OPTConfig", {**FAMILIES["opt"][1], "word_embed_proj_dim": 16, "do_layer_norm_before": False}),
    "falcon_new_decoder": ("FalconConfig", {**FAMILIES["falcon"][1], "new_decoder_architecture": True,
                                            "num_kv_heads": 2}),
    "falcon_alibi": ("FalconConfig", {**FAMILIES["falcon"][1], "alibi": True, "parallel_attn": False,
                                      "multi_query": False}),
    "gpt_neox_serial": ("GPTNeoXConfig", {**FAMILIES["gpt_neox"][1], "use_parallel_residual": False}),
    "bloom_slow_but_exact": ("BloomConfig", {**FAMILIES["bloom"][1], "slow_but_exact": True, "pretraining_tp": 2}),
}
FAMILIES.update(VARIANTS)


def _config(family: str):
    import transformers

    cls_name, kwargs = FAMILIES[family]
    cls = getattr(transformers, cls_name)
    if family == "gemma3":
        text = dict(FAMILIES["gemma3_text"][1])
        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      image_size=28, patch_size=14)
        text.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return cls(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                   image_token_index=VOCAB - 1, boi_token_index=VOCAB - 2, eoi_token_index=VOCAB - 3)
    return cls(**kwargs, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def build(family: str, folder: Path, seed: int = 0) -> Path:
    """A tiny random checkpoint of ``family`` saved in ``folder`` (made if absent); returns it."""
    import torch
    import transformers

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(seed)
    config = _config(family)
    if family == "gemma3":
        model = transformers.Gemma3ForConditionalGeneration(config)
    else:
        model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # the default init is ~0.02 wide: make every module's numbers matter
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, p.shape[-1] ** -0.5)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (TOKENIZER / name).is_file():
            shutil.copy(TOKENIZER / name, folder / name)
    return folder

"""Is transformers 5's attention-function registry a seam for reading and writing attention?

transformers 5 routes most decoder attention modules through
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)``:
the module computes q, k, v (rotary and q/k norms already applied, the cache already updated)
and hands them, with the 4-D mask and ``scaling=`` / ``dropout=`` / ``softcap=`` /
``sliding_window=`` keywords, to one function that returns ``(z, probs)``. A function registered
under a new name and chosen with ``from_pretrained(..., attn_implementation=NAME)`` therefore sees
every layer's attention: q, k, v, the pre-softmax scores and the pattern, and can change the
pattern before it is multiplied into v.

This script registers one generic function, ``causalab_attention`` (the standard eager math plus
an observer hook that may return replacement probabilities), loads every family of
``tests/families.py`` (tiny random 2-layer checkpoints, fp32) once with ``attn_implementation=
"eager"`` and once with ``"causalab"``, and measures on a batch of two left-padded rows:

- whether the family's attention goes through the registry at all (the hook is called, per layer);
- which keywords the family passes the attention function;
- max |logits(causalab) - logits(eager)| over every position and over real (non-pad) tokens;
- how masked positions appear in the scores the hook sees;
- writing: a replaced pattern (layer 0, head 0, last query: all weight moved onto key 0) against
  the eager model with the same change made by hand (``torch.nn.functional.softmax`` patched
  for the 4-D attention softmax of layer 0 only), and, for llama, against a from-scratch
  re-implementation of the llama forward that uses no transformers code at all.

Registration has two halves. ``AttentionInterface.register(name, fn)`` makes ``name`` a valid
``attn_implementation`` (``get_correct_attn_implementation`` checks ``ALL_ATTENTION_FUNCTIONS.
valid_keys()``). But ``masking_utils._preprocess_mask_arguments`` returns *no mask at all* for an
implementation that is not a key of ``AttentionMaskInterface``: the model then runs without its
causal and padding masks and nothing raises. So the mask builder must be registered too
(``AttentionMaskInterface.register(name, eager_mask)``: 4-D float masks, 0 where attended and
``finfo(dtype).min`` where not). The script shows the silent failure with a name registered only
in the first interface.

GPT-Neo and BLOOM never call the registry (they compute attention in their own code): the project
serves them with a routine of their own instead (``causalab_mini/engine/attention_families.py``,
installed by ``attention.serve``). For those the script measures the routine the same way: the
eager model against a copy served with it (logits, cached decoding, bf16), and the same pattern
write through the routine's listener against the eager model with the softmax patched.

Run: ``python benchmarks/attention_seam.py`` (builds the checkpoints in a temporary folder;
``--keep DIR`` to reuse a folder, ``--family NAME`` to run some of them).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from families import FAMILIES, build  # noqa: E402  (tests/ on sys.path)

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, eager_mask  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface  # noqa: E402

sys.path.insert(0, str(REPO))
from causalab_mini.engine import attention as seam  # noqa: E402  (the function measured)
from causalab_mini.layouts import FAMILIES as LAYOUTS  # noqa: E402

NAME = "causalab_probe"  # not the project's own name: this script registers its observer around it
TEXTS = ["The quick brown fox jumps over the lazy dog near the river", "Hello world"]
STANDARD = {"scaling", "dropout", "softcap", "sliding_window"}


# ---------------------------------------------------------------------------------------------
# The seam: one generic attention function with an observer hook
# ---------------------------------------------------------------------------------------------

_state: dict = {"hook": None, "calls": 0}


def causalab_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                       sliding_window=None, **kwargs):
    """The project's registered attention function (``causalab_mini/engine/attention.py``: the
    standard eager math with a per-module listener), with this script's observer on its listener.

    query (batch, heads, q, head_dim); key/value (batch, kv_heads, k, head_dim), as the module passes
    them (after rotary / q-k norms; OPT passes q already multiplied by head_dim**-0.5 and scaling=1).
    The hook is called as ``hook(layer, q, k, v, scores, probs, module=..., kwargs=...)`` where k, v are
    repeated to one per query head, ``scores`` are after scaling, softcap and the additive mask
    (masked positions hold ``finfo(dtype).min``, or the alibi bias where the family folds it into the
    mask), ``probs`` are the softmax; a returned tensor replaces ``probs``.
    """
    hook = _state["hook"]
    _state["calls"] += 1
    seen: dict = {}

    def listen(part, x):
        seen[part] = x
        if part != "attention_probs" or hook is None:
            return x
        q, k, v = seen["attention_query"], seen["attention_key"], seen["attention_value"]
        groups = q.shape[1] // k.shape[1]
        all_kwargs = dict(kwargs, scaling=scaling if scaling is not None else q.shape[-1] ** -0.5,
                          dropout=dropout, softcap=softcap, sliding_window=sliding_window,
                          attention_mask=attention_mask)
        replaced = hook(getattr(module, "layer_idx", None), q, seam._repeat(k, groups), seam._repeat(v, groups),
                        seen["attention_scores"], x, module=module, kwargs=all_kwargs)
        return x if replaced is None else replaced.to(x.dtype)

    setattr(module, seam.LISTENER, listen)
    try:
        return seam.attention(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                              softcap=softcap, sliding_window=sliding_window, **kwargs)
    finally:
        delattr(module, seam.LISTENER)


AttentionInterface.register(NAME, causalab_attention)
AttentionMaskInterface.register(NAME, eager_mask)
assert NAME in ALL_ATTENTION_FUNCTIONS.valid_keys()  # what from_pretrained(attn_implementation=NAME) checks
# The silent failure: a valid attn_implementation without a mask builder gets attention_mask=None.
AttentionInterface.register(NAME + "_nomask", causalab_attention)


def _ignoring_softcap(*args, softcap=None, **kwargs):
    return causalab_attention(*args, **kwargs)


# A control: how far off a generic function that dropped the family's softcap would be.
AttentionInterface.register(NAME + "_nocap", _ignoring_softcap)
AttentionMaskInterface.register(NAME + "_nocap", eager_mask)


@contextlib.contextmanager
def hooked(hook):
    _state["hook"], _state["calls"] = hook, 0
    try:
        yield _state
    finally:
        _state["hook"] = None


# ---------------------------------------------------------------------------------------------
# The write used throughout: layer 0, head 0, last query -> all weight on key 0
# ---------------------------------------------------------------------------------------------

WRITE_LAYER, WRITE_HEAD = 0, 0


def rewrite(probs: torch.Tensor) -> torch.Tensor:
    probs = probs.clone()
    probs[:, WRITE_HEAD, -1, :] = 0.0
    probs[:, WRITE_HEAD, -1, 0] = 1.0
    return probs


@contextlib.contextmanager
def eager_softmax_rewrite():
    """Patch torch.nn.functional.softmax so that the eager path's 4-D attention softmax of layer 0 is rewritten.

    The families call ``nn.functional.softmax`` / ``F.softmax`` by attribute at run time, so the patch
    reaches their eager_attention_forward; 4-D calls are the attention ones (MoE routers are 2-D), and
    layers run in order, so the first 4-D call of a forward is layer 0.
    """
    original = torch.nn.functional.softmax
    seen = {"n": 0}

    def patched(x, *args, **kwargs):
        out = original(x, *args, **kwargs)
        if x.dim() == 4:
            if seen["n"] == WRITE_LAYER:
                out = rewrite(out)
            seen["n"] += 1
        return out

    torch.nn.functional.softmax = patched
    try:
        yield seen
    finally:
        torch.nn.functional.softmax = original


# ---------------------------------------------------------------------------------------------
# A llama forward written from the weights, no transformers code
# ---------------------------------------------------------------------------------------------

def llama_by_hand(model, input_ids, attention_mask, write: bool) -> torch.Tensor:
    cfg = model.config
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    D = cfg.hidden_size // H
    eps = cfg.rms_norm_eps
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    B, T = input_ids.shape

    def rms(x, w):
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    pos = torch.arange(T, dtype=torch.float32)  # transformers' default position ids: 0..T-1, padding or not
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.outer(pos, inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rot(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    keep = torch.tril(torch.ones(T, T, dtype=torch.bool))[None, None] & attention_mask.bool()[:, None, None, :]
    x = sd["model.embed_tokens.weight"][input_ids]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = (h @ sd[p + "self_attn.q_proj.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (h @ sd[p + "self_attn.k_proj.weight"].T).view(B, T, KV, D).transpose(1, 2)
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(B, T, KV, D).transpose(1, 2)
        q, k = rot(q), rot(k)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(~keep, torch.finfo(s.dtype).min)
        a = s.softmax(-1)
        if write and i == WRITE_LAYER:
            a = rewrite(a)
        z = (a @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + z @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        g = h @ sd[p + "mlp.gate_proj.weight"].T
        u = h @ sd[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ sd[p + "mlp.down_proj.weight"].T
    x = rms(x, sd["model.norm.weight"])
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return x @ head.T


# ---------------------------------------------------------------------------------------------
# Per-family measurement
# ---------------------------------------------------------------------------------------------

# What the generic function lacks, or what a user of the seam must know, per family (from reading
# transformers/models/<family>/modeling_<family>.py; see the report printed at the end).
NOTES = {
    "gpt_neo": "attention inline (GPTNeoSelfAttention._attn): unscaled q.k in fp32, own causal/local-window "
               "buffer then the padding mask (-inf where both mask); GPT_NEO_ATTENTION_CLASSES has only "
               "eager/flash_attention_2, a custom name -> KeyError at init: the routine replaces _attn",
    "bloom": "attention inline (BloomAttention.forward): alibi.baddbmm(q, k) + mask, never reads "
             "_attn_implementation (a custom name loads and is silently ignored): the routine replaces "
             "the forward",
    "bloom_slow_but_exact": "as bloom",
    "opt": "q reaches the seam pre-multiplied by head_dim**-0.5 (bias included), scaling=1.0",
    "opt_350m": "as opt",
    "falcon_alibi": "alibi/sqrt(head_dim) is folded into attention_mask (batch, heads, q, k): scores "
                    "include it, 'mask' is not 0/-min; no rotary",
    "gpt2": "below fp32 only: eager's softmax is not upcast (input dtype, then .type(v.dtype)); "
            "reorder_and_upcast_attn (fp32 baddbmm) is honoured only when _attn_implementation == 'eager', "
            "so any custom name bypasses it; module has no num_key_value_groups (take it from shapes)",
    "gptj": "below fp32 only: eager computes q.kT with q, k upcast to fp32 (the bf16 column); probs cast "
            "to v.dtype",
    "gpt_neox": "eager has no repeat_kv; partial rotary applied before the seam",
    "gpt_neox_serial": "as gpt_neox",
    "gpt_bigcode": "multi_query: key/value reach the seam with 1 kv head (repeat_kv by shape works)",
    "gemma2": "softcap= passed (tanh before mask); scaling = query_pre_attn_scalar**-0.5",
    "gemma3_text": "sliding layers: window in the mask, sliding_window= passed; q/k RMSNorm before the seam; "
                   "softcap only if attn_logit_softcapping is set",
    "gemma3": "as gemma3_text for the language model; the SigLIP vision tower also dispatches through the "
              "same name (its calls only happen with pixel_values)",
    "qwen3": "q/k RMSNorm before the seam", "qwen3_moe": "q/k RMSNorm before the seam",
    "olmo2": "q/k RMSNorm (over all heads) before the seam",
    "cohere": "interleaved rotary before the seam; logit_scale is on the output",
    "phi": "partial rotary before the seam", "stablelm": "partial rotary before the seam; passes position_ids=",
    "falcon": "passes position_ids=", "falcon_new_decoder": "grouped kv heads; passes position_ids=",
    "granite": "scaling = attention_multiplier (0.3), not head_dim**-0.5",
}


def decode(model, ids, mask, steps: int = 3) -> torch.Tensor:
    """Prefill, then ``steps`` greedy steps with the KV cache; the logits of every step (q length 1)."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        steps_logits = []
        for _ in range(steps):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(nxt)], 1)
            out = model(input_ids=nxt, attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)
            steps_logits.append(out.logits[:, -1])
    return torch.stack(steps_logits)


def load(folder, impl, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation=impl, dtype=dtype).eval()


def written(row: dict, eager, ids, mask, real, out, out_w) -> None:
    """A pattern write's row entries: the same write made by hand in the eager model's softmax,
    how many 4-D softmaxes it saw, how far the write moved the logits, and how far it is from the
    hand-made one on real tokens."""
    with torch.no_grad(), eager_softmax_rewrite() as n4d:
        ref_w = eager(input_ids=ids, attention_mask=mask).logits
    row["softmax4d_calls"] = n4d["n"]
    row["effect"] = float((out_w - out).abs().max())
    row["d_write"] = float((out_w - ref_w)[real].abs().max())


def batch_of(folder: Path):
    """TEXTS as the checkpoint's tokenizer pads them on the left: ids, mask, and the real tokens."""
    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    return batch["input_ids"], batch["attention_mask"], batch["attention_mask"].bool()


def measure(family: str, folder: Path) -> dict:
    row = {"family": family, "notes": NOTES.get(family, "")}
    ids, mask, real = batch_of(folder)

    eager = load(folder, "eager")
    with torch.no_grad():
        ref = eager(input_ids=ids, attention_mask=mask).logits

    try:
        model = load(folder, NAME)
    except Exception as e:  # noqa: BLE001
        row.update(dispatch="no", error=f"load: {type(e).__name__}: {str(e).splitlines()[0][:90]}")
        return row
    row["config_impl"] = model.config._attn_implementation

    seen = {"layers": [], "kw": set(), "scal": set(), "softcap": set(), "sw": set(), "masked": [], "maskshape": None,
            "qkv": None}

    def record(layer, q, k, v, scores, probs, module, kwargs):
        seen["layers"].append(layer)
        seen["kw"] |= {k_ for k_, v_ in kwargs.items() if k_ not in STANDARD | {"attention_mask"}}
        seen["scal"].add(round(float(kwargs["scaling"]), 6))
        if kwargs["softcap"] is not None:
            seen["softcap"].add(kwargs["softcap"])
        if kwargs["sliding_window"] is not None:
            seen["sw"].add(kwargs["sliding_window"])
        m = kwargs["attention_mask"]
        if m is not None:
            seen["maskshape"] = tuple(m.shape)
            masked = m < torch.finfo(m.dtype).min / 2
            if masked.any():
                vals = scores.expand(-1, -1, -1, -1)[masked.expand_as(scores)]
                seen["masked"].append((float(vals.min()), float(vals.max()), bool(torch.isinf(scores).any())))
        seen["qkv"] = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
        return None

    try:
        with torch.no_grad(), hooked(record) as st:
            out = model(input_ids=ids, attention_mask=mask).logits
    except Exception as e:  # noqa: BLE001
        row.update(dispatch="?", error=f"forward: {type(e).__name__}: {str(e).splitlines()[0][:90]}")
        return row
    calls = st["calls"]
    row["dispatch"] = "yes" if calls else "no"
    row["calls"] = calls
    row["layers"] = seen["layers"]
    row["kwargs"] = sorted(seen["kw"])
    row["scaling"] = sorted(seen["scal"])
    row["softcap"] = sorted(seen["softcap"])
    row["sliding_window"] = sorted(seen["sw"])
    row["mask_shape"] = seen["maskshape"]
    row["masked"] = (min(a for a, _, _ in seen["masked"]), max(b for _, b, _ in seen["masked"]),
                     any(c for _, _, c in seen["masked"])) if seen["masked"] else None
    row["qkv"] = seen["qkv"]
    row["d_all"] = float((out - ref).abs().max())
    row["d_real"] = float((out - ref)[real].abs().max())
    if not calls:
        return row

    # Writing: hook returns a replaced pattern at layer 0 vs. eager with softmax patched at layer 0.
    order = {"n": 0}

    def write(layer, q, k, v, scores, probs, module, kwargs):
        idx = order["n"]
        order["n"] += 1
        return rewrite(probs) if idx == WRITE_LAYER else None

    with torch.no_grad(), hooked(write):
        out_w = model(input_ids=ids, attention_mask=mask).logits
    written(row, eager, ids, mask, real, out, out_w)
    if family == "llama":
        with torch.no_grad():
            hand = llama_by_hand(eager, ids, mask, write=False)
            hand_w = llama_by_hand(eager, ids, mask, write=True)
        row["d_hand"] = float((hand - ref)[real].abs().max())
        row["d_hand_write"] = float((hand_w - out_w)[real].abs().max())
        nomask = load(folder, NAME + "_nomask")
        with torch.no_grad():
            row["d_nomask"] = float((nomask(input_ids=ids, attention_mask=mask).logits - ref)[real].abs().max())

    if row["softcap"]:
        with torch.no_grad():
            nocap = load(folder, NAME + "_nocap")(input_ids=ids, attention_mask=mask).logits
        row["d_nocap"] = float((nocap - ref)[real].abs().max())

    # Switching a default-loaded model (sdpa or eager) at run time, and cached greedy decoding.
    try:
        default = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        row["default_impl"] = default.config._attn_implementation
        default.set_attn_implementation(NAME)
        with torch.no_grad(), hooked(None) as st:
            sw = default(input_ids=ids, attention_mask=mask).logits
        row["d_switch"] = float((sw - ref)[real].abs().max()) if st["calls"] else "no calls"
    except Exception as e:  # noqa: BLE001
        row["d_switch"] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    try:
        row["d_decode"] = float((decode(model, ids, mask) - decode(eager, ids, mask)).abs().max())
    except Exception as e:  # noqa: BLE001
        row["d_decode"] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"

    # bf16: where the families' eager dtype handling departs from the generic function's.
    try:
        e16, m16 = load(folder, "eager", torch.bfloat16), load(folder, NAME, torch.bfloat16)
        with torch.no_grad():
            a = e16(input_ids=ids, attention_mask=mask).logits.float()
            b = m16(input_ids=ids, attention_mask=mask).logits.float()
        row["d_bf16"] = float((a - b)[real].abs().max())
    except Exception as e:  # noqa: BLE001
        row["d_bf16"] = f"{type(e).__name__}"
    return row


def measure_routine(family: str, folder: Path) -> dict:
    """A family the registry does not reach, against the routine ``attention.serve`` installs: the
    eager model, and a copy served with the routine (its listener recording and, for the write,
    rewriting layer 0's pattern as ``rewrite`` does)."""
    routine = LAYOUTS[_config_of(folder).model_type].attention_routine
    row: dict = {"routine": routine}
    ids, mask, real = batch_of(folder)
    eager, served = load(folder, "eager"), load(folder, "eager")
    row["before"] = seam.serve(served)
    modules = [m for m in served.modules() if type(m).__name__.startswith("Seamed")]
    row["calls"] = len(modules)
    seen: dict = {}

    def listener(layer, write):
        def listen(part, x):
            seen.setdefault(layer, {})[part] = tuple(x.shape)
            return rewrite(x) if write and layer == WRITE_LAYER and part == "attention_probs" else x
        return listen

    with torch.no_grad():
        ref = eager(input_ids=ids, attention_mask=mask).logits
        with seam.listening({m: listener(i, False) for i, m in enumerate(modules)}):
            out = served(input_ids=ids, attention_mask=mask).logits
        row["layers"] = sorted(seen)
        row["qkv"] = tuple(seen[0][p] for p in ("attention_query", "attention_key", "attention_value"))
        row["d_all"] = float((out - ref).abs().max())
        row["d_real"] = float((out - ref)[real].abs().max())
        with seam.listening({m: listener(i, True) for i, m in enumerate(modules)}):
            out_w = served(input_ids=ids, attention_mask=mask).logits
    written(row, eager, ids, mask, real, out, out_w)
    row["d_decode"] = float((decode(served, ids, mask) - decode(eager, ids, mask)).abs().max())
    e16, m16 = load(folder, "eager", torch.bfloat16), load(folder, "eager", torch.bfloat16)
    seam.serve(m16)
    with torch.no_grad():
        a = e16(input_ids=ids, attention_mask=mask).logits.float()
        b = m16(input_ids=ids, attention_mask=mask).logits.float()
    row["d_bf16"] = float((a - b)[real].abs().max())
    return row


def _config_of(folder: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)


def fmt(x):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.1e}" if x else "0"
    return str(x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="build checkpoints here (reused if present)")
    ap.add_argument("--family", action="append", help="only these families (repeatable)")
    args = ap.parse_args(argv)
    families = args.family or list(FAMILIES)
    torch.manual_seed(0)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()

    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        rows = []
        for fam in families:
            try:
                folder = build(fam, root / fam)
                rows.append(measure(fam, folder))
                if rows[-1].get("dispatch") == "no" and LAYOUTS[_config_of(folder).model_type].attention_routine:
                    rows[-1].update(measure_routine(fam, folder))
                    rows[-1].pop("error", None)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                rows.append({"family": fam, "dispatch": "?", "error": f"{type(e).__name__}: {e}"[:120]})
            r = rows[-1]
            print(f"# {fam}: dispatch={r.get('dispatch')} d_real={fmt(r.get('d_real'))} "
                  f"d_write={fmt(r.get('d_write'))} {r.get('error', '')}", file=sys.stderr, flush=True)

    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}; "
          f"batch: {len(TEXTS)} left-padded rows; fp32 unless said")
    print("Δall/Δreal: max |logits(causalab) - logits(eager)| over all positions / real tokens. "
          "Δwrite: hook-written pattern vs eager with the same write by hand (real tokens); "
          "effect: how much the write moves the logits. bf16: Δreal in bfloat16.\n")
    head = ("family", "registry?", "calls/layers", "extra kwargs seen", "scaling", "softcap/sw", "Δall", "Δreal",
            "Δwrite", "effect", "bf16", "notes")
    print(" | ".join(head))
    print("|".join("---" for _ in head))
    for r in rows:
        if "routine" in r:
            print(" | ".join([r["family"], f"no: routine {r['routine']}", f"{r['calls']}/{r['layers']}", "-", "-",
                              "-", fmt(r["d_all"]), fmt(r["d_real"]), fmt(r["d_write"]), fmt(r["effect"]),
                              fmt(r["d_bf16"]), r.get("notes", "")]))
            continue
        if "error" in r and "d_real" not in r:
            print(" | ".join([r["family"], r.get("dispatch", "?"), "-", "-", "-", "-", "-", "-", "-", "-", "-",
                              (r.get("notes", "") + "; " + r["error"]).strip("; ")]))
            continue
        layers = r.get("layers") or []
        sc = ",".join(str(s) for s in r.get("softcap", [])) or "-"
        sw = ",".join(str(s) for s in r.get("sliding_window", [])) or "-"
        print(" | ".join([
            r["family"], r["dispatch"], f"{r['calls']}/{layers}", ",".join(r.get("kwargs", [])) or "-",
            ",".join(str(s) for s in r.get("scaling", [])) or "-", f"{sc}/{sw}",
            *((fmt(r["d_all"]), fmt(r["d_real"])) if r["calls"] else ("n/a", "n/a")),
            fmt(r.get("d_write")), fmt(r.get("effect")), fmt(r.get("d_bf16")),
            r.get("notes", "")]))
    print()
    for r in rows:
        extra = []
        if r.get("masked"):
            lo, hi, inf = r["masked"]
            extra.append(f"masked scores in [{lo:.4g}, {hi:.4g}], any inf: {inf}; mask {r['mask_shape']}")
        if r.get("qkv"):
            extra.append(f"q,k,v {'as the listener sees them' if 'routine' in r else '(k/v repeated)'} {r['qkv']}")
        if "softmax4d_calls" in r:
            extra.append(f"eager 4-D softmax calls {r['softmax4d_calls']}")
        for key in ("d_switch", "d_decode", "d_hand", "d_hand_write", "d_nomask", "d_nocap"):
            if key in r:
                extra.append(f"{key}={fmt(r[key])}")
        if r.get("default_impl"):
            extra.append(f"default impl {r['default_impl']}")
        if r.get("config_impl") and r["config_impl"] != NAME:
            extra.append(f"config._attn_implementation={r['config_impl']}")
        if extra:
            print(f"{r['family']}: " + "; ".join(extra))
    print("\nA routine row (GPT-Neo, BLOOM): Δ is the model served with the family's routine against the "
          "same checkpoint's eager model; calls/layers: modules the routine replaced / layers its listener "
          "heard; d_decode likewise.")
    print("\nd_switch: a model loaded with the default implementation, then set_attn_implementation("
          f"'{NAME}'), vs eager (real tokens); d_decode: 3 cached greedy steps after the prefill "
          "(q length 1 against the cache), causalab vs eager.")
    print("d_hand: llama by hand (no transformers) vs eager; d_hand_write: by hand with the write vs the hook's "
          "write; d_nomask: a name registered only in AttentionInterface (no AttentionMaskInterface entry) "
          "vs eager — the masks silently vanish; d_nocap: the generic function with softcap= dropped, vs eager "
          "(the control that the softcap is seen).")
    return rows


if __name__ == "__main__":
    main()

"""A residual patching sweep against TransformerLens, side by side in one run, where it imports.

The workload: a 28-point residual interchange sweep (4 layers x positions -7 to -1; ``block_output``
read on the counterfactual prompt, swapped into the base prompt at the same layer and position;
``logit_diff`` and ``iia`` at the last position) over ``sweep.py``'s 32 rows, on a random GPT-2
built from a transformers ``GPT2Config`` (4 layers x 64 wide, 4 heads; nothing downloaded).

The variants, each in its own process, warmed up on a 7-point slice and then taking turns:

- floor: the hand-written loop of ``sweep_loops.py`` on the transformers model, one
  counterfactual forward read by hooks on every swept layer, then one patched forward per point
  (P + 1 forwards);
- TransformerLens ``HookedTransformer`` (TransformerLens before 4.0, which removed it): built from
  a ``HookedTransformerConfig`` matching the GPT-2 config, with the same weights converted
  (``convert_gpt2_weights``) and left unprocessed (no LayerNorm folding, no centering), so its
  logits are the transformers model's;
- TransformerLens ``TransformerBridge`` (3.0 on; 4.0's way to hook a transformers model): booted
  over the same transformers model, which it runs as it is;
- causalab-mini: ``cm.run(doc)`` on the hooks engine, shared (P + 1), reading and compiling the
  document inside every timed run, as a user's run does.

Both TransformerLens variants run the sweep as TransformerLens is written: one ``run_with_cache``
of the counterfactual prompts (only the swept layers' residual stream kept), then one
``run_with_hooks`` per point whose hook swaps the cached vector in: P + 1 forwards. Every
hand-written variant gets its prompts tokenized once, before timing, from the compiled plan (the
ids, left-padding mask and position ids the engines feed the model; the ``HookedTransformer``
derives the same positions from the mask).

How to read the table: ``median s`` is the median wall time of one whole sweep, ``x floor`` and
``x TL`` divide it by the floor's and by the fastest TransformerLens variant's, ``forwards`` counts
the model's calls in one sweep. Below it, every variant's largest per-row ``logit_diff`` difference
against the floor, asserted within 1e-4; times never are. Without TransformerLens installed the
section prints one line saying so.

    python benchmarks/lens.py               # three rounds (about a minute on 2 idle cores)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from children import Child, protocol, say
from sweep_loops import floor_sweep, hidden_of, logit_diffs, prepared
from workload import Counter, document, max_difference, write_rows

HERE = Path(__file__).resolve().parent
LAYERS = 4
POSITIONS = tuple(range(-7, 0))  # every row has at least 8 tokens
WIDTH, HEADS = 64, 4
VARIANTS = ("floor", "hooked", "bridge", "causalab")
LABELS = {"floor": "floor (P+1)", "hooked": "TL HookedTransformer", "bridge": "TL TransformerBridge",
          "causalab": "causalab-mini hooks, shared"}
TOLERANCE = 1e-4  # per-row logit_diff, as sweep.py holds its variants
NOT_INSTALLED = "not installed (pip install transformer-lens to compare)"


def build(directory: Path) -> int:
    """The random GPT-2, the 32-row dataset and the documents, under ``directory``; returns the
    parameter count."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(HERE.parent / "documents" / "models" / "tiny-llama")
    config = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(directory / "models" / "model", safe_serialization=True)
    tok.save_pretrained(directory / "models" / "model")
    write_rows(directory)
    (directory / "sweep.causalab.json").write_text(json.dumps(document(LAYERS, positions=POSITIONS)))
    (directory / "warmup.causalab.json").write_text(json.dumps(document(1, positions=POSITIONS)))
    return sum(p.numel() for p in model.parameters())


# --- the variants, each in its own process ----------------------------------------------------------

def transformers_model(directory: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory / "models" / "model").eval().requires_grad_(False)


def hooked_transformer(hf_model):
    """TransformerLens' own GPT-2 with the transformers model's weights, unprocessed; its forward's
    extra arguments (the mask: it derives left padding's positions from it) and its residual hook."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf_model.config
    cfg = HookedTransformerConfig(
        d_model=c.n_embd, d_head=c.n_embd // c.n_head, n_heads=c.n_head, d_mlp=c.n_inner or 4 * c.n_embd,
        n_layers=c.n_layer, n_ctx=c.n_positions, d_vocab=c.vocab_size, act_fn=c.activation_function,
        eps=c.layer_norm_epsilon, normalization_type="LN", positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel")
    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(convert_gpt2_weights(hf_model, cfg), fold_ln=False,
                                      center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False, refactor_factored_attn_matrices=False)
    return model.eval(), ("attention_mask",), "hook_resid_post"


def transformer_bridge(hf_model, directory: Path):
    """TransformerLens' bridge over the transformers model itself; it takes the same mask and
    position ids the model does."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory / "models" / "model")
    model = TransformerBridge.boot_transformers(str(directory / "models" / "model"), hf_model=hf_model,
                                                tokenizer=tok, device="cpu")
    resid = "hook_resid_post" if "blocks.0.hook_resid_post" in model.hook_dict else "hook_out"
    return model.eval(), ("attention_mask", "position_ids"), resid


def lens_sweep(model, passes: tuple, resid: str, points: list) -> dict:
    """The sweep as TransformerLens is written: the counterfactual prompts run once with the swept
    layers' residual stream cached, then per point a run whose hook swaps the cached vector in."""
    import torch

    def call(inputs: dict) -> tuple:
        return (inputs["input_ids"],), {k: inputs[k] for k in passes}

    names = {f"blocks.{layer}.{resid}" for layer in {p["layer"] for p in points}}
    out = {}
    with torch.no_grad():
        args, kwargs = call(points[0]["cf"])
        _, cache = model.run_with_cache(*args, names_filter=lambda name: name in names, **kwargs)
        for point in points:
            cached = hidden_of(cache[f"blocks.{point['layer']}.{resid}"])[:, point["index"]]

            def swap(activation, hook, index=point["index"], value=cached):
                activation[:, index] = value
                return activation
            args, kwargs = call(point["base"])
            logits = model.run_with_hooks(*args, fwd_hooks=[(f"blocks.{point['layer']}.{resid}", swap)], **kwargs)
            out[point["name"]] = logit_diffs(logits, point)
    return out


def variant(name: str, directory: Path):
    """(sweep(doc) -> values, counter) for one variant; raises ImportError where it cannot be made."""
    import causalab_mini as cm

    if name == "causalab":
        loaded = cm.load(directory / "sweep.causalab.json", engine="hooks", models=[directory / "models"])

        def sweep(doc: Path) -> dict:
            ran = cm.run(doc, loaded=loaded, data=[directory / "data"])
            return {p.name: [r["value"] for r in p.result("logit_diff").rows] for p in ran.points}
        return sweep, Counter(loaded.model)
    hf_model = transformers_model(directory)
    plans = {doc: prepared(directory, doc, "cpu") for doc in documents(directory)}
    if name == "floor":
        return (lambda doc: floor_sweep(hf_model, plans[doc])), Counter(hf_model)
    if name == "hooked":
        model, passes, resid = hooked_transformer(hf_model)
        counter = Counter(model, wrap=True)  # run_with_hooks calls model.forward, not the module
    else:
        model, passes, resid = transformer_bridge(hf_model, directory)
        counter = Counter(hf_model)
    return (lambda doc: lens_sweep(model, passes, resid, plans[doc])), counter


def documents(directory: Path) -> tuple[Path, Path]:
    """(the warm-up, the sweep)."""
    return directory / "warmup.causalab.json", directory / "sweep.causalab.json"


def child(name: str, directory: Path, threads: int) -> None:
    """Load, warm up, then one timed sweep per "go" from the parent."""
    answers = protocol()
    import torch

    torch.set_num_threads(threads)
    try:
        sweep, counter = variant(name, directory)
    except ImportError as err:  # TransformerLens 4 has no HookedTransformer; before 3, no bridge
        say(answers, skip=f"{type(err).__name__}: {str(err).split('. ')[0]}")
        return
    warmup, doc = documents(directory)
    sweep(warmup)
    counter.take()
    say(answers, ready=True)
    for _ in sys.stdin:
        start = time.perf_counter()
        values = sweep(doc)
        say(answers, seconds=time.perf_counter() - start, forwards=counter.take(), values=values)


# --- the parent ------------------------------------------------------------------------------------

def measure(directory: Path, rounds: int, threads: int) -> tuple[dict, dict]:
    """Every variant's rounds, taking turns: (name -> round results, name -> why it was skipped)."""
    procs, skipped = {}, {}
    for name in VARIANTS:
        proc = Child(HERE / "lens.py", ["--variant", name, "--dir", directory, "--threads", threads],
                     directory / f"lens-{name}.log")
        first = proc.answer()
        if "skip" in first:
            skipped[name] = first["skip"]
            proc.close()
        else:
            procs[name] = proc
    results: dict = {name: [] for name in procs}
    for _ in range(rounds):
        for name, proc in procs.items():  # one at a time: the variants never compete for the cores
            results[name].append(proc.go())
    for proc in procs.values():
        proc.close()
    return results, skipped


def report_lens(directory: Path, threads: int, rounds: int = 3) -> None:
    """The section: nothing but a line when TransformerLens does not import."""
    if importlib.util.find_spec("transformer_lens") is None:
        print(f"\nTransformerLens: {NOT_INSTALLED}")
        return
    version = metadata.version("transformer-lens")
    directory.mkdir(parents=True, exist_ok=True)
    params = build(directory)
    results, skipped = measure(directory, rounds, threads)
    print(f"\nagainst TransformerLens {version}: random GPT-2, {LAYERS} layers x {WIDTH} wide, "
          f"{params / 1e6:.2f}M parameters; {LAYERS * len(POSITIONS)} points x 32 rows; on cpu; "
          f"{threads} torch thread(s); median of {rounds} round(s)")
    medians = {n: statistics.median(r["seconds"] for r in rs) for n, rs in results.items()}
    lens = min((medians[n] for n in ("hooked", "bridge") if n in medians), default=None)
    print(f"  {'variant':<30}{'median s':>10}{'x floor':>9}{'x TL':>7}{'forwards':>10}")
    for name in VARIANTS:
        if name in skipped:
            print(f"  {LABELS[name]:<30}skipped: {skipped[name]}")
            continue
        x_lens = f"{medians[name] / lens:>7.2f}" if lens else f"{'-':>7}"
        print(f"  {LABELS[name]:<30}{medians[name]:>10.3f}{medians[name] / medians['floor']:>9.2f}{x_lens}"
              f"{results[name][-1]['forwards']:>10}")
    print("  max |logit_diff difference| per row, against the floor:")
    for name in results:
        if name != "floor":
            diff = max_difference(results[name][-1]["values"], results["floor"][-1]["values"])
            print(f"    {LABELS[name]:<30}{diff:.3g}")
            assert diff <= TOLERANCE, f"{LABELS[name]} differs from the floor by {diff}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.variant:
        child(opts.variant, Path(opts.dir), opts.threads)
        return 0
    with tempfile.TemporaryDirectory(prefix="lens-bench-") as tmp:
        report_lens(Path(tmp), opts.threads, opts.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Engine overhead: each engine against a minimal hand-written hook loop, side by side in one run.

Builds (does not ship) a random Llama from a config — about 100M parameters by
default — writes a 32-point layer × position patching sweep over 32 rows, and
times: the hooks engine, the nnterp engine, and a minimal loop doing the same
forwards with one `register_forward_hook` per patch. Prints the ratios
engine / minimal and the peak resident memory each adds.

    python benchmarks/engines.py            # ~100M model (minutes on 2 cores)
    python benchmarks/engines.py --small    # 2-layer 32-wide model (per-call overhead)
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "documents" / "data"
ROWS = "weekdays_full/train"


def build_model(directory: Path, small: bool) -> None:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(REPO / "documents" / "models" / "tiny-llama")
    if small:
        config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, vocab_size=len(tok))
    else:  # ~100M parameters: 16 layers of 640 wide
        config = LlamaConfig(hidden_size=640, intermediate_size=2560, num_hidden_layers=16,
                             num_attention_heads=10, num_key_value_heads=10, vocab_size=len(tok))
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory, safe_serialization=True)
    tok.save_pretrained(directory)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{config.num_hidden_layers} layers x {config.hidden_size}", flush=True)


def sweep_document(layers: int) -> dict:
    # 32 points: every layer (up to 16) x two positions; more layers than 16 are sampled.
    chosen = list(range(layers))[:16]
    return {
        "model": {"key": "model", "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"component": "block_output", "layers": {"sweep": [[l] for l in chosen]}},
                  "head": {"component": "lm_head"}},
        "interventions": {"patching": {
            "reads": {"v_cf": {"site": "target", "pos": {"sweep": [-1, -2], "as": "pos"},
                               "input": "counterfactual"},
                      "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}},
            "writes": {"patch": {"site": "target", "pos": {"sweep": [-1, -2], "as": "pos"},
                                 "mechanism": "swap", "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {"logit_diff": {"kind": "logit_diff", "of": "logits", "a": "cf_answer",
                                       "b": "base_answer"}}}},
        "steps": {"score": {"kind": "observe", "interventions": "patching",
                            "rows": {"base": ROWS, "counterfactual": ROWS}}},
    }


def minimal(model_dir: Path, plan) -> list:
    """The same forwards with nothing but a model and a hook: the floor an engine is measured against."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval().requires_grad_(False)
    out = []
    with torch.no_grad():
        for point in plan.points:
            obs = point.steps["score"]
            cf, base = obs.forwards
            (read,) = cf.reads
            layer = model.model.layers[read.address.layer]
            index = read.where.index
            ids = torch.tensor(cf.ids)
            saved = {}
            h = layer.register_forward_hook(lambda m, a, o: saved.__setitem__("v", o[0][:, index].clone()))
            try:
                model(input_ids=ids, attention_mask=torch.tensor(cf.mask))
            finally:
                h.remove()

            def patch(m, a, o):
                hidden = o[0].clone()
                hidden[:, index] = saved["v"]
                return (hidden, *o[1:])

            h = layer.register_forward_hook(patch)
            try:
                logits = model(input_ids=torch.tensor(base.ids), attention_mask=torch.tensor(base.mask)).logits
            finally:
                h.remove()
            out.append(logits[:, -1])
    return out


def timed(label: str, fn) -> float:
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    print(f"  {label:<10} {elapsed:8.2f} s   peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB",
          flush=True)
    return elapsed


def main(argv=None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--small", action="store_true")
    opts = args.parse_args(argv)
    from causalab_mini import documents
    from causalab_mini.engine.hooks import HooksEngine
    from causalab_mini.engine.nnterp import NNterpEngine
    from causalab_mini.plan.spec import ModelRef

    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build_model(tmp / "model", opts.small)
        raw = sweep_document(16 if not opts.small else 2)
        doc = tmp / "sweep.causalab.json"
        doc.write_text(json.dumps(raw))
        ref = ModelRef(key="model")
        hooks = HooksEngine.load(ref, document=doc)
        nnterp = NNterpEngine.load(ref, document=doc)
        plan_h = documents.compile_plan(raw, document=doc, data=[DATA], facts=hooks)
        plan_n = documents.compile_plan(raw, document=doc, data=[DATA], facts=nnterp)
        rows = plan_h.points[0].steps["score"].rows
        print(f"sweep: {len(plan_h.points)} points x {rows} rows, two forwards per point", flush=True)
        t_min = timed("minimal", lambda: minimal(tmp / "model", plan_h))
        t_hooks = timed("hooks", lambda: hooks.execute(plan_h))
        t_nnterp = timed("nnterp", lambda: nnterp.execute(plan_n))
        print(f"ratios: hooks/minimal = {t_hooks / t_min:.2f}x   nnterp/minimal = {t_nnterp / t_min:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Engine overhead: each engine against a minimal hand-written hook loop, side by side in one run.

Builds (does not ship) a random Llama from a config — about 100M parameters by
default — and a 32-point layer × position patching sweep over 32 rows. Three
variants do the same forwards: the hooks engine, the nnterp engine, and a
minimal loop with one ``register_forward_hook`` per patch. Each variant runs in
its own process (so its peak memory is its own), warms up once, then the
variants take turns for ``--rounds`` rounds; the median of each is reported with
the ratio engine / minimal.

    python benchmarks/engines.py            # ~100M model: 16 layers x 640 (minutes on 2 cores)
    python benchmarks/engines.py --small    # 16 layers x 32: per-call overhead dominates
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
LAYERS = 16  # x two positions = 32 points
ROWS = 32


def build(directory: Path, small: bool) -> None:
    """A random Llama and a 32-row dataset, written under ``directory``."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(REPO / "documents" / "models" / "tiny-llama")
    width = 32 if small else 640
    config = LlamaConfig(hidden_size=width, intermediate_size=4 * width, num_hidden_layers=LAYERS,
                         num_attention_heads=4 if small else 10, num_key_value_heads=4 if small else 10,
                         vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory / "models" / "model", safe_serialization=True)
    tok.save_pretrained(directory / "models" / "model")
    pairs = []
    for split in ("train", "test"):
        text = (REPO / "documents" / "data" / "weekdays_full" / f"{split}.jsonl").read_text()
        pairs += [line for line in text.splitlines() if line.strip()]
    (directory / "data" / "bench").mkdir(parents=True)
    (directory / "data" / "bench" / "rows.jsonl").write_text("\n".join(pairs[:ROWS]) + "\n")
    doc = {
        "model": {"key": "model", "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"component": "block_output", "layers": {"sweep": [[l] for l in range(LAYERS)]}},
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
                            "rows": {"base": "bench/rows", "counterfactual": "bench/rows"}}},
    }
    (directory / "sweep.causalab.json").write_text(json.dumps(doc))
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{LAYERS} layers x {width}; sweep: {LAYERS * 2} points x {ROWS} rows", flush=True)


def minimal_runner(directory: Path, plan):
    """The same forwards with nothing but a model and a hook: the floor an engine is measured against."""
    from transformers import AutoModelForCausalLM

    from causalab_mini.engine import taps  # the same call arguments the engines make

    model = AutoModelForCausalLM.from_pretrained(directory / "models" / "model").eval().requires_grad_(False)
    hidden_of = lambda o: o[0] if isinstance(o, tuple) else o  # noqa: E731  (older families return tuples)

    def run() -> None:
        with torch.no_grad():
            for point in plan.points:
                cf, base = point.steps["score"].forwards
                (read,) = cf.reads
                layer, index = model.model.layers[read.address.layer], read.where.index
                saved = {}
                h = layer.register_forward_hook(lambda m, a, o: saved.__setitem__("v", hidden_of(o)[:, index].clone()))
                try:
                    model(**taps.model_inputs(cf, "cpu"))
                finally:
                    h.remove()

                def patch(m, a, o):
                    hidden = hidden_of(o).clone()
                    hidden[:, index] = saved["v"]
                    return (hidden, *o[1:]) if isinstance(o, tuple) else hidden

                h = layer.register_forward_hook(patch)
                try:
                    model(**taps.model_inputs(base, "cpu")).logits[:, -1]
                finally:
                    h.remove()
    return run


def variant(name: str, directory: Path, rounds: int) -> None:
    """One variant in this process: load, warm up, then time each round when the parent says go."""
    from causalab_mini import documents
    from causalab_mini.plan.spec import ModelRef

    doc = directory / "sweep.causalab.json"
    raw = json.loads(doc.read_text())
    models, data = [directory / "models"], [directory / "data"]
    if name == "minimal":
        plan = documents.compile_plan(raw, document=doc, models=models, data=data)
        run = minimal_runner(directory, plan)
    else:
        from causalab_mini.runner import engine_class
        engine = engine_class(name).load(ModelRef(key="model"), document=doc, models=models)

        def run() -> None:
            # Compiling is part of what a user waits for; it needs no weights and is cheap.
            engine.execute(documents.compile_plan(raw, document=doc, data=data, facts=engine))
    run()  # warm-up: first-call costs (allocator, nnsight source parsing) are not the steady state
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:  # one "go" per round, so the variants take turns
        start = time.perf_counter()
        run()
        print(json.dumps({"seconds": time.perf_counter() - start,
                          "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="16 layers x 32 wide instead of x 640")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.variant:
        variant(opts.variant, Path(opts.dir), opts.rounds)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        build(directory, opts.small)
        names = ("minimal", "hooks", "nnterp")
        procs = {n: subprocess.Popen([sys.executable, __file__, "--variant", n, "--dir", tmp],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for n in names}
        for n in names:  # every variant loaded and warmed up before any round is timed
            json.loads(procs[n].stdout.readline())
        times: dict = {n: [] for n in names}
        peaks: dict = {}
        for _ in range(opts.rounds):
            for n in names:  # one at a time: the variants never compete for the cores
                procs[n].stdin.write("go\n")
                procs[n].stdin.flush()
                result = json.loads(procs[n].stdout.readline())
                times[n].append(result["seconds"])
                peaks[n] = result["peak_mib"]
        for p in procs.values():
            p.stdin.close()
            p.wait()
        floor = statistics.median(times["minimal"])
        for n in names:
            med = statistics.median(times[n])
            print(f"  {n:<8} median {med:7.2f} s over {opts.rounds} rounds  {med / floor:5.2f}x minimal  "
                  f"peak RSS {peaks[n]:6.0f} MiB ({peaks[n] - peaks['minimal']:+.0f} vs minimal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

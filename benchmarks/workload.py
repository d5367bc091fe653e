"""The benchmarks' shared workload: the random Llamas, the sweep documents and data, the forward counter.

What ``sweep.py`` times and its sections (``writing.py``, ``startup.py``, ``lens.py``) run on: the
sweep as a document (``document``), the 32-row weekday dataset (``write_rows``), a random Llama of
a size with its documents under one folder (``build``), the counter of a model's calls
(``Counter``) and the per-row comparison of two runs' values (``max_difference``). Nothing here
times or prints; importing it puts the checkout's package first on ``sys.path``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the checkout's package

LAYERS = 12
POSITIONS = (-4, -1)  # the day's last token on every row, and the answer position
ROWS = 32
SIZES = {  # width, heads, MLP width (Llama's 8/3 ratio for mid)
    "small": (32, 4, 128),
    "mid": (768, 12, 2048),
}
SCALE_POINTS = {100: 5, 500: 25, 1000: 50, 10000: 500}  # points -> values of t (x 10 layers x 2 positions)


# --- the documents, the data, the models --------------------------------------------------------

def document(layers: int, lerp_ts=None, positions=POSITIONS) -> dict:
    """The sweep as a document: ``layers`` x ``positions`` points, swap; with ``lerp_ts``, a lerp
    write swept over those ``t`` as a third axis (the scale runs)."""
    pos = {"sweep": list(positions), "as": "pos"}
    write = {"site": "target", "pos": pos, "mechanism": "swap", "operand": "v_cf"}
    if lerp_ts:
        write.update(mechanism="lerp", params={"t": {"sweep": list(lerp_ts), "as": "t"}})
    return {
        "model": {"key": "model", "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"component": "block_output", "layers": [{"sweep": {"range": [0, layers]}}]},
                  "head": {"component": "lm_head"}},
        "interventions": {"patching": {
            "reads": {"v_cf": {"site": "target", "pos": pos, "model": "original", "input": "counterfactual"},
                      "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}},
            "writes": {"patch": write},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {"iia": {"kind": "match", "of": "logits", "expected": "cf_answer"},
                        "logit_diff": {"kind": "logit_diff", "of": "logits", "a": "cf_answer",
                                       "b": "base_answer"}}}},
        "steps": {"score": {"kind": "observe", "interventions": "patching",
                            "rows": {"base": "bench/rows", "counterfactual": "bench/rows"},
                            # What the pytest variant's values are read back from; a cm.run
                            # without out= writes nothing.
                            "saves": [{"value": "logit_diff", "file_path": "logit_diff.json"},
                                      {"value": "iia", "file_path": "iia.json"}]}},
    }


def build(directory: Path, size: str) -> int:
    """A random Llama of ``size``, the 32-row dataset and the documents, under ``directory``;
    returns the model's parameter count."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # save_pretrained's bar would break up the table

    tok = AutoTokenizer.from_pretrained(REPO / "documents" / "models" / "tiny-llama")
    width, heads, mlp = SIZES[size]
    config = LlamaConfig(hidden_size=width, intermediate_size=mlp, num_hidden_layers=LAYERS,
                         num_attention_heads=heads, num_key_value_heads=heads, vocab_size=len(tok),
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory / "models" / "model", safe_serialization=True)
    tok.save_pretrained(directory / "models" / "model")
    write_rows(directory)
    (directory / "sweep.causalab.json").write_text(json.dumps(document(LAYERS)))
    # The warm-up: the same code paths on two points (which share a counterfactual forward).
    (directory / "warmup.causalab.json").write_text(json.dumps(document(1)))
    for points, n in SCALE_POINTS.items():
        ts = [round((i + 1) / n, 6) for i in range(n)]
        (directory / f"scale{points}.causalab.json").write_text(json.dumps(document(10, ts)))
    return sum(p.numel() for p in model.parameters())


def write_rows(directory: Path) -> None:
    """The dataset every document here reads, ``bench/rows``: the first ``ROWS`` weekday rows."""
    rows = []
    for split in ("train", "test"):
        text = (REPO / "documents" / "data" / "weekdays_full" / f"{split}.jsonl").read_text()
        rows += [line for line in text.splitlines() if line.strip()]
    (directory / "data" / "bench").mkdir(parents=True)
    (directory / "data" / "bench" / "rows.jsonl").write_text("\n".join(rows[:ROWS]) + "\n")


# --- the forward counter and the comparison --------------------------------------------------------

class Counter:
    """Calls of the transformers model: a forward pre-hook where the model keeps its hooks, a
    wrapper on the instance's ``forward`` where a variant clears them (pyvene does, every call)."""

    def __init__(self, model, wrap: bool = False):
        self.n = 0
        if wrap:
            inner = model.forward

            def counted(*args, **kwargs):
                self.n += 1
                return inner(*args, **kwargs)
            model.forward = counted
        else:
            model.register_forward_pre_hook(self._count)

    def _count(self, _module, _args):
        self.n += 1

    def take(self) -> int:
        n, self.n = self.n, 0
        return n


def max_difference(a: dict, b: dict) -> float:
    """The largest per-row |a - b| over every point; rows excluded in both are skipped."""
    if a.keys() != b.keys():
        raise AssertionError(f"different points: {sorted(a)[:3]}... vs {sorted(b)[:3]}...")
    worst = 0.0
    for point in a:
        for x, y in zip(a[point], b[point], strict=True):
            if (x is None) != (y is None):
                raise AssertionError(f"{point}: a row excluded by one variant and not the other")
            if x is not None:
                worst = max(worst, abs(x - y))
    return worst

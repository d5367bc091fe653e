"""Attribution patching against the exact sweep it estimates, side by side in one run.

The workload: a head-patching grid — ``attention_z`` (each head's result, the input of the output
projection) at every layer x the prompt's last ``--positions`` tokens x every head, each point
swapping one head's value from the counterfactual prompt into the base prompt, ``logit_diff``
scored at the last position — over 32 rows of long weekday prompts, on the random Llamas of
``workload.py`` (small: 12 layers x 32 wide, 4 heads; mid: 12 layers x 768 wide, 12 heads: the
12 x 16 x 12 grid is 2,304 points). Each size's model is loaded once per engine; every variant
compiles and runs the document through ``cm.run(doc, loaded=...)``:

- exact: the shared sweep (P + 1 forwards: the counterfactual forward once, one patched forward
  per point) — what the estimate replaces. Its time is linear in P, so two one-layer samples
  (``heads`` and ``4 x heads`` points) give the shared forward's cost and a point's, and the line
  through them gives the whole grid's; on the small model the whole grid is run too (the line and
  the run side by side), on the mid model only the line (2,304 forwards of an 85M model are hours
  on 2 cores);
- attribution: the same document with ``"estimate": {"by": "attribution"}`` — the counterfactual
  forward, one base forward with a zero perturbation at every layer's attention_z, one backward.

Printed per size: wall time of each (median of ``--rounds``), ``x exact`` (the exact sweep's time
over this one's — run on the small model, on its line on the mid one: the speed-up), the transformers model's calls (a forward pre-hook on the model)
and the backwards (``torch.autograd.grad`` calls, counted by a wrapper in this process), and the
largest per-row difference between the two engines' estimates (nnterp against hooks).

The call counts are then shown flat in P: the same grid at 1, 4 and 12 layers, and at a batch
size of 8 (four windows: 2 forwards + 1 backward per window).

Then agreement with the exact sweep on the shipped trained models (documents/models: tiny-llama,
tiny-gpt2, tiny-gemma2; every point verified, ``"verify": {"all": true, "top": 3}``): Spearman's
rank correlation between estimated and exact effects, recall of the exact top-3 among the
estimated top-3 and the worst row's absolute error, for the residual stream (block_output,
block_input), attention and MLP outputs, heads (attention_z) and MLP neurons (mlp_hidden, in
groups of units), on the layer x position grid of the last six tokens.

    python benchmarks/attribution.py                # both sizes (~15 minutes on 2 cores)
    python benchmarks/attribution.py --sizes small  # a minute
    python benchmarks/attribution.py --sections agreement
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import workload  # noqa: F401 — puts the checkout's package first on sys.path

import torch  # noqa: E402

import causalab_mini as cm  # noqa: E402

REPO = workload.REPO
PREFIX = "Recall the days of the week, in their order, one after another. "


def grid(layers: int, positions: int, heads: int, *, estimate: bool, data: str = "bench/long") -> dict:
    pos = {"sweep": list(range(-positions, 0)), "as": "pos"}
    step = {"kind": "observe", "interventions": "patching", "rows": {"base": data, "counterfactual": data}}
    if estimate:
        step["estimate"] = {"by": "attribution"}
    return {
        "model": {"key": "model", "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"component": "attention_z", "layers": [{"sweep": {"range": [0, layers]}}],
                             "heads": {"sweep": [[h] for h in range(heads)]}},
                  "head": {"component": "lm_head"}},
        "interventions": {"patching": {
            "reads": {"v_cf": {"site": "target", "pos": pos, "model": "original", "input": "counterfactual"},
                      "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}},
            "writes": {"patch": {"site": "target", "pos": copy.deepcopy(pos), "mechanism": "swap",
                                 "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": {"logit_diff": {"kind": "logit_diff", "of": "logits", "a": "cf_answer",
                                       "b": "base_answer"}}}},
        "steps": {"score": step},
    }


def long_rows(directory: Path) -> None:
    """``bench/long``: the benchmark's 32 weekday rows with a sentence before each prompt, so every
    row has 16 positions before its answer."""
    rows = []
    for line in (directory / "data" / "bench" / "rows.jsonl").read_text().splitlines():
        row = json.loads(line)
        row["input"] = PREFIX + row["input"]
        row["counterfactual_inputs"] = [PREFIX + c for c in row["counterfactual_inputs"]]
        rows.append(json.dumps(row))
    (directory / "data" / "bench" / "long.jsonl").write_text("\n".join(rows) + "\n")


class Backwards:
    """``torch.autograd.grad`` calls in this process (the walk's only way to a gradient)."""

    def __init__(self):
        self.n = 0
        inner = torch.autograd.grad

        def counted(*args, **kwargs):
            self.n += 1
            return inner(*args, **kwargs)
        torch.autograd.grad = counted

    def take(self) -> int:
        n, self.n = self.n, 0
        return n


def timed(doc: Path, loaded, counter, backwards, rounds: int, **options):
    times, run = [], None
    for _ in range(rounds):
        counter.take()
        backwards.take()
        start = time.perf_counter()
        run = cm.run(doc, loaded=loaded, models=[doc.parent / "models"], data=[doc.parent / "data"], **options)
        times.append(time.perf_counter() - start)
    return statistics.median(times), counter.take() // rounds, backwards.take() // rounds, run


def values(run) -> dict:
    return {p.name: p.result("logit_diff").values for p in run.points}


def largest_difference(a: dict, b: dict) -> float:
    return max((abs(x - y) for k in a for x, y in zip(a[k], b[k])), default=0.0)


def speed(sizes: list[str], positions: int, rounds: int, backwards: Backwards) -> None:
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            params = workload.build(root, size)
            long_rows(root)
            heads = workload.SIZES[size][1]
            layers = workload.LAYERS
            docs = {}
            for name, (n_layers, n_positions, estimate) in {
                    "estimate": (layers, positions, True), "exact": (layers, positions, False),
                    "sample_a": (1, 1, False), "sample_b": (1, 4, False), "warm": (1, 2, True)}.items():
                docs[name] = root / f"{name}.causalab.json"
                docs[name].write_text(json.dumps(grid(n_layers, n_positions, heads if name != "warm" else 2,
                                                      estimate=estimate)))
            points = layers * positions * heads
            print(f"\n{size}: {params / 1e6:.1f}M parameters; {layers} layers x {positions} positions x "
                  f"{heads} heads = {points} points, {workload.ROWS} rows")
            print(f"{'variant':44s} {'median s':>9s} {'x exact':>8s} {'forwards':>9s} {'backwards':>10s}")
            estimates, exact = {}, None
            for engine in ("hooks", "nnterp"):
                loaded = cm.load(docs["estimate"], engine=engine, models=[root / "models"])
                counter = workload.Counter(_model_of(loaded))
                cm.run(docs["warm"], loaded=loaded, models=[root / "models"], data=[root / "data"])
                if engine == "hooks":
                    exact = exact_cost(docs, loaded, counter, backwards, rounds, points, heads,
                                       whole=size == "small")
                t_est, f_est, b_est, run = timed(docs["estimate"], loaded, counter, backwards, rounds)
                estimates[engine] = values(run)
                print(f"{'attribution (' + engine + ')':44s} {t_est:9.2f} {exact / t_est:8.1f} {f_est:9d} "
                      f"{b_est:10d}")
                del loaded
            print(f"largest per-row difference, nnterp against hooks: "
                  f"{largest_difference(estimates['hooks'], estimates['nnterp']):.3g}")
            if size == "small":
                calls(root, heads, positions, backwards)


def exact_cost(docs: dict, loaded, counter, backwards, rounds: int, points: int, heads: int, *,
               whole: bool) -> float:
    """The exact shared sweep's time: P + 1 forwards, the shared one and one per point, so the
    time is linear in P. Two sample grids of one layer (``heads`` and ``4 x heads`` points) give
    the shared forward's cost and a point's; the whole grid is run too where ``whole`` (the small
    model), which shows the line holds. Returns the time the estimate is compared with: the
    measured one where run, else the line's."""
    t_a, f_a, _, _ = timed(docs["sample_a"], loaded, counter, backwards, rounds)
    t_b, f_b, _, _ = timed(docs["sample_b"], loaded, counter, backwards, rounds)
    per_point = (t_b - t_a) / (3 * heads)
    shared = t_a - heads * per_point
    line = shared + points * per_point
    print(f"{'exact (hooks, shared), ' + str(heads) + ' points':44s} {t_a:9.2f} {'':8s} {f_a:9d} {0:10d}")
    print(f"{'exact (hooks, shared), ' + str(4 * heads) + ' points':44s} {t_b:9.2f} {'':8s} {f_b:9d} {0:10d}")
    print(f"{'exact, ' + str(points) + ' points, on that line':44s} {line:9.2f} {1.0 if not whole else '':>8} "
          f"{points + 1:9d} {0:10d}")
    if not whole:
        return line
    t, f, b, _ = timed(docs["exact"], loaded, counter, backwards, rounds)
    print(f"{'exact (hooks, shared), ' + str(points) + ' points, run':44s} {t:9.2f} {1.0:8.2f} {f:9d} {b:10d}")
    print(f"the line against the run: {line / t:.2f} (below 1: the line understates the exact sweep, and a "
          "speed-up measured against it)")
    return t


def calls(root: Path, heads: int, positions: int, backwards: Backwards) -> None:
    """Model calls and backwards flat in the number of points, and per batch window."""
    doc = root / "calls.causalab.json"
    loaded = cm.load(root / "estimate.causalab.json", engine="hooks", models=[root / "models"])
    counter = workload.Counter(_model_of(loaded))
    print(f"\n{'grid':34s} {'points':>7s} {'batch':>6s} {'forwards':>9s} {'backwards':>10s}")
    for layers, batch in ((1, None), (4, None), (12, None), (12, 8)):
        doc.write_text(json.dumps(grid(layers, positions, heads, estimate=True)))
        _, forwards, backs, _ = timed(doc, loaded, counter, backwards, 1, batch_size=batch)
        shown = f"{layers} layers x {positions} positions x {heads} heads"
        print(f"{shown:34s} {layers * positions * heads:7d} {batch or workload.ROWS:6d} {forwards:9d} {backs:10d}")


def _model_of(loaded):
    """The transformers model under either engine (nnterp's StandardizedTransformer wraps it)."""
    model = loaded.model
    return getattr(model, "_model", model)


SITES = (("block_output", None), ("block_input", None), ("attention_output", None), ("mlp_output", None),
         ("attention_z", "heads"), ("mlp_hidden", "units"))
SHIPPED = {"tiny-llama": "layer_pos_sweep", "tiny-gpt2": "patching_gpt2", "tiny-gemma2": "head_patching_gemma2"}


def agreement() -> None:
    print("\nagreement with the exact sweep, shipped trained models (2 layers x the last 6 positions"
          " [x 4 heads | x 4 unit groups]; every point verified)")
    print(f"{'model':12s} {'site':17s} {'points':>6s} {'spearman':>9s} {'recall@3':>9s} {'worst row':>10s}")
    base = json.loads((REPO / "documents" / "v2" / "layer_pos_sweep.causalab.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        for model, source in SHIPPED.items():
            ref = json.loads((REPO / "documents" / "v2" / f"{source}.causalab.json").read_text())["model"]
            loaded = None
            for component, selector in SITES:
                d = copy.deepcopy(base)
                d.pop("header")
                d["model"] = ref
                iv = d["interventions"]["patching"]
                del iv["metrics"]["iia"]
                target = {"component": component, "layers": [{"sweep": {"range": [0, 2]}}]}
                if selector == "heads":
                    target["heads"] = {"sweep": [[h] for h in range(4)]}
                elif selector == "units":
                    target["units"] = {"sweep": [list(range(u, u + 8)) for u in range(0, 32, 8)]}
                d["sites"]["target"] = target
                pos = {"sweep": list(range(-6, 0)), "as": "pos"}
                iv["reads"]["v_cf"]["pos"] = pos
                iv["writes"]["patch"]["pos"] = copy.deepcopy(pos)
                d["steps"]["score"].pop("saves")
                d["steps"]["score"]["estimate"] = {"by": "attribution", "verify": {"all": True, "top": 3}}
                path = REPO / "documents" / "v2" / f".agreement-{model}.causalab.json"
                try:
                    path.write_text(json.dumps(d))
                    if loaded is None:
                        loaded = cm.load(path, engine="hooks")
                    run = cm.run(path, loaded=loaded)
                finally:
                    path.unlink()
                record = run.plan.results["attribution"]["attribution"]
                f = record["figures"]["logit_diff"]
                spearman = "—" if f["spearman"] is None else f"{f['spearman']:.3f}"
                print(f"{model:12s} {component:17s} {record['points']:6d} {spearman:>9s} {f['recall']:9.2f} "
                      f"{f['error']:10.3g}")
    del tmp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="small,mid")
    parser.add_argument("--positions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sections", default="speed,agreement")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sections = args.sections.split(",")
    backwards = Backwards()
    if "speed" in sections:
        speed(args.sizes.split(","), args.positions, args.rounds, backwards)
    if "agreement" in sections:
        agreement()


if __name__ == "__main__":
    sys.exit(main())

"""What crosses the wire to NDIF, per corpus document: the request and the response, in bytes.

Every document of ``documents/v2`` is compiled for ``--engine ndif`` (a weightless shell) and sent,
as one session each, in both forms a request takes:

- **kernel** (the default): the kernel's source and the walk's forwards as a program of plain data,
  to a stand-in for a stock server (``cm.stand_in(doc, stock=True)``: torch, transformers and nnsight
  only; causalab_mini and nnterp blocked). The walk runs on the client; the metrics of built-in
  kinds are scored on the server, and what comes home is their values and the reads the client's
  walk itself uses. Checked: the results equal a local nnterp run's.
- **package**: the walk itself by reference, to a stand-in with causalab-mini and nnterp installed
  (``cm.stand_in(doc)``); only the plan's results come home.

Bytes are as NDIF's client sends the request and its server sends the response (zstd where
nnsight's ``CONFIG.API.COMPRESS`` says). Logit rows still come home where the client scores them
(a metric on a cut of a continuation, an extension's kind, a read the run keeps), and those grow
with the vocabulary: the last column estimates the response for a 128,256-token vocabulary (Llama
3's), those rows × 4 bytes (float32, uncompressed) added to what was measured. Documents a request
cannot carry are listed with the compiler's refusal.

    python benchmarks/wire.py
    python benchmarks/wire.py --documents patching,layer_pos_sweep
"""
from __future__ import annotations

import argparse
import sys

import workload  # noqa: F401 — puts the checkout's package first on sys.path

import causalab_mini as cm  # noqa: E402
from causalab_mini.errors import CausalabError  # noqa: E402

V2 = workload.REPO / "documents" / "v2"
LARGE_VOCABULARY = 128_256


def home_logits(program: dict, head: str) -> int:
    """How many logit rows (one per row and position) a kernel request brought home: reads of the
    unembedding's output (``head``), of the model's logits, and through a logit lens."""
    keys = set(program["home"])
    rows = 0
    for step in program["steps"]:
        for group in step.get("groups", ()):
            for tap in group["taps"]:
                for read in tap["reads"]:
                    logits = read["view"] == "logits" or group["kind"] == ("logits",) or group["path"] == head
                    if logits and read["key"] in keys:
                        rows += _positions(read, step)
    return rows


def _positions(read: dict, step: dict) -> int:
    if read["step"] == "stack":
        return step["rows"] * step["decode"]
    if read["step"] is not None:
        return step["rows"]
    return sum(len(w) for w in read["window"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", default="", help="comma-separated names (default: the whole corpus)")
    args = parser.parse_args()
    names = [n for n in args.documents.split(",") if n] or sorted(
        p.name.removesuffix(cm.SUFFIX) for p in V2.glob("*" + cm.SUFFIX))
    print(f"{'document':24s} {'points':>6s}  {'kernel: sent B':>14s} {'received B':>10s} {'= local':>7s}"
          f"  {'package: sent B':>15s} {'received B':>10s}  {'kernel received at 128k vocab':>29s}")
    servers: dict = {}
    compressed = None
    for name in names:
        path = V2 / f"{name}{cm.SUFFIX}"
        doc = cm.read(path)
        key = (doc.model.key, doc.attention_probs)
        if key not in servers:
            servers[key] = {"kernel": cm.stand_in(doc, stock=True), "package": cm.stand_in(doc)}
        row, local = {}, None
        for kind in ("kernel", "package"):
            shell = cm.load(doc, engine="ndif", request=kind)
            shell.server = servers[key][kind]
            try:
                ran = cm.run(doc, loaded=shell)
            except CausalabError as refused:
                row[kind] = f"refused at {refused.path}"
                continue
            wire = ran.record["wire"]
            compressed = wire["compressed"]
            row[kind] = (wire["sent"], wire["received"])
            if kind == "kernel":
                local = local or cm.run(doc, engine="nnterp")
                same = {p.name: {k: r.rows for k, r in p.results().items()} for p in ran.points} == \
                    {p.name: {k: r.rows for k, r in p.results().items()} for p in local.points}
                vocabulary = len(shell.tokenizer)
                rows = home_logits(shell.last_request, shell._found("lm_head", None, "lm_head").path)
                large = wire["received"] + rows * (LARGE_VOCABULARY - vocabulary) * 4
                row["check"], row["large"] = ("yes" if same else "NO"), f"{large / 1e6:.1f} MB ({rows} logit rows)"
        cells = []
        for kind in ("kernel", "package"):
            value = row[kind]
            cells.append(f"{value[0]:14d} {value[1]:10d}" if isinstance(value, tuple) else f"{value:>25s}")
        print(f"{name:24s} {len(doc.points):6d}  {cells[0]} {row.get('check', ''):>7s}  {cells[1]:>26s}  "
              f"{row.get('large', ''):>29s}")
    print("bytes as sent: zstd-compressed" if compressed else "bytes as sent: uncompressed")


if __name__ == "__main__":
    sys.exit(main())

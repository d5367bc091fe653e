"""What crosses the wire to NDIF, per corpus document: the request and the response, in bytes.

Every document of ``documents/v2`` is compiled for ``--engine ndif`` (a weightless shell); those a
remote server can serve are sent, as one session each, to the stand-in (``cm.stand_in``: nnsight's
round trip, serialized as NDIF's client serializes it, against a copy of the model here), whose
``wire`` is the request as sent and the response as the server would send it (zstd-compressed where
nnsight's ``CONFIG.API.COMPRESS`` says). Printed per document: the points, the forwards the walk
runs, the bytes sent and received, and whether a stock server (torch, transformers, nnsight; no
causalab_mini, no nnterp) can run the request (``stand_in(stock=True)``). Documents a remote server
cannot serve are listed with the compiler's refusal.

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", default="", help="comma-separated names (default: the whole corpus)")
    args = parser.parse_args()
    names = [n for n in args.documents.split(",") if n] or sorted(
        p.name.removesuffix(cm.SUFFIX) for p in V2.glob("*" + cm.SUFFIX))
    print(f"{'document':26s} {'points':>6s} {'sent B':>8s} {'received B':>11s}  stock server")
    servers: dict = {}
    for name in names:
        path = V2 / f"{name}{cm.SUFFIX}"
        doc = cm.read(path)
        try:
            shell = cm.load(doc, engine="ndif")
            cm.compile(doc, loaded=shell)
        except CausalabError as refused:
            print(f"{name:26s} {'':>6s} {'':>8s} {'':>11s}  not served remotely: {refused.problem[:70]}")
            continue
        key = (doc.model.key, doc.attention_probs)
        if key not in servers:
            servers[key] = (cm.stand_in(doc), cm.stand_in(doc, stock=True))
        shell.server = servers[key][0]
        run = cm.run(doc, loaded=shell)
        wire = run.record["wire"]
        shell.server = servers[key][1]
        try:
            cm.run(doc, loaded=shell)
            verdict = "runs"
        except CausalabError as refused:
            verdict = "refused" + (" (the walk's code is not there)" if "stock server" in refused.problem else
                                   f": {refused.problem[:60]}")
        print(f"{name:26s} {len(run.points):6d} {wire['sent']:8d} {wire['received']:11d}  {verdict}")
    print("bytes as sent: zstd-compressed" if servers and wire["compressed"] else "bytes as sent: uncompressed")


if __name__ == "__main__":
    sys.exit(main())

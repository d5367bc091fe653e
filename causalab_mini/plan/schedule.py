"""The order an intervention's passes run in: every operand read before it is written.

A pass is one (model, input) pair; a write whose operand another pass reads runs after that
pass. What the compiler (``build.py``) asks once per intervention it compiles.
"""
from __future__ import annotations

from ..document.rules import ORIGINAL
from ..errors import CompileError


def schedule(path: str, iv, addresses: dict) -> list[tuple[str, str]]:
    """(model, input) pairs in an order where every operand is read before it is written."""
    nodes: list[tuple[str, str]] = []
    for r in iv.reads.values():
        if (r.model, r.input) not in nodes:
            nodes.append((r.model, r.input))
    after: dict = {n: set() for n in nodes}
    for node in nodes:
        model = node[0]
        if model == ORIGINAL:
            continue
        for wname in iv.models[model].writes:
            w = iv.writes[wname]
            if not isinstance(w.operand, str):
                continue
            src = iv.reads[w.operand]
            source = (src.model, src.input)
            if source == node:
                if addresses[src.site].key >= addresses[w.site].key:
                    raise CompileError(f"{path}.writes.{wname}.operand",
                                       f"read {w.operand!r} is in the same pass and not before the write",
                                       "read the operand from another model (e.g. \"original\")")
                continue
            after[node].add(source)
    order: list = []
    pending = list(nodes)
    while pending:
        ready = [n for n in pending if after[n] <= set(order)]
        if not ready:
            cycle = " → ".join(f"{m!r} on {i!r}" for m, i in pending)
            raise CompileError(f"{path}.models", f"the passes read each other's values in a cycle: {cycle}",
                               "take one side's operand from the un-written model \"original\"")
        order.append(ready[0])
        pending.remove(ready[0])
    return order

"""What two runs are compared by: every step's results (tensors by value), or the metric rows of
each (point, result). Shared by the tests that hold one way of running to another (remote against
local, GPU against CPU, bf16 against fp32)."""
from __future__ import annotations


def same(a, b) -> bool:
    """Equal results: tensors bit for bit, bundles (dicts of tensors) key by key, the rest by ``==``."""
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def same_results(a, b) -> bool:
    """Two executed plans of one document: some step has results, and every step's are the same."""
    steps = [(sa.results, sb.results) for (_, sa), (_, sb) in zip(a.walk(), b.walk(), strict=True)]
    return any(ra for ra, _ in steps) and all(ra.keys() == rb.keys() and same(ra, rb) for ra, rb in steps)


def metric_rows(run) -> dict:
    """``{(point, result): [value per row]}`` of a Run (None where a row is excluded)."""
    return {(p.name, k): [row["value"] for row in r.rows] for p in run.points for k, r in p.results().items()}

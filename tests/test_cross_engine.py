"""Both engines give bit-equal results on every corpus document they both run.

The claim is that everything but ``engine.forward`` is engine-independent, and
that the two ``forward``s make the same model call: so the tolerance is zero.
Every ``*.causalab.json`` under ``documents/`` is a case. A document either
engine refuses as not yet implemented (``Unsupported``) or whose artifact another
document makes (``MissingArtifact``) is skipped with the refusal as the reason,
so a refusal shows in the summary instead of passing; any other error fails.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import causalab_mini as cm
from causalab_mini.errors import MissingArtifact, Unsupported
from causalab_mini.plan.plan import Plan
from paths import CORPUS, DOCUMENTS

ENGINES = ("hooks", "nnterp")


def _id(path: Path) -> str:
    return path.relative_to(DOCUMENTS).as_posix().removesuffix(".causalab.json")


def _differences(a, b, where: str) -> list[str]:
    """Every way two results differ, as lines; tensors compared bit for bit."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{where}: {type(a).__name__} vs {type(b).__name__}"]
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{where}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"]
        if torch.equal(a, b):
            return []
        diff = (a.double() - b.double()).abs()
        return [f"{where}: not bit-equal, max |diff| {diff.max().item():.3e} "
                f"({int((diff > 0).sum())} of {diff.numel()} elements differ)"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a)} vs {sorted(b)}"]
        return [line for k in a for line in _differences(a[k], b[k], f"{where}[{k!r}]")]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def _tensors(results: dict) -> int:
    return sum(isinstance(v, torch.Tensor) for v in results.values())


@pytest.mark.parametrize("path", CORPUS, ids=_id)
def test_both_engines_give_bit_equal_results(path, engines):
    doc = cm.read(path)
    plans = {}
    for name in ENGINES:
        try:
            plans[name] = cm.run(doc, loaded=engines(doc.raw, name, document=path)).plan
        except (Unsupported, MissingArtifact) as err:
            pytest.skip(f"{name} engine: {type(err).__name__}: {err}")
    hooks, nnterp = plans["hooks"], plans["nnterp"]

    walked = {name: dict(plan.walk()) for name, plan in plans.items()}
    assert list(walked["hooks"]) == list(walked["nnterp"]), "the same plan tree on both engines"
    problems, compared = [], 0
    for step_path, step in walked["hooks"].items():
        if isinstance(step, Plan):
            continue
        other = walked["nnterp"][step_path]
        problems += _differences(step.results, other.results, step_path)
        compared += _tensors(step.results)
    assert compared, "no result tensor to compare: the test would pass on nothing"
    assert not problems, "hooks vs nnterp:\n" + "\n".join(problems)
    # Eligibility is part of the results, and both halves of it must agree.
    for step_path, step in walked["hooks"].items():
        if not isinstance(step, Plan) and "eligible" in step.results:
            assert step.results["eligible"] == walked["nnterp"][step_path].results["eligible"]
    assert hooks.provenance["served_dtype"] == nnterp.provenance["served_dtype"]

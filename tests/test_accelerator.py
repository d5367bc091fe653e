"""The engine and generation paths on an accelerator, held to the same documents on the CPU.

Every test here is marked ``accelerator`` and skipped, saying why, where torch sees no CUDA
device; ``scripts/accelerator_check.sh`` runs them (and the sweep benchmark's GPU table) on a
machine that has one. Tolerances: a float32 model on a GPU runs other kernels (fused attention,
another GEMM blocking) than on the CPU, so rows agree to float32 rounding over a dozen ops,
``1e-3`` relative and ``1e-4`` absolute; a bf16 model to its dtype's default
(``cm.checks.default_tolerance``)."""
from __future__ import annotations

import json

import pytest
import torch
from paths import DATA, MODELS, V2
from run_values import metric_rows

import causalab_mini as cm

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.accelerator,
              pytest.mark.skipif(not CUDA, reason="no CUDA device visible (torch.cuda.is_available() is False)")]

# A sweep with shared forwards and at_once, a decode, a fit, anchored positions.
DOCS = {"layer_pos_sweep": {"at_once": 3}, "generate_probe": {}, "das": {}, "entity_patch": {}}
TOLERANCE = {"fp32": (1e-3, 1e-4)}


def _document(name: str, dtype: str):
    raw = json.loads((V2 / f"{name}.causalab.json").read_text())
    raw["model"]["dtype"] = dtype
    if name == "das":
        raw["steps"]["fit"]["epochs"] = 1
    return cm.read(raw, path=V2 / f"{name}.causalab.json")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
@pytest.mark.parametrize("name", DOCS)
def test_a_document_on_the_gpu_computes_what_it_does_on_the_cpu(name, engine, dtype):
    doc = _document(name, dtype)
    gpu = cm.run(doc, engine=engine, models=[MODELS], data=[DATA], device_map="cuda:0", **DOCS[name])
    cpu = cm.run(doc, engine=engine, models=[MODELS], data=[DATA], device_map="cpu", **DOCS[name])
    assert gpu.record["served_dtype"] == cpu.record["served_dtype"]
    rtol, atol = TOLERANCE.get(dtype) or cm.checks.default_tolerance(dtype)
    there, here = metric_rows(gpu), metric_rows(cpu)
    assert there.keys() == here.keys() and there
    for key in here:
        for a, b in zip(here[key], there[key], strict=True):
            assert (a is None) == (b is None) and (a is None or cm.checks.close(a, b, rtol, atol)), (key, a, b)


def test_the_model_is_on_the_gpu():
    for engine in ("hooks", "nnterp"):
        loaded = cm.load(V2 / "patching.causalab.json", engine=engine, models=[MODELS], device_map="cuda:0")
        model = getattr(loaded.model, "_model", loaded.model)
        assert {p.device.type for p in model.parameters()} == {"cuda"}

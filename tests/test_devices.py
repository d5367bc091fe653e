"""One worker per accelerator: ``--causalab-device-map`` resolved per xdist worker (pytest_causalab/devices.py).

The mapping is held to hand-written cases on device lists a CPU machine cannot have; under real
xdist workers, CPU device strings stand in for accelerators (``cpu`` and ``cpu:0`` are two names
torch accepts for the one CPU), and each worker reports the map it loaded with, the device its
model's weights are on, and the model it loaded.
"""
from __future__ import annotations

import json

import pytest
from paths import V2

from pytest_causalab import devices

pytest_plugins = ["pytester"]

GPUS = ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


@pytest.mark.parametrize("spec, worker, visible, expected", [
    ("auto", "gw0", GPUS, "cuda:0"),
    ("auto", "gw3", GPUS, "cuda:3"),
    ("auto", "gw5", GPUS, "cuda:1"),  # more workers than devices: they share, round robin
    ("auto", "gw1", [], "cpu"),  # nothing visible: every worker on the CPU
    ("auto", None, GPUS, "auto"),  # not a worker: transformers' auto spreads one model over all
    ("auto", "master", GPUS, "auto"),
    ("cuda:0,cuda:2", "gw0", [], "cuda:0"),
    ("cuda:0,cuda:2", "gw1", [], "cuda:2"),
    ("cuda:0,cuda:2", "gw2", [], "cuda:0"),
    ("cuda:0, cuda:2", None, [], "cuda:0"),
    ("cpu", "gw7", GPUS, "cpu"),
    ("balanced", "gw1", GPUS, "balanced"),
])
def test_a_worker_takes_its_own_device(spec, worker, visible, expected):
    assert devices.resolve(spec, worker, visible) == expected


REPORTING = """
import json, os
from pytest_causalab.session import session_of

def pytest_causalab_model_loaded(key, engine, config):
    model = getattr(engine.model, "_model", engine.model)
    worker = getattr(config, "workerinput", {}).get("workerid", "none")
    with open(os.path.join(str(config.rootpath), f"device-{worker}-{len(os.listdir(str(config.rootpath)))}.json"), "w") as fh:
        json.dump({"worker": worker, "device_map": session_of(config).device_map,
                   "weights": sorted({str(p.device) for p in model.parameters()}),
                   "model": model.config.model_type}, fh)
"""


def test_each_xdist_worker_loads_its_models_on_its_own_device(tester):
    for name in ("patching", "patching_gpt2"):
        raw = json.loads((V2 / f"{name}.causalab.json").read_text())
        raw["header"]["expect"] = []
        (tester.path / f"{name}.causalab.json").write_text(json.dumps(raw))
    tester.makeconftest(REPORTING)
    result = tester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "--causalab-engine=hooks",
                                         "--causalab-device-map=cpu,cpu:0")
    result.assert_outcomes(passed=2)
    reports = [json.loads(f.read_text()) for f in sorted(tester.path.glob("device-*.json"))]
    # The grouping scheduler gave each model's document to one worker, and each loaded one model.
    assert sorted(r["model"] for r in reports) == ["gpt2", "llama"]
    assert sorted(r["worker"] for r in reports) == ["gw0", "gw1"]
    for r in reports:
        assert r["device_map"] == {"gw0": "cpu", "gw1": "cpu:0"}[r["worker"]]
        assert r["weights"] == ["cpu"]
    # Without xdist, a list's first entry; auto on a machine with no accelerator loads on the CPU.
    for f in tester.path.glob("device-*.json"):
        f.unlink()
    tester.runpytest_subprocess("--causalab-engine=hooks", "--causalab-device-map=auto").assert_outcomes(passed=2)
    reports = [json.loads(f.read_text()) for f in tester.path.glob("device-*.json")]
    assert [r["device_map"] for r in reports] == ["auto", "auto"] and all(r["weights"] == ["cpu"] for r in reports)

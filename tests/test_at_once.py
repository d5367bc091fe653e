"""Points at once (engine/at_once.py): several points' forwards stacked into one model call.

Held to the same points run one by one (``at_once=1``): on one thread, bit for bit. Stacking
changes only the batch a kernel sees; on several threads PyTorch may split a left-padded batch's
work by its size (the plain model's own low bits can move with it, depending on the machine),
so there the results are held within fp32's default tolerance and matches exactly.
"""
from __future__ import annotations

import pytest
import torch
from model_calls import counting_calls
from paths import CORPUS, V2

import causalab_mini as cm
from causalab_mini.engine import at_once


pytestmark = pytest.mark.usefixtures("one_thread")

LAYER_POS = V2 / "layer_pos_sweep.causalab.json"
SWEPT = [p for p in CORPUS if len(cm.read(p).points) > 1]


def _values(runs: dict) -> dict:
    return {(n, k): [r["value"] for r in result.rows] for n, ran in runs.items()
            for k, result in ran.point().results().items()}


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
@pytest.mark.parametrize("path", SWEPT, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_points_at_once_compute_what_points_one_by_one_do(engines, path, engine):
    loaded = engines(path, engine)
    plan = cm.compile(path, loaded=loaded)
    plain, together = (_values(cm.run_points(path, loaded=loaded, at_once=k)) for k in (1, len(plan.points)))
    assert together.keys() == plain.keys()
    assert together == plain  # on one thread (this module's), bit for bit


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
def test_on_two_threads_at_once_agrees_with_one_by_one_within_the_dtypes_tolerance(engines, engine):
    """What at_once promises on several threads: PyTorch may split a left-padded batch's work by
    its size there (whether the low bits then move is the machine's BLAS to decide, so it is not
    asserted), and every value stays within fp32's default tolerance, every match exactly."""
    loaded = engines(LAYER_POS, engine)
    points = len(cm.read(LAYER_POS).points)
    rtol, atol = cm.checks.default_tolerance("fp32")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        plain, together = (_values(cm.run_points(LAYER_POS, loaded=loaded, at_once=k)) for k in (1, points))
    finally:
        torch.set_num_threads(before)
    assert together.keys() == plain.keys()
    for key, values in plain.items():
        assert [v is None for v in together[key]] == [v is None for v in values], key
        if key[1] == "iia":
            assert together[key] == values, key
        else:
            for a, b in zip(together[key], values):
                assert b is None or abs(a - b) <= atol + rtol * abs(b), (key, a, b)


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
def test_at_once_makes_one_call_per_group_within_the_batch_size(engines, engine):
    loaded = engines(LAYER_POS, engine)
    points = len(cm.read(LAYER_POS).points)
    rows = cm.compile(LAYER_POS, loaded=loaded).points[0].steps["score"].rows
    with counting_calls(loaded) as calls:
        cm.run_points(LAYER_POS, loaded=loaded, at_once=points)
    assert len(calls) == 1 + 1  # the shared counterfactual pass, then every point in one call
    with counting_calls(loaded) as calls:
        cm.run_points(LAYER_POS, loaded=loaded, at_once=4)
    assert len(calls) == 1 + 2  # groups of 4 and 2
    # A batch size bounds the stacked rows: two points' rows fit in one window of 2·rows.
    with counting_calls(loaded) as calls:
        cm.run_points(LAYER_POS, loaded=loaded, at_once=points, batch_size=2 * rows)
    assert len(calls) == 1 + points // 2


def test_a_run_records_at_once_and_the_points_results_are_their_own(engines, tmp_path):
    loaded = engines(LAYER_POS, "hooks")
    runs = cm.run_points(LAYER_POS, loaded=loaded, at_once=3, out=tmp_path)
    alone = cm.run_points(LAYER_POS, loaded=loaded)
    for name, ran in runs.items():
        assert ran.record["at_once"] == 3
        assert cm.open(tmp_path / name).record["at_once"] == 3
        # Each point's writes landed only in its own rows: its results are its own, not a neighbour's.
        assert ran.point().result("iia").values == alone[name].point().result("iia").values
    assert "at_once" not in alone[next(iter(alone))].record


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_a_bad_at_once_is_refused_before_a_forward(engines, bad):
    loaded = engines(LAYER_POS, "hooks")
    with counting_calls(loaded) as calls, pytest.raises(cm.EngineError, match="at_once"):
        cm.run_points(LAYER_POS, loaded=loaded, at_once=bad)
    assert calls == []


def test_points_that_cannot_stack_run_one_by_one():
    """A fit (DBM) or a decode (generation) is a point's own: never stacked."""
    for name in ("dbm", "generate_probe", "generate_steer"):
        plan = cm.compile(V2 / f"{name}.causalab.json")
        groups = at_once.groups([(p.name, p) for p in plan.points], 8, None)
        assert [len(g) for g in groups] == [1] * len(plan.points), name

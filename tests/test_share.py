"""Shared forwards (plan/share.py): a forward several sweep points run identically runs once.

Held to the plain mode (``share=False``, every point its own forwards): every swept corpus
document on both engines writes the same bytes either way; the model is called P + 1 times
for a P-point patching sweep, not 2P (counted by a hook on the model itself); the shared
reads are freed as their last point finishes; ``explain`` shows the sharing.
"""
from __future__ import annotations

import pytest
from model_calls import counting_calls, folder_bytes
from paths import CORPUS, DATA, MODELS, V2

import causalab_mini as cm
from causalab_mini import cli
from causalab_mini.engine import progress, steps
from causalab_mini.plan.share import SHARED, shared_step

pytestmark = pytest.mark.usefixtures("one_thread")

SWEPT = [p for p in CORPUS if len(cm.read(p).points) > 1]
LAYER_POS = V2 / "layer_pos_sweep.causalab.json"


def test_the_corpus_has_documents_that_share_and_ones_that_cannot():
    names = {p.name.split(".")[0] for p in SWEPT if shared_step(cm.compile(p)) is not None}
    assert {"layer_pos_sweep", "pos_sweep", "head_patching", "neuron_patching", "logit_lens"} <= names
    # A fit's passes and a decode are a point's own (its featurizers, its continuation).
    assert {"dbm", "generate_probe", "generate_steer"}.isdisjoint(names)


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
@pytest.mark.parametrize("path", SWEPT, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_shared_and_plain_runs_write_the_same_bytes(engines, tmp_path, path, engine):
    loaded = engines(path, engine)
    for share in (True, False):
        cm.run(path, loaded=loaded, out=tmp_path / str(share), share=share)
    shared, plain = folder_bytes(tmp_path / "True"), folder_bytes(tmp_path / "False")
    assert list(shared) == list(plain)
    for name in plain:
        assert shared[name] == plain[name], name


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
def test_a_p_point_patching_sweep_calls_the_model_p_plus_one_times(engines, engine):
    loaded = engines(LAYER_POS, engine)
    points = len(cm.read(LAYER_POS).points)
    with counting_calls(loaded) as calls:
        cm.run(LAYER_POS, loaded=loaded)
    assert len(calls) == points + 1
    with counting_calls(loaded) as calls:
        cm.run(LAYER_POS, loaded=loaded, share=False)
    assert len(calls) == 2 * points
    # Windowed by a batch size, each window is one call of each pass: (P + 1) per window.
    rows = cm.compile(LAYER_POS, loaded=loaded).points[0].steps["score"].rows
    with counting_calls(loaded) as calls:
        cm.run(LAYER_POS, loaded=loaded, batch_size=16)
    assert len(calls) == (points + 1) * -(-rows // 16)


def test_a_shared_read_is_freed_when_its_last_point_has_run(engines):
    loaded = engines(LAYER_POS, "hooks")
    plan = cm.compile(LAYER_POS, loaded=loaded)
    shared = shared_step(plan)
    last_user = {name: users[-1] for name, users in shared.users}
    state = steps.State()
    held = []
    with progress.reporting(lambda name, done, total: held.append((name, set(state.shared)))):
        steps.run(loaded, plan, state=state)
    order = [p.name for p in plan.points]
    for point, kept in held:
        # Kept: exactly the reads some point still to run borrows.
        assert kept == {n for n, last in last_user.items() if order.index(last) > order.index(point)}
    assert state.shared == {} and state.borrowers == {}


def test_every_point_borrows_what_its_own_forward_would_have_read(engines):
    loaded = engines(LAYER_POS, "hooks")
    plain = {p.name: p for p in cm.compile(LAYER_POS, loaded=loaded, share=False).points}
    plan = cm.compile(LAYER_POS, loaded=loaded)
    reads = {r.name: r for f in shared_step(plan).forwards for r in f.reads}
    for point in plan.points:
        obs, own = point.steps["score"], plain[point.name].steps["score"]
        (cf,) = [f for f in own.forwards if not f.writes]
        assert [f.model for f in obs.forwards] == [f.model for f in own.forwards if f.writes]
        for mine, theirs in obs.borrowed:
            (read,) = [r for r in cf.reads if r.name == mine]
            assert (reads[theirs].address, reads[theirs].where) == (read.address, read.where)


def test_explain_shows_the_shared_step_and_the_borrowing(capsys):
    paths = ["--models", str(MODELS), "--data", str(DATA)]
    assert cli.main(["explain", str(LAYER_POS), *paths]) == 0
    text = capsys.readouterr().out
    points = len(cm.read(LAYER_POS).points)
    assert f"{SHARED}: Shared  1 forward run once for {points} points" in text
    assert text.count("borrow 'v_cf' = shared read") == points
    assert cli.main(["explain", str(LAYER_POS), "--no-share", *paths]) == 0
    assert "Shared" not in capsys.readouterr().out

"""A document's points as pytest items share their forwards: the first item of a document runs the
selected points together (``causalab_mini.run_points``), so a P-point patching sweep calls the
model P + 1 times in a session, as ``causalab-mini run`` does — and each item still gets exactly
the run, and the files, of its point run alone.

The model's calls are counted by a forward pre-hook a conftest registers when the plugin loads
the model (``pytest_causalab_model_loaded``); each process writes its count to a file.
"""
from __future__ import annotations

import json

import pytest
from model_calls import folder_bytes
from paths import DATA, V2

import causalab_mini as cm

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("one_thread")

LAYER_POS = V2 / "layer_pos_sweep.causalab.json"
POINTS = [p.name for p in cm.read(LAYER_POS).points]

COUNTING = """
import json, os
CALLS = []

def pytest_causalab_model_loaded(key, engine, config):
    model = getattr(engine.model, "_model", engine.model)
    model.register_forward_pre_hook(lambda module, args: CALLS.append(1))

def pytest_sessionfinish(session):
    # One file a process (the controller and each worker; the suite's own xdist worker name is
    # inherited by all of them, so it cannot tell them apart).
    (session.config.rootpath / f"calls-{os.getpid()}.json").write_text(json.dumps(len(CALLS)))
"""


@pytest.fixture
def sweep(tester):
    doc = json.loads(LAYER_POS.read_text())
    doc["header"]["expect"] = []
    (tester.path / "grid.causalab.json").write_text(json.dumps(doc, indent=1))
    return tester


def _calls(tester) -> int:
    found = sorted(tester.path.glob("calls-*.json"))
    total = sum(json.loads(f.read_text()) for f in found)
    for f in found:
        f.unlink()
    return total


def test_a_sweeps_items_call_the_model_p_plus_one_times_and_write_what_each_point_alone_writes(
        sweep, engines, tmp_path):
    sweep.makeconftest(COUNTING)
    result = sweep.runpytest("--causalab-engine=hooks", "--causalab-out=out")
    result.assert_outcomes(passed=len(POINTS), warnings=len(POINTS))  # baselines written
    assert _calls(sweep) == len(POINTS) + 1
    doc = cm.read(sweep.path / "grid.causalab.json")
    loaded = engines(LAYER_POS, "hooks")
    for name in POINTS:
        alone = tmp_path / name
        cm.run(doc.point(name), loaded=loaded, out=alone, data=[DATA])
        assert folder_bytes(sweep.path / "out" / "grid" / "hooks" / name) == folder_bytes(alone)
    # The second session checks the baselines the first wrote: the same numbers, shared again.
    result = sweep.runpytest("--causalab-engine=hooks")
    result.assert_outcomes(passed=len(POINTS))
    assert _calls(sweep) == len(POINTS) + 1


@pytest.mark.parametrize("selected, points", [(["-k", "layers:1"], 3), (["grid.causalab.json::layers=0,pos=-1"], 1)])
def test_a_selection_shares_among_the_selected_points_only(sweep, selected, points):
    sweep.makeconftest(COUNTING)
    result = sweep.runpytest("--causalab-engine=hooks", *selected)
    result.assert_outcomes(passed=points, warnings=points)
    assert _calls(sweep) == (points + 1 if points > 1 else 2)


def test_a_point_a_hook_changes_runs_alone_and_the_others_together(sweep):
    sweep.makeconftest(COUNTING + """
def pytest_causalab_modify_point(point, config):
    if point.name == "layers=1,pos=-1":
        point.batch_size = 7
""")
    result = sweep.runpytest("--causalab-engine=hooks")
    result.assert_outcomes(passed=len(POINTS), warnings=len(POINTS))
    rows = cm.compile(LAYER_POS, share=False).points[0].steps["score"].rows
    windows = -(-rows // 7)
    assert _calls(sweep) == (len(POINTS) - 1 + 1) + 2 * windows


def test_under_xdist_loadgroup_a_document_is_shared_on_its_worker_and_plain_load_runs_points_alone(sweep):
    sweep.makeconftest(COUNTING)
    result = sweep.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "--causalab-engine=hooks")
    result.assert_outcomes(passed=len(POINTS))
    assert _calls(sweep) == len(POINTS) + 1
    result = sweep.runpytest_subprocess("-n", "2", "--causalab-engine=hooks")
    result.assert_outcomes(passed=len(POINTS))
    assert _calls(sweep) == 2 * len(POINTS)  # a worker may get only some of the points: each alone


def test_at_once_in_a_session_stacks_a_documents_points(sweep):
    sweep.makeconftest(COUNTING)
    result = sweep.runpytest("--causalab-engine=hooks", f"--causalab-at-once={len(POINTS)}", "--causalab-out=out")
    result.assert_outcomes(passed=len(POINTS), warnings=len(POINTS))
    assert _calls(sweep) == 2  # the shared pass, then every point in one call
    for name in POINTS:
        assert cm.open(sweep.path / "out" / "grid" / "hooks" / name).record["at_once"] == len(POINTS)
    result = sweep.runpytest("--causalab-engine=hooks", "--causalab-at-once=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--causalab-at-once: '0' is below 1*"])


def test_a_result_cache_serves_unchanged_points_and_computes_only_the_changed(sweep):
    sweep.makeconftest(COUNTING)
    first = sweep.runpytest("--causalab-engine=hooks", "--causalab-cache=cache", "--causalab-out=one")
    first.assert_outcomes(passed=len(POINTS), warnings=len(POINTS))
    assert _calls(sweep) == len(POINTS) + 1
    first.stdout.fnmatch_lines([f"0 of {len(POINTS)} points served from *cache (not computed)"])
    second = sweep.runpytest("--causalab-engine=hooks", "--causalab-cache=cache", "--causalab-out=two")
    second.assert_outcomes(passed=len(POINTS))
    assert _calls(sweep) == 0
    second.stdout.fnmatch_lines([f"{len(POINTS)} of {len(POINTS)} points served from *cache (not computed)",
                                 "  cached     grid.causalab.json::layers=0,pos=-4"])
    assert folder_bytes(sweep.path / "two") == folder_bytes(sweep.path / "one")  # what a served point writes
    # One point changed by a hook (its batch size, a key part): computed alone; the rest served.
    sweep.makeconftest(COUNTING + """
def pytest_causalab_modify_point(point, config):
    if point.name == "layers=1,pos=-1":
        point.batch_size = 7
""")
    third = sweep.runpytest("--causalab-engine=hooks", "--causalab-cache=cache")
    third.assert_outcomes(passed=len(POINTS))
    rows = cm.compile(LAYER_POS, share=False).points[0].steps["score"].rows
    assert _calls(sweep) == 2 * -(-rows // 7)
    third.stdout.fnmatch_lines([f"{len(POINTS) - 1} of {len(POINTS)} points served from *"])


def test_documents_on_one_model_share_the_clean_forward_they_all_read(tester, engines, tmp_path):
    """Three documents whose points all read the counterfactual prompts unpatched: the session
    runs that pass once for the three (``cm.run_together``), and each item still writes exactly
    what its point writes alone."""
    names = ("patching", "pos_sweep", "head_patching")
    for name in names:
        doc = json.loads((V2 / f"{name}.causalab.json").read_text())
        doc["header"]["expect"] = []
        (tester.path / f"{name}.causalab.json").write_text(json.dumps(doc, indent=1))
    points = {name: [p.name for p in cm.read(tester.path / f"{name}.causalab.json").points] for name in names}
    total = sum(map(len, points.values()))
    tester.makeconftest(COUNTING)
    result = tester.runpytest("--causalab-engine=hooks", "--causalab-out=out")
    result.assert_outcomes(passed=total, warnings=total)
    assert _calls(tester) == total + 1
    loaded = engines(LAYER_POS, "hooks")
    for name, inside in points.items():
        doc = cm.read(tester.path / f"{name}.causalab.json")
        for point in inside:
            single, shown = (doc, name) if point is None else (doc.point(point), point)
            alone = tmp_path / name / shown
            cm.run(single, loaded=loaded, out=alone, data=[DATA], share=False)
            assert folder_bytes(tester.path / "out" / name / "hooks" / shown) == folder_bytes(alone)
    # One document selected: it shares within itself only.
    result = tester.runpytest("--causalab-engine=hooks", "pos_sweep.causalab.json")
    result.assert_outcomes(passed=len(points["pos_sweep"]))
    assert _calls(tester) == len(points["pos_sweep"]) + 1


def test_a_document_that_cannot_compile_leaves_the_others_sharing(tester):
    good = json.loads((V2 / "pos_sweep.causalab.json").read_text())
    good["header"]["expect"] = []
    bad = json.loads(json.dumps(good))
    bad["sites"]["target"]["layers"] = [99]  # past the model's layers: a compile-time refusal
    (tester.path / "good.causalab.json").write_text(json.dumps(good))
    (tester.path / "bad.causalab.json").write_text(json.dumps(bad))
    points = len(cm.read(tester.path / "good.causalab.json").points)
    tester.makeconftest(COUNTING)
    result = tester.runpytest("--causalab-engine=hooks")
    result.assert_outcomes(passed=points, failed=points, warnings=points)
    result.stdout.fnmatch_lines(["*sites.target.layers*"])
    assert _calls(tester) == points + 1


# --- each item pays for its own point ------------------------------------------------------------

PER_ITEM = COUNTING + """
ITEMS = []

def pytest_runtest_call(item):
    ITEMS.append([item.name, len(CALLS), None])

def pytest_runtest_logreport(report):
    if report.when == "call":
        ITEMS[-1][1] = len(CALLS) - ITEMS[-1][1]  # the model calls made inside this item's call
        ITEMS[-1][2] = report.duration

def pytest_unconfigure(config):
    (config.rootpath / "items.json").write_text(json.dumps(ITEMS))
"""


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
def test_each_item_computes_its_own_point_and_reports_its_own_duration(sweep, engine):
    """The first item of the sweep runs the shared forward and its own patched one; every later
    item runs its own, inside its own call — so pytest's durations and -v lines are each point's
    own work, and the session still calls the model P + 1 times."""
    sweep.makeconftest(PER_ITEM)
    result = sweep.runpytest(f"--causalab-engine={engine}", "-v")
    result.assert_outcomes(passed=len(POINTS), warnings=len(POINTS))
    items = json.loads((sweep.path / "items.json").read_text())
    assert [name for name, _, _ in items] == POINTS
    assert [calls for _, calls, _ in items] == [2] + [1] * (len(POINTS) - 1)
    assert all(duration > 0 for _, _, duration in items)
    assert _calls(sweep) == len(POINTS) + 1
    # -v names each point as it passes, in order.
    result.stdout.fnmatch_lines([f"grid.causalab.json::{name} PASSED*" for name in POINTS], consecutive=False)


def test_x_stops_between_points(sweep):
    """-x after the first point fails: the later points are never computed."""
    doc = json.loads((sweep.path / "grid.causalab.json").read_text())
    doc["header"]["expect"] = [{"result": "iia", "mean": {">": 2}, "points": [POINTS[0]]}]
    (sweep.path / "grid.causalab.json").write_text(json.dumps(doc, indent=1))
    sweep.makeconftest(PER_ITEM)
    result = sweep.runpytest("--causalab-engine=hooks", "-x")
    result.assert_outcomes(failed=1)
    assert _calls(sweep) == 2  # the shared forward and the first point's own; nothing after it


def test_scratch_point_folders_are_committed_unflushed_and_an_asked_for_out_is_flushed(sweep, monkeypatch):
    """Without --causalab-out a point's folder is scratch under pytest's temporary directory: committed
    whole (run.json, every file) but never flushed; with --causalab-out each point's folder is made
    durable by its one barrier before its run.json."""
    from causalab_mini.outputs import write as write_mod

    barriers = []
    original = write_mod.barrier
    monkeypatch.setattr(write_mod, "barrier", lambda folder, written=(): (barriers.append(folder),
                                                                          original(folder, written)))
    scratch = sweep.runpytest("--causalab-engine=hooks", f"--basetemp={sweep.path / 'tmp'}")
    scratch.assert_outcomes(passed=len(POINTS), warnings=len(POINTS))
    folders = sorted(p.parent for p in (sweep.path / "tmp").rglob("run.json"))
    assert [f.name for f in folders] == sorted(POINTS) and barriers == []
    assert all(write_mod.state(f) == "complete" for f in folders)
    kept = sweep.runpytest("--causalab-engine=hooks", "--causalab-out=out")
    kept.assert_outcomes(passed=len(POINTS))
    assert sorted(barriers) == sorted(sweep.path / "out" / "grid" / "hooks" / name for name in POINTS)
    assert {f.name: folder_bytes(f) for f in folders} == \
        {name: folder_bytes(sweep.path / "out" / "grid" / "hooks" / name) for name in POINTS}

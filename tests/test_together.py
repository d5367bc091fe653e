"""Points of several documents on one model run together (``cm.run_together``): a clean forward
that documents share — the same model on the same token ids, unwritten — runs once for all of
them, and every point comes back exactly as it runs alone: the same Run, the same files."""
from __future__ import annotations

import json

import pytest
from model_calls import counting_calls, folder_bytes
from paths import DATA, MODELS, V2

import causalab_mini as cm
from causalab_mini.errors import PlanError
from causalab_mini.plan.share import shared_step

pytestmark = pytest.mark.usefixtures("one_thread")

# Three documents whose every point reads the counterfactual weekdays prompts unpatched (one
# unswept, two swept), then runs one patched forward on the base prompts.
DOCS = [V2 / f"{n}.causalab.json" for n in ("patching", "pos_sweep", "head_patching")]


def _folder(root):
    return lambda doc, name: root / doc.name / (name or "root")


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
def test_documents_reading_the_same_clean_prompts_call_the_model_once_for_them(engines, engine, tmp_path):
    loaded = engines(DOCS[0], engine)
    points = [len(cm.read(p).points) for p in DOCS]
    with counting_calls(loaded) as calls:
        runs = cm.run_together([(p, None) for p in DOCS], loaded=loaded, out=_folder(tmp_path / "together"))
    # One patched forward per point, and the counterfactual pass once for all three documents.
    assert len(calls) == sum(points) + 1
    with counting_calls(loaded) as calls:
        for p in DOCS:
            cm.run(p, loaded=loaded)
    assert len(calls) == sum(points) + len(DOCS)  # each document shares only within itself
    assert [list(r) for r in runs] == [[q.name for q in cm.read(p).points] for p in DOCS]
    alone = _folder(tmp_path / "alone")
    for p in DOCS:
        doc = cm.read(p)
        for q in doc.points:
            single = doc if q.name is None else doc.point(q.name)
            cm.run(single, loaded=loaded, out=alone(doc, q.name), share=False)
    together, separate = folder_bytes(tmp_path / "together"), folder_bytes(tmp_path / "alone")
    assert list(together) == list(separate) and len(together) > 3 * sum(points)
    for name in separate:
        assert together[name] == separate[name], name
    # The Runs handed back are the runs alone: their results, row for row.
    ran = runs[1]["pos=-1"].point().result("iia").rows
    assert ran == cm.open(alone(cm.read(DOCS[1]), "pos=-1")).point().result("iia").rows


def test_a_selection_of_points_and_two_documents_sharing_names(engines, tmp_path):
    loaded = engines(DOCS[0], "hooks")
    doc = json.loads(DOCS[1].read_text())
    twin = tmp_path / "twin.causalab.json"
    twin.write_text(json.dumps(doc))
    with counting_calls(loaded) as calls:
        first, second = cm.run_together([(DOCS[1], ["pos=-1"]), (twin, ["pos=-1", "pos=-2"])], loaded=loaded,
                                         data=[DATA])
    assert len(calls) == 3 + 1
    assert list(first) == ["pos=-1"] and list(second) == ["pos=-1", "pos=-2"]
    assert first["pos=-1"].point().result("iia").rows == second["pos=-1"].point().result("iia").rows


def test_share_false_runs_each_points_own_forwards(engines):
    loaded = engines(DOCS[0], "hooks")
    with counting_calls(loaded) as calls:
        cm.run_together([(p, None) for p in DOCS], loaded=loaded, share=False)
    assert len(calls) == 2 * sum(len(cm.read(p).points) for p in DOCS)


def test_an_unknown_point_and_a_bad_option_are_refused_before_a_forward(engines):
    loaded = engines(DOCS[0], "hooks")
    with counting_calls(loaded) as calls:
        with pytest.raises(PlanError) as err:
            cm.run_together([(DOCS[0], None), (DOCS[1], ["pos=-9"])], loaded=loaded)
        assert "pos=-9" in err.value.path and "pos=-1" in err.value.fix
        with pytest.raises(PlanError) as err:
            cm.run_together([(DOCS[0], ["pos=-1"])], loaded=loaded)
        assert "not swept" in err.value.fix
        with pytest.raises(cm.EngineError):
            cm.run_together([(DOCS[0], None)], loaded=loaded, at_once=0)
    assert calls == []


def test_a_swept_chat_document_shares_its_forwards(engines, tmp_path):
    """A chat row's turn spans are part of what makes two forwards the same: a swept chat
    document's clean pass is shared like any other, and writes what the plain run writes."""
    doc = json.loads((V2 / "chat_turn.causalab.json").read_text())
    sites = doc["sites"]
    site = next(s for s in sites.values() if "layers" in s)
    site["layers"] = [{"sweep": [0, 1]}]
    path = tmp_path / "chat_sweep.causalab.json"
    path.write_text(json.dumps(doc))
    loaded = engines(V2 / "chat_turn.causalab.json", "hooks")
    assert shared_step(cm.compile(path, loaded=loaded, data=[DATA])) is not None
    for share in (True, False):
        cm.run(path, loaded=loaded, data=[DATA], out=tmp_path / str(share), share=share)
    assert folder_bytes(tmp_path / "True") == folder_bytes(tmp_path / "False")


def test_points_of_several_documents_stacked_at_once_compute_what_they_do_alone(engines):
    """at_once stacks points whose passes run over the same prompts, whichever document they come
    from: the three documents' eight patched passes in two calls, after the one shared pass."""
    loaded = engines(DOCS[0], "hooks")
    plain = cm.run_together([(p, None) for p in DOCS], loaded=loaded)
    with counting_calls(loaded) as calls:
        stacked = cm.run_together([(p, None) for p in DOCS], loaded=loaded, at_once=4)
    assert len(calls) == 1 + 2
    for a, b in zip(plain, stacked):
        assert list(a) == list(b)
        for name in a:
            assert {k: r.rows for k, r in a[name].point().results().items()} == \
                {k: r.rows for k, r in b[name].point().results().items()}
        assert all(run.record["at_once"] == 4 for run in b.values())


def test_run_points_refuses_an_out_that_is_a_file_before_the_model_loads(tmp_path, monkeypatch):
    """As ``run`` refuses it: the folder is checked before the (seconds-long) load, not after."""
    from causalab_mini import api

    loads = []

    def no_load(*args, **kwargs):
        loads.append(args)
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(api, "load", no_load)
    occupied = tmp_path / "out"
    occupied.mkdir()
    (occupied / "pos=-1").write_text("a file where a point's folder goes")
    with pytest.raises(cm.EngineError, match="is a file, and a run writes a folder"):
        cm.run_points(DOCS[1], ["pos=-1"], engine="hooks", models=[MODELS], data=[DATA], out=occupied)
    assert loads == []
    # The control: the point whose folder is free goes on to load the model.
    with pytest.raises(AssertionError, match="the model was loaded"):
        cm.run_points(DOCS[1], ["pos=-2"], engine="hooks", models=[MODELS], data=[DATA], out=occupied)
    assert len(loads) == 1

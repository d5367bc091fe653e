"""pytest_causalab through pytester: documents collected, run, checked and reported as a user sees it.

Each test writes documents (copies of the corpus's, changed where the test needs)
into pytester's directory and points the plugin at the shipped models and data
through an ini file. Most runs are in-process; the ones that check imports or
need real process isolation (xdist) run pytest in a subprocess.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from xml.etree import ElementTree

import pytest
from paths import V2

pytest_plugins = ["pytester"]

CORPUS = V2  # the corpus documents the tests copy and change


@pytest.fixture(scope="session")
def measured(warm):
    """``measured(source, metric, point=None, engine="nnterp")``: a corpus point's per-row values,
    computed by causalab_mini itself, not through the plugin — what the plugin's tables, summaries
    and baselines must show. (The engines' numbers are held to hand computations elsewhere:
    test_patching, test_hooks_engine, test_positions_run.)"""
    import causalab_mini as cm

    plans = {}

    def values(source: str, metric: str, point=None, engine: str = "nnterp") -> list:
        if (source, engine) not in plans:
            plans[source, engine] = cm.run(CORPUS / f"{source}.causalab.json", engine=engine).plan
        plan = plans[source, engine]
        return (plan.steps[point] if point else plan).steps["score"].results[metric].tolist()

    return values


def g6(value: float) -> str:
    """A number as the failure tables print it."""
    return f"{value:.6g}"


def g4(value: float) -> str:
    """A number as the summary prints it (0 for zero, as an int would print)."""
    return f"{value:.4g}"


def mean(values) -> float:
    return sum(values) / len(values)


def corpus(name: str) -> dict:
    return json.loads((CORPUS / f"{name}.causalab.json").read_text())


def write(tester, name: str, source: str, *, expect=None, edit=None) -> Path:
    doc = copy.deepcopy(corpus(source))
    doc["header"]["expect"] = expect or []
    if edit:
        edit(doc)
    path = tester.path / f"{name}.causalab.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def baseline(tester, name: str) -> dict:
    return json.loads((tester.path / "baselines" / f"{name}.json").read_text())


def save_baseline(tester, name: str, data: dict) -> None:
    (tester.path / "baselines" / f"{name}.json").write_text(json.dumps(data, indent=1))


# --- collection -------------------------------------------------------------------------------

def test_one_item_per_point_and_one_for_an_unswept_document(tester):
    write(tester, "sweep", "pos_sweep")
    write(tester, "single", "patching")
    result = tester.runpytest("--collect-only", "-q")
    assert result.ret == 0
    ids = [line for line in result.outlines if "::" in line]
    assert sorted(ids) == ["single.causalab.json::single", "sweep.causalab.json::pos=-1",
                           "sweep.causalab.json::pos=-2", "sweep.causalab.json::pos=-3"]


def test_collection_imports_no_engine(tester):
    write(tester, "sweep", "pos_sweep")
    write(tester, "single", "patching_gpt2")
    tester.makeconftest("""
        import sys
        def pytest_collection_finish(session):
            heavy = sorted(m for m in sys.modules
                           if m.split(".")[0] in ("torch", "transformers", "nnterp", "nnsight"))
            print("HEAVY:", heavy[:5])
    """)
    result = tester.runpytest_subprocess("--collect-only", "-q")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["HEAVY: []", "4 tests collected*"])


def test_an_invalid_document_is_one_failing_item_and_the_others_still_run(tester):
    def two_cuts(doc):
        doc["interventions"]["patching"]["writes"]["patch"]["pos"] = {"index": -1, "last": 2}
    write(tester, "bad", "patching", edit=two_cuts)
    write(tester, "good", "patching")
    (tester.path / "broken.causalab.json").write_text("{not json")
    result = tester.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "DocumentError in bad.causalab.json::bad",
        "  at:   interventions.patching.writes.patch.pos",
        "  what: a position has exactly one cut*",
    ])
    result.stdout.fnmatch_lines(["DocumentError in broken.causalab.json::broken", "*not valid JSON*"])
    assert "Traceback" not in result.stdout.str() and "Interrupted" not in result.stdout.str()


def test_an_expectation_naming_no_metric_is_refused_at_collection(tester):
    """Refused without a model: the document is one failing item (collected as ``typo``)."""
    write(tester, "typo", "patching", expect=[{"result": "iaa", "mean": {">": 0}}])
    tester.runpytest("--collect-only", "-q").stdout.fnmatch_lines(["typo.causalab.json::typo"])
    result = tester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["  at:   header.expect.0.result", "  what: no metric named 'iaa'",
                                 "  fix:  did you mean 'iia'? metrics here: ['iia', 'logit_diff']"])


MISSPELLED = {  # name: (corpus document, expectations)
    "result": ("pos_sweep", [{"result": "iiaa", "mean": {">": 0}}]),
    "point": ("pos_sweep", [{"result": "iia", "mean": {">": 0}, "points": ["pos=-9"]}]),
    "axis": ("pos_sweep", [{"result": "iia", "mean": {">": 0}, "points": {"layer": 0}}]),
    "value": ("pos_sweep", [{"result": "iia", "mean": {">": 0}, "points": {"pos": [-1, -7]}}]),
    "unswept": ("patching", [{"result": "iia", "mean": {">": 0}, "points": ["pos=-1"]}]),
}


def test_validate_refuses_every_expectation_misspelling_as_collection_does(tester, capsys):
    """One checker (document.read.points) serves validate, explain and collection: same path, problem, fix."""
    from causalab_mini import cli

    refusals = {}
    for name, (source, expectations) in MISSPELLED.items():
        path = write(tester, name, source, expect=expectations)
        assert cli.main(["validate", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: DocumentError: header.expect.0"), err
        refusals[name] = err.strip().removeprefix("error: DocumentError: ")
        assert cli.main(["explain", str(path)]) == 2
        assert capsys.readouterr().err.strip().removeprefix("error: DocumentError: ") == refusals[name]
    result = tester.runpytest()
    result.assert_outcomes(failed=len(MISSPELLED))
    out = result.stdout.str()
    for name, text in refusals.items():
        where, rest = text.split(": ", 1)
        what, fix = rest.split("; ", 1)
        assert f"DocumentError in {name}.causalab.json::{name}\n  at:   {where}\n  what: {what}\n  fix:  {fix}" in out


# --- selection --------------------------------------------------------------------------------

def test_selection_by_node_id_marker_and_keyword(tester):
    write(tester, "sweep", "pos_sweep")
    write(tester, "single", "patching")

    def selected(*args):
        result = tester.runpytest("--collect-only", "-q", *args)
        return sorted(line for line in result.outlines if "::" in line)

    assert selected("sweep.causalab.json::pos=-2") == ["sweep.causalab.json::pos=-2"]
    assert selected("-m", "point(pos=-2)") == ["sweep.causalab.json::pos=-2"]
    assert selected("-m", "causalab and not point(pos=-1)") == [
        "single.causalab.json::single", "sweep.causalab.json::pos=-2", "sweep.causalab.json::pos=-3"]
    assert selected("-k", "single") == ["single.causalab.json::single"]
    assert selected("-k", "pos:-3") == ["sweep.causalab.json::pos=-3"]


def test_items_of_one_model_run_together_and_carry_its_xdist_group(tester):
    write(tester, "a_llama", "pos_sweep")
    write(tester, "b_gpt2", "patching_gpt2")
    write(tester, "c_llama", "patching")
    tester.makeconftest("""
        def pytest_collection_finish(session):
            for item in session.items:
                print("ORDER", item.nodeid, item.get_closest_marker("xdist_group").kwargs["name"])
    """)
    result = tester.runpytest("--collect-only", "-q", "-s")
    order = [line.split()[1:] for line in result.outlines if line.startswith("ORDER")]
    assert [o[1] for o in order] == ["tiny-llama"] * 4 + ["tiny-gpt2"]
    assert order[3][0] == "c_llama.causalab.json::c_llama"


# --- running: expectations, engines, models loaded once ---------------------------------------

def test_failing_expectation_is_a_table(tester, measured):
    iia, diff = measured("pos_sweep", "iia", "pos=-1"), measured("pos_sweep", "logit_diff", "pos=-1")
    misses = [v for v in diff if not v > 0]
    assert mean(iia) <= 0.8 and misses  # the premise: both checks fail on this point
    worst = diff.index(min(diff))
    write(tester, "sweep", "pos_sweep", expect=[
        {"result": "iia", "mean": {">": 0.8}, "points": ["pos=-1"]},
        {"result": "logit_diff", "all": {">": 0}, "points": {"pos": -1}},
        {"result": "iia", "eligible": 1.0},
    ])
    result = tester.runpytest("sweep.causalab.json::pos=-1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*pos=-1 (sweep.causalab.json)*",
        f"2 of 3 checks failed on nnterp: iia mean got {g6(mean(iia))}, expected > 0.8 (+1 more)",
        "point   result      aggregate  expected/baseline  got*difference",
        f"pos=-1  iia         mean       > 0.8              {g6(mean(iia))}* {g6(mean(iia) - 0.8)}",
        f"pos=-1  logit_diff  all        > 0                {g6(min(diff))}* {g6(min(diff))}* "
        f"({len(misses)}/4 rows miss; worst is row {worst})",
    ])
    assert "Traceback" not in result.stdout.str()


def test_true_expectations_pass_and_report_means(tester, measured):
    iia, diff = measured("pos_sweep", "iia", "pos=-1"), measured("pos_sweep", "logit_diff", "pos=-1")
    off = [v for p in ("pos=-2", "pos=-3") for v in measured("pos_sweep", "iia", p)]
    assert 0.25 <= mean(iia) <= 0.9 and max(off) <= 0  # the premise: all three are true
    write(tester, "sweep", "pos_sweep", expect=[
        {"result": "iia", "mean": {"between": [0.25, 0.9]}, "points": ["pos=-1"]},
        {"result": "iia", "max": {"<=": 0}, "points": {"pos": [-2, -3]}},
        {"result": "logit_diff", "mean": {"approx": round(mean(measured("pos_sweep", "logit_diff", "pos=-2")), 2),
                                          "atol": 0.01}, "points": ["pos=-2"]},
    ])
    junit = tester.path / "junit.xml"
    result = tester.runpytest("-v", f"--junitxml={junit}")
    result.assert_outcomes(passed=3, warnings=3)  # three baselines written
    result.stdout.fnmatch_lines(["*causalab summary*", "sweep.causalab.json",
                                 "  point   engine  outcome  iia*logit_diff",
                                 f"  pos=-1  nnterp  passed   {g4(mean(iia))}* {g4(mean(diff))}"])
    props = {p.get("name"): p.get("value") for p in ElementTree.parse(junit).iter("property")}
    assert props["causalab.engine"] == "nnterp"
    assert float(props["causalab.mean.iia"]) in (0.0, mean(iia))


def test_a_later_feature_is_skipped_with_the_typed_reason(tester):
    """What a later step or version provides (pytest_causalab.items.LATER: Unsupported, or a
    MissingArtifact another document makes) skips the item with its typed reason, never passes it.
    No shipped document is Unsupported any more, so the case is das_apply without the rotation
    its sibling document's weights step saves."""
    write(tester, "apply", "das_apply")
    assert not (tester.path / "artifacts" / "rot.safetensors").exists()
    result = tester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1] apply.causalab.json:1: MissingArtifact: featurizers.rot.file_path: "
                                 "'artifacts/rot.safetensors' does not exist*"])


def test_run_time_refusal_shows_the_typed_message(tester):
    def no_such_model(doc):
        doc["model"] = {"key": "no-such-model/here/at-all"}
    write(tester, "lost", "patching", edit=no_such_model)
    result = tester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["ModelError in lost.causalab.json::lost", "  at:   model.key"])
    assert "Traceback" not in result.stdout.str()


COUNT_LOADS = """
    import os
    def pytest_causalab_model_loaded(key, engine, config):
        with open(os.path.join(str(config.rootpath), "loads.txt"), "a") as fh:
            fh.write(f"{os.getpid()} {key[0]} {key[3]}\\n")
    def pytest_causalab_modify_point(point, config):
        with open(os.path.join(str(config.rootpath), "points.txt"), "a") as fh:
            fh.write(f"{point.name} {point.engine}\\n")
"""


def test_one_model_load_and_one_run_per_point_shared_with_the_fixture(tester, measured):
    write(tester, "sweep", "pos_sweep")
    write(tester, "single", "patching")
    write(tester, "layers", "layer_pos_sweep")
    tester.makeconftest(COUNT_LOADS)
    tester.makepyfile(test_zz_python="""
        from pytest_causalab.asserts import assert_result

        def test_results_from_python(causalab):
            run = causalab.run("sweep.causalab.json")
            assert [p.name for p in run.points] == ["pos=-1", "pos=-2", "pos=-3"]
            point = run.point("pos=-2")
            assert point.result("iia").mean() == 0.0
            assert point.result("iia").values == (0.0, 0.0, 0.0, 0.0)
            assert point.result("iia").eligible == (True,) * 4
            assert_result(point, "logit_diff", mean=("<", 0), all=("between", -20, 0), eligible=1.0)
            import json
            on_disk = json.loads((point.out / "iia.json").read_text())
            assert point.table("iia") == on_disk
            assert causalab.run("single.causalab.json").point().result("iia").mean() == SINGLE_IIA
            assert causalab.loads == 1
    """.replace("SINGLE_IIA", repr(mean(measured("patching", "iia")))))
    points = 3 + 1 + 6  # pos_sweep, patching, layer_pos_sweep
    result = tester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=points + 1, warnings=points)
    loads = (tester.path / "loads.txt").read_text().splitlines()
    assert len(loads) == 1 and loads[0].endswith("tiny-llama nnterp")
    ran = (tester.path / "points.txt").read_text().splitlines()
    assert sorted(ran) == sorted(set(ran)) and len(ran) == points  # each point once, items and fixture


def test_assert_result_fails_with_the_table(tester, measured):
    iia = mean(measured("patching", "iia"))
    assert iia <= 0.8  # the premise: the assertion fails
    write(tester, "single", "patching")
    tester.makepyfile("""
        from pytest_causalab.asserts import assert_result

        def test_it(causalab):
            point = causalab.run("single.causalab.json").point()
            assert_result(point, "iia", mean=(">", 0.8))
    """)
    result = tester.runpytest("test_assert_result_fails_with_the_table.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E       AssertionError: ", "E         point * result  aggregate*",
                                 f"E         single [[]nnterp]  iia     mean       > 0.8  *{g6(iia)}*{g6(iia - 0.8)}*"])
    assert "asserts.py" not in result.stdout.str()  # the failure is at the caller's line


def test_hooks_engine_out_dir_and_summary_columns(tester, measured):
    iia, diff = (measured("pos_sweep", m, "pos=-3", engine="hooks") for m in ("iia", "logit_diff"))
    assert max(iia) <= 0  # the premise: the expectation holds
    write(tester, "sweep", "pos_sweep", expect=[{"result": "iia", "max": {"<=": 0}, "points": {"pos": -3}}])
    tester.makeconftest("""
        def pytest_causalab_summary_columns(point, config):
            return {"rows": len(point.table("iia"))}
    """)
    result = tester.runpytest("--causalab-engine=hooks", "--causalab-summary", "--causalab-out=out",
                              "--causalab-batch-size=3")
    result.assert_outcomes(passed=3, warnings=3)
    result.stdout.fnmatch_lines(["  point   engine  outcome  iia*logit_diff*rows",
                                 f"  pos=-3  hooks   passed   {g4(mean(iia))}* {g4(mean(diff))}* 4"])
    assert baseline(tester, "sweep")["points"]["pos=-1"]["engine"] == "hooks"
    written = tester.path / "out" / "sweep" / "hooks" / "pos=-2"
    assert sorted(p.name for p in written.iterdir()) == ["document.json", "iia.json", "logit_diff.json",
                                                         "run.json"]
    assert json.loads((written / "run.json").read_text())["batch_size"] == 3


def test_both_engines_agree_and_a_difference_shows_where(tester, measured):
    means = {e: [g4(mean(measured("patching", m, engine=e))) for m in ("iia", "logit_diff")]
             for e in ("nnterp", "hooks")}
    write(tester, "single", "patching")
    result = tester.runpytest("--causalab-engine=both", "-v")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines([f"  single  {e:<6}  passed   {i}* {d}" for e, (i, d) in means.items()])
    # The hooks engine writes at -2 instead: pos_sweep's pos=-2 point is that experiment.
    last, early = measured("patching", "iia"), measured("pos_sweep", "iia", "pos=-2", engine="hooks")
    row = next(r for r, (a, b) in enumerate(zip(last, early)) if a != b)
    tester.makeconftest("""
        def pytest_causalab_modify_point(point, config):
            if point.engine == "hooks":  # a different experiment on one engine only
                point.document["interventions"]["patching"]["writes"]["patch"]["pos"] = -2
    """)
    result = tester.runpytest("--causalab-engine=both")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*checks failed on nnterp, hooks*",
                                 f"single  iia         row {row}      nnterp {g6(last[row])}* hooks {g6(early[row])}* "
                                 f"{g6(early[row] - last[row])} *"])


def test_both_engines_compare_saved_tensors(tester):
    """generate_probe saves the generated ids: a hooks-only steer that changes them is caught
    element by element, integers exactly."""
    write(tester, "probe", "generate_probe", edit=lambda d: d["interventions"]["generate"]["reads"]["logits"]
          .__setitem__("pos", {"frame": "generated", "index": 0}))
    tester.runpytest("--causalab-engine=both").assert_outcomes(passed=1, warnings=1)
    tester.makeconftest("""
        def pytest_causalab_modify_point(point, config):
            if point.engine == "hooks":  # the patch lands a token early: other ids, same shapes
                point.document["interventions"]["generate"]["writes"]["patch"]["pos"] = -2
    """)
    result = tester.runpytest("--causalab-engine=both")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*generated.safetensors:patched.generated*nnterp *hooks *"])


def test_unknown_engine_is_a_usage_error(tester):
    write(tester, "single", "patching")
    result = tester.runpytest("--causalab-engine=pyvene")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--causalab-engine (ini causalab_engine): 'pyvene' is not one of "
                                 "nnterp, hooks, ndif, both*"])


# --- baselines --------------------------------------------------------------------------------

def test_baseline_written_then_checked_then_drift_then_update(tester, measured):
    write(tester, "sweep", "pos_sweep")
    result = tester.runpytest()
    result.assert_outcomes(passed=3, warnings=3)
    result.stdout.fnmatch_lines(["*BaselineWarning: baseline was missing and is now written*"])
    stored = baseline(tester, "sweep")
    assert stored["format"] == "causalab-baseline/2"
    assert list(stored["points"]) == ["pos=-1", "pos=-2", "pos=-3"]
    assert stored["points"]["pos=-1"]["results"]["iia"]["rows"] == dict(
        (str(r), v) for r, v in enumerate(measured("pos_sweep", "iia", "pos=-1")))
    assert re.fullmatch(r"[0-9a-f]{64}", stored["points"]["pos=-1"]["produced_by"])

    tester.runpytest().assert_outcomes(passed=3)  # checked, nothing written

    drifted = copy.deepcopy(stored)
    drifted["points"]["pos=-2"]["results"]["logit_diff"]["rows"]["1"] += 0.5
    save_baseline(tester, "sweep", drifted)
    result = tester.runpytest()
    result.assert_outcomes(passed=2, failed=1)
    got = measured("pos_sweep", "logit_diff", "pos=-2")[1]
    result.stdout.fnmatch_lines([f"pos=-2  logit_diff  row 1      baseline {g6(got + 0.5)[:5]}*  {g6(got)[:5]}*  -0.5*"])
    tester.runpytest("--causalab-atol=0.6").assert_outcomes(passed=3)  # within a looser tolerance

    result = tester.runpytest("--causalab-update-baselines=failing")
    result.assert_outcomes(passed=3, warnings=1)
    assert baseline(tester, "sweep") == stored
    tester.runpytest().assert_outcomes(passed=3)


def test_saved_tensors_are_baselined_and_drift_fails(tester):
    """A saved tensor (here the PCA basis pca_harvest publishes) is stored by shape, dtype and
    value; a value moved beyond tolerance fails naming the file, tensor and element."""
    from safetensors.torch import load_file

    write(tester, "harvest", "pca_harvest")
    out = tester.path / "out"
    tester.runpytest(f"--causalab-out={out}").assert_outcomes(passed=1, warnings=1)
    stored = baseline(tester, "harvest")
    entry = stored["points"]["harvest"]["tensors"]["pca.safetensors"]["basis"]
    (written,) = out.rglob("pca.safetensors")
    basis = load_file(written)["basis"]
    assert entry["shape"] == list(basis.shape) and entry["dtype"] == "float32"
    assert entry["values"] == basis.flatten().tolist()

    drifted = copy.deepcopy(stored)
    drifted["points"]["harvest"]["tensors"]["pca.safetensors"]["basis"]["values"][5] += 0.5
    save_baseline(tester, "harvest", drifted)
    result = tester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["harvest  pca.safetensors:basis  element 5  baseline *(1 of 128 differ*"])
    tester.runpytest("--causalab-update-baselines=failing").assert_outcomes(passed=1, warnings=1)
    assert baseline(tester, "harvest") == stored


def test_a_changed_experiment_fails_until_its_baseline_is_updated(tester):
    write(tester, "single", "patching")
    tester.runpytest().assert_outcomes(passed=1, warnings=1)
    stored = baseline(tester, "single")
    old = copy.deepcopy(stored)
    old["points"]["single"]["produced_by"] = "0" * 64
    save_baseline(tester, "single", old)
    result = tester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["single  experiment  produced_by  baseline 000000000000*"
                                 "the experiment changed since the baseline was recorded*"])
    tester.runpytest("--causalab-update-baselines=failing").assert_outcomes(passed=1, warnings=1)
    assert baseline(tester, "single") == stored


@pytest.mark.parametrize("broken", ["{not json", '{"format": "causalab-baseline/0", "points": {}}', "[1, 2]",
                                    '{"format": "causalab-baseline/1", "points": {"single": {"results": '
                                    '{"iia": {"no_rows": 1}}}}}'])
@pytest.mark.parametrize("flag", ["failing", "all"])
def test_a_broken_baseline_is_refused_by_name_and_repaired_by_the_update_flag(tester, broken, flag):
    write(tester, "single", "patching")
    tester.runpytest().assert_outcomes(passed=1, warnings=1)
    stored = baseline(tester, "single")
    (tester.path / "baselines" / "single.json").write_text(broken)
    result = tester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["BaselineError in single.causalab.json::single",
                                 "*single.json*", "*--causalab-update-baselines=all*"])
    assert "Traceback" not in result.stdout.str() and "AttributeError" not in result.stdout.str()
    tester.runpytest(f"--causalab-update-baselines={flag}").assert_outcomes(passed=1, warnings=1)
    assert baseline(tester, "single") == stored
    tester.runpytest().assert_outcomes(passed=1)


GOOD_ENTRY = {"produced_by": "0" * 64, "results": {"iia": {"rows": {"0": 1.0, "1": None}}},
              "tensors": {"generated.safetensors": {"ids": {"shape": [2, 2], "dtype": "int64",
                                                            "values": [1, 2, 3, 4]}}}}


def _single(f):
    return f["points"]["single"]


def _ids(f):
    return _single(f)["tensors"]["generated.safetensors"]["ids"]


@pytest.mark.parametrize("edit, what", [
    (lambda f: f.pop("points"), '"points" is null'),
    (lambda f: _single(f).pop("results"), "points.single.results is null"),
    (lambda f: _single(f)["results"]["iia"]["rows"].update({"1": "0.5"}),
     "points.single.results.iia.rows.1 is the string '0.5'"),
    (lambda f: _single(f)["results"]["iia"]["rows"].update({"1": 10 ** 400}),
     "points.single.results.iia.rows.1 is the number 100000000000…"),
    (lambda f: _single(f)["results"]["iia"]["rows"].update({"1": [1.0]}),
     "points.single.results.iia.rows.1 is an array"),
    (lambda f: _ids(f).pop("dtype"), "points.single.tensors.generated.safetensors.ids.dtype is null"),
    (lambda f: _ids(f).update(shape=2),
     "points.single.tensors.generated.safetensors.ids.shape is the number 2, not a list of sizes"),
    (lambda f: _ids(f).update(values=None),
     "points.single.tensors.generated.safetensors.ids.values is null, not a list of numbers"),
    (lambda f: _ids(f)["values"].pop(),
     "points.single.tensors.generated.safetensors.ids.values holds 3 numbers for shape [2, 2]"),
    (lambda f: _ids(f).pop("values") and _ids(f).update(sums={"sum": 1}),
     "points.single.tensors.generated.safetensors.ids.sums is an object, not {'sum', 'abs_sum', 'square_sum'} "
     "numbers"),
    (lambda f: _ids(f).pop("values"), 'points.single.tensors.generated.safetensors.ids has neither "values" nor "sums"'),
], ids=["no points", "no results", "a string row", "a row past a float", "an array row", "no dtype",
        "shape a number", "values null", "fewer values than the shape", "sums incomplete", "no values"])
def test_a_baseline_the_comparison_cannot_read_is_refused_at_load_naming_where(tmp_path, edit, what):
    """Before, these loaded, and the comparison raised TypeError, OverflowError or KeyError inside
    the item (a string row, 1e400 as an integer, a tensor entry without values, a file without
    "points" written to by an update) — or, for a values list shorter than its shape, compared
    only its prefix and passed."""
    from causalab_mini.errors import BaselineError
    from pytest_causalab import baseline as baseline_mod

    path = tmp_path / "single.json"
    stored = {"format": baseline_mod.FORMAT, "document": "single.causalab.json",
              "points": {"single": copy.deepcopy(GOOD_ENTRY)}}
    path.write_text(json.dumps(stored))
    assert baseline_mod.load(path) == stored
    edit(stored)
    path.write_text(json.dumps(stored))
    with pytest.raises(BaselineError) as caught:
        baseline_mod.load(path)
    assert str(caught.value) == (f"{path}: {what}, not what a baseline holds ({baseline_mod.SHAPE}); "
                                 f"{baseline_mod.REPAIR}")
    assert baseline_mod.load(path, repair=True) == {}  # an update flag writes it anew


def test_missing_baseline_fails_under_ci(tester, monkeypatch):
    write(tester, "single", "patching")
    monkeypatch.setenv("CI", "1")
    result = tester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no baseline in baselines*single.json*--causalab-update-baselines=all*"])
    assert not (tester.path / "baselines" / "single.json").exists()
    tester.runpytest("--causalab-update-baselines=all").assert_outcomes(passed=1, warnings=1)
    tester.runpytest().assert_outcomes(passed=1)


def test_update_all_rewrites_passing_points(tester):
    write(tester, "single", "patching")
    tester.runpytest().assert_outcomes(passed=1, warnings=1)
    stored = baseline(tester, "single")
    stored["points"]["single"]["stale"] = True
    save_baseline(tester, "single", stored)
    tester.runpytest("--causalab-update-baselines=all").assert_outcomes(passed=1, warnings=1)
    assert "stale" not in baseline(tester, "single")["points"]["single"]


# --- xdist ------------------------------------------------------------------------------------

def test_xdist_loadgroup_loads_each_model_once_per_worker(tester):
    write(tester, "sweep", "pos_sweep")
    write(tester, "layers", "layer_pos_sweep")
    write(tester, "gpt2", "patching_gpt2")
    tester.makeconftest(COUNT_LOADS)
    result = tester.runpytest_subprocess("-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=3 + 6 + 1)  # pos_sweep, layer_pos_sweep, patching_gpt2
    loads = (tester.path / "loads.txt").read_text().splitlines()
    assert len(loads) == len(set(loads)) == 2  # one per model: each group went to one worker


class _Stub:
    """What ``baseline.store`` reads of a point."""

    def __init__(self, document, name):
        self.document, self.name, self.engine, self.produced_by = document, name, "hooks", name * 4
        self.weights = "sha256:" + "0" * 64

    def saved(self):
        return {}

    def saved_tensors(self):
        return {}


def _store_many(document: str, worker: int) -> None:
    from pytest_causalab import baseline
    for i in range(15):
        baseline.store(baseline.path_for(Path(document)), Path(document), _Stub(document, f"w{worker}-{i}"))


def test_concurrent_baseline_writers_lose_nothing(tmp_path):
    """xdist workers writing points of one document: locked read-modify-write, atomic replace."""
    import multiprocessing

    document = str(tmp_path / "doc.causalab.json")
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_store_many, args=(document, w)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    stored = json.loads((tmp_path / "baselines" / "doc.json").read_text())
    assert len(stored["points"]) == 60
    assert not list((tmp_path / "baselines").glob("*.tmp"))

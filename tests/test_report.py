"""The HTML report: ``causalab_mini.report``, ``causalab-mini report`` and ``pytest --causalab-report``.

The page is read back with the standard library's HTML parser (what a browser is given);
tests/test_report_browser.py renders it in a real browser. Every expected number comes from
the run itself (``causalab_mini.open``, ``Result.mean``, ``cm.verdicts``), never typed in.
"""
from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from urllib.parse import unquote

import pytest
from paths import V2
from report_page import ReportPage as Page

import causalab_mini as cm
from causalab_mini import cli, report
from causalab_mini.outputs.write import INCOMPLETE
from causalab_mini.plots import encode

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.usefixtures("one_thread")

pytest_plugins = ["pytester"]

LAYER_POS = V2 / "layer_pos_sweep.causalab.json"
PATCHING = V2 / "patching.causalab.json"


def _png(src: str) -> bytes:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    return base64.b64decode(src[len(prefix):])


@pytest.fixture(scope="module")
def runs(engines, tmp_path_factory):
    """layer_pos_sweep (2 × 3) and patching (unswept) written by cm.run on the hooks engine: their folders."""
    base = tmp_path_factory.mktemp("report")
    out = {}
    for path in (LAYER_POS, PATCHING):
        out[path.name] = base / "runs" / path.name.split(".")[0]
        cm.run(path, loaded=engines(path, "hooks"), out=out[path.name])
    return base, out


def test_the_page_shows_every_points_means_as_the_run_has_them(runs):
    base, out = runs
    page = report.from_folders([base / "runs"])
    path = report.write(page, base / "page" / "index.html")
    parsed = Page(path.read_text(encoding="utf-8"))
    expected = {}
    for folder in out.values():
        for point in cm.open(folder).points:
            for name, result in point.saved().items():
                expected[point.name, name] = result.mean()
    got = {(m["point"], m["result"]): m for m in parsed.means}
    assert set(got) == set(expected)
    for key, mean in expected.items():
        assert float(got[key]["value"]) == mean  # repr round-trips: the exact float
        assert got[key]["text"] == f"{mean:.4g}"
    # One section a run, named by its document, in the order found (sorted folders).
    assert [s["data-document"] for s in parsed.sections] == ["layer_pos_sweep", "patching"]
    assert [r["data-point"] for r in parsed.rows] == [*(p.name for p in cm.open(out[LAYER_POS.name]).points),
                                                      "patching"]
    assert parsed.scripts == 0 and parsed.external == []  # nothing runs, nothing is fetched


def test_a_two_axis_sweep_gets_a_heatmap_per_saved_metric_and_the_images_are_whole_pngs(runs):
    base, out = runs
    page = report.from_folders([out[LAYER_POS.name], out[PATCHING.name]])
    sweep, single = page.sections
    assert [(f.kind, f.result) for f in sweep.figures] == [("heatmap", "iia"), ("heatmap", "logit_diff")]
    assert [f.kind for f in single.figures] == ["bars"]
    # Each figure is the same bytes plot() writes for that choice: the page embeds what a user would save.
    opened = cm.open(out[LAYER_POS.name])
    for figure in sweep.figures:
        assert figure.png == encode(cm.plot(opened, figure.result))
    parsed = Page(report.render(page))
    assert len(parsed.images) == 3
    for img in parsed.images:
        png = _png(img["src"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert (int(img["width"]), int(img["height"])) == (int.from_bytes(png[16:20], "big"),
                                                           int.from_bytes(png[20:24], "big"))


def test_expectation_verdicts_decide_a_points_outcome(runs):
    base, out = runs
    folder = out[LAYER_POS.name]
    opened = cm.open(folder)
    checks = cm.verdicts(opened)
    assert checks and all(c.ok for c in checks)  # the corpus's own expectations hold
    section = report.section_of(opened)
    assert section.outcome == "passed"
    for row in section.points:
        mine = [c for c in checks if c.point == row.name]
        assert row.checks == mine
        assert row.outcome == ("passed" if mine else "ran")
    # A claim the run does not meet fails its point, the section and the page's count.
    edited = json.loads((folder / "document.json").read_text())
    target = "layers=1,pos=-1"
    edited["header"]["expect"] = [{"result": "iia", "mean": {"<": 0.5}, "points": [target]}]
    spec = next(p.spec for p in cm.read(edited, path=folder / "document.json").points if p.name == target)
    checks = cm.evaluate(spec.header.expect, target,
                         opened.point(target).coords, opened.point(target).lookup(), label=target)
    assert [c.ok for c in checks] == [False]
    assert checks[0].got == opened.point(target).result("iia").mean()
    row = report.point_row(opened.point(target), checks=checks)
    assert row.outcome == "failed"
    page = report.Page("t", [report.Section("layer_pos_sweep", points=[row])])
    assert page.sections[0].outcome == "failed" and page.counts() == {"failed": 1}
    parsed = Page(report.render(page))
    assert [c["data-ok"] for c in parsed.checks] == ["false"]


def test_links_are_relative_to_the_page_and_reach_each_points_files(runs):
    base, out = runs
    page = report.from_folders([base / "runs"])
    path = report.write(page, base / "elsewhere" / "deeper" / "report.html")
    parsed = Page(path.read_text(encoding="utf-8"))
    targets = [path.parent / unquote(href) for href in parsed.links if not href.startswith("#")]
    assert targets and all(t.exists() for t in targets)
    for point in cm.open(out[LAYER_POS.name]).points:
        for name in (*(r.file for r in point.scored), "document.json"):
            assert (point.out / name).resolve() in {t.resolve() for t in targets}
    anchors = [href[1:] for href in parsed.links if href.startswith("#")]
    assert anchors == [s["id"] for s in parsed.sections]


def test_the_cli_writes_the_page_and_prints_where(runs, tmp_path, capsys):
    base, out = runs
    target = tmp_path / "r" / "page.html"
    assert cli.main(["report", str(out[LAYER_POS.name]), str(out[PATCHING.name]), "-o", str(target)]) == 0
    printed = capsys.readouterr().out.splitlines()
    points = len(cm.open(out[LAYER_POS.name]).points) + 1
    assert printed == [str(target.resolve()), f"2 runs, {points} passed"]
    assert Page(target.read_text(encoding="utf-8")).sections


@pytest.mark.parametrize("case", ["missing", "empty", "output is a folder"])
def test_the_cli_refuses_without_a_traceback_and_writes_nothing(runs, tmp_path, capsys, case):
    base, out = runs
    target = tmp_path / "page.html"
    given = {"missing": [str(tmp_path / "nope")], "empty": [str(tmp_path)]}.get(case, [str(out[PATCHING.name])])
    if case == "output is a folder":
        target = tmp_path / "a_folder"
        target.mkdir()
    assert cli.main(["report", *given, "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert {"missing": "not a folder", "empty": "no run.json", "output is a folder": "a folder, not a file"}[case] in err
    assert not (tmp_path / "page.html").exists()
    if case == "output is a folder":
        assert list(target.iterdir()) == []


def test_an_unfinished_run_is_left_out_and_a_damaged_one_is_shown_as_such(runs, tmp_path):
    base, out = runs
    for name in ("done", "half", "damaged"):
        shutil.copytree(out[PATCHING.name], tmp_path / name)
    (tmp_path / "half" / INCOMPLETE).write_text("")  # the mark a write that never finished leaves
    (tmp_path / "damaged" / "run.json").write_text("{")
    assert report.run_folders([tmp_path]) == [tmp_path / "damaged", tmp_path / "done"]
    page = report.from_folders([tmp_path])
    damaged, done = page.sections
    assert (damaged.outcome, damaged.points, done.outcome) == ("error", [], "passed")
    assert "run.json" in damaged.notes[0] and "cannot be read" in damaged.notes[0]


# --- pytest --causalab-report ---------------------------------------------------------------------

def _write(tester, name: str, source: Path, expect=None) -> dict:
    doc = json.loads(source.read_text())
    doc["header"]["expect"] = expect or []
    (tester.path / f"{name}.causalab.json").write_text(json.dumps(doc, indent=1))
    return doc


def test_pytest_writes_the_page_with_outcomes_drift_and_skips(tester, runs):
    base, out = runs
    opened = cm.open(out[LAYER_POS.name])
    target = "layers=1,pos=-1"
    mean = opened.point(target).result("iia").mean()
    _write(tester, "grid", LAYER_POS, expect=[{"result": "iia", "mean": {"<": mean}, "points": [target]}])
    _write(tester, "single", PATCHING)
    result = tester.runpytest("--causalab-engine=hooks", "--causalab-report=rep")
    result.assert_outcomes(passed=6, failed=1, warnings=7)  # 7 baselines written
    page_path = tester.path / "rep" / "index.html"
    lines = result.outlines
    assert lines[lines.index(next(x for x in lines if "causalab report" in x)) + 1] == str(page_path)
    parsed = Page(page_path.read_text(encoding="utf-8"))
    outcomes = {r["data-point"]: r["data-outcome"] for r in parsed.rows}
    assert outcomes == {**{p.name: "passed" for p in opened.points}, target: "failed", "single": "passed"}
    assert {s["data-document"]: s["data-outcome"] for s in parsed.sections} == {"grid": "failed", "single": "passed"}
    # The numbers are the session's, read from the folders the session wrote (beside the page).
    for cell in parsed.means:
        folder = tester.path / "rep" / "runs" / ("grid" if cell["point"] != "single" else "single") / "hooks" / cell["point"]
        assert float(cell["value"]) == cm.open(folder).point().result(cell["result"]).mean()
    assert len(parsed.images) == 3
    text = page_path.read_text(encoding="utf-8")
    assert "1 of 1 checks failed on hooks" in text  # the failure's own title, under the failing point

    # Drift: a stored baseline moved by hand is reported as drift on the page.
    stored = json.loads((tester.path / "baselines" / "single.json").read_text())
    rows = stored["points"]["single"]["results"]["iia"]["rows"]
    first = next(iter(rows))
    rows[first] = 1.0 - rows[first]
    (tester.path / "baselines" / "single.json").write_text(json.dumps(stored))
    result = tester.runpytest("--causalab-engine=hooks", "--causalab-report=rep", "single.causalab.json")
    result.assert_outcomes(failed=1)
    parsed = Page((tester.path / "rep" / "index.html").read_text(encoding="utf-8"))
    assert [r["data-outcome"] for r in parsed.rows] == ["failed"]
    text = (tester.path / "rep" / "index.html").read_text(encoding="utf-8")
    assert 'class="drift" data-point="single"' in text and "iia" in text


def test_two_documents_of_one_name_get_their_own_anchors():
    page = report.Page("t", [report.Section("pos_sweep", source="protocol/pos_sweep.causalab.json"),
                             report.Section("pos_sweep", source="v2/pos_sweep.causalab.json")])
    parsed = Page(report.render(page))
    ids = [s["id"] for s in parsed.sections]
    assert len(set(ids)) == 2
    assert [href[1:] for href in parsed.links] == ids


def test_under_xdist_the_controller_writes_the_page_from_the_workers_points(tester):
    _write(tester, "grid", LAYER_POS)
    _write(tester, "single", PATCHING)
    result = tester.runpytest_subprocess("-n", "2", "--causalab-engine=hooks", "--causalab-report=rep")
    result.assert_outcomes(passed=7)
    parsed = Page((tester.path / "rep" / "index.html").read_text(encoding="utf-8"))
    names = [p.name for p in cm.read(LAYER_POS).points]
    assert [r["data-point"] for r in parsed.rows] == [*names, "single"]  # the documents' order, not the workers'
    for cell in parsed.means:
        document = "single" if cell["point"] == "single" else "grid"
        folder = tester.path / "rep" / "runs" / document / "hooks" / cell["point"]
        assert float(cell["value"]) == cm.open(folder).point().result(cell["result"]).mean()
    assert len(parsed.means) == 2 * 7 and len(parsed.images) == 3

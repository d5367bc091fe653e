"""A run's results as tables: ``causalab-mini table``, the means ``causalab-mini run`` reports
(and ``run --json``), per-batch progress events, and the pytest summary's grid for a two-axis sweep.

Every expected number is computed here from the run itself (``causalab_mini.open``,
``Run.table``, ``Result.mean``), never typed.
"""
from __future__ import annotations

import copy
import csv
import io
import json
import math
import sys

import pytest
from paths import DATA, MODELS, V2

import causalab_mini as cm
from causalab_mini import cli
from causalab_mini.engine import progress
from causalab_mini.outputs import tables

pytest_plugins = ["pytester"]

LAYER_POS = V2 / "layer_pos_sweep.causalab.json"
NEURONS = V2 / "neuron_patching.causalab.json"  # units=[0,1,2,3], …: a list-valued axis on 4 rows
ENTITY = V2 / "entity_patch.causalab.json"


def g4(value: float) -> str:
    """A mean as the tables print it."""
    return "nan" if math.isnan(value) else f"{value:.4g}"


@pytest.fixture(scope="module")
def layer_pos(engines, tmp_path_factory):
    """layer_pos_sweep run on the hooks engine and written by ``causalab_mini.run(out=...)``:
    (the folder, the run as ``open`` reads it back)."""
    out = tmp_path_factory.mktemp("tables") / "layer_pos"
    cm.run(LAYER_POS, loaded=engines(LAYER_POS, "hooks"), out=out)
    return out, cm.open(out)


@pytest.fixture(scope="module")
def neurons(engines, tmp_path_factory):
    """neuron_patching with batch_size=1, every progress event recorded: (folder, run, events)."""
    out = tmp_path_factory.mktemp("tables") / "neurons"
    events = []
    with progress.listening(events.append):
        ran = cm.run(NEURONS, loaded=engines(NEURONS, "hooks"), out=out, batch_size=1)
    return out, ran, events


def table(capsys, *args) -> str:
    assert cli.main(["table", *map(str, args)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


# --- causalab-mini table ----------------------------------------------------------------------

def test_table_json_is_run_table(layer_pos, capsys):
    out, run = layer_pos
    for name in ("iia", "logit_diff"):
        assert json.loads(table(capsys, out, "--result", name, "--format", "json")) == run.table(name)
    assert tables.records(run, "iia") == run.table("iia")


def test_table_csv_reads_back_to_the_same_numbers(layer_pos, capsys):
    out, run = layer_pos
    expected = run.table("logit_diff")
    text = table(capsys, out, "--result", "logit_diff")  # csv is the default
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0])[:4] == ["point", "layers", "pos", "example_id"]
    assert len(rows) == len(expected) == 6 * 30
    for got, want in zip(rows, expected):
        assert got["point"] == want["point"] and got["example_id"] == want["example_id"]
        assert (int(got["layers"]), int(got["pos"])) == (want["layers"], want["pos"])
        assert float(got["value"]) == want["value"]  # bit for bit: the float's shortest repr
        assert got["eligible"] == json.dumps(want["eligible"])


def test_table_without_result_has_every_saved_metric_and_a_result_column(layer_pos, capsys):
    out, run = layer_pos
    rows = list(csv.DictReader(io.StringIO(table(capsys, out))))
    assert list(rows[0])[:4] == ["point", "layers", "pos", "result"]
    names = list(dict.fromkeys(r["result"] for r in rows))
    assert names == ["iia", "logit_diff"]
    for name in names:
        mine = [r for r in rows if r["result"] == name]
        want = run.table(name)
        assert [(r["point"], r["example_id"], float(r["value"])) for r in mine] == \
               [(w["point"], w["example_id"], w["value"]) for w in want]
    as_json = json.loads(table(capsys, out, "--format", "json"))
    assert [{k: v for k, v in r.items() if k != "result"} for r in as_json if r["result"] == "iia"] \
        == run.table("iia")


def test_table_markdown_has_a_header_row_and_the_values(layer_pos, capsys):
    out, run = layer_pos
    expected = run.table("iia")
    lines = table(capsys, out, "--result", "iia", "--format", "md").splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == tables.columns(expected) and header[:3] == ["point", "layers", "pos"]
    assert set(lines[1].replace("|", "").replace(" ", "")) == {"-"}
    body = lines[2:]
    assert len(body) == len(expected)
    at = header.index("value")
    for line, want in zip(body, expected):
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert cells[0] == want["point"] and float(cells[at]) == want["value"]


def test_a_list_coordinate_is_its_json_text_in_csv_and_markdown(neurons, capsys):
    out, ran, _ = neurons
    run = cm.open(out)
    rows = list(csv.DictReader(io.StringIO(table(capsys, out, "--result", "iia"))))
    assert [r["units"] for r in rows] == [json.dumps(r["units"], separators=(",", ":"))
                                          for r in run.table("iia")]
    assert rows[0]["units"] == "[0,1,2,3]"
    md = table(capsys, out, "--result", "iia", "--format", "md")
    assert "| [0,1,2,3] " in md
    assert json.loads(table(capsys, out, "--result", "iia", "--format", "json"))[0]["units"] == [0, 1, 2, 3]


def test_table_refusals(layer_pos, tmp_path, capsys):
    out, run = layer_pos
    assert cli.main(["table", str(out), "--result", "nope"]) == 2
    err = capsys.readouterr().err
    assert err == "error: PlanError: result 'nope': not a metric this run saved; results: ['iia', 'logit_diff']\n"

    for folder in (tmp_path / "empty", tmp_path / "missing"):
        if folder.name == "empty":
            folder.mkdir()
        with pytest.raises(cm.CausalabError) as refused:
            cm.open(folder)
        assert cli.main(["table", str(folder)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == f"error: {type(refused.value).__name__}: {refused.value}\n"
        assert "not a run directory" in captured.err


def test_a_run_that_saved_no_metric_has_no_table(engines, tmp_path, capsys):
    harvest = V2 / "pca_harvest.causalab.json"  # saves one tensor file, no .json metric
    out = tmp_path / "out"
    cm.run(harvest, loaded=engines(harvest, "hooks"), out=out)
    assert cli.main(["table", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: PlanError: {out}: this run saved no .json metric"), err


# --- causalab-mini run: what it measured --------------------------------------------------------

def test_run_prints_each_points_means_at_a_terminal(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert cli.main(["run", str(LAYER_POS), "--engine", "hooks", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    run = cm.open(out)
    blank = lines.index("")
    assert lines[:blank] == [str(out / f) for f in ["document.json", "run.json"]] + [
        str(out / p.name / f) for p in run.points for f in ("document.json", "iia.json", "logit_diff.json")]
    header, rule, *body = lines[blank + 1:]
    assert header.split() == ["point", "iia", "logit_diff"]
    assert set(rule.replace(" ", "")) == {"-"}
    assert len(body) == len(run.points) == 6
    for line, point in zip(body, run.points):
        assert line.split() == [point.name, *(g4(cm.open(out).point(point.name).result(m).mean())
                                              for m in ("iia", "logit_diff"))]
    # The columns line up: every cell starts where its header does.
    starts = [header.index(h) for h in ("iia", "logit_diff")]
    for line in body:
        assert all(line[s - 2:s] == "  " and line[s] != " " for s in starts)


def test_run_into_a_pipe_prints_only_its_files(tmp_path, capfd):
    """Not at a terminal, stdout stays one path a line (what scripts, and tests/test_run.py, read)."""
    out = tmp_path / "out"
    assert cli.main(["run", str(NEURONS), "--engine", "hooks", "--out", str(out)]) == 0
    printed = capfd.readouterr().out.splitlines()
    names = [p.name for p in cm.open(out).points]
    assert printed == [str(out / f) for f in ["document.json", "run.json"]] + [
        str(out / n / f) for n in names for f in ("document.json", "iia.json", "logit_diff.json")]


def test_run_json_is_one_object_of_files_coords_and_means(tmp_path, capfd):
    out = tmp_path / "out"
    assert cli.main(["run", str(LAYER_POS), "--engine", "hooks", "--out", str(out), "--json"]) == 0
    report = json.loads(capfd.readouterr().out)  # the whole of stdout is one JSON value
    run = cm.open(out)
    assert report["out"] == str(out)
    assert report["files"] == [str(out / f) for f in ["document.json", "run.json"]] + [
        str(out / p.name / f) for p in run.points for f in ("document.json", "iia.json", "logit_diff.json")]
    assert list(report["points"]) == [p.name for p in run.points]
    for p in run.points:
        got = report["points"][p.name]
        assert got["coords"] == p.coords
        assert got["means"] == {m: p.result(m).mean() for m in ("iia", "logit_diff")}


def test_a_point_refused_in_the_run_is_named_and_nothing_is_written(tmp_path, capfd):
    """entity_patch swept over pos: -1, then the entity's last token; row 1's entity is not in its
    prompt, so the second point's write has nothing to write on that row — found only in the run,
    after the first point ran. The refusal says which point, and that the folder was not touched."""
    rows = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines() if line]
    assert "Wednesday" not in rows[1]["input"]
    rows[1]["entity"] = "Wednesday"
    (tmp_path / "data" / "weekdays").mkdir(parents=True)
    (tmp_path / "data" / "weekdays" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = json.loads(ENTITY.read_text())
    raw["header"].pop("expect", None)
    entity = raw["interventions"]["patching"]["writes"]["patch"]["pos"]
    swept = {"sweep": [-1, entity], "as": "pos"}
    raw["interventions"]["patching"]["writes"]["patch"]["pos"] = swept
    raw["interventions"]["patching"]["reads"]["v_cf"]["pos"] = copy.deepcopy(swept)
    doc = tmp_path / "swept.causalab.json"
    doc.write_text(json.dumps(raw))
    second = cm.read(doc).points[1].name
    out = tmp_path / "out"
    assert cli.main(["run", str(doc), "--engine", "hooks", "--models", str(MODELS), "--data",
                     str(tmp_path / "data"), "--out", str(out)]) == 2
    captured = capfd.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: EngineError: "), captured.err
    assert "has nothing to write on row(s) {1: 'alignment_missing'}" in lines[0]
    assert lines[0].endswith(f"at point {second} (2 of 2); nothing was written to {out}: a run's folder is "
                             "committed whole, after every point has run")
    assert not out.exists()


# --- progress, per batch ----------------------------------------------------------------------

def test_every_batch_is_announced_and_the_rows_add_up(neurons):
    _, ran, events = neurons
    assert len(ran.points) == 3
    first, *rest = events
    # The counterfactual pass the three points share runs once, first (4 rows, one a batch);
    # then each point's own pass.
    assert (first.kind, first.done, first.total) == ("run", 0, 4 + 3 * 4)
    assert [(b.kind, b.name, b.rows, b.done, b.total) for b in rest[:4]] == \
        [("batch", "shared", 1, k, 4) for k in (1, 2, 3, 4)]
    at = 4
    for i, point in enumerate(ran.points):
        start, *batches, done = rest[at:at + 6]
        at += 6
        assert (start.kind, start.name, start.done, start.total) == ("point", point.name, i, 3)
        # batch_size=1 on 4 rows: 4 batches of the pass, one row each, counting up to the rows.
        assert [(b.kind, b.name, b.rows, b.done, b.total) for b in batches] == \
            [("batch", "score", 1, k, 4) for k in (1, 2, 3, 4)]
        assert sum(b.rows for b in batches) == len(point.result("iia").rows) == 4
        assert (done.kind, done.name, done.done, done.total) == ("done", point.name, i + 1, 3)
    assert at == len(rest)
    assert sum(e.rows for e in events if e.kind == "batch") == first.total


def test_a_whole_batch_is_one_event_and_reporting_still_hears_only_points(engines):
    events, heard = [], []
    with progress.listening(events.append), progress.reporting(lambda *a: heard.append(a)):
        ran = cm.run(NEURONS, loaded=engines(NEURONS, "hooks"), batch_size=3)
    batches = [(e.rows, e.done, e.total) for e in events if e.kind == "batch"]
    assert batches == [(3, 3, 4), (1, 4, 4)] * 4  # the shared pass, then each point's
    assert heard == [(p.name, i + 1, 3) for i, p in enumerate(ran.points)]


# --- the pytest summary: a two-axis sweep as a grid ----------------------------------------------

def _cells(line: str) -> list[str]:
    return line.split()


def test_the_summary_lays_a_two_axis_sweep_out_as_a_grid_per_result(tester, layer_pos):
    _, run = layer_pos
    doc = json.loads(LAYER_POS.read_text())
    doc["header"]["expect"] = []
    (tester.path / "grid.causalab.json").write_text(json.dumps(doc, indent=1))
    result = tester.runpytest("--causalab-engine=hooks", "--causalab-summary")
    result.assert_outcomes(passed=6, warnings=6)  # six baselines written
    lines = result.outlines
    start = lines.index("grid.causalab.json")
    layers = list(dict.fromkeys(p.coords["layers"] for p in run.points))
    positions = list(dict.fromkeys(p.coords["pos"] for p in run.points))
    at = start + 1
    for name in ("iia", "logit_diff"):
        header, *body = lines[at:at + 1 + len(layers)]
        at += 1 + len(layers)
        assert header.startswith(f"  {name} (hooks)  ")
        assert _cells(header)[2:] == [f"pos={p}" for p in positions]
        for line, layer in zip(body, layers):
            assert _cells(line) == [f"layers={layer}",
                                    *(g4(run.point(layers=layer, pos=p).result(name).mean()) for p in positions)]
    assert not lines[at].startswith("  ")  # nothing else: every point passed


def test_the_summary_grid_per_engine_with_holes_and_outcomes():
    """report.render on rows as xdist delivers them (out of order, one point missing, one failed,
    two engines): cells where they belong, ``-`` for the missing point, axes in the document's order."""
    from pytest_causalab import report

    def row(a, b, index, outcome, iia, other):
        return {"nodeid": f"d.causalab.json::a={a},b={b}", "outcome": outcome, report.ENGINE: "hooks,nnterp",
                f"{report.MEAN}iia": iia, f"{report.MEAN}iia@nnterp": other,
                report.COORDS: json.dumps({"a": a, "b": b}), report.INDEX: index}

    rows = [row(2, "y", 3, "passed", 0.25, 0.5), row(1, "x", 0, "failed", 1.0, 1.0),
            row(2, "x", 2, "passed", 0.125, 0.75)]  # (1, "y") never reported
    assert report.render(rows) == [
        "d.causalab.json",
        "  iia (hooks)   b=x    b=y",
        "  a=1           1      -",
        "  a=2           0.125  0.25",
        "  iia (nnterp)  b=x    b=y",
        "  a=1           1      -",
        "  a=2           0.75   0.5",
        "  not passed: a=1,b=x (failed)",
    ]
    one_axis = [{k: v for k, v in r.items()} for r in rows]
    for r in one_axis:
        r[report.COORDS] = json.dumps({"a": json.loads(r[report.COORDS])["a"]})
    assert report.render(one_axis)[1].split() == ["point", "engine", "outcome", "iia"]  # as before

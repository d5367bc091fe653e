"""The public API (``import causalab_mini as cm``) used as a researcher uses it: read a
document, run it, ask the Run for points, results, tables and grids, write it and open it
back, and the statistics a Result gives.

The numbers the API returns are held to values computed here without it: the patched
model's predictions by plain ``transformers`` with ``register_forward_hook`` on a batch
left padded by hand (tests/reference.py), the aggregates from the rows by
``math.fsum``/``statistics``, and the bootstrap on data whose exact bootstrap
distribution is known.
"""
from __future__ import annotations

import copy
import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from paths import DATA, MODELS, REPO, V2
from reference import answer_id, hidden_of, padded, with_hidden

import causalab_mini as cm
from causalab_mini import DocumentError, EngineError, PlanError, Result

LAYER_POS = V2 / "layer_pos_sweep.causalab.json"
PATCHING = V2 / "patching.causalab.json"
PROBE = V2 / "generate_probe.causalab.json"
SEARCH = dict(models=[MODELS], data=[DATA])  # for documents written outside documents/
TOL = 1e-4


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sweep_axes() -> tuple[list, list]:
    """layer_pos_sweep's two axes, in document order, read from its JSON (not from the library)."""
    raw = json.loads(LAYER_POS.read_text())
    low, high = raw["sites"]["target"]["layers"][0]["sweep"]["range"]
    pos = raw["interventions"]["patching"]["reads"]["v_cf"]["pos"]["sweep"]
    assert raw["interventions"]["patching"]["writes"]["patch"]["pos"]["sweep"] == pos
    return list(range(low, high)), list(pos)


LAYERS, POSITIONS = sweep_axes()
NAMES = [f"layers={layer},pos={pos}" for layer in LAYERS for pos in POSITIONS]


# --- shared runs -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine():
    """tiny-llama on the hooks engine, loaded once through the API and passed as ``loaded``."""
    return cm.load(cm.read(LAYER_POS), engine="hooks")


@pytest.fixture(scope="module")
def sweep(engine, tmp_path_factory):
    """layer_pos_sweep run once, written to a folder (``run.out``)."""
    out = tmp_path_factory.mktemp("api") / "layer_pos"
    return cm.run(LAYER_POS, loaded=engine, out=out)


@pytest.fixture(scope="module")
def patching(engine):
    return cm.run(PATCHING, loaded=engine)


@pytest.fixture(scope="module")
def probe(engine, tmp_path_factory):
    """generate_probe (saves generated.safetensors) run once, written to a folder."""
    out = tmp_path_factory.mktemp("api") / "probe"
    return cm.run(PROBE, loaded=engine, out=out)


@pytest.fixture(scope="module")
def hf(hf_model):
    return hf_model("tiny-llama")


# --- 1. importing ----------------------------------------------------------------------------------

HEAVY = ("torch", "transformers", "nnsight", "nnterp")


def in_subprocess(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_loads_no_torch_and_all_names_exist():
    got = in_subprocess(
        "import causalab_mini, json, sys\n"
        f"print(json.dumps({{'heavy': [m for m in {HEAVY!r} if m in sys.modules],\n"
        "  'missing': [n for n in causalab_mini.__all__ if not hasattr(causalab_mini, n)],\n"
        "  'all': list(causalab_mini.__all__)}))")
    assert got["heavy"] == []
    assert got["missing"] == []
    for name in ("read", "points", "compile", "load", "run", "open", "Document", "Run", "Point", "Result",
                 "Grid", "CausalabError", "DocumentError", "PlanError", "EngineError"):
        assert name in got["all"]


def test_reading_and_opening_need_no_torch(sweep):
    """The package docstring: reading, validating and opening a run's metrics do not need torch."""
    got = in_subprocess(
        "import causalab_mini as cm, json, sys\n"
        f"doc = cm.read({str(LAYER_POS)!r})\n"
        f"run = cm.open({str(sweep.out)!r})\n"
        "values = run.grid('iia', 'layers', 'pos').values\n"
        f"print(json.dumps({{'heavy': [m for m in {HEAVY!r} if m in sys.modules], 'points': doc.point_names,"
        " 'values': values}))")
    assert got["heavy"] == []
    assert got["points"] == NAMES
    assert got["values"] == sweep.grid("iia", "layers", "pos").values


# --- 2. read -----------------------------------------------------------------------------------------

def test_read_from_a_path():
    doc = cm.read(str(PATCHING))
    assert isinstance(doc, cm.Document)
    assert doc.path == PATCHING.resolve()
    assert doc.name == "patching"
    assert doc.point_names == ["patching"]
    assert doc.model.key == json.loads(PATCHING.read_text())["model"]["key"]
    assert cm.read(doc) is doc
    swept = cm.read(LAYER_POS)
    assert swept.point_names == NAMES
    assert [p.name for p in cm.points(LAYER_POS)] == NAMES
    assert [dict(p.coords) for p in swept.points] == [{"layers": l, "pos": p} for l in LAYERS for p in POSITIONS]


def test_read_from_a_dict_does_not_keep_the_callers_dict(tmp_path):
    raw = json.loads(LAYER_POS.read_text())
    before = copy.deepcopy(raw)
    doc = cm.read(raw, path=tmp_path / "mine.causalab.json")
    assert doc.path == (tmp_path / "mine.causalab.json").resolve()
    assert doc.name == "mine"
    assert doc.point_names == NAMES
    raw["model"]["key"] = "changed"  # the Document holds its own copy
    assert doc.raw["model"]["key"] == before["model"]["key"]
    assert cm.read(before).path is None


def test_read_refuses_an_expectation_on_a_metric_that_does_not_exist():
    raw = json.loads(PATCHING.read_text())
    index = len(raw["header"]["expect"])
    raw["header"]["expect"].append({"result": "accuracy", "mean": {">": 0.5}})
    with pytest.raises(DocumentError) as err:
        cm.read(raw, path=PATCHING)
    assert err.value.path == f"header.expect.{index}.result"
    assert "accuracy" in err.value.problem
    assert "iia" in err.value.fix and "logit_diff" in err.value.fix


def test_read_refuses_an_unknown_component():
    raw = json.loads(PATCHING.read_text())
    raw["sites"]["target"]["component"] = "residual"
    with pytest.raises(DocumentError) as err:
        cm.read(raw)
    assert err.value.path == "sites.target.component"
    assert "block_output" in str(err.value)


def test_read_refuses_a_missing_file(tmp_path):
    missing = tmp_path / "absent.causalab.json"
    with pytest.raises(DocumentError) as err:
        cm.read(missing)
    assert str(missing) in err.value.path


def test_document_point_refuses_an_unknown_name():
    with pytest.raises(PlanError) as err:
        cm.read(LAYER_POS).point("layers=2,pos=-1")
    assert NAMES[0] in err.value.fix


# --- 3. the Run ------------------------------------------------------------------------------------

def test_run_points_names_and_coords(sweep):
    assert isinstance(sweep, cm.Run)
    assert sweep.engine == "hooks"
    assert [p.name for p in sweep.points] == NAMES
    assert [p.coords for p in sweep.points] == [{"layers": l, "pos": p} for l in LAYERS for p in POSITIONS]
    assert all(type(p.coords) is dict for p in sweep.points)
    assert sweep.axes == ["layers", "pos"]


def test_point_by_name_and_by_coordinates(sweep):
    by_coords = sweep.point(layers=1, pos=-1)
    assert by_coords is sweep.point("layers=1,pos=-1")
    assert by_coords.coords == {"layers": 1, "pos": -1}
    with pytest.raises(PlanError):
        sweep.point(layers=1)  # three points
    with pytest.raises(PlanError):
        sweep.point(layers=5, pos=-1)  # none
    with pytest.raises(PlanError):
        sweep.point("layers=1,pos=-2")
    with pytest.raises(PlanError):
        sweep.point()  # a sweep has no only point
    with pytest.raises(PlanError):
        sweep.point("layers=1,pos=-1", layers=1)


def test_select(sweep):
    assert [p.name for p in sweep.select(layers=1).points] == [n for n in NAMES if n.startswith("layers=1,")]
    assert [p.name for p in sweep.select(pos=[-4, -1]).points] == [
        n for n in NAMES if n.endswith(",pos=-4") or n.endswith(",pos=-1")]
    assert [p.name for p in sweep.select(layers=0, pos=-3).points] == ["layers=0,pos=-3"]
    assert sweep.select(layers=7).points == []
    assert sweep.select(layers=1).point(pos=-4) is sweep.point("layers=1,pos=-4")
    with pytest.raises(PlanError) as err:
        sweep.select(depth=1)
    assert "layers" in err.value.fix


def test_result_on_a_sweep_is_refused_naming_a_point(sweep):
    with pytest.raises(PlanError) as err:
        sweep.result("iia")
    assert "run.point(" in err.value.fix
    assert any(name in err.value.fix for name in NAMES)


def test_result_on_an_unswept_run(patching):
    assert [p.name for p in patching.points] == ["patching"]
    assert patching.axes == []
    only = patching.point()
    assert patching.point("patching") is only
    assert patching.result("iia") is only.result("iia")
    rows = jsonl(DATA / "weekdays" / "train.jsonl")
    assert len(patching.result("iia").rows) == len(rows)
    assert set(only.results()) == {"iia", "logit_diff"}


def test_point_prompt_is_the_rows_base_text_in_the_dataset_file(patching, sweep):
    """``Point.prompt`` gives each row's base input as the dataset file spells it (the file read
    here, the role's field and dataset taken from the document); None for an id or a step the
    point has not, and for a point opened from disk."""
    raw = json.loads(PATCHING.read_text())
    field = raw["roles"]["base"]["field"]
    (step, spec), = raw["steps"].items()
    rows = jsonl(DATA / f"{spec['rows']['base']}.jsonl")
    point = patching.point()
    ids = point.result("iia").example_ids
    assert len(ids) == len(rows) > 1
    for example_id, row in zip(ids, rows):
        assert point.prompt(example_id) == point.prompt(example_id, step=step) == row[field]
    assert point.prompt("no such row") is None
    assert point.prompt(ids[0], step="no such step") is None
    opened = cm.open(sweep.out).points[0]
    assert opened.prompt(opened.result("iia").example_ids[0]) is None


def test_table_is_every_points_rows_with_coordinates(sweep):
    table = sweep.table("iia")
    rows = jsonl(DATA / "weekdays_full" / "train.jsonl")
    assert len(table) == len(NAMES) * len(rows)
    assert [r["point"] for r in table] == [n for n in NAMES for _ in rows]
    for p in sweep.points:
        mine = [r for r in table if r["point"] == p.name]
        assert all(r["layers"] == p.coords["layers"] and r["pos"] == p.coords["pos"] for r in mine)
        own = p.result("iia").rows
        assert [r["value"] for r in mine] == [r["value"] for r in own]
        assert [r["example_id"] for r in mine] == [r["example_id"] for r in own]
        assert [{k: v for k, v in r.items() if k not in ("point", "layers", "pos")} for r in mine] == own
    assert all(r["value"] in (0.0, 1.0) for r in table)


def hand_aggregate(table, point, how):
    values = [r["value"] for r in table if r["point"] == point and r["eligible"]]
    return {"mean": math.fsum(values) / len(values), "max": max(values), "min": min(values)}[how]


def test_grid_cells_are_means_of_the_table(sweep):
    table = sweep.table("iia")
    grid = sweep.grid("iia", "layers", "pos")
    assert grid.rows == LAYERS and grid.columns == POSITIONS
    assert (grid.row_axis, grid.column_axis) == ("layers", "pos")
    for i, layer in enumerate(LAYERS):
        for j, pos in enumerate(POSITIONS):
            assert grid.values[i][j] == hand_aggregate(table, f"layers={layer},pos={pos}", "mean")
    # swapped axes: the transpose
    flipped = sweep.grid("iia", "pos", "layers")
    assert flipped.rows == POSITIONS and flipped.columns == LAYERS
    assert flipped.values == [list(col) for col in zip(*grid.values)]
    # not every cell the same, so the layout is tested
    assert len({v for row in grid.values for v in row}) > 1
    assert sweep.means() == {n: {"iia": hand_aggregate(table, n, "mean"),
                                 "logit_diff": sweep.point(n).result("logit_diff").mean()} for n in NAMES}


def test_grid_aggregate_max(sweep):
    table = sweep.table("logit_diff")
    grid = sweep.grid("logit_diff", "layers", "pos", aggregate="max")
    for i, layer in enumerate(LAYERS):
        for j, pos in enumerate(POSITIONS):
            name = f"layers={layer},pos={pos}"
            assert grid.values[i][j] == hand_aggregate(table, name, "max")
            assert grid.values[i][j] > hand_aggregate(table, name, "mean")  # logit_diff varies by row
    with pytest.raises(PlanError):
        sweep.grid("iia", "layers", "pos", aggregate="median")


def test_grid_over_one_axis(sweep):
    with pytest.raises(PlanError) as err:
        sweep.grid("iia", "pos")  # layers varies too
    assert "layers" in err.value.problem
    one = sweep.select(layers=1).grid("iia", "pos")
    table = sweep.table("iia")
    assert one.rows == POSITIONS and one.column_axis is None
    assert [row[0] for row in one.values] == [hand_aggregate(table, f"layers=1,pos={p}", "mean") for p in POSITIONS]


def test_grid_refuses_an_unknown_axis(sweep):
    with pytest.raises(PlanError) as err:
        sweep.grid("iia", "layers", "depth")
    assert "depth" in err.value.path
    assert "pos" in err.value.fix


# --- 4. the numbers, computed without the library --------------------------------------------------

def hand_patch(hf, rows, layer: int, pos: int) -> dict:
    """Decoder layer ``layer``'s output at ``pos`` (from the end) of the counterfactual prompt swapped
    into the same place of the base prompt; iia and logit_diff of the last position's logits."""
    import torch

    model, tok = hf
    block = model.model.layers[layer]
    base = [r["input"] for r in rows]
    cf = [r["counterfactual_inputs"][0] for r in rows]
    seen = {}

    def batch(texts):
        ids, mask, positions = padded(tok, texts)
        return dict(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False), ids.shape[1]

    def read(_m, _a, output):
        seen["v"] = hidden_of(output)[:, seen["at"]].detach().clone()

    def write(_m, _a, output):
        hidden = hidden_of(output).clone()
        hidden[:, seen["at"]] = seen["v"]
        return with_hidden(output, hidden)

    with torch.no_grad():
        inputs, width = batch(cf)
        seen["at"] = width + pos  # left padded: the same index on every row
        handle = block.register_forward_hook(read)
        try:
            model(**inputs)
        finally:
            handle.remove()
        inputs, width = batch(base)
        seen["at"] = width + pos
        handle = block.register_forward_hook(write)
        try:
            logits = model(**inputs).logits[:, -1]
        finally:
            handle.remove()
    want = torch.tensor([answer_id(tok, r["cf_answer"]) for r in rows])
    other = torch.tensor([answer_id(tok, r["base_answer"]) for r in rows])
    i = torch.arange(len(rows))
    return {"iia": tuple((logits.argmax(-1) == want).float().tolist()),
            "logit_diff": tuple((logits[i, want] - logits[i, other]).tolist())}


def test_patching_numbers_by_hand(patching, hf):
    rows = jsonl(DATA / "weekdays" / "train.jsonl")
    raw = json.loads(PATCHING.read_text())
    assert raw["sites"]["target"] == {"component": "block_output", "layers": [0]}
    expected = hand_patch(hf, rows, layer=0, pos=-1)
    got = patching.result("iia")
    assert got.values == expected["iia"]
    assert got.mean() == math.fsum(expected["iia"]) / len(rows)
    assert len(set(expected["iia"])) == 2  # some rows move, some do not: a wrong site would show
    diff = patching.result("logit_diff").values
    assert len(diff) == len(rows)
    assert all(abs(g - e) <= TOL for g, e in zip(diff, expected["logit_diff"]))


@pytest.mark.parametrize("name", NAMES)
def test_sweep_numbers_by_hand(sweep, hf, name):
    rows = jsonl(DATA / "weekdays_full" / "train.jsonl")
    point = sweep.point(name)
    expected = hand_patch(hf, rows, point.coords["layers"], point.coords["pos"])
    assert point.result("iia").values == expected["iia"]
    diff = point.result("logit_diff").values
    assert len(diff) == len(rows)
    assert all(abs(g - e) <= TOL for g, e in zip(diff, expected["logit_diff"]))


def test_batch_size_does_not_change_the_rows(engine, patching):
    batched = cm.run(PATCHING, loaded=engine, batch_size=3)  # 4 rows: a batch of 3 and one of 1
    assert batched.result("iia").rows == patching.result("iia").rows
    # Other batches pad to other widths, so the logits may round differently in the last bits.
    here, whole = batched.result("logit_diff").rows, patching.result("logit_diff").rows
    assert [{**r, "value": None} for r in here] == [{**r, "value": None} for r in whole]
    assert all(abs(a["value"] - b["value"]) <= TOL for a, b in zip(here, whole))


# --- 5. Result statistics --------------------------------------------------------------------------

def rows_of(values, eligible=None) -> list[dict]:
    eligible = eligible or [True] * len(values)
    return [{"example_id": str(i), "value": v if ok else None, "eligible": ok}
            for i, (v, ok) in enumerate(zip(values, eligible))]


def test_result_over_eligible_rows_only():
    rows = rows_of([1.0, None, 0.0, 0.5, None], [True, False, True, True, False])
    result = Result("m", rows)
    assert len(result) == 3
    assert list(result) == [1.0, 0.0, 0.5]
    assert result.values == (1.0, 0.0, 0.5)
    assert result.mean() == 0.5
    assert result.std() == statistics.stdev([1.0, 0.0, 0.5])
    assert (result.min(), result.max()) == (0.0, 1.0)
    assert result.eligible == (True, False, True, True, False)
    assert result.rows == rows and len(result.rows) == 5
    assert result.example_ids == ("0", "1", "2", "3", "4")
    assert result.fraction_eligible() == 3 / 5


def test_result_with_no_eligible_row():
    result = Result("m", rows_of([None, None], [False, False]))
    assert len(result) == 0 and list(result) == []
    assert math.isnan(result.mean()) and math.isnan(result.std())
    assert all(math.isnan(x) for x in result.ci())


def test_std_is_the_sample_standard_deviation():
    values = [0.3, -1.25, 2.0, 0.0, 7.5, 1.1]
    result = Result("m", rows_of(values))
    assert math.isclose(result.std(), statistics.stdev(values), rel_tol=1e-12)
    assert math.isclose(result.mean(), statistics.fmean(values), rel_tol=1e-12)
    assert math.isnan(Result("m", rows_of([4.0])).std())


def test_ci_of_constant_values_is_the_constant():
    assert Result("m", rows_of([0.75] * 9)).ci() == (0.75, 0.75)


def test_ci_on_two_values_follows_the_exact_bootstrap_distribution():
    # The mean of two draws from {0, 1}: 0 w.p. 1/4, 0.5 w.p. 1/2, 1 w.p. 1/4. A 95% interval cuts
    # at 2.5% and 97.5%, inside the end masses; a 40% interval at 30% and 70%, inside the middle one.
    result = Result("m", rows_of([0.0, 1.0]))
    assert result.ci(0.95) == (0.0, 1.0)
    assert result.ci(0.40) == (0.5, 0.5)


def test_ci_is_seeded():
    values = [0.1 * k * k - k for k in range(20)]
    result = Result("m", rows_of(values))
    assert result.ci(seed=3, resamples=2000) == result.ci(seed=3, resamples=2000)
    assert result.ci(seed=3, resamples=2000) != result.ci(seed=4, resamples=2000)
    low, high = result.ci(resamples=2000)
    assert min(values) <= low < result.mean() < high <= max(values)


def test_ci_width_matches_the_normal_approximation():
    values = [1.0 if (7 * k) % 10 < 3 else 0.0 for k in range(200)]  # 60 ones, 140 zeros
    result = Result("m", rows_of(values))
    low, high = result.ci(0.95)
    mean = math.fsum(values) / len(values)
    assert low < mean < high
    normal = 2 * 1.96 * statistics.stdev(values) / math.sqrt(len(values))
    assert abs((high - low) - normal) <= 0.15 * normal


@pytest.mark.parametrize("level", [0, 1, 1.5, -0.5])
def test_ci_refuses_a_level_outside_0_1(level):
    with pytest.raises(PlanError) as err:
        Result("m", rows_of([0.0, 1.0])).ci(level)
    assert "level" in err.value.path


def test_ci_refuses_no_resamples():
    with pytest.raises(PlanError):
        Result("m", rows_of([0.0, 1.0])).ci(resamples=0)


# --- 6. written and opened -------------------------------------------------------------------------

def test_open_reads_back_the_same_run(sweep):
    opened = cm.open(sweep.out)
    assert (sweep.out / "run.json").is_file()
    assert [p.name for p in opened.points] == [p.name for p in sweep.points]
    assert [p.coords for p in opened.points] == [p.coords for p in sweep.points]
    saved = [s["value"] for s in json.loads(LAYER_POS.read_text())["steps"]["score"]["saves"]
             if s["file_path"].endswith(".json")]
    assert saved == ["iia", "logit_diff"]
    for mine, back in zip(sweep.points, opened.points):
        assert sorted(back.results()) == sorted(saved)
        for metric in saved:
            assert back.table(metric) == mine.table(metric)
            assert back.table(metric) == json.loads((sweep.out / mine.name / f"{metric}.json").read_text())
    assert opened.grid("iia", "layers", "pos") == sweep.grid("iia", "layers", "pos")
    assert opened.table("logit_diff") == sweep.table("logit_diff")
    assert opened.point(layers=1, pos=-1) is opened.point("layers=1,pos=-1")


def test_open_an_unswept_run_keeps_the_point_name(engine, patching, tmp_path):
    written = cm.run(PATCHING, loaded=engine, out=tmp_path / "run")
    opened = cm.open(tmp_path / "run")
    assert opened.result("iia").rows == written.result("iia").rows == patching.result("iia").rows
    assert [p.name for p in opened.points] == [p.name for p in written.points]


def test_open_an_unswept_run(engine, patching, tmp_path):
    cm.run(PATCHING, loaded=engine, out=tmp_path / "run")
    opened = cm.open(tmp_path / "run")
    assert len(opened.points) == 1 and opened.axes == []
    for metric in ("iia", "logit_diff"):
        assert opened.result(metric).rows == patching.result(metric).rows


def test_open_refuses_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(PlanError) as err:
        cm.open(tmp_path)
    assert "run.json" in err.value.problem
    with pytest.raises(PlanError):
        cm.open(tmp_path / "absent")


def test_open_refuses_an_unfinished_run(sweep, tmp_path):
    from causalab_mini.outputs.write import INCOMPLETE, state

    copy_of = tmp_path / "copy"
    shutil.copytree(sweep.out, copy_of)
    assert cm.open(copy_of).table("iia") == sweep.table("iia")  # the copy itself opens
    (copy_of / INCOMPLETE).write_text(json.dumps({"files": []}) + "\n")
    assert state(copy_of) == "incomplete"
    with pytest.raises(PlanError) as err:
        cm.open(copy_of)
    assert "did not finish" in err.value.problem


def test_saved_tensors_read_back_equal(probe):
    import torch

    opened = cm.open(probe.out)
    assert [p.name for p in opened.points] == [p.name for p in probe.points]
    for mine, back in zip(probe.points, opened.points):
        here, there = mine.saved_tensors(), back.saved_tensors()
        assert list(here) == list(there) == ["generated.safetensors"]
        assert list(here["generated.safetensors"]) == list(there["generated.safetensors"])
        for name, tensor in here["generated.safetensors"].items():
            assert torch.equal(tensor, there["generated.safetensors"][name])
        assert back.table("p_answer") == mine.table("p_answer")


def test_value_on_an_opened_point_is_refused(probe):
    import torch

    assert isinstance(probe.points[0].value("p_answer"), torch.Tensor)
    opened = cm.open(probe.out)
    with pytest.raises(PlanError) as err:
        opened.points[0].value("p_answer")
    assert "saved_tensors" in err.value.fix


# --- 7. frames -------------------------------------------------------------------------------------

def test_frames(sweep):
    pandas = pytest.importorskip("pandas")
    table = sweep.table("iia")
    frame = sweep.to_frame("iia")
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns) == list(table[0])
    assert len(frame) == len(table)
    for column in ("point", "layers", "pos", "example_id", "value", "eligible"):
        assert frame[column].tolist() == [r[column] for r in table]
    grid = sweep.grid("iia", "layers", "pos")
    cells = grid.to_frame()
    assert cells.values.tolist() == grid.values
    assert list(cells.index) == LAYERS and list(cells.columns) == POSITIONS
    assert (cells.index.name, cells.columns.name) == ("layers", "pos")
    assert cells.loc[1, -1] == sweep.point(layers=1, pos=-1).result("iia").mean()


def test_frames_without_pandas(sweep, monkeypatch):
    grid = sweep.grid("iia", "layers", "pos")
    monkeypatch.setitem(sys.modules, "pandas", None)
    for make in (lambda: sweep.to_frame("iia"), grid.to_frame):
        with pytest.raises(PlanError) as err:
            make()
        assert "causalab-mini[frames]" in str(err.value)


# --- 8. one point, and the weightless compile ------------------------------------------------------

def test_one_point_alone_gives_that_points_rows(engine, sweep):
    doc = cm.read(LAYER_POS)
    alone = cm.run(doc.point("layers=0,pos=-4"), loaded=engine)
    assert len(alone.points) == 1
    for metric in ("iia", "logit_diff"):
        assert alone.result(metric).rows == sweep.point(layers=0, pos=-4).result(metric).rows


def test_compile_is_one_child_per_point_after_the_forward_they_share():
    plan = cm.compile(cm.read(LAYER_POS), engine="hooks")
    assert list(plan.steps) == ["shared", *NAMES]
    assert [p.name for p in plan.points] == NAMES
    assert list(cm.compile(cm.read(LAYER_POS), engine="hooks", share=False).steps) == NAMES


# --- 9. refusals before the load -------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [0, -1, True, 2.0])
def test_bad_batch_size_is_refused_before_the_model_is_looked_up(batch_size, tmp_path, monkeypatch):
    from causalab_mini import api

    loads = []

    def no_load(*args, **kwargs):
        loads.append(args)
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(api, "load", no_load)
    raw = json.loads(PATCHING.read_text())
    raw["model"] = {"key": "nope", "dtype": "fp32"}
    doc = cm.read(raw, path=tmp_path / "nope.causalab.json")
    with pytest.raises(EngineError) as err:
        cm.run(doc, engine="hooks", batch_size=batch_size, models=[tmp_path], data=[DATA])
    assert err.value.path == "batch_size"
    assert loads == []
    # The control: with no batch_size the run goes on to load the model.
    with pytest.raises(AssertionError, match="the model was loaded"):
        cm.run(doc, engine="hooks", models=[tmp_path], data=[DATA])
    assert len(loads) == 1


def test_bad_out_is_refused_before_the_load(tmp_path, monkeypatch):
    from causalab_mini import api

    monkeypatch.setattr(api, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(EngineError) as err:
        cm.run(PATCHING, engine="hooks", out=a_file)
    assert err.value.path == "--out"


def test_a_document_outside_documents_runs_with_search_paths(engine, patching, tmp_path):
    path = tmp_path / "copy.causalab.json"
    path.write_text(PATCHING.read_text())
    moved = cm.run(path, loaded=engine, **SEARCH)
    assert [p.name for p in moved.points] == ["copy"]
    assert moved.result("iia").values == patching.result("iia").values

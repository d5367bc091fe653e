"""A finished run folder damaged after its commit: ``cm.open`` refuses it with a ``DamagedRun``
naming the file and what is wrong with it, ``table`` and ``plot`` exit 2 with that message, and
``report`` writes its page with the run marked damaged, says so, and exits 1.

The folders are real runs (a 3-point sweep, and an unswept run that also saves a tensor), copied
and then damaged with plain file operations: a file cut in half, deleted, or rewritten.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from paths import DATA, V2
from samples import saving_cf_resid
from report_page import ReportPage

import causalab_mini as cm
from causalab_mini import cli, report

pytestmark = pytest.mark.usefixtures("one_thread")

SWEEP = V2 / "pos_sweep.causalab.json"  # pos=-1, -2, -3: one folder a point
PATCHING = V2 / "patching.causalab.json"


@pytest.fixture(scope="module")
def runs(engines, tmp_path_factory) -> dict:
    """Real run folders, never changed: ``sweep`` (pos_sweep) and ``saving`` (patching, with its
    counterfactual read published and saved as cf_resid.safetensors beside its metrics)."""
    base = tmp_path_factory.mktemp("damaged")
    cm.run(SWEEP, loaded=engines(SWEEP, "hooks"), out=base / "sweep")
    path = saving_cf_resid(base)
    cm.run(path, loaded=engines(PATCHING, "hooks"), out=base / "saving", data=DATA)
    return {"sweep": base / "sweep", "saving": base / "saving"}


def _copy(runs, which: str, tmp_path: Path) -> Path:
    folder = tmp_path / which
    shutil.copytree(runs[which], folder)
    return folder


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


# What is done to the file, and the words the refusal must say about it.
DAMAGE = {
    "cut in half": (_truncate, "cannot be read as JSON (truncated?)"),
    "deleted": (Path.unlink, "listed in run.json, but the file is missing"),
    "an object": (lambda f: f.write_text('{"rows": []}'), "not a metric file: a JSON array of row objects"),
    "not rows": (lambda f: f.write_text("[1, 2]"), "row 0 is not an object"),
    "a row without its value": (lambda f: f.write_text('[{"example_id": "0", "eligible": true}]'),
                                "row 0 has no value"),
    "a text value": (lambda f: f.write_text('[{"example_id": "0", "eligible": true, "value": "1.0"}]'),
                     "row 0 has a value that is neither a number nor null"),
    "not UTF-8": (lambda f: f.write_bytes(b"\xff\xfe[]"), "not UTF-8"),
}


def _refusal(folder: Path) -> cm.DamagedRun:
    with pytest.raises(cm.DamagedRun) as err:
        cm.open(folder)
    assert isinstance(err.value, cm.PlanError)  # what open refused a damaged run.json as, before
    assert err.value.fix == f"run the document again into this folder (--out {folder})"
    return err.value


def _cli_refuses(capsys, argv: list, refused: cm.DamagedRun) -> None:
    """The verb exits 2 printing the refusal itself, one line, nothing on stdout, no traceback."""
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: DamagedRun: {refused}\n"


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_metric_file_is_refused_by_open_table_and_plot(runs, tmp_path, capsys, damage):
    pytest.importorskip("matplotlib")
    folder = _copy(runs, "sweep", tmp_path)
    assert cm.open(folder).table("iia") == cm.open(runs["sweep"]).table("iia")  # the copy itself opens
    file = folder / "pos=-2" / "iia.json"
    do, words = DAMAGE[damage]
    do(file)
    refused = _refusal(folder)
    assert refused.path == str(file)
    assert words in refused.problem
    _cli_refuses(capsys, ["table", str(folder)], refused)
    _cli_refuses(capsys, ["plot", str(folder), "-o", str(tmp_path / "p.png")], refused)
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("damage", ["cut in half", "deleted"])
def test_a_damaged_tensor_file_is_refused(runs, tmp_path, capsys, damage):
    folder = _copy(runs, "saving", tmp_path)
    assert list(cm.open(folder).point().saved_tensors()) == ["cf_resid.safetensors"]
    file = folder / "cf_resid.safetensors"
    DAMAGE[damage][0](file)
    refused = _refusal(folder)
    assert refused.path == str(file)
    assert {"cut in half": "does not load as a safetensors file",
            "deleted": "cf_resid.safetensors is listed in run.json, but the file is missing"}[damage] in refused.problem
    _cli_refuses(capsys, ["table", str(folder)], refused)


@pytest.mark.parametrize("file, words", [
    ("run.json", "cannot be read as JSON (truncated?)"),
    ("document.json", "cannot be read as JSON (truncated?)"),
    ("pos=-1/document.json", "cannot be read as JSON (truncated?)"),  # what plot reads for its labels
])
def test_a_damaged_record_or_document_is_refused(runs, tmp_path, capsys, file, words):
    pytest.importorskip("matplotlib")
    folder = _copy(runs, "sweep", tmp_path)
    _truncate(folder / file)
    refused = _refusal(folder)
    assert (refused.path, words in refused.problem) == (str(folder / file), True)
    _cli_refuses(capsys, ["table", str(folder)], refused)
    _cli_refuses(capsys, ["plot", str(folder), "-o", str(tmp_path / "p.png")], refused)


def test_a_record_that_lists_no_files_is_refused(runs, tmp_path):
    folder = _copy(runs, "sweep", tmp_path)
    record = json.loads((folder / "run.json").read_text())
    del record["files"]
    (folder / "run.json").write_text(json.dumps(record))
    refused = _refusal(folder)
    assert refused.path == str(folder / "run.json") and '"files" lists the run\'s files' in refused.problem


@pytest.mark.parametrize("damage", ["run.json cut in half", "iia.json deleted"])
def test_report_writes_the_page_with_the_damaged_run_marked_and_exits_1(runs, tmp_path, capsys, damage):
    pytest.importorskip("matplotlib")
    under = tmp_path / "runs"
    _copy(runs, "saving", under)  # a healthy run beside it
    bad = _copy(runs, "sweep", under)
    if damage == "run.json cut in half":
        _truncate(bad / "run.json")
    else:
        (bad / "pos=-3" / "iia.json").unlink()
    refused = _refusal(bad)
    page_path = tmp_path / "page.html"
    assert cli.main(["report", str(under), "-o", str(page_path)]) == 1
    captured = capsys.readouterr()
    # Sorted by path: "saving" then "sweep"; the healthy run's one point is counted, the damaged
    # run is counted apart, and stderr says which folder and why.
    assert captured.out.splitlines() == [str(page_path.resolve()), "2 runs, 1 passed, 1 damaged"]
    assert captured.err == f"damaged: {bad}: {refused}\n"
    page = report.from_folders([under])
    assert [s.damaged for s in page.sections] == ["", str(refused)]
    assert [s.name for s in page.damaged] == ["sweep"]
    parsed = ReportPage(page_path.read_text(encoding="utf-8"))
    assert [(s["data-document"], s["data-outcome"], s.get("data-damaged")) for s in parsed.sections] == [
        ("saving", "passed", None), ("sweep", "error", "true")]
    assert [r["data-point"] for r in parsed.rows] == ["saving"]  # no row of the damaged run is shown
    text = page_path.read_text(encoding="utf-8")
    assert 'data-damaged="1">1 damaged run<' in text
    assert "damaged, not read: " in text and str(refused.path) in text


def test_report_of_healthy_runs_still_exits_0(runs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert cli.main(["report", str(runs["sweep"]), "-o", str(tmp_path / "page.html")]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[1] == "1 runs, 3 passed" and captured.err == ""

"""pytest_causalab's baselines in daily use, through pytester: the bare update flag, the session's
baseline report (xdist included), stale entries, drift lines, a changed experiment's fields, the
aggregates mode, file permissions and what ``CI`` means.

As in test_plugin.py, each test writes copies of corpus documents into pytester's directory and
points the plugin at the shipped models and data through an ini file; expected numbers are read
from the baseline file a first run wrote (or from the shipped data), never typed in.
"""
from __future__ import annotations

import copy
import json
import math
import os
import statistics
import stat

import pytest
from paths import DATA, V2

pytest_plugins = ["pytester"]


def corpus(name: str) -> dict:
    return json.loads((V2 / f"{name}.causalab.json").read_text())


def write(tester, name: str, source: str, *, edit=None) -> dict:
    doc = copy.deepcopy(corpus(source))
    doc["header"]["expect"] = []
    if edit:
        edit(doc)
    (tester.path / f"{name}.causalab.json").write_text(json.dumps(doc, indent=1))
    return doc


def baseline(tester, name: str) -> dict:
    return json.loads((tester.path / "baselines" / f"{name}.json").read_text())


def save_baseline(tester, name: str, data: dict) -> None:
    (tester.path / "baselines" / f"{name}.json").write_text(json.dumps(data, indent=1))


def g6(value: float) -> str:
    """A number as the failure output prints it."""
    return f"{value:.6g}"


def report(result) -> list:
    """The lines of the session's "causalab baselines" section."""
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "causalab baselines" in line)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("=")), len(lines))
    return lines[start + 1:end]


def rows_mean(rows: dict) -> float:
    values = [v for v in rows.values() if v is not None]
    return math.fsum(values) / len(values)


# --- the update flag ----------------------------------------------------------------------------

def test_a_path_after_the_bare_update_flag_is_a_usage_error_that_says_why(tester):
    write(tester, "single", "patching")
    result = tester.runpytest("--causalab-update-baselines", "single.causalab.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--causalab-update-baselines: 'single.causalab.json' is not one of failing, "
                                 "all (--causalab-update-baselines alone means failing; followed by a path*"])


# --- the session report, stale entries, the bare flag -------------------------------------------

def test_session_report_counts_each_category_and_stale_entries_are_reported_then_removed(tester):
    write(tester, "sweep", "pos_sweep")
    result = tester.runpytest()
    result.assert_outcomes(passed=3, warnings=3)
    assert report(result) == ["3 points: 3 written, 0 updated, 0 drifted, 0 unchanged; 0 stale",
                              "  written    sweep.causalab.json: pos=-1, pos=-2, pos=-3"]
    stored = baseline(tester, "sweep")

    # pos=-3 leaves the sweep (its entry is now stale), and one row of pos=-2 drifts.
    def two_positions(doc):
        doc["interventions"]["patching"]["writes"]["patch"]["pos"]["sweep"] = [-1, -2]
    write(tester, "sweep", "pos_sweep", edit=two_positions)
    drifted = copy.deepcopy(stored)
    drifted["points"]["pos=-2"]["results"]["logit_diff"]["rows"]["1"] += 0.5
    save_baseline(tester, "sweep", drifted)
    result = tester.runpytest()
    result.assert_outcomes(passed=1, failed=1)  # the stale entry is not a failure
    assert report(result) == [
        "2 points: 0 written, 0 updated, 1 drifted, 1 unchanged; 1 stale (kept)",
        "  drifted    sweep.causalab.json: pos=-2",
        "  stale      sweep.causalab.json: pos=-3 (kept: not points of the document any more; "
        "--causalab-update-baselines removes them)",
    ]
    assert list(baseline(tester, "sweep")["points"]) == ["pos=-1", "pos=-2", "pos=-3"]  # kept

    # The bare flag: failing. The drifted entry is rewritten, the stale one removed.
    result = tester.runpytest("--causalab-update-baselines")
    result.assert_outcomes(passed=2, warnings=2)
    assert report(result) == ["2 points: 0 written, 1 updated, 0 drifted, 1 unchanged; 1 stale (removed)",
                              "  updated    sweep.causalab.json: pos=-2",
                              "  stale      sweep.causalab.json: pos=-3 (removed)"]
    result.stdout.fnmatch_lines(["*BaselineWarning: stale baseline entries removed from baselines*sweep.json: "
                                 "pos=-3 (no longer points of sweep.causalab.json)"])
    now = baseline(tester, "sweep")
    assert now["points"] == {name: stored["points"][name] for name in ("pos=-1", "pos=-2")}

    # All unchanged: the count, and with --causalab-summary the documents too.
    result = tester.runpytest("--causalab-summary")
    result.assert_outcomes(passed=2)
    assert report(result) == ["2 points: 0 written, 0 updated, 0 drifted, 2 unchanged; 0 stale",
                              "  unchanged  sweep.causalab.json: pos=-1, pos=-2"]


def test_session_report_under_xdist_is_gathered_from_the_workers(tester):
    write(tester, "sweep", "pos_sweep")
    tester.runpytest().assert_outcomes(passed=3, warnings=3)
    stored = baseline(tester, "sweep")
    drifted = copy.deepcopy(stored)
    drifted["points"]["pos=-1"]["results"]["iia"]["rows"]["0"] += 0.5
    drifted["points"]["pos=-9"] = stored["points"]["pos=-3"]  # a point the sweep does not have
    save_baseline(tester, "sweep", drifted)
    result = tester.runpytest_subprocess("-n", "2")
    result.assert_outcomes(passed=2, failed=1)
    lines = report(result)
    # Every item saw the stale entry, on either worker: it is counted once.
    assert lines[0] == "3 points: 0 written, 0 updated, 1 drifted, 2 unchanged; 1 stale (kept)"
    assert lines[1:] == ["  drifted    sweep.causalab.json: pos=-1",
                         "  stale      sweep.causalab.json: pos=-9 (kept: not points of the document any more; "
                         "--causalab-update-baselines removes them)"]


# --- drift lines --------------------------------------------------------------------------------

def test_drift_leads_with_one_line_per_result_naming_the_worst_row_and_its_prompt(tester):
    """30 rows (weekdays_full): 8 rows of logit_diff moved; the line gives both means, how many
    moved, the worst row with its change and its base prompt; the table shows 5 rows, then a count."""
    def thirty_rows(doc):
        doc["steps"]["score"]["rows"] = {"base": "weekdays_full/train", "counterfactual": "weekdays_full/train"}
    write(tester, "sweep", "pos_sweep", edit=thirty_rows)
    tester.runpytest("sweep.causalab.json::pos=-1").assert_outcomes(passed=1, warnings=1)
    stored = baseline(tester, "sweep")
    got = stored["points"]["pos=-1"]["results"]["logit_diff"]["rows"]
    assert len(got) == 30
    drifted = copy.deepcopy(stored)
    moved = list(got)[:8]
    for k, example_id in enumerate(moved):
        drifted["points"]["pos=-1"]["results"]["logit_diff"]["rows"][example_id] += 0.1 * (k + 1)
    save_baseline(tester, "sweep", drifted)
    ref = drifted["points"]["pos=-1"]["results"]["logit_diff"]["rows"]
    worst = max(moved, key=lambda e: abs(got[e] - ref[e]))
    prompts = [json.loads(line)["input"] for line in (DATA / "weekdays_full" / "train.jsonl").read_text().splitlines()]
    prompt = prompts[int(worst)]  # example ids are row numbers: the data has no example_id column

    result = tester.runpytest("sweep.causalab.json::pos=-1")
    result.assert_outcomes(failed=1)
    by_size = sorted(moved, key=lambda e: -abs(got[e] - ref[e]))
    result.stdout.fnmatch_lines([
        f"8 of 8 checks failed on nnterp: logit_diff row {worst} got {g6(got[worst])}, "
        f"expected baseline {g6(ref[worst])} (+7 more)",
        f"logit_diff: mean {g6(rows_mean(ref))} → {g6(rows_mean(got))}, 8 of 30 rows moved, "
        f"worst row {worst} ({got[worst] - ref[worst]:+.6g}) {prompt!r}",
        "point   result      aggregate  expected/baseline  got*",
        "-*",
        *(f"pos=-1  logit_diff  row {e:<2}*baseline {g6(ref[e])}*{g6(got[e])}*" for e in by_size[:5]),
        "pos=-1  logit_diff  … and 3 more rows",
    ])
    assert f"row {by_size[5]} " not in result.stdout.str()


# --- a changed experiment -----------------------------------------------------------------------

def test_a_changed_experiment_names_its_changed_fields_and_a_v1_baseline_its_digests(tester):
    import causalab_mini

    path = tester.path / "single.causalab.json"
    write(tester, "single", "patching")
    tester.runpytest().assert_outcomes(passed=1, warnings=1)
    stored = baseline(tester, "single")
    entry = stored["points"]["single"]
    spec = causalab_mini.read(path).points[0].spec
    assert stored["format"] == "causalab-baseline/2"
    assert entry["experiment"] == spec.canonical() and entry["produced_by"] == spec.produced_by

    def moved(doc):
        doc["interventions"]["patching"]["writes"]["patch"]["pos"] = -2
        doc["sites"]["target"]["layers"] = [1]
    write(tester, "single", "patching", edit=moved)
    changed = causalab_mini.read(path).points[0].spec
    result = tester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"1 of 1 checks failed on nnterp: experiment produced_by got {changed.produced_by[:12]}, "
        f"expected baseline {spec.produced_by[:12]}",
        "experiment changed (2 fields):",
        "  sites.target.layers.0: 0 → 1",
        "  interventions.patching.writes.patch.pos: -1 → -2",
        "point   result      aggregate    expected/baseline*",
    ])

    # A causalab-baseline/1 file records no experiment: the two digests, and the file is still read.
    v1 = copy.deepcopy(stored)
    v1["format"] = "causalab-baseline/1"
    del v1["points"]["single"]["experiment"]
    save_baseline(tester, "single", v1)
    result = tester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"experiment changed: produced_by {spec.produced_by[:12]} → "
                                 f"{changed.produced_by[:12]} (the baseline (causalab-baseline/1) does not "
                                 "record the experiment's fields; updating the baseline records them)"])

    tester.runpytest("--causalab-update-baselines").assert_outcomes(passed=1, warnings=1)
    updated = baseline(tester, "single")
    assert updated["format"] == "causalab-baseline/2"
    assert updated["points"]["single"]["experiment"] == changed.canonical()

    # A /1 file whose digest still matches passes, and is left as it is.
    del updated["points"]["single"]["experiment"]
    updated["format"] = "causalab-baseline/1"
    save_baseline(tester, "single", updated)
    before = (tester.path / "baselines" / "single.json").read_bytes()
    result = tester.runpytest()
    result.assert_outcomes(passed=1)
    assert (tester.path / "baselines" / "single.json").read_bytes() == before
    assert report(result) == ["1 point: 0 written, 0 updated, 0 drifted, 1 unchanged; 0 stale"]


# --- aggregates mode ----------------------------------------------------------------------------

def test_aggregates_mode_stores_mean_std_n_and_holds_the_mean_within_tolerance_and_n_exactly(tester, plugin_ini):
    """``big`` matches the ini's aggregates glob, ``small`` does not; both are the same experiment,
    so big's aggregates are the statistics of small's stored rows."""
    plugin_ini("causalab_baseline_aggregates = big*.causalab.json")
    write(tester, "big", "patching")
    write(tester, "small", "patching")
    tester.runpytest().assert_outcomes(passed=2, warnings=2)
    rows = baseline(tester, "small")["points"]["small"]["results"]
    big = baseline(tester, "big")
    results = big["points"]["big"]["results"]
    assert sorted(results) == sorted(rows) == ["iia", "logit_diff"]
    for name, stored in results.items():
        values = [v for v in rows[name]["rows"].values() if v is not None]
        # Counts exactly; mean and std to the last few bits: the plugin's sample std and
        # statistics.stdev (exact fractions) are two roundings of one number.
        assert (stored["n"], stored["n_rows"]) == (len(values), len(rows[name]["rows"]))
        assert math.isclose(stored["mean"], math.fsum(values) / len(values), rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(stored["std"], statistics.stdev(values), rel_tol=1e-12, abs_tol=1e-15)
    iia, diff = results["iia"], results["logit_diff"]

    drifted = copy.deepcopy(big)
    drifted["points"]["big"]["results"]["iia"]["mean"] += 0.5
    drifted["points"]["big"]["results"]["logit_diff"]["n"] -= 1
    save_baseline(tester, "big", drifted)
    result = tester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "2 of 2 checks failed on nnterp: *",
        f"iia: mean {g6(iia['mean'] + 0.5)} → {g6(iia['mean'])}, n {iia['n']}",
        f"logit_diff: mean {g6(diff['mean'])} → {g6(diff['mean'])}, n {diff['n'] - 1} → {diff['n']}",
        "*",
        "*",
        f"big    iia         mean       baseline {g6(iia['mean'] + 0.5)}*{g6(iia['mean'])}*-0.5*",
        f"big    logit_diff  n          baseline {diff['n'] - 1}*{diff['n']}*1*(eligible rows, held exactly)",
    ])
    # Within a looser tolerance the mean passes; n is still held exactly.
    result = tester.runpytest("--causalab-atol=0.6")
    result.assert_outcomes(passed=1, failed=1)
    assert "big    iia" not in result.stdout.str()
    result.stdout.fnmatch_lines(["1 of 1 checks failed on nnterp: logit_diff n got *"])

    # Every document in aggregates mode: small's rows baseline is checked by its aggregates and
    # left as it is; the bare update flag rewrites only big.
    plugin_ini("causalab_baseline_mode = aggregates")
    small_before = (tester.path / "baselines" / "small.json").read_bytes()
    result = tester.runpytest("--causalab-update-baselines")
    result.assert_outcomes(passed=2, warnings=1)
    assert report(result)[0] == "2 points: 0 written, 1 updated, 0 drifted, 1 unchanged; 0 stale"
    assert baseline(tester, "big") == big
    assert (tester.path / "baselines" / "small.json").read_bytes() == small_before


def test_a_bad_baseline_mode_is_a_usage_error(tester, plugin_ini):
    plugin_ini("causalab_baseline_mode = sums")
    result = tester.runpytest("--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini causalab_baseline_mode: 'sums' is not one of rows, aggregates*"])


# --- permissions and CI -------------------------------------------------------------------------

def test_baselines_are_written_with_the_users_umask_and_ci_false_is_not_strict(tester, monkeypatch):
    write(tester, "single", "patching")
    written = tester.path / "baselines" / "single.json"
    monkeypatch.setenv("CI", "false")  # not strict: the missing baseline is written
    previous = os.umask(0o022)
    try:
        tester.runpytest().assert_outcomes(passed=1, warnings=1)
        assert stat.S_IMODE(written.stat().st_mode) == 0o644
        written.unlink()
        os.umask(0o077)
        tester.runpytest().assert_outcomes(passed=1, warnings=1)
        assert stat.S_IMODE(written.stat().st_mode) == 0o600
        os.umask(0o022)  # a rewrite (an update) takes the umask of its run too
        tester.runpytest("--causalab-update-baselines=all").assert_outcomes(passed=1, warnings=1)
        assert stat.S_IMODE(written.stat().st_mode) == 0o644
    finally:
        os.umask(previous)


CI_VALUES = {"": False, "0": False, "false": False, "False": False, " FALSE ": False, "no": False, "off": False,
             "1": True, "true": True, "TRUE": True, "yes": True, "woodpecker": True}


def test_what_ci_means(pytester, monkeypatch):
    """Unset, empty, 0, false, no and off (any case) are not CI; anything else is, and is strict.
    (Each configuration costs a second at teardown — pytest collects garbage as it unconfigures —
    so the settings are read through pytest for two values, and the rule itself for all.)"""
    from pytest_causalab.session import ci_is_set, session_of

    assert {value: ci_is_set(value) for value in [*CI_VALUES, None]} == {**CI_VALUES, None: False}
    for value in ("False", "yes"):
        monkeypatch.setenv("CI", value)
        assert session_of(pytester.parseconfigure()).settings.strict is CI_VALUES[value]


def test_a_documents_baseline_file_is_parsed_once_per_session_not_once_per_point(tester, monkeypatch):
    """Every point's entry is in one file; checking a 3-point sweep reads it once (a sweep's checks
    were quadratic in its points), and a file changed between sessions is read again."""
    from pytest_causalab import baseline as baseline_mod

    write(tester, "sweep", "pos_sweep")
    tester.runpytest().assert_outcomes(passed=3, warnings=3)  # writes the baselines
    parsed = []
    original = baseline_mod.load

    def counted(path, **kwargs):
        parsed.append(path.name)
        return original(path, **kwargs)

    monkeypatch.setattr(baseline_mod, "load", counted)
    tester.runpytest().assert_outcomes(passed=3)
    assert parsed == ["sweep.json"]
    drifted = baseline(tester, "sweep")
    drifted["points"]["pos=-2"]["results"]["logit_diff"]["rows"]["1"] += 0.5
    save_baseline(tester, "sweep", drifted)
    parsed.clear()
    tester.runpytest().assert_outcomes(passed=2, failed=1)  # the edit is seen
    assert parsed == ["sweep.json"]

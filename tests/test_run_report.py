"""What ``causalab-mini run`` tells a person beyond the files: where the time went (also in
run.json), the notes on how rows were scored (once per metric), its version and its help."""
from __future__ import annotations

import json
import subprocess

import pytest
from paths import MODELS, REPO, V2
from samples import cli_command

import causalab_mini as cm

LAYER_POS = V2 / "layer_pos_sweep.causalab.json"
pytest_plugins = ["pytester"]


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=600)


@pytest.fixture(scope="module")
def swept_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "lp"
    done = cli("run", LAYER_POS, "--engine", "hooks", "--out", out)
    assert done.returncode == 0, done.stderr
    return done, out


def _is_seconds(value) -> bool:
    return isinstance(value, float) and value >= 0 or value == 0


def test_run_json_records_load_compile_and_each_points_compute(swept_run):
    _, out = swept_run
    timing = json.loads((out / "run.json").read_text())["timing"]
    names = [p.name for p in cm.read(LAYER_POS).points]
    assert list(timing) == ["load_s", "compile_s", "compute_s", "shared_s", "points"]
    assert list(timing["points"]) == names
    assert all(_is_seconds(timing[k]) for k in ("load_s", "compile_s", "compute_s", "shared_s"))
    assert all(_is_seconds(s) for s in timing["points"].values())
    # The walk's time is the points' own plus the shared forwards, each rounded to a millisecond.
    assert abs(sum(timing["points"].values()) + timing["shared_s"] - timing["compute_s"]) <= 0.001 * (len(names) + 2)
    # cm.open reads the folder with its timing as recorded.
    assert cm.open(out).record["timing"] == timing


def test_run_says_where_the_time_went_and_each_note_once(swept_run):
    done, out = swept_run
    timing = json.loads((out / "run.json").read_text())["timing"]
    said = [line for line in done.stderr.splitlines() if line.startswith("time: ")]
    assert said == [f"time: load {timing['load_s']:.2f} s, compile {timing['compile_s']:.2f} s, compute "
                    f"{timing['compute_s']:.2f} s (shared forwards {timing['shared_s']:.2f} s, 6 points "
                    f"{min(timing['points'].values()):.2f}–{max(timing['points'].values()):.2f} s each)"]
    notes = [line for line in done.stderr.splitlines() if line.startswith("note: ")]
    # One line per metric for the whole sweep, not one per point and metric.
    assert [n.split(":")[1].strip() for n in notes] == ["score/iia", "score/logit_diff"]
    partial = _first_of_several(out)
    for note, metric in zip(notes, ("iia", "logit_diff")):
        assert note == (f"note: score/{metric}: {partial[metric]} of 30 rows scored on the first of several "
                        "tokens (at all 6 points)")


def _first_of_several(out) -> dict:
    """Per metric: rows whose scored answers take several tokens, counted with the tokenizer here
    (iia scores cf_answer; logit_diff cf_answer against base_answer, the contrast by its first)."""
    from transformers import AutoTokenizer

    from paths import DATA
    tok = AutoTokenizer.from_pretrained(MODELS / "tiny-llama")
    rows = [json.loads(line) for line in (DATA / "weekdays_full" / "train.jsonl").read_text().splitlines()]
    long = [len(tok(r["cf_answer"], add_special_tokens=False)["input_ids"]) > 1 for r in rows]
    either = [len(tok(r["cf_answer"], add_special_tokens=False)["input_ids"]) > 1
              or len(tok(r["base_answer"], add_special_tokens=False)["input_ids"]) > 1 for r in rows]
    return {"iia": sum(long), "logit_diff": sum(either)}


def test_version_and_help():
    from importlib.metadata import version

    done = cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"causalab-mini {version('causalab-mini')}"
    top = cli("--help").stdout
    for verb in ("vocab", "schema", "data", "validate", "explain", "revision", "run", "table", "plot", "report"):
        assert f"\n    {verb} " in top, verb
    run = " ".join(cli("run", "--help").stdout.split())
    assert "--engine {nnterp,hooks,ndif} nnterp: nnsight through nnterp's standardized names; hooks: plain " \
           "torch forward hooks; ndif:" in run and "(default nnterp)" in run
    assert "--device-map MAP where the weights load:" in run
    assert "--batch-size N rows per forward" in run


def test_pytest_without_the_plugin_names_it_instead_of_collecting_nothing():
    """`pytest documents/` from a pytest that lacks the plugin (the venv not activated; here the
    plugin's autoload turned off): one line naming it, and not exit 5 (no tests)."""
    import os
    import sys

    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "documents/v2/patching.causalab.json"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert done.stderr.strip() == "ERROR: Missing required plugins: causalab-mini"


def test_under_strict_a_point_that_cannot_run_fails_instead_of_skipping(tester, monkeypatch):
    """A misspelt model key with no hub reads as an unreachable hub id: skipped in a plain
    session, a failure under --causalab-strict and under CI."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    doc = json.loads((V2 / "patching.causalab.json").read_text())
    doc["header"]["expect"] = []
    doc["model"] = {"key": "tiny-lama"}
    (tester.path / "typo.causalab.json").write_text(json.dumps(doc))
    tester.runpytest("--causalab-engine=hooks").assert_outcomes(skipped=1)
    strict = tester.runpytest("--causalab-engine=hooks", "--causalab-strict")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*HubUnreachable*", "*under --causalab-strict (or CI) a point that cannot run "
                                 "fails rather than skips*"])
    monkeypatch.setenv("CI", "true")
    tester.runpytest("--causalab-engine=hooks").assert_outcomes(failed=1)

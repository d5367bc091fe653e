"""``causalab-mini run`` and the files it writes, as a user meets them.

The command line itself (its stdout, exit status and stderr, what lands in
``--out``) is exercised through a subprocess where a process boundary is the
point — the two patching runs per engine that determinism compares, and a bad
document. Everything else goes through ``causalab_mini.cli.main`` in this
process, or the Python API (``cm.run`` with a loaded engine), so a model is loaded once per module.

The numbers written are checked against an independent computation: a Hugging
Face model loaded here, a hand-written forward hook doing the patch on a batch
left-padded by hand, position ids from the mask, no cache, and answer ids taken
straight from the tokenizer — none of this package's tokenization, positions,
ops or engines.
"""
from __future__ import annotations

import json
import re
import socket
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from model_calls import untimed
from paths import DATA, MODELS, REPO, V2
from reference import answer_id, padded
from samples import cli_command
import torch

import causalab_mini as cm
from causalab_mini import cli
from causalab_mini.document import read as front
from causalab_mini.errors import PlanError
from causalab_mini.outputs.write import write
from causalab_mini.plan.plan import Observe

transformers = pytest.importorskip("transformers")

PATCHING = V2 / "patching.causalab.json"
POS_SWEEP = V2 / "pos_sweep.causalab.json"
ENTITY = V2 / "entity_patch.causalab.json"
ROWS = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines()
        if line.strip()]
ENGINES = ("hooks", "nnterp")
ENGINE_CLASS = {"hooks": "HooksEngine", "nnterp": "NNterpEngine"}
PATCHING_FILES = ["document.json", "run.json", "iia.json", "logit_diff.json"]
ROW_KEYS = ["example_id", "metric", "value", "eligible", "positions", "reason", "answers", "unit",
            "estimand_version", "produced_by"]
# Each metric's answers as patching.causalab.json names them: (label, column). The match takes
# the logit_diff's other answer as its contrast, because the document compares the two.
ANSWERS = {"iia": (("expected", "cf_answer"), ("distinct_from", "base_answer")),
           "logit_diff": (("a", "cf_answer"), ("b", "base_answer"))}
KINDS = {"iia": ("fraction", "match/v2"), "logit_diff": ("logit", "logit_diff/v2")}
PACKAGES = ("torch", "transformers", "nnsight", "nnterp", "pydantic")
TOL = 1e-6


# --- the command line ------------------------------------------------------------------------




def cli_run(*args, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), "run", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def files_under(directory: Path) -> list[str]:
    """Every file below ``directory``, as sorted posix paths relative to it."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())


def listed(stdout: str, out: Path) -> list[str]:
    """stdout's lines as paths relative to ``out`` (in the order printed)."""
    return [Path(line).relative_to(out).as_posix() for line in stdout.splitlines() if line.strip()]


def load_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def values(path: Path) -> list:
    return [row["value"] for row in load_json(path)]


def produced_by(raw: dict) -> str:
    return front.points(raw)[0].spec.produced_by


def nothing_written(out: Path) -> bool:
    return not out.exists() or not any(out.iterdir())


@pytest.fixture(scope="module")
def patching_runs(request, tmp_path_factory):
    """engine -> the subprocess run of patching.causalab.json, (CompletedProcess, out), made on demand.

    Under xdist the run is made once per session, not once per worker: the workers share
    the session's temporary directory, and a lock says who makes it.
    """
    from filelock import FileLock  # huggingface_hub's own dependency

    shared = hasattr(request.config, "workerinput")
    root = tmp_path_factory.getbasetemp()
    root = root.parent if shared else root
    made: dict = {}

    def get(engine: str):
        if engine not in made:
            out = root / f"patching-{engine}"
            record = root / f"patching-{engine}.run.json"
            with FileLock(str(root / f"patching-{engine}.lock")):
                if not record.exists():
                    done = cli_run(PATCHING, "--engine", engine, "--out", out)
                    record.write_text(json.dumps([done.returncode, done.stdout, done.stderr]))
            code, stdout, stderr = json.loads(record.read_text())
            assert code == 0, stderr
            made[engine] = (subprocess.CompletedProcess([], code, stdout, stderr), out)
        return made[engine]

    return get


@pytest.fixture(scope="module")
def hooks_engine(engines):
    """The hooks engine for tiny-llama, for the module's in-process runs (the session's, shared)."""
    return engines(PATCHING, "hooks")


# --- the independent computation ---------------------------------------------------------------

class Reference:
    """tiny-llama as plain transformers (the session's shared load: the hooks below are removed
    after each forward), and activation patching at block_output[0] written by hand."""

    def __init__(self, model, tok) -> None:
        self.model, self.tok = model, tok

    def answer(self, word: str) -> int:
        return answer_id(self.tok, word)

    def batch(self, texts):
        ids, mask, positions = padded(self.tok, texts)
        return dict(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)

    def patched_logits(self, write_pos: int = -1) -> torch.Tensor:
        """Last-token lm_head logits of the base prompts with layer 0's output at ``write_pos``
        replaced by the counterfactual prompts' layer-0 output at their last token."""
        layer = self.model.model.layers[0]
        seen = {}

        def read(_m, _a, output):
            hidden = output[0] if isinstance(output, tuple) else output
            seen["v_cf"] = hidden[:, -1, :].detach().clone()

        def patch(_m, _a, output):
            hidden = (output[0] if isinstance(output, tuple) else output).clone()
            hidden[:, write_pos, :] = seen["v_cf"]
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        with torch.no_grad():
            handle = layer.register_forward_hook(read)
            try:
                self.model(**self.batch([r["counterfactual_inputs"][0] for r in ROWS]))
            finally:
                handle.remove()
            handle = layer.register_forward_hook(patch)
            try:
                logits = self.model(**self.batch([r["input"] for r in ROWS])).logits
            finally:
                handle.remove()
        return logits[:, -1, :]

    def metrics(self, write_pos: int = -1) -> dict[str, list[float]]:
        logits = self.patched_logits(write_pos)
        cf = torch.tensor([self.answer(r["cf_answer"]) for r in ROWS])
        base = torch.tensor([self.answer(r["base_answer"]) for r in ROWS])
        rows = torch.arange(len(ROWS))
        return {"iia": (logits.argmax(-1) == cf).float().tolist(),
                "logit_diff": (logits[rows, cf] - logits[rows, base]).tolist()}


@pytest.fixture(scope="module")
def reference(hf_model):
    ref = Reference(*hf_model("tiny-llama"))
    made: dict = {}

    def get(write_pos: int = -1):
        if write_pos not in made:
            made[write_pos] = ref.metrics(write_pos)
        return made[write_pos]

    return get


def assert_close(got: list, expected: list, tol: float = TOL) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g is not None and abs(g - e) <= tol, (got, expected)


# --- one run, as a user runs it --------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_run_writes_exactly_the_files_it_lists(patching_runs, engine):
    done, out = patching_runs(engine)
    assert "Traceback" not in done.stderr
    assert listed(done.stdout, out) == PATCHING_FILES  # the manifest, in order
    assert files_under(out) == sorted(PATCHING_FILES)  # and nothing else, temporary files included


@pytest.mark.parametrize("engine", ENGINES)
def test_document_json_is_the_document_as_written(patching_runs, engine):
    _, out = patching_runs(engine)
    assert load_json(out / "document.json") == load_json(PATCHING)


@pytest.mark.parametrize("engine", ENGINES)
def test_run_json_records_what_ran_and_nothing_about_where(patching_runs, engine):
    _, out = patching_runs(engine)
    record = load_json(out / "run.json")
    assert record["engine"] == ENGINE_CLASS[engine]
    assert record["remote"] is False
    assert record["batch_size"] is None
    assert record["versions"] == {name: metadata.version(name) for name in PACKAGES}
    assert re.fullmatch(r"[0-9a-f]{64}", record["causalab_mini"])
    assert record["served_dtype"] == "torch.float32"
    text = (out / "run.json").read_text()
    for place in {str(out), str(out.resolve()), str(REPO), str(Path.home())}:
        assert place not in text
    host = socket.gethostname()
    if len(host) >= 4:  # a very short name would match by accident
        assert host not in text
    assert not re.search(r"\b(19|20)\d\d\b", text), "a year: run.json holds no timestamp"
    assert not re.search(r"\d\d:\d\d:\d\d", text)


@pytest.mark.parametrize("engine", ENGINES)
def test_metric_rows_match_an_independent_computation(patching_runs, reference, engine):
    _, out = patching_runs(engine)
    expected = reference(-1)
    digest = produced_by(load_json(PATCHING))
    for name, (unit, version) in KINDS.items():
        rows = load_json(out / f"{name}.json")
        assert [list(r) for r in rows] == [ROW_KEYS] * len(ROWS)
        assert [r["example_id"] for r in rows] == [str(i) for i in range(len(ROWS))]
        for r in rows:
            assert r["metric"] == name and r["eligible"] is True
            assert r["positions"] is None and r["reason"] == ""  # the document fixed every position
            assert (r["unit"], r["estimand_version"], r["produced_by"]) == (unit, version, digest)
        assert_close([r["value"] for r in rows], expected[name])
        tok = AutoTokenizer.from_pretrained(MODELS / "tiny-llama")
        head = len(tok("a", add_special_tokens=False)["input_ids"])
        for r, data in zip(rows, ROWS):
            assert r["answers"] == {label: {
                "column": column, "text": data[column],
                "token": tok.convert_ids_to_tokens(answer_id(tok, data[column])),
                "tokens": len(tok("a " + data[column].strip(), add_special_tokens=False)["input_ids"]) - head}
                for label, column in ANSWERS[name]}


def test_a_row_without_an_answer_is_written_excluded(tmp_path, reference, capfd):
    """cf_answer null on row 1: that row is in both files, value null and not eligible, with a reason."""
    rows = [dict(r) for r in ROWS]
    rows[1]["cf_answer"] = None
    (tmp_path / "data" / "weekdays").mkdir(parents=True)
    (tmp_path / "data" / "weekdays" / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert cli.main(["run", str(PATCHING), "--engine", "hooks", "--data", str(tmp_path / "data"),
                     "--out", str(out)]) == 0
    assert listed(capfd.readouterr().out, out) == PATCHING_FILES
    expected = reference(-1)
    for name in KINDS:
        written = load_json(out / f"{name}.json")
        assert [r["example_id"] for r in written] == [str(i) for i in range(len(ROWS))]
        excluded = written[1]
        assert excluded["value"] is None and excluded["eligible"] is False
        assert excluded["reason"], "an excluded row says why"
        kept = [r for i, r in enumerate(written) if i != 1]
        assert all(r["eligible"] is True and r["reason"] == "" for r in kept)
        assert_close([r["value"] for r in kept], [v for i, v in enumerate(expected[name]) if i != 1])


# --- a swept document ------------------------------------------------------------------------

def test_a_swept_run_writes_a_directory_per_point(tmp_path, reference, capfd):
    out = tmp_path / "out"
    assert cli.main(["run", str(POS_SWEEP), "--engine", "hooks", "--out", str(out)]) == 0
    printed = listed(capfd.readouterr().out, out)
    names = ["pos=-1", "pos=-2", "pos=-3"]
    expected = ["document.json", "run.json"] + [f"{n}/{f}" for n in names
                                                for f in ("document.json", "iia.json", "logit_diff.json")]
    assert printed == expected
    assert files_under(out) == sorted(expected)

    raw = load_json(POS_SWEEP)
    assert load_json(out / "document.json") == raw  # the sweep and all
    assert load_json(out / "run.json")["engine"] == "HooksEngine"
    points = {p.name: p for p in front.points(raw)}
    assert sorted(points) == sorted(names)
    for name, pos in zip(names, (-1, -2, -3)):
        point = points[name]
        doc = load_json(out / name / "document.json")
        assert doc == point.document
        assert "sweep" not in json.dumps(doc)  # lowered out
        assert doc["interventions"]["patching"]["writes"]["patch"]["pos"] == pos
        for metric in KINDS:
            rows = load_json(out / name / f"{metric}.json")
            assert {r["produced_by"] for r in rows} == {point.spec.produced_by}
            assert_close([r["value"] for r in rows], reference(pos)[metric])
    # Each point is its own experiment: its own digest.
    assert len({p.spec.produced_by for p in points.values()}) == 3


def test_result_on_a_swept_plan_names_the_count_and_the_point_answers(tmp_path, hooks_engine):
    plan = cm.run(POS_SWEEP, loaded=hooks_engine).plan
    with pytest.raises(PlanError) as caught:
        plan.result("iia")
    message = str(caught.value)
    assert "'iia'" in message and "3 in this plan" in message
    assert "iia" in message.split("3 in this plan", 1)[1] and "logit_diff" in message  # the results here
    write(plan, tmp_path, plan.provenance)
    for name in ("pos=-1", "pos=-2", "pos=-3"):
        got = plan.steps[name].result("iia")
        assert got.tolist() == values(tmp_path / name / "iia.json")
        assert plan.steps[name].result("logit_diff").tolist() == values(tmp_path / name / "logit_diff.json")


# --- determinism and batching --------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_the_same_document_twice_writes_identical_bytes(patching_runs, tmp_path, engine, capfd):
    """The subprocess's files, and this process's run of the same command: the same bytes."""
    _, a = patching_runs(engine)
    b = tmp_path / "again"
    assert cli.main(["run", str(PATCHING), "--engine", engine, "--out", str(b)]) == 0
    assert listed(capfd.readouterr().out, b) == PATCHING_FILES
    assert files_under(a) == files_under(b)
    for rel in files_under(a):
        assert untimed(a / rel) == untimed(b / rel), rel  # run.json's timing is seconds measured


@pytest.mark.parametrize("engine", ENGINES)
def test_batch_size_one_agrees_with_the_whole_batch(patching_runs, tmp_path, engine, capfd):
    _, whole = patching_runs(engine)
    out = tmp_path / "out"
    assert cli.main(["run", str(PATCHING), "--engine", engine, "--batch-size", "1", "--out", str(out)]) == 0
    capfd.readouterr()
    assert load_json(out / "run.json")["batch_size"] == 1
    assert load_json(whole / "run.json")["batch_size"] is None
    for name in KINDS:
        assert_close(values(out / f"{name}.json"), values(whole / f"{name}.json"), tol=1e-5)


# --- refusals ------------------------------------------------------------------------------

def test_a_bad_document_exits_2_with_one_line_and_writes_nothing(tmp_path):
    raw = load_json(PATCHING)
    raw["interventions"]["patching"]["writes"]["patch"]["mechanism"] = "swapp"
    doc = tmp_path / "bad.causalab.json"
    doc.write_text(json.dumps(raw, indent=1))
    out = tmp_path / "out"
    done = cli_run(doc, "--engine", "hooks", "--out", out)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: DocumentError: ")
    assert "interventions.patching.writes.patch.mechanism" in lines[0]
    assert nothing_written(out)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_run_time_refusal_exits_2_typed_and_writes_nothing(tmp_path, engine, capfd):
    """entity_patch on data where row 1's entity is not in its prompt: the write has nothing to
    write there, which only the run can find (the resolver runs where the model is, inside the
    nnterp session) — refused as this project's error, not as nnsight's wrapper."""
    rows = [dict(r) for r in ROWS]
    assert "Wednesday" not in rows[1]["input"]
    rows[1]["entity"] = "Wednesday"
    (tmp_path / "data" / "weekdays").mkdir(parents=True)
    (tmp_path / "data" / "weekdays" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert cli.main(["run", str(ENTITY), "--engine", engine, "--data", str(tmp_path / "data"),
                     "--out", str(out)]) == 2
    captured = capfd.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: EngineError: "), captured.err
    assert "write 'patch' has nothing to write on row(s) {1: 'alignment_missing'}. A read may skip a row; " \
           "a write may not" in lines[0]
    assert nothing_written(out)


# --- writing is all or nothing -------------------------------------------------------------

def test_a_failing_write_leaves_no_file(tmp_path, hooks_engine):
    """The manifest is built before anything is written: a save that cannot be made (its value
    was never produced) fails the write before document.json or run.json exist."""
    plan = cm.run(PATCHING, loaded=hooks_engine).plan
    score = plan.steps["score"]
    assert isinstance(score, Observe) and [s.value for s in score.saves] == ["iia", "logit_diff"]
    del score.results["logit_diff"]  # the second save's value
    out = tmp_path / "out"
    with pytest.raises(PlanError, match="logit_diff"):
        write(plan, out, plan.provenance)
    assert nothing_written(out)


def test_a_file_whose_place_is_a_folder_is_refused_before_anything_is_written(tmp_path, hooks_engine):
    """A folder where a save's file goes: refused by name before the first write, the folder as it was
    (tests/test_run_commit.py kills and fails writes half way)."""
    from causalab_mini.errors import PlanError

    plan = cm.run(PATCHING, loaded=hooks_engine).plan
    out = tmp_path / "out"
    (out / "iia.json").mkdir(parents=True)
    with pytest.raises(PlanError, match="iia.json: .* is a folder"):
        write(plan, out, plan.provenance)
    assert files_under(out) == [] and (out / "iia.json").is_dir()


def test_a_nan_metric_is_refused_rather_than_written_as_invalid_json():
    from causalab_mini.errors import PlanError
    from causalab_mini.outputs.write import json_bytes

    assert json.loads(json_bytes([{"value": 1.5}])) == [{"value": 1.5}]
    with pytest.raises(PlanError, match="NaN or infinite"):
        json_bytes([{"value": float("nan")}])


def test_a_rerun_removes_what_the_previous_run_wrote_and_this_one_does_not(tmp_path, capfd):
    """A save dropped from the document, or a sweep point no longer in it, does not linger
    beside the new files; a file a person put in the folder is left alone."""
    out = tmp_path / "out"
    swept = json.loads(POS_SWEEP.read_text())
    doc = tmp_path / "sweep.causalab.json"
    doc.write_text(json.dumps(swept))
    args = ["run", str(doc), "--engine", "hooks", "--out", str(out), "--models", str(MODELS), "--data", str(DATA)]
    assert cli.main(args) == 0
    first = files_under(out)
    (out / "notes.txt").write_text("mine")
    assert load_json(out / "run.json")["files"] == sorted(f for f in first if f != "run.json")

    # One save fewer, and the sweep cut to its first point: that point's directory keeps the
    # kept save; the other points' directories go entirely.
    swept["interventions"]["patching"]["writes"]["patch"]["pos"] = -1
    swept["header"].pop("expect", None)  # it names the points the sweep no longer has
    kept = swept["steps"]["score"]["saves"][:1]
    swept["steps"]["score"]["saves"] = kept
    doc.write_text(json.dumps(swept))
    assert cli.main(args) == 0
    capfd.readouterr()
    second = files_under(out)
    assert second == sorted(["document.json", "run.json", kept[0]["file_path"], "notes.txt"])
    assert not [p for p in out.iterdir() if p.is_dir()], "emptied point directories are removed"

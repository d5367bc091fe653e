"""examples/ run the way a user runs them: scripts and pytest in subprocesses, their output read.

- ``quickstart.py`` prints the grid ``causalab_mini.run`` computes (computed here, in process);
- ``cd examples && pytest`` passes, with examples/pytest.ini as its configfile;
- ``ci/causalab.yml`` parses, and every command it runs is one this checkout accepts;
- ``hub_model.causalab.json`` validates, and without the hub is refused with a typed
  ``HubUnreachable`` (a ``ModelError``) naming ``model.key`` — the CLI exits 2, the plugin skips
  the item with that reason — never a traceback.

The slow subprocesses (each imports torch) start side by side, once, when the first test that
needs one asks for it (under xdist, one at a time: ``Jobs``); every subprocess runs with the hub switched off (``HF_HUB_OFFLINE``) and an empty
Hugging Face cache, so nothing here can reach the network and the hub refusal is the same on
every machine.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO
from samples import cli_command

EXAMPLES = REPO / "examples"
WORKFLOW = EXAMPLES / "ci" / "causalab.yml"
HUB_DOCUMENT = EXAMPLES / "hub_model.causalab.json"
TIMEOUT = 300




def offline_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER",
                                                          "QUICKSTART_ENGINE")}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    return env


class Jobs:
    """The examples that import torch, as subprocesses: ``jobs["quickstart"]`` is its
    CompletedProcess. The first one asked for starts them all side by side — except under
    xdist, where the other worker keeps the cores busy and a test on it would start its own
    copies: there each starts when a test first asks for it."""

    def __init__(self, base: Path):
        self.base = base
        env = offline_env(base / "hf-home")
        pytest_cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
        self._specs = {  # name: (argv, cwd)
            # From a directory that is not the checkout: the script finds the repository itself.
            "quickstart": ([sys.executable, str(EXAMPLES / "quickstart.py"), str(base / "quickstart")], base),
            "my_model": ([*pytest_cmd, f"--basetemp={base / 'my_model'}", "-rA"], EXAMPLES),
            "hub_cli": ([*cli_command(), "run", str(HUB_DOCUMENT), "--engine", "hooks",
                         "--out", str(base / "hub-out")], base),
            "hub_pytest": ([*pytest_cmd, "-rs", f"--basetemp={base / 'hub'}", HUB_DOCUMENT.name], EXAMPLES),
        }
        self._env = env
        self._procs: dict[str, subprocess.Popen] = {}
        self._done: dict[str, subprocess.CompletedProcess] = {}

    def start(self, name: str) -> None:
        together = [name] if os.environ.get("PYTEST_XDIST_WORKER") else [name, *self._specs]
        for each in together:
            if each not in self._procs:
                argv, cwd = self._specs[each]
                self._procs[each] = subprocess.Popen(argv, cwd=cwd, env=self._env, text=True,
                                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def __getitem__(self, name: str) -> subprocess.CompletedProcess:
        if name not in self._done:
            self.start(name)
            proc = self._procs[name]
            out, err = proc.communicate(timeout=TIMEOUT)
            self._done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        return self._done[name]

    def stop(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    started = Jobs(tmp_path_factory.mktemp("examples"))
    yield started
    started.stop()


def outcomes(stdout: str) -> dict:
    """pytest's final summary line as {noun: count} ({"passed": 4, "warnings": 1})."""
    return pytest.RunResult.parse_summary_nouns(stdout.splitlines())


def numbers(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+\.\d+", line)]


# --- quickstart.py ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def layer_pos(jobs):
    """The quickstart's experiment run in this process, through the API it demonstrates."""
    import causalab_mini as cm

    jobs.start("quickstart")  # the script runs while this process computes the same experiment
    return cm.run(REPO / "documents" / "v2" / "layer_pos_sweep.causalab.json", engine="hooks")


def test_quickstart_prints_the_grid_and_interval_the_api_computes(jobs, layer_pos):
    done = jobs["quickstart"]
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    grid = layer_pos.grid("iia", "layers", "pos")

    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["layers"])
    assert lines[header].split()[1:] == [f"pos={c}" for c in grid.columns]
    for offset, (layer, cells) in enumerate(zip(grid.rows, grid.values), start=1):
        first, *printed = lines[header + offset].split()
        assert int(first) == layer
        assert [float(x) for x in printed] == pytest.approx(cells, abs=5e-4)
    # The table is aligned: every line of it as long as the header.
    assert len({len(line) for line in lines[header:header + 1 + len(grid.rows)]}) == 1

    iia = layer_pos.point(layers=0, pos=-1).result("iia")
    (ci_line,) = [line for line in lines if line.startswith("layers=0,pos=-1: iia mean")]
    assert numbers(ci_line) == pytest.approx([iia.mean(), *iia.ci(0.95)], abs=5e-4)
    assert 0 < iia.ci(0.95)[0] < iia.mean() < iia.ci(0.95)[1] < 1  # a point worth an interval
    assert f"over {len(iia)} rows" in ci_line
    assert lines[-1] == "reopened hooks run from disk: same grid: True"


def test_quickstart_run_folder_opens_to_the_same_results(jobs, layer_pos):
    import causalab_mini as cm

    assert jobs["quickstart"].returncode == 0
    folder = jobs.base / "quickstart" / "layer_pos_sweep"
    assert f"wrote {folder}" in jobs["quickstart"].stdout
    opened = cm.open(folder)
    assert opened.engine == "hooks" and [p.name for p in opened.points] == [p.name for p in layer_pos.points]
    assert opened.grid("iia", "layers", "pos").values == layer_pos.grid("iia", "layers", "pos").values
    for got, want in zip(opened.grid("logit_diff", "layers", "pos").values,
                         layer_pos.grid("logit_diff", "layers", "pos").values):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-6)


# --- test_my_model.py, conftest.py, pytest.ini ----------------------------------------------------

def test_the_researchers_pytest_folder_passes(jobs):
    done = jobs["my_model"]
    assert done.returncode == 0, done.stdout + done.stderr
    found = outcomes(done.stdout)
    assert found.get("passed") == 4, done.stdout
    assert not {"failed", "errors", "error", "skipped", "xfailed"} & set(found), done.stdout
    # The folder's own ini is the one pytest picked, so its settings are the ones in force.
    assert f"rootdir: {EXAMPLES}" in done.stdout
    assert "configfile: pytest.ini" in done.stdout
    # conftest's collect_ignore: a plain `pytest` there does not collect the hub document.
    assert "hub_model" not in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_the_examples_ini_pins_what_the_plugin_reads():
    import configparser

    ini = configparser.ConfigParser()
    ini.read(EXAMPLES / "pytest.ini")
    section = ini["pytest"]
    assert section["causalab_engine"] == "hooks"
    for key, target in (("causalab_models", "models"), ("causalab_data", "data")):
        assert (EXAMPLES / section[key]).resolve() == REPO / "documents" / target


# --- ci/ -----------------------------------------------------------------------------------------

def workflow() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(WORKFLOW.read_text())


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def run_steps(flow: dict) -> list[str]:
    (job,) = flow["jobs"].values()
    return [step["run"] for step in job["steps"] if "run" in step]


@pytest.fixture(scope="module")
def registered_options() -> set[str]:
    """Every --causalab-* option the installed plugin registers, from `pytest --help`."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--help"],
                          capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    found = set(re.findall(r"^\s+(--causalab-[a-z-]+)", done.stdout, re.M))
    assert {"--causalab-strict", "--causalab-out", "--causalab-update-baselines"} <= found
    return found


def test_ci_workflow_gates_pull_requests_and_uploads_the_runs():
    flow = workflow()
    on = flow.get("on", flow.get(True))  # YAML 1.1 reads a bare `on` key as true
    assert "pull_request" in on
    (job,) = flow["jobs"].values()
    uses = [step.get("uses", "") for step in job["steps"]]
    assert any(u.startswith("actions/checkout@") for u in uses)
    assert any(u.startswith("actions/setup-python@") for u in uses)

    commands = run_steps(flow)
    pinned = next(d for d in pyproject()["project"]["dependencies"]
                  if d.startswith("torch=="))
    torch_at = next(i for i, c in enumerate(commands) if f"pip install {pinned}" in c)
    assert "--index-url https://download.pytorch.org/whl/cpu" in commands[torch_at]
    project_at = next(i for i, c in enumerate(commands) if shlex.split(c)[:3] == ["pip", "install", "-e"])
    assert torch_at < project_at  # torch's CPU wheel first, or pip resolves the CUDA build
    extra = re.fullmatch(r"\.\[(\w+)\]", shlex.split(commands[project_at])[3]).group(1)
    assert extra in pyproject()["project"]["optional-dependencies"]

    (upload,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["if"] == "always()"
    (test,) = [c for c in commands if shlex.split(c)[0] == "pytest"]
    out = next(a.split("=", 1)[1] for a in shlex.split(test) if a.startswith("--causalab-out="))
    assert upload["with"]["path"] == out == "causalab-runs"
    assert "--causalab-strict" in shlex.split(test) and "documents/" in shlex.split(test)


def test_ci_commands_use_only_options_the_plugin_registers(registered_options):
    texts = run_steps(workflow()) + [(EXAMPLES / "ci" / "README.md").read_text()]
    used = {m for text in texts for m in re.findall(r"--causalab-[a-z-]+", text)}
    assert used and used <= registered_options, used - registered_options
    # The update value the README tells you to use is one the plugin accepts.
    from pytest_causalab.session import UPDATES

    for value in re.findall(r"--causalab-update-baselines=(\w+)", (EXAMPLES / "ci" / "README.md").read_text()):
        assert value in UPDATES


def test_the_workflows_pytest_command_is_accepted_and_collects_the_corpus(tmp_path):
    """The workflow's own command line, collect-only (no model loads): options, paths, the corpus."""
    (test,) = [c for c in run_steps(workflow()) if shlex.split(c)[0] == "pytest"]
    args = shlex.split(test)[1:]
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "--collect-only", "-q"],
                          capture_output=True, text=True, cwd=REPO, env=offline_env(tmp_path), timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^\d+ tests? collected", done.stdout, re.M), done.stdout
    assert "ERROR" not in done.stdout and "errors" not in outcomes(done.stdout)


# --- hub_model.causalab.json --------------------------------------------------------------------

def test_the_hub_document_validates_and_is_the_patching_experiment_on_a_pinned_commit(tmp_path):
    done = subprocess.run([*cli_command(), "validate", str(HUB_DOCUMENT)], capture_output=True, text=True,
                          cwd=tmp_path, env=offline_env(tmp_path), timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: ")
    hub = json.loads(HUB_DOCUMENT.read_text())
    assert hub["model"]["key"] == "gpt2"
    assert re.fullmatch(r"[0-9a-f]{40}", hub["model"]["revision"])  # a commit, not a branch
    patching = json.loads((REPO / "documents" / "v2" / "patching.causalab.json").read_text())
    strip = lambda doc: {k: v for k, v in doc.items() if k not in ("header", "model")}  # noqa: E731
    assert strip(hub) == strip(patching)
    # Its rows are the shipped weekdays, found from the document's own folder.
    from causalab_mini.data import data_roots

    assert (REPO / "documents" / "data").resolve() in [r.resolve() for r in data_roots(document=HUB_DOCUMENT)]


def test_the_hub_document_without_the_hub_is_a_typed_refusal_from_the_cli(jobs):
    done = jobs["hub_cli"]
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: HubUnreachable: model.key: 'gpt2' is not a local model directory, "
                                  "not in the Hugging Face cache, and the hub cannot be reached"), done.stderr
    assert "Traceback" not in done.stderr
    assert not (jobs.base / "hub-out").exists()  # refused before anything was written


def test_the_hub_document_without_the_hub_under_pytest_is_skipped_with_the_reason(jobs):
    """No hub is not the document's fault: the item is skipped (never passed) with the typed reason."""
    done = jobs["hub_pytest"]
    assert outcomes(done.stdout) == {"skipped": 1}, done.stdout
    assert done.returncode == 0
    line = next(x for x in done.stdout.splitlines() if x.startswith("SKIPPED"))
    assert "HubUnreachable: model.key: 'gpt2' is not a local model directory" in line, line
    assert "Traceback" not in done.stdout + done.stderr
    assert not (EXAMPLES / "baselines").exists()  # no baseline written for a model that never ran


def _glob(pattern: str, line: str) -> bool:
    from fnmatch import fnmatchcase

    return fnmatchcase(line, pattern)

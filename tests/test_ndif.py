"""``--engine ndif``: the client holds the model's structure and no weights, and sends one session.

The remote side is nnsight's local simulation of it (the request serialized, deserialized with
the client's modules blocked, run) against a stand-in server that holds the weights
(``cm.stand_in``), loaded before the audit starts. The audit watches every way
a weight reaches the client: a safetensors file opened (the library's entry points, and
Python's own ``open`` audit event for any weight file), and a parameter or buffer of the
client's model off the meta device. A positive control shows it catching an ordinary load.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch
import transformers.modeling_utils
from paths import DATA, MODELS, V2
from run_values import same_results
from samples import with_pattern

import causalab_mini as cm
from causalab_mini.engine import ndif
from causalab_mini.model import loading
from causalab_mini.errors import EngineError, Unsupported

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("one_thread")

WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
_OPENED: list = []  # what the audit hook saw, while one is watching


def _audit(event, args):
    # ("open", (path, mode, flags)): a file opened to be read; the run's own saves are written.
    if event == "open" and _OPENED and isinstance(args[0], (str, bytes)) and not args[2] & (os.O_WRONLY | os.O_RDWR):
        name = args[0].decode() if isinstance(args[0], bytes) else args[0]
        if name.endswith(WEIGHT_FILES):
            _OPENED[0].append(name)


sys.addaudithook(_audit)  # audit hooks cannot be removed; this one records only inside `reads`


@contextlib.contextmanager
def reads(monkeypatch):
    """Every weight file opened to be read while the block runs, by any route the audit can see."""
    seen: list = []

    def spy(original):
        def opened(path, *args, **kwargs):
            if isinstance(path, (str, os.PathLike)):  # a buffer (a request's own tensors) is no file
                seen.append(str(path))
            return original(path, *args, **kwargs)
        return opened

    monkeypatch.setattr(safetensors, "safe_open", spy(safetensors.safe_open))
    monkeypatch.setattr(transformers.modeling_utils, "safe_open", spy(transformers.modeling_utils.safe_open))
    monkeypatch.setattr(safetensors.torch, "load_file", spy(safetensors.torch.load_file))
    monkeypatch.setattr(torch, "load", spy(torch.load))
    # A local checkpoint's digest is kept by (path, size, mtime): forgotten, so a hash of the weight
    # file's bytes inside the block would be seen, not served from an earlier load's memory.
    monkeypatch.setattr(loading, "_FILE_DIGESTS", {})
    _OPENED.append(seen)
    try:
        yield seen
    finally:
        _OPENED.clear()


def weightless(shell) -> bool:
    model = shell.model._model
    tensors = [*model.parameters(), *model.buffers()]
    return not shell.model.dispatched and bool(tensors) and all(
        t.device.type == "meta" for t in model.parameters())


@pytest.fixture(scope="module")
def server():
    """The stand-in server for the tiny Llama, loaded (with its weights) once, before any audit."""
    return cm.stand_in(V2 / "patching.causalab.json", models=[MODELS])


def test_the_audit_sees_an_ordinary_load(monkeypatch):
    with reads(monkeypatch) as seen:
        engine = cm.load(V2 / "patching.causalab.json", engine="nnterp", models=[MODELS])
    assert any(p.endswith("model.safetensors") for p in seen)
    assert all(p.device.type == "cpu" for p in engine.model._model.parameters())


CASES = {  # name -> (document, change, run options)
    "patching": ("patching", None, {}),
    "sweep": ("layer_pos_sweep", None, {}),
    "sweep_at_once": ("layer_pos_sweep", None, {"at_once": 3}),
    "anchors": ("entity_patch", None, {}),
    "decode": ("generate_probe", None, {}),
    "fit": ("das", lambda raw: raw["steps"]["fit"].update(epochs=1), {"request": "package"}),
    "pattern": ("patching", with_pattern, {}),
    "featurizer_file": ("das_apply", None, {}),
}


@pytest.mark.parametrize("case", CASES)
def test_a_shell_reads_no_weight_sends_one_session_and_brings_home_the_local_numbers(
        server, monkeypatch, tmp_path, case):
    """Anchored positions, a sweep's shared forwards (stacked at_once too), a decode, a fit's
    optimizer steps and the attention pattern all ship; the results that come home equal the
    local nnterp run's, bit for bit."""
    name, change, options = CASES[case]
    options = dict(options)
    request = options.pop("request", None)  # a fit goes by reference, to a server with the package
    path = V2 / f"{name}.causalab.json"
    raw = json.loads(path.read_text())
    if change is not None:
        change(raw)
    doc = cm.read(raw, path=path)
    target = server if not doc.attention_probs else cm.stand_in(doc, models=[MODELS])
    before = target.requests
    with reads(monkeypatch) as seen:
        shell = cm.load(doc, engine="ndif", models=[MODELS], request=request)
        assert weightless(shell)
        shell.server = target
        there = cm.run(doc, loaded=shell, data=[DATA], out=tmp_path / "there", **options)
    # A kernel request records the kernel that ran; a package request, the server's causalab-mini.
    assert ("request" in there.record) == (request is None) and ("server" in there.record) == (request == "package")
    # No file of the model's was read; a featurizer's own bundle is the client's to read and send.
    # (The run's own saves, opened once more by the commit's barrier to flush them, are its output.)
    out = (tmp_path / "there").resolve()
    seen = [f for f in seen if out not in Path(f).resolve().parents]
    model_dir = (MODELS / doc.model.key).resolve()
    assert [f for f in seen if model_dir in Path(f).resolve().parents] == []
    assert all(Path(f).resolve().parent == (V2 / "artifacts").resolve() for f in seen), seen
    assert bool(seen) == (case == "featurizer_file")
    assert weightless(shell)  # nothing was dispatched by the run either
    assert target.requests == before + 1  # the whole walk is one request
    here = cm.run(doc, engine="nnterp", models=[MODELS], data=[DATA], out=tmp_path / "here", **options)
    assert same_results(here.plan, there.plan)
    assert there.record["engine"] == "NDIFEngine" and there.record["remote"] == "local"
    assert there.record["served_dtype"] == here.record["served_dtype"] == "torch.float32"
    reopened = cm.open(tmp_path / "there")
    assert reopened.engine == "ndif"
    assert {p.name: p.results() and {k: r.rows for k, r in p.results().items()} for p in reopened.points} == \
        {p.name: p.results() and {k: r.rows for k, r in p.results().items()} for p in cm.open(tmp_path / "here").points}


def test_a_shell_refuses_to_run_here_and_names_where_it_can(server, tmp_path):
    shell = cm.load(V2 / "patching.causalab.json", engine="ndif", models=[MODELS])
    plan = cm.compile(V2 / "patching.causalab.json", loaded=shell, data=[DATA])
    with pytest.raises(EngineError, match="loaded without its weights"):
        shell.execute(plan, remote=False)
    with pytest.raises(EngineError, match="simulates the round trip on the weights"):
        shell.execute(plan, remote="local")
    # NDIF serves hub ids: a model named by a local directory is refused before anything is sent.
    with pytest.raises(EngineError, match="local directory"):
        cm.run(V2 / "patching.causalab.json", loaded=shell, data=[DATA])
    assert weightless(shell)


def test_compile_for_ndif_applies_the_nnterp_engines_refusals(tmp_path):
    """Compiled weightless for "ndif" (no model loaded at all), a component a server cannot serve
    on a family is refused by name."""
    raw = json.loads((V2 / "patching_gpt2.causalab.json").read_text())
    raw["sites"]["target"] = {"component": "attention_probs", "layers": [0]}
    with pytest.raises(cm.CompileError, match="nnterp 1.3.0's own load-time check"):
        cm.compile(raw, engine="ndif", models=[MODELS], data=[DATA])
    # Here, the nnterp engine reaches it through transformers' attention function instead
    # (engine/attention.py), which a server does not run; nor the scores, on any family.
    # (A write of its own: a pattern swapped across prompts must line up key for key.)
    raw["interventions"]["patching"]["writes"]["patch"] = {"site": "target", "pos": -1, "mechanism": "clamp",
                                                           "params": {"max": 1.0}}
    cm.compile(raw, engine="nnterp", models=[MODELS], data=[DATA])
    raw["sites"]["target"] = {"component": "attention_scores", "layers": [0]}
    with pytest.raises(cm.CompileError, match="a remote server runs its own attention function"):
        cm.compile(raw, engine="ndif", models=[MODELS], data=[DATA])


def test_an_image_text_model_is_refused_by_name_before_any_weight_is_read(monkeypatch, tmp_path):
    import families

    from causalab_mini.document.spec import ModelRef

    families.build("gemma3", tmp_path / "gemma3")  # a tiny random Gemma-3 image-text checkpoint
    with reads(monkeypatch) as seen:
        with pytest.raises(Unsupported, match="image-text model"):
            ndif.NDIFEngine.load(ModelRef(key="gemma3"), models=[tmp_path])
    assert seen == []


# --- the pytest plugin ------------------------------------------------------------------------------

STAND_IN = """
import causalab_mini as cm

def pytest_causalab_model_loaded(key, engine, config):
    # A conftest points each shell at a server: here, the stand-in; by default, NDIF.
    engine.server = cm.stand_in(config.rootpath / "pos_sweep.causalab.json", models=[{models!r}])
"""


def test_the_plugin_runs_items_on_ndif_shells(tester):
    doc = json.loads((V2 / "pos_sweep.causalab.json").read_text())
    doc["header"]["expect"] = []
    (tester.path / "pos_sweep.causalab.json").write_text(json.dumps(doc))
    points = [p.name for p in cm.read(V2 / "pos_sweep.causalab.json").points]
    # Unpointed, the shell's session goes to NDIF, which does not have a local directory: refused
    # by name, before anything is sent.
    result = tester.runpytest("--causalab-engine=ndif")
    result.assert_outcomes(failed=len(points))
    result.stdout.fnmatch_lines(["*local directory*NDIF does not have*"])
    tester.makeconftest(STAND_IN.format(models=str(MODELS)))
    result = tester.runpytest("--causalab-engine=ndif", "--causalab-out=there")
    result.assert_outcomes(passed=len(points), warnings=len(points))
    result = tester.runpytest("--causalab-engine=nnterp", "--causalab-out=here")
    result.assert_outcomes(passed=len(points))  # against the baselines the ndif session wrote
    for name in points:
        there, here = (tester.path / side / "pos_sweep" / engine / name
                       for side, engine in (("there", "ndif"), ("here", "nnterp")))
        assert json.loads((there / "run.json").read_text())["engine"] == "NDIFEngine"
        for metric in ("iia.json", "logit_diff.json"):
            assert (there / metric).read_bytes() == (here / metric).read_bytes()


def test_the_command_line_refuses_a_local_directory_for_ndif_without_a_traceback(tmp_path, capsys):
    from causalab_mini import cli

    out = tmp_path / "out"
    status = cli.main(["run", str(V2 / "patching.causalab.json"), "--engine", "ndif", "--out", str(out),
                       "--models", str(MODELS), "--data", str(DATA)])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert err.startswith("error: EngineError: remote: the model was loaded from a local directory")
    assert not out.exists() or not any(out.iterdir())  # nothing half-written


def test_the_command_line_says_what_a_request_carries(tmp_path, capsys):
    """A fit is refused for the default (kernel) request at its step, with the flag that sends the walk
    itself; with that flag the document compiles and goes on to the next check (a local directory)."""
    from causalab_mini import cli

    args = ["run", str(V2 / "das.causalab.json"), "--engine", "ndif", "--out", str(tmp_path / "out"),
            "--models", str(MODELS), "--data", str(DATA)]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: CompileError: steps.fit: a fit trains through the model")
    assert "--ndif-request package" in err and "Traceback" not in err
    assert cli.main([*args, "--ndif-request", "package"]) == 2
    assert capsys.readouterr().err.startswith("error: EngineError: remote: the model was loaded from a local directory")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())

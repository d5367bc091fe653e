"""Extensions (causalab_mini/extensions.py) as a user meets them: installed with pip, found by their
entry point, used by a document that names them, and refused — by name, without a traceback, and
without a half-written run — when they are missing, unnamed or broken.

Everything that loads an extension runs in a subprocess: an installed one is put on the child's
``PYTHONPATH`` (its entry point is then discovered as a user's would be), and a broken module's
registrations never reach this process's registries. The main venv is never installed into.

1. The example (examples/extension: causalab-margin, metric ``logit_margin``, mechanism ``scale``)
   run by the CLI, by ``cm.run`` and by pytest, on both engines, held to the margins computed on the
   raw transformers model with a forward hook; run.json's record of it; ``causalab-mini vocab``.
2. Refusals of a document: the extension not installed, not named, a kind misspelt.
3. Broken extensions: one that does not import, cannot be called, is not a plugin, raises, returns
   the wrong shape or NaN (metric and mechanism), and an installed distribution that does not import.
4. A baseline made with another version of the extension says so, and still passes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from paths import DATA, MODELS, REPO
from reference import answer_id, hidden_of, padded, with_hidden
from samples import cli_command

EXAMPLE = REPO / "examples" / "extension"
HALVE = EXAMPLE / "halve.causalab.json"
DIST, VERSION, MODULE = "causalab-margin", "0.1.0", "causalab_margin.plugin"
RESULTS = ("margin_halved", "margin_clean")
TOL = 1e-5
ENGINES = ("hooks", "nnterp")


# --- installing, and running things in a child process ------------------------------------------

def pip_install(source: Path, prefix: Path) -> Path:
    """``source`` installed as a user installs it (pip, its own pyproject), into ``prefix``: the
    site-packages folder to put on a child's PYTHONPATH. Built from a copy, so the build's leftovers
    (build/, *.egg-info) never land in the repository."""
    tree = prefix.parent / f"{prefix.name}-src"
    shutil.copytree(source, tree, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "--disable-pip-version-check", "--prefix", str(prefix), str(tree)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert site.is_dir(), sorted(str(p) for p in prefix.rglob("*"))[:20]
    return site


def env(*paths) -> dict:
    """The environment of a child: PYTHONPATH exactly ``paths`` (none: no extension installed), and
    nothing of this pytest's (CI would make baselines strict, xdist's variables name a worker)."""
    out = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("PYTEST_")}
    out.pop("PYTHONPATH", None)
    if paths:
        out["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    return out


def cli(*args, paths=(), cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=env(*paths), timeout=300)


def cli_refused(*args, paths=(), cwd: Path = REPO) -> str:
    """A CLI refusal: exit 2, one ``error:`` message on stderr, no traceback anywhere."""
    done = cli(*args, paths=paths, cwd=cwd)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, done.stderr
    assert done.stderr.startswith("error: "), done.stderr
    return done.stderr


PRELUDE = '''
import json, sys
import causalab_mini as cm
from causalab_mini.errors import CausalabError

def refusal(fn):
    """What ``fn()`` was refused with: the typed error's fields (an untyped one is the test's failure)."""
    try:
        fn()
    except CausalabError as err:
        return {"type": type(err).__name__, "path": err.path, "problem": err.problem, "fix": err.fix}
    return None
'''


def python(code: str, *paths, cwd: Path = REPO):
    """Run ``code`` (after PRELUDE) in a child Python; what it prints last, as JSON."""
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=cwd, env=env(*paths), timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def digest(package: Path) -> str:
    """extensions._digest's rule, written out: every .py under the top package folder, sorted, each
    as its relative path, NUL, its bytes."""
    h = hashlib.sha256()
    for f in sorted(package.rglob("*.py")):
        h.update(str(f.relative_to(package)).encode("utf-8") + b"\0" + f.read_bytes())
    return "sha256:" + h.hexdigest()


def halve() -> dict:
    return json.loads(HALVE.read_text())


def write_doc(folder: Path, name: str, doc: dict) -> Path:
    path = folder / f"{name}.causalab.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def rows_of(path: Path) -> list:
    return [row["value"] for row in json.loads(path.read_text())]


def close(got, want) -> bool:
    return len(got) == len(want) and all(abs(g - w) <= TOL for g, w in zip(got, want))


@pytest.fixture(scope="module")
def margin(tmp_path_factory) -> Path:
    """The example extension installed with pip: its site-packages folder."""
    return pip_install(EXAMPLE, tmp_path_factory.mktemp("margin") / "prefix")


@pytest.fixture(scope="module")
def record(margin) -> dict:
    """What run.json should say of the example: its distribution, version, module, source digest."""
    return {"distribution": DIST, "version": VERSION, "module": MODULE,
            "source_sha256": digest(margin / "causalab_margin")}


@pytest.fixture(scope="module")
def by_hand(hf_model) -> dict:
    """The example's margins on raw transformers: the rows left padded as the project pads them,
    layer 0's output at each row's last real token (index -1, left padded) multiplied by 0.5, and
    logit[base_answer] − max of the other logits at the last position; clean without the hook."""
    import torch

    model, tok = hf_model("tiny-llama")
    rows = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines() if line]
    ids, mask, positions = padded(tok, [r["input"] for r in rows])
    token = torch.tensor([answer_id(tok, r["base_answer"]) for r in rows])

    def halved(_module, _args, output):
        hidden = hidden_of(output).clone()
        hidden[:, -1] = hidden[:, -1] * 0.5
        return with_hidden(output, hidden)

    def margins(hook) -> list:
        handle = model.model.layers[0].register_forward_hook(hook) if hook else None
        try:
            with torch.no_grad():
                out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
            logits = out.logits[:, -1]
        finally:
            if handle is not None:
                handle.remove()
        i = torch.arange(len(rows))
        own = logits[i, token]
        others = logits.clone()
        others[i, token] = float("-inf")
        return (own - others.max(-1).values).tolist()

    out = {"margin_halved": margins(halved), "margin_clean": margins(None)}
    # The halving moves every row: a write that landed nowhere would pass as the clean margins.
    assert all(abs(h - c) > 0.1 for h, c in zip(out["margin_halved"], out["margin_clean"]))
    return out


# --- 1. the example, run as a user runs it ------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_the_cli_runs_the_example(margin, record, by_hand, tmp_path, engine):
    out = tmp_path / "out"
    done = cli("run", HALVE, "--engine", engine, "--out", out, "--models", MODELS, "--data", DATA, paths=[margin])
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for name in RESULTS:
        assert close(rows_of(out / f"{name}.json"), by_hand[name]), (name, rows_of(out / f"{name}.json"), by_hand[name])
    assert json.loads((out / "run.json").read_text())["extensions"] == [record]


def test_python_runs_the_example(margin, record, by_hand, tmp_path):
    got = python(f"""
        out = {{}}
        for engine in {list(ENGINES)!r}:
            folder = {str(tmp_path)!r} + "/" + engine
            ran = cm.run({str(HALVE)!r}, engine=engine, out=folder, models=[{str(MODELS)!r}], data=[{str(DATA)!r}])
            back = cm.open(folder)
            out[engine] = {{"values": {{n: list(ran.result(n).values) for n in {list(RESULTS)!r}}},
                           "opened": {{n: list(back.result(n).values) for n in {list(RESULTS)!r}}},
                           "extensions": ran.record["extensions"]}}
        print(json.dumps(out))
    """, margin)
    for engine in ENGINES:
        for name in RESULTS:
            assert close(got[engine]["values"][name], by_hand[name]), (engine, name, got[engine]["values"][name])
            assert got[engine]["opened"][name] == got[engine]["values"][name]
        assert got[engine]["extensions"] == [record]


def test_pytest_runs_the_example_and_notes_a_baseline_of_another_version(margin, by_hand, tmp_path):
    """pytest on a copy of the example's folder (its baselines land there), on both engines: the
    baseline is written with the extension's version; made with another version, it is a note
    (BaselineWarning) and the point still passes on its values."""
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(HALVE, folder)
    (folder / "pytest.ini").write_text(f"[pytest]\naddopts = -p no:cacheprovider\ncausalab_models = {MODELS}\n"
                                       f"causalab_data = {DATA}\n")

    def pytest_run(*args) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "pytest", HALVE.name, *args], capture_output=True, text=True,
                              cwd=folder, env=env(margin), timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 passed" in done.stdout, done.stdout
        return done

    first = pytest_run("--causalab-engine=both")
    assert "baseline was missing and is now written" in first.stdout, first.stdout
    stored = folder / "baselines" / "halve.json"
    data = json.loads(stored.read_text())
    entry = data["points"]["halve"]
    assert entry["extensions"] == {DIST: VERSION}
    for name in RESULTS:
        rows = entry["results"][name]["rows"]
        assert close([rows[str(i)] for i in range(len(rows))], by_hand[name]), (name, rows)

    entry["extensions"] = {DIST: "0.0.9"}
    stored.write_text(json.dumps(data, indent=1))
    again = pytest_run("--causalab-engine=hooks")  # hooks loads fastest; the note is the baseline's
    said = " ".join(again.stdout.split())  # the warnings summary may wrap
    assert f"was made with {DIST} 0.0.9; this run used {DIST} {VERSION}" in said, again.stdout
    assert "BaselineWarning" in said


def test_vocab_lists_the_extension_and_its_kinds(margin):
    done = cli("vocab", paths=[margin])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    listed = [line for line in lines if line.strip().startswith(f"{DIST} {VERSION}")]
    assert len(listed) == 1, done.stdout
    assert MODULE in listed[0] and "metric logit_margin" in listed[0] and "mechanism scale" in listed[0]
    assert any(line.strip().startswith("logit_margin(token)") and f"[{DIST}]" in line for line in lines)
    assert any(line.strip().startswith("scale ") and f"[{DIST}]" in line for line in lines)

    done = cli("vocab", "--json", paths=[margin])
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["extensions"]
    assert found[DIST]["version"] == VERSION and found[DIST]["module"] == MODULE
    assert found[DIST]["metric_kinds"] == ["logit_margin"] and found[DIST]["mechanisms"] == ["scale"]
    assert found[DIST]["error"] is None
    assert found[DIST]["source_sha256"] == digest(margin / "causalab_margin")


def installed_here(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution(dist)
    except PackageNotFoundError:
        return False
    return True


# The tests of "not installed" run the venv's own Python: they mean nothing where someone installed it.
not_in_the_venv = pytest.mark.skipif(installed_here(DIST), reason=f"{DIST} is installed in this venv")


@not_in_the_venv
def test_vocab_without_extensions_says_how_they_are_found():
    done = cli("vocab")
    assert done.returncode == 0, done.stderr
    assert "extensions:" in done.stdout and "entry-point" in done.stdout
    assert DIST not in done.stdout


# --- 2. a document refused: the extension missing, unnamed, a kind misspelt ---------------------

@not_in_the_venv
def test_a_document_naming_an_extension_not_installed_is_refused(tmp_path):
    out = tmp_path / "out"
    said = cli_refused("run", HALVE, "--out", out, "--models", MODELS, "--data", DATA)
    assert said.startswith("error: DocumentError: extensions[0]: "), said
    assert f"pip install {DIST}" in said
    assert not out.exists()
    got = python(f"""
        print(json.dumps(refusal(lambda: cm.run({str(HALVE)!r}, out={str(out)!r}, models=[{str(MODELS)!r}],
                                                data=[{str(DATA)!r}]))))
    """)
    assert got["type"] == "DocumentError" and got["path"] == "extensions[0]", got
    assert repr(DIST) in got["problem"] and "not installed" in got["problem"]
    assert got["fix"].startswith(f"pip install {DIST}")
    assert not out.exists()

    # pytest: the point fails with the same three lines, no traceback, before any model loads.
    shutil.copy(HALVE, tmp_path)
    done = subprocess.run([sys.executable, "-m", "pytest", HALVE.name, "-p", "no:cacheprovider",
                           f"--causalab-models={MODELS}", f"--causalab-data={DATA}"], capture_output=True, text=True,
                          cwd=tmp_path, env=env(), timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "at:   extensions[0]" in done.stdout and f"fix:  pip install {DIST}" in done.stdout, done.stdout
    assert "Traceback" not in done.stdout and not (tmp_path / "baselines").exists()


def unnamed() -> dict:
    doc = halve()
    del doc["extensions"]
    return doc


def only_the_mechanism() -> dict:
    """The extension's mechanism with built-in metrics, the extension not named."""
    doc = unnamed()
    iv = doc["interventions"]["halve"]
    for metric in iv["metrics"].values():
        metric["kind"] = "token_logit"
    return doc


def misspelt(kind: str) -> dict:
    doc = halve()
    metric = doc["interventions"]["halve"]["metrics"]["margin_halved"]
    if kind == "logit_margn":
        metric["kind"] = kind
    else:  # a built-in kind, its columns
        doc["interventions"]["halve"]["metrics"]["margin_halved"] = {"kind": kind, "of": "logits",
                                                                    "a": "base_answer", "b": "cf_answer"}
    return doc


REFUSED = {  # document -> (path, what the message says)
    "unnamed": (unnamed, "interventions.halve.metrics.margin_halved.kind", "does not name"),
    "mechanism_unnamed": (only_the_mechanism, "interventions.halve.writes.half.mechanism", "does not name"),
    "misspelt": (lambda: misspelt("logit_margn"), "interventions.halve.metrics.margin_halved.kind",
                 "did you mean 'logit_margin'?"),
    "misspelt_builtin": (lambda: misspelt("logit_dif"), "interventions.halve.metrics.margin_halved.kind",
                         "did you mean 'logit_diff'?"),
}


def test_documents_using_the_extension_wrongly_are_refused(margin, tmp_path):
    paths = {name: write_doc(tmp_path, name, make()) for name, (make, _, _) in REFUSED.items()}
    got = python(f"""
        paths = {({k: str(v) for k, v in paths.items()})!r}
        print(json.dumps({{name: refusal(lambda: cm.run(p, out={str(tmp_path / 'out')!r}, models=[{str(MODELS)!r}],
                                                      data=[{str(DATA)!r}])) for name, p in paths.items()}}))
    """, margin)
    for name, (_, path, says) in REFUSED.items():
        err = got[name]
        assert err is not None and err["type"] == "DocumentError", (name, err)
        assert err["path"] == path, (name, err)
        assert says in (err["fix"] if says.startswith("did you mean") else err["problem"]), (name, err)
        if says == "does not name":
            assert repr(DIST) in err["problem"] and '"extensions"' in err["fix"] and DIST in err["fix"], (name, err)
        said = cli_refused("run", paths[name], "--out", tmp_path / "out", "--models", MODELS, "--data", DATA,
                           paths=[margin])
        assert said.startswith(f"error: DocumentError: {path}: "), (name, said)
        assert says in said
    assert not (tmp_path / "out").exists()


# --- 3. broken extensions -----------------------------------------------------------------------

HEAD = ("from causalab_mini.extensions import hookimpl\n"
        "from causalab_mini.metric_kinds import MetricKind, Params\n"
        "from causalab_mini.vocab import Mechanism\n")


def a_metric(kind: str, body: str, signature: str = "logits, token") -> str:
    return HEAD + textwrap.dedent(f"""
        def compute({signature}):
            {body}

        @hookimpl
        def causalab_mini_metric_kinds():
            return [MetricKind({kind!r}, ("token",), unit="logit", differentiable=True, compute=compute)]
        """)


def a_mechanism(name: str, body: str) -> str:
    return HEAD + textwrap.dedent(f"""
        class NoParams(Params):
            pass

        def apply(f, operand, params, f0=None):
            {body}

        @hookimpl
        def causalab_mini_mechanisms():
            return [Mechanism({name!r}, operand=False, params=NoParams, apply=apply)]
        """)


# Refused when loaded (cm.run(plugins=...), --plugin, --causalab-plugins): module -> (source, path, says)
AT_LOAD = {
    "broken_import": ("import causalab_no_such_module_xyz\n", "plugins.broken_import",
                      "does not import: ModuleNotFoundError"),
    "broken_signature": (a_metric("sig_margin", "return logits[:, 0]", signature="logits"),
                         "extensions.broken_signature", "cannot be called as compute(logits, token)"),
    "broken_record": (HEAD + "\n@hookimpl\ndef causalab_mini_metric_kinds():\n    return [{'name': 'dict_kind'}]\n",
                      "extensions.broken_record", "causalab_mini_metric_kinds returned dict, not MetricKind"),
    "broken_hook_args": (HEAD + "\n@hookimpl\ndef causalab_mini_metric_kinds(registry):\n    return []\n",
                         "extensions.broken_hook_args", "is not a causalab_mini plugin"),
    # pluggy would keep a misspelt hook pending and load nothing, silently
    "broken_hook_name": (HEAD + "\n@hookimpl\ndef causalab_mini_metric_kind():\n    return []\n",
                         "extensions.broken_hook_name", "unknown hook(s) ['causalab_mini_metric_kind']"),
}
# Refused when they score or write: module -> (source, metric kind or mechanism, path, says)
AT_RUN = {
    "broken_raises": (a_metric("raising_margin", "raise RuntimeError('deliberately broken')"), "metric",
                      "raising_margin", "margin_halved", "raised RuntimeError: deliberately broken"),
    "broken_shape": (a_metric("shaped_margin", "return logits[:, :2]"), "metric", "shaped_margin",
                     "margin_halved", "returned torch.float32 (4, 2), not one float32 value per row (4,)"),
    "broken_nan": (a_metric("nan_margin", "return logits[:, 0] * float('nan')"), "metric", "nan_margin",
                   "margin_halved", "returned NaN on 4 of 4 rows"),
    "broken_mech_shape": (a_mechanism("shrink", "return f[..., :1]"), "mechanism", "shrink", "half",
                          "returned torch.float32 (4, 1, 1) for a feature value of torch.float32 (4, 1, "),
    "broken_mech_raises": (a_mechanism("explode", "raise ValueError('deliberately broken')"), "mechanism",
                           "explode", "half", "raised ValueError: deliberately broken"),
}


def using(what: str, kind: str, module: str) -> dict:
    """The example's document with built-in kinds but one: ``kind``, a metric or a mechanism of ``module``."""
    doc = halve()
    iv = doc["interventions"]["halve"]
    iv["writes"]["half"] = {"site": "target", "pos": -1, "mechanism": "clamp", "params": {"max": 1e9}}
    for metric in iv["metrics"].values():
        metric["kind"] = "token_logit"
    if what == "metric":
        iv["metrics"]["margin_halved"]["kind"] = kind
    else:
        iv["writes"]["half"] = {"site": "target", "pos": -1, "mechanism": kind}
    doc["extensions"] = [module]
    return doc


@pytest.fixture
def modules(tmp_path) -> Path:
    folder = tmp_path / "modules"
    folder.mkdir()
    for name, (source, *_) in {**AT_LOAD, **AT_RUN}.items():
        (folder / f"{name}.py").write_text(source)
    return folder


def test_a_broken_module_is_refused_when_it_is_loaded(modules, tmp_path):
    """cm.run(plugins=[...]) raises ExtensionError naming the module before anything runs; the CLI's
    --plugin and pytest's --causalab-plugins refuse it the same way."""
    out = tmp_path / "out"
    docs = {name: using("metric", "token_logit", name) for name in AT_LOAD}
    got = python(f"""
        docs = json.loads({json.dumps(docs)!r})
        print(json.dumps({{name: refusal(lambda: cm.run(doc, out={str(out)!r}, models=[{str(MODELS)!r}],
                                                      data=[{str(DATA)!r}], plugins=[name]))
                          for name, doc in docs.items()}}))
    """, modules)
    for name, (_, path, says) in AT_LOAD.items():
        err = got[name]
        assert err is not None and err["type"] == "ExtensionError", (name, err)
        assert err["path"] == path, (name, err)
        assert says in err["problem"] and err["fix"], (name, err)
        if name != "broken_import":
            assert err["problem"].startswith(f"extension {name!r} ({name}) "), (name, err)
        said = cli_refused("--plugin", name, "vocab", paths=[modules])
        assert said.startswith(f"error: ExtensionError: {path}: "), (name, said)
    assert not out.exists()

    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only",
                           "--causalab-plugins", "broken_signature"], capture_output=True, text=True,
                          cwd=tmp_path, env=env(modules), timeout=120)
    assert done.returncode == 4, done.stdout + done.stderr  # a UsageError
    assert "--causalab-plugins: extensions.broken_signature:" in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_a_broken_kind_is_refused_when_it_runs_and_nothing_is_written(modules, tmp_path, engine):
    """Each broken metric or mechanism, run by a loaded engine: an EngineError naming the kind and the
    module that registered it, raised without a chained traceback from the walk, and ``out`` left
    without a run (no run.json; cm.open refuses it)."""
    docs = {name: using(what, kind, name) for name, (_, what, kind, _, _) in AT_RUN.items()}
    plain = using("metric", "token_logit", "x")
    del plain["extensions"]
    got = python(f"""
        from pathlib import Path
        docs = json.loads({json.dumps(docs)!r})
        loaded = cm.load(json.loads({json.dumps(plain)!r}), engine={engine!r}, models=[{str(MODELS)!r}])
        got = {{}}
        for name, doc in docs.items():
            out = Path({str(tmp_path)!r}) / ("out-" + name)
            err = None
            try:
                cm.run(doc, loaded=loaded, out=out, data=[{str(DATA)!r}], plugins=[name])
            except CausalabError as e:
                err = {{"type": type(e).__name__, "path": e.path, "problem": e.problem, "fix": e.fix,
                       "chained": e.__cause__ is not None}}
            got[name] = {{"err": err, "run_json": (out / "run.json").exists(),
                         "open": refusal(lambda: cm.open(out))}}
        print(json.dumps(got))
    """, modules)
    for name, (_, what, kind, path, says) in AT_RUN.items():
        err = got[name]["err"]
        assert err is not None and err["type"] == "EngineError", (name, err)
        assert err["path"] == path, (name, err)
        assert repr(kind) in err["problem"] and name in err["problem"] and says in err["problem"], (name, err)
        assert not err["chained"], (name, err)
        assert err["fix"], (name, err)
        assert not got[name]["run_json"], name
        assert got[name]["open"] is not None and "no run.json" in got[name]["open"]["problem"], (name, got[name])


def test_a_broken_kind_refused_by_the_cli_writes_nothing(modules, tmp_path):
    """The same refusal through ``causalab-mini --plugin``: one message, exit 2, no traceback, and
    it says nothing was written."""
    doc = write_doc(tmp_path, "raises", using("metric", "raising_margin", "broken_raises"))
    out = tmp_path / "out"
    said = cli_refused("--plugin", "broken_raises", "run", doc, "--engine", "hooks", "--out", out,
                       "--models", MODELS, "--data", DATA, paths=[modules])
    assert said.startswith("error: EngineError: margin_halved: "), said
    assert "'raising_margin' by broken_raises raised RuntimeError: deliberately broken" in said
    assert f"nothing was written to {out}" in said
    assert not (out / "run.json").exists()


BROKEN_DIST = "causalab-broken"


def test_an_installed_extension_that_does_not_import_is_refused_by_name(margin, tmp_path):
    """A second distribution, installed with pip, whose module raises ImportError: discovery keeps it
    as a failure (vocab says BROKEN) and does not stop anything else; a document naming it is
    refused at extensions[0], saying it does not import."""
    source = tmp_path / "broken-src"
    (source / "src" / "causalab_broken").mkdir(parents=True)
    (source / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{BROKEN_DIST}"
        version = "0.0.1"

        [project.entry-points.causalab_mini]
        broken = "causalab_broken.plugin"

        [tool.setuptools.packages.find]
        where = ["src"]
        """))
    (source / "src" / "causalab_broken" / "__init__.py").write_text("")
    (source / "src" / "causalab_broken" / "plugin.py").write_text("raise ImportError('this extension is broken')\n")
    site = pip_install(source, tmp_path / "prefix")

    naming = halve()
    naming["extensions"] = [DIST, BROKEN_DIST]
    path = write_doc(tmp_path, "naming", naming)
    got = python(f"""
        print(json.dumps({{"named": refusal(lambda: cm.read({str(path)!r})),
                          "unnamed": refusal(lambda: cm.read({str(HALVE)!r}))}}))
    """, margin, site)
    assert got["unnamed"] is None  # a broken extension no document names stops nothing
    err = got["named"]
    assert err["type"] == "DocumentError" and err["path"] == "extensions[1]", err
    assert err["problem"].startswith(f"extension {BROKEN_DIST!r} (causalab_broken.plugin) does not import: "
                                     "ImportError: this extension is broken"), err
    assert BROKEN_DIST in err["fix"] and "0.0.1" in err["fix"], err

    only = halve()
    only["extensions"] = [BROKEN_DIST]
    said = cli_refused("run", write_doc(tmp_path, "only", only), "--out", tmp_path / "out", "--models", MODELS,
                       "--data", DATA, paths=[margin, site])
    assert said.startswith(f"error: DocumentError: extensions[0]: extension {BROKEN_DIST!r}"), said
    assert "does not import" in said
    assert not (tmp_path / "out").exists()

    done = cli("vocab", paths=[margin, site])
    assert done.returncode == 0, done.stderr
    broken = [line for line in done.stdout.splitlines() if BROKEN_DIST in line]
    assert len(broken) == 1 and "BROKEN" in broken[0] and "does not import" in broken[0], done.stdout
    assert any(line.strip().startswith(f"{DIST} {VERSION}") for line in done.stdout.splitlines())


FEATURIZER_MODULE = HEAD + textwrap.dedent('''
    from causalab_mini.vocab import FeaturizerKind


    class Doubled:
        """Features twice the activation; the inverse halves them back (exact in binary floats)."""

        def featurize(self, x):
            return x * 2.0, None

        def inverse(self, f, err, x):
            return f * 0.5


    @hookimpl
    def causalab_mini_featurizer_kinds():
        return [FeaturizerKind("doubled", trainable=False, loads="never", params=(), needs_without_file=(),
                               space="units", tensor=None, make=lambda d, k, tensors: Doubled(),
                               doc="2x, and back")]
    ''')


def test_an_extension_featurizer_kind_runs_like_the_same_write_without_it(tmp_path):
    """A write of +1 in a featurizer kind of an extension's (features 2x) is x + 0.5: bit for bit the
    built-in write of +0.5 on the activation itself, on both engines; run.json records the extension."""
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "doubled_kind.py").write_text(FEATURIZER_MODULE)
    doc = halve()
    del doc["extensions"]
    iv = doc["interventions"]["halve"]
    iv["writes"]["half"] = {"site": "target", "pos": -1, "mechanism": "add_scaled", "operand": 0.5}
    for metric in iv["metrics"].values():
        metric["kind"] = "token_logit"
    plain = dict(doc)
    ext = json.loads(json.dumps(doc))
    ext["extensions"] = ["doubled_kind"]
    ext["featurizers"] = {"dbl": {"kind": "doubled", "site": "target"}}
    ext["interventions"]["halve"]["writes"]["half"].update(operand=1.0, featurizer="dbl")
    got = python(f"""
        out = {{}}
        for engine in ("hooks", "nnterp"):
            for name, doc in (("plain", {plain!r}), ("ext", {ext!r})):
                folder = {str(tmp_path)!r} + f"/out-{{engine}}-{{name}}"
                ran = cm.run(doc, engine=engine, out=folder, models=[{str(MODELS)!r}], data=[{str(DATA)!r}],
                             plugins=["doubled_kind"])
                out[f"{{engine}}-{{name}}"] = [r["value"] for r in ran.points[0].result("margin_halved").rows]
                out[f"{{engine}}-{{name}}-record"] = json.load(open(folder + "/run.json")).get("extensions")
                out[f"{{engine}}-{{name}}-clean"] = [r["value"] for r in ran.points[0].result("margin_clean").rows]
        print(json.dumps(out))
    """, folder)
    for engine in ("hooks", "nnterp"):
        assert got[f"{engine}-ext"] == got[f"{engine}-plain"], engine
        assert got[f"{engine}-plain-record"] is None
        (record,) = got[f"{engine}-ext-record"]
        assert record["distribution"] == "doubled_kind" and record["module"] == "doubled_kind"
    assert got["hooks-ext"] == got["nnterp-ext"]
    # The write did something: the written logits differ from the clean ones on some row.
    assert any(abs(a - b) > 1e-3 for a, b in zip(got["hooks-ext"], got["hooks-ext-clean"]))

"""Fixtures shared by the test modules: loaded models, one torch thread, the family checkpoints' folder.

Paths are not fixtures: they live in tests/paths.py (``from paths import MODELS``), since
modules need them at import time.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from paths import REPO, V2

import load_counter
from model_cache import EngineCache, TransformersCache

load_counter.install()  # only under CAUSALAB_COUNT_LOADS: see load_counter.py


def pytest_sessionfinish(session):
    load_counter.report()


@pytest.fixture(scope="session")
def engines():
    """``engines(document_or_model, "hooks" | "nnterp")``: a causalab_mini engine, loaded once per
    session for each model and way of loading it (model_cache.EngineCache says which)."""
    cache = EngineCache()
    yield cache
    cache.clear()


@pytest.fixture(scope="session")
def hf_model():
    """``hf_model("tiny-llama", attn_implementation=None)``: a shipped checkpoint as a plain
    transformers ``(model, tokenizer)``, loaded once per session; never to be changed."""
    cache = TransformersCache()
    yield cache
    cache.clear()


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module that opts in (``pytestmark = pytest.mark.usefixtures("one_thread")``).

    Why one: tiny models make many small ops, and on a busy machine two spinning OpenMP
    threads per worker make them 10 to 50 times slower (the planted fit in
    test_featurizers.py: 6 s against 60 s; a three-step generate: ~50x). Why the count goes
    back afterwards: a count left at 1 changes the bits of later in-process runs that other
    modules compare with a subprocess's.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def family_root(tmp_path_factory) -> Path:
    """One folder per session for the tiny family checkpoints ``families.build`` writes."""
    return tmp_path_factory.mktemp("families")


@pytest.fixture(scope="module")
def folders(family_root):
    """``folder(case) -> (model key, the folder searched for it)``: a shipped model's key, or
    ``"family:<name>"``, a tiny family checkpoint built (once per session) into ``family_root``."""
    import families
    from paths import MODELS

    def folder(case: str) -> tuple[str, Path]:
        if case.startswith("family:"):
            family = case.removeprefix("family:")
            families.build(family, family_root / family)
            return family, family_root
        return case, MODELS
    return folder


# --- the plugin run through pytester ----------------------------------------------------------

def write_plugin_ini(pytester, extra: str = "") -> None:
    """The ini a plugin test runs under: no cache, the shipped models and data. ``extra`` adds
    lines (``"causalab_baseline_mode = aggregates"``). Written unindented: makeini dedents."""
    lines = ["[pytest]", "addopts = -p no:cacheprovider",
             f"causalab_models = {REPO / 'documents' / 'models'}",
             f"causalab_data = {REPO / 'documents' / 'data'}", *extra.strip().splitlines()]
    pytester.makeini("\n".join(line.strip() for line in lines) + "\n")


@pytest.fixture(scope="session")
def warm(engines):
    """Run one document on both engines through the public API, in this process, before any
    pytester exists.

    An in-process pytester run restores ``sys.modules`` when it ends. torch or a transformers
    model module dropped that way and imported again breaks the process ("bad call flags", a
    segfault); causalab_mini's own modules dropped that way come back as new classes, and a
    ``Document`` made by one copy of ``causalab_mini.api`` is not an instance of the other's.
    Imported here, they are part of every snapshot.
    """
    import importlib

    import causalab_mini as cm

    for module in ("causalab_mini.api", "causalab_mini.outputs.results", "causalab_mini.plots",
                   "causalab_mini.outputs.tables"):
        importlib.import_module(module)

    path = V2 / "patching.causalab.json"
    for engine in ("hooks", "nnterp"):
        cm.run(path, loaded=engines(path, engine))


@pytest.fixture
def tester(warm, pytester, monkeypatch):
    """pytester set up for the plugin: the ini above, and ``CI`` unset (the suite itself may run
    under CI, where a missing baseline is strict)."""
    monkeypatch.delenv("CI", raising=False)
    write_plugin_ini(pytester)
    return pytester


@pytest.fixture
def plugin_ini(tester):
    """``plugin_ini(extra)``: rewrite the plugin test's ini with more lines."""
    return lambda extra="": write_plugin_ini(tester, extra)

"""Fuzzing through an engine: a mutated document that compiles runs on the hooks engine, or is refused, typed.

The front-end fuzz (tests/test_fuzz.py) stops at the compiled plan. Here the documents it
mutates go on, as ``causalab-mini run --engine hooks`` takes them: compiled against a
loaded tiny model (each shipped model loaded once per module, and again only for a dtype
or module map a mutation asks for), executed, and written to a fresh folder. Each example
finishes, with a value for every metric row the writer writes, or raises a
``CausalabError``; another exception, or an example past its 20 s deadline, is a defect.

A compiled plan is only run when its work — the tokens its forwards take, times a fit's
epochs — is within ``WORK``, about the largest corpus document but the two fits: a mutation
that asks for a thousand epochs of DAS is a long run the document asked for, not a hang.

Fewer examples than the front end's (``max(EXAMPLES // 20, 15)``): each may run a model.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings

import causalab_mini as cm
from causalab_mini.document import read as front
from causalab_mini.errors import CausalabError
from causalab_mini.outputs.write import check_targets, metric_rows, planned_files, write
from causalab_mini.plan import compile as compiler
from causalab_mini.plan.plan import Fit, Observe
from fuzzing import CORPUS, DATA, EXAMPLES, FUZZED, MODELS, RAW, mutated

pytest.importorskip("transformers")

# Tokens through the model (rows x (prompt + decode) per forward, a fit's epochs x its updates'
# forwards). The corpus: 44 to 444 but for das (7,476) and dbm (24,384), which take 20-30 s.
WORK = 2_000


def work(plan) -> int:
    total = 0
    for _, step in plan.walk():
        if isinstance(step, Observe):
            total += sum(f.rows * (f.tokens + (f.decode or 0)) for f in step.forwards)
        elif isinstance(step, Fit) and len(step.epochs):
            total += len(step.epochs) * sum(f.rows * f.tokens for u in step.epochs[0] for f in u.forwards)
    return total


def _key(raw) -> tuple:
    model = front.points(raw)[0].spec.model
    return (model.key, model.dtype, repr(model.modules))


@pytest.fixture(scope="module")
def engines() -> dict:
    """Each shipped model on the hooks engine, loaded as its first corpus document loads it, and warmed
    by running that document's first point once."""
    loaded = {}
    for path, raw in zip(CORPUS, RAW):
        key = _key(raw)
        if key in loaded or work(compiler.compile_plan(raw, document=path, data=[DATA])) > WORK:
            continue
        loaded[key] = cm.load(cm.read(raw, path=path), engine="hooks", models=[MODELS])
        # Unshared: one point run on its own holds every forward it needs.
        plan = compiler.compile_plan(raw, document=path, data=[DATA], facts=loaded[key], share=False)
        loaded[key].execute(plan.points[0])
    assert {k[0] for k in loaded} == {p.name for p in MODELS.iterdir() if p.is_dir()}
    return loaded


@pytest.fixture(scope="module")
def outs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzzed-runs")


@settings(max_examples=max(EXAMPLES // 20, 15), deadline=20_000, suppress_health_check=[HealthCheck.too_slow])
@given(doc=mutated(rounds=(1, 2)))  # fewer changes than the front end's: more documents reach the engine
def test_a_mutated_document_runs_on_the_hooks_engine_or_is_refused_typed(engines, outs, doc):
    try:
        compiler.compile_plan(doc, document=FUZZED, models=[MODELS], data=[DATA])  # no weights: the cheap refusals
        key = _key(doc)
        if key not in engines:
            engines[key] = cm.load(cm.read(doc, path=FUZZED), engine="hooks", models=[MODELS])
        engine = engines[key]
        plan = compiler.compile_plan(doc, document=FUZZED, data=[DATA], facts=engine)
        if work(plan) > WORK:
            event("compiled; over the work bound, not run")
            return
        out = Path(tempfile.mkdtemp(dir=outs))
        try:
            check_targets(out, planned_files(plan))
            plan = engine.execute(plan)
            for _, step in plan.walk():
                if isinstance(step, Observe):
                    for metric in step.metrics:
                        rows = metric_rows(step, metric.name, step.produced_by)
                        assert len(rows) == step.rows
                        assert all(isinstance(r["value"], float) for r in rows if r["eligible"])
            written = write(plan, out, plan.provenance)
            assert all(p.is_file() for p in written)
        finally:
            shutil.rmtree(out)
        event("ran and written")
    except CausalabError as err:
        event(f"refused: {type(err).__name__}")

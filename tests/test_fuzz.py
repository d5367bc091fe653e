"""Fuzzing the front end: mutated corpus documents either validate or are refused, typed.

Hypothesis takes a corpus document and mutates it — deletes a key, replaces a value with
arbitrary JSON, swaps a value's type, wraps a value in a sweep, renames a key — a few
times over; the result must either lower and validate, or raise a ``CausalabError``
(what the CLI prints as a refusal). Any other exception is a defect: a traceback where a
refusal belongs. Each example has a deadline, so a hang is a failure too, and a memory
bound: its peak Python allocation (tracemalloc) stays under ``fuzzing.MEMORY_BOUND``,
128 MiB, so a document that makes the front end build something in proportion to a
number it names fails here rather than filling a machine. The bound is set from
measurement: over 6,750 examples of these three properties the highest peak was 1.2 MiB
(the data property's, 16 MiB; a row at its size limit compiles in about 80 MiB); see
tests/fuzzing.py.

The other fuzz properties: data rows (tests/test_fuzz_data.py), stored baselines
(tests/test_fuzz_baselines.py), documents run through the hooks engine
(tests/test_fuzz_engine.py), model directories, cache entries and a run's folder before a
rerun (tests/test_fuzz_inputs.py).

CI runs a few hundred examples per test; ``CAUSALAB_FUZZ_EXAMPLES=100000 pytest
tests/test_fuzz.py`` runs as many as it is told, locally.
"""
from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from causalab_mini.document import read as front
from causalab_mini.plan import compile as compiler
from fuzzing import CORPUS, EXAMPLES, FUZZED, JSON, RAW, bounded, mutated, warm_up


@pytest.fixture(scope="module", autouse=True)
def _warm():
    """Every corpus document compiled once, unmeasured: what the first compile in a process imports
    (transformers, the tokenizers) is not what an example allocates."""
    warm_up(CORPUS)


@settings(max_examples=EXAMPLES, deadline=2_000, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_a_mutated_document_validates_or_is_refused_typed(doc):
    bounded(lambda: front.points(doc))


@settings(max_examples=EXAMPLES, deadline=2_000, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(RAW), JSON)
def test_arbitrary_json_at_the_top_level_is_refused_typed(doc, value):
    doc = copy.deepcopy(doc)
    doc[next(iter(doc))] = value
    bounded(lambda: front.points(doc))


@settings(max_examples=max(EXAMPLES // 4, 50), deadline=10_000, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_a_mutated_document_compiles_or_is_refused_typed(doc):
    """Further in: against the shipped model's config and tokenizer and the shipped data (no weights)."""
    bounded(lambda: compiler.compile_plan(doc, document=FUZZED))

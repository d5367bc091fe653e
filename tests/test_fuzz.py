"""Fuzzing the front end: mutated corpus documents either validate or are refused, typed.

Hypothesis takes a corpus document and mutates it — deletes a key, replaces a value with
arbitrary JSON, swaps a value's type, wraps a value in a sweep, renames a key — a few
times over; the result must either lower and validate, or raise a ``CausalabError``
(what the CLI prints as a refusal). Any other exception is a defect: a traceback where a
refusal belongs. Each example has a deadline, so a hang is a failure too.

CI runs a few hundred examples per test; ``CAUSALAB_FUZZ_EXAMPLES=100000 pytest
tests/test_fuzz.py`` runs as many as it is told, locally.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from causalab_mini import documents
from causalab_mini.errors import CausalabError

ROOT = Path(__file__).resolve().parents[1]
CORPUS = sorted((ROOT / "documents").rglob("*.causalab.json"))
RAW = [json.loads(p.read_text()) for p in CORPUS]

EXAMPLES = int(os.environ.get("CAUSALAB_FUZZ_EXAMPLES", "400"))

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)


def _paths(value, prefix=()):
    """Every (path, value) in a JSON tree."""
    yield prefix, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value):
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


@st.composite
def mutated(draw):
    doc = copy.deepcopy(draw(st.sampled_from(RAW)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p, _ in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        old = parent[path[-1]]
        action = draw(st.sampled_from(["delete", "replace", "swap", "sweep", "rename"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = draw(JSON)
        elif action == "swap":  # the same content in another type
            parent[path[-1]] = draw(st.sampled_from([str(old), [old], {"v": old}, None, True, 0, 1.5]))
        elif action == "sweep":
            parent[path[-1]] = {"sweep": draw(st.sampled_from([[old], [old, old], {"range": [0, 3]}, [],
                                                               {"range": [0, 2 ** 70]}, {"sweep": [old]}]))}
        elif isinstance(parent, dict):  # rename
            value = parent.pop(path[-1])
            parent[draw(st.text(max_size=8))] = value
    return doc


@settings(max_examples=EXAMPLES, deadline=2_000, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_a_mutated_document_validates_or_is_refused_typed(doc):
    try:
        documents.points(doc)
    except CausalabError:
        pass


@settings(max_examples=EXAMPLES, deadline=2_000, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(RAW), JSON)
def test_arbitrary_json_at_the_top_level_is_refused_typed(doc, value):
    doc = copy.deepcopy(doc)
    doc[next(iter(doc))] = value
    try:
        documents.points(doc)
    except CausalabError:
        pass


@settings(max_examples=max(EXAMPLES // 4, 50), deadline=10_000, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_a_mutated_document_compiles_or_is_refused_typed(doc):
    """Further in: against the shipped model's config and tokenizer and the shipped data (no weights)."""
    try:
        documents.compile_plan(doc, document=ROOT / "documents" / "v2" / "fuzzed.causalab.json")
    except CausalabError:
        pass

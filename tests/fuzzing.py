"""What the fuzz tests (tests/test_fuzz*.py) share: the corpus, arbitrary JSON, mutations, a memory bound.

``mutate`` changes a JSON tree a few times over — deletes a key, replaces a value with
arbitrary JSON, swaps a value's type, wraps a value in a sweep, renames a key — and
``mutated()`` applies it to a corpus document. ``bounded`` runs one example under
``tracemalloc`` and holds its peak to ``MEMORY_BOUND``.
"""
from __future__ import annotations

import copy
import json
import os
import tracemalloc
from pathlib import Path

from hypothesis import strategies as st

from causalab_mini.errors import CausalabError
from paths import CORPUS, DATA, MODELS, REPO, V2  # noqa: F401  (re-exported to the fuzz modules)

ROOT = REPO  # the name test_fuzz_baselines.py imports it by
RAW = [json.loads(p.read_text()) for p in CORPUS]
# Where a fuzzed document says it lives: beside the corpus, so its relative references resolve.
FUZZED = V2 / "fuzzed.causalab.json"

EXAMPLES = int(os.environ.get("CAUSALAB_FUZZ_EXAMPLES", "400"))

# The most Python memory one front-end example (a document validated or compiled, a data
# split read and compiled) may take at its peak, as tracemalloc counts it: the Python heap
# (the parsed JSON, the rows, token ids as Python lists, the plan), not the tokenizer's or
# torch's native heaps. Measured with CAUSALAB_FUZZ_EXAMPLES=3000 (after the warm-up, which
# the first compile's imports would otherwise dominate): a mutated document peaked at 1.2 MiB,
# a mutated split at 16 MiB (a 64 KiB prompt tokenized; a row past 1 MiB is refused at read).
# A row at the 1 MiB limit (data.MAX_LINE_BYTES) compiles at about 80 MiB; 4 MiB rows, before
# that limit, took 300 MiB. The bound sits above the largest input the front end accepts and
# far below what one that builds in proportion to a number it names (a range, a count, a
# decode length) rather than to its own size would take.
MEMORY_BOUND = 128 * 2**20

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)


def paths(value, prefix=()):
    """Every (path, value) in a JSON tree."""
    yield prefix, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, prefix + (i,))


def holder(doc, path):
    """The object or list in ``doc`` that holds the value at ``path`` (a ``paths`` path)."""
    for key in path[:-1]:
        doc = doc[key]
    return doc


def mutate(draw, doc, rounds=(1, 3)):
    """``doc`` changed in place ``rounds`` times over (a hypothesis ``draw`` decides how); returned."""
    for _ in range(draw(st.integers(*rounds))):
        found = [p for p, _ in paths(doc) if p]
        if not found:
            break
        path = draw(st.sampled_from(found))
        parent = holder(doc, path)
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


@st.composite
def mutated(draw, rounds=(1, 3)):
    """A corpus document, mutated one to three times (``rounds``)."""
    return mutate(draw, copy.deepcopy(draw(st.sampled_from(RAW))), rounds)


class Blob(bytes):
    """A file's bytes, shown by their size and ends: a failing example may hold megabytes."""

    def __repr__(self) -> str:
        if len(self) <= 2000:
            return f"Blob({bytes(self)!r})"
        return f"Blob({len(self)} bytes: {bytes(self[:600])!r} … {bytes(self[-600:])!r})"


def warm_up(paths, data=None) -> None:
    """Compile each document once, unmeasured: the imports and caches a process's first compile
    fills (transformers, the tokenizers, pydantic's validators) are not an example's allocation."""
    from causalab_mini.plan import compile as compiler

    for path in paths:
        compiler.compile_plan(json.loads(Path(path).read_text()), document=path, data=data)


def bounded(call, *, bound: int = MEMORY_BOUND):
    """``call()``'s result, or the ``CausalabError`` it raised; any other exception propagates.

    Its peak Python allocation (tracemalloc) must stay under ``bound``. (Not a hypothesis
    ``target``: climbing towards the largest inputs would make the examples' time unpredictable.)
    """
    tracing = tracemalloc.is_tracing()  # already on (python -X tracemalloc): measure, leave it on
    if tracing:
        tracemalloc.reset_peak()
    else:
        tracemalloc.start()
    try:
        try:
            outcome = call()
        except CausalabError as err:
            outcome = err
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        if not tracing:
            tracemalloc.stop()
    assert peak < bound, f"one example peaked at {peak / 2**20:.1f} MiB, over the {bound >> 20} MiB bound"
    return outcome

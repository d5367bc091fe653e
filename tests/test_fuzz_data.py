"""Fuzzing the data: a mutated JSON Lines split either compiles or is refused, typed.

Hypothesis takes a shipped split (documents/data/<name>/<split>.jsonl) and a corpus document
that reads it, and mutates the split one to three times: deletes a column (on one row or
every row), replaces a value anywhere in a row with arbitrary JSON, gives a column that
matters (the prompt, the counterfactual prompts, an answer, the variables, ``example_id``)
a value of another type, numbers the rows with ids of odd types (duplicates included),
inserts a line that is not an object, not JSON or not UTF-8, truncates or empties the
file, duplicates a row, or plants a long string (1 KiB, 64 KiB, or one byte past the 1 MiB a
row may hold) as a value or a column's name. The split is written into a fresh data root
(the other splits copied unchanged) and the document compiled against it, with the model's
config and tokenizer: it compiles, or raises a ``CausalabError``. Anything else — a
traceback, a hang past the 10 s deadline, a peak allocation over ``fuzzing.MEMORY_BOUND`` —
is a defect.

A second property: any JSON objects, written one per line as JSON Lines allows, read back as
exactly those rows.

``CAUSALAB_FUZZ_EXAMPLES`` sets the count, as for tests/test_fuzz.py.
"""
from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from causalab_mini import data
from causalab_mini.document import read as front
from causalab_mini.plan import compile as compiler
from fuzzing import CORPUS, DATA, EXAMPLES, FUZZED, JSON, MODELS, RAW, Blob, bounded, paths, warm_up

SPLITS = sorted(p.relative_to(DATA).with_suffix("").as_posix() for p in DATA.glob("*/*.jsonl"))
LINES = {ref: (DATA / f"{ref}.jsonl").read_bytes().splitlines() for ref in SPLITS}


def _reads(raw) -> set:
    return {v for _, v in paths(raw) if isinstance(v, str) and v in LINES}


# (document, split it reads): every split the corpus reads, with each document that reads it.
USES = [(raw, ref) for raw in RAW for ref in sorted(_reads(raw))]

# Values of another type for a column that matters; the row's own value is added as a list and an object.
ODD = [None, True, False, 0, -1, 1.5, 1e308, "", " ", [], {}, [[]], {"role": "user"},
       [{"role": "user", "content": 3}], [{"role": "user"}], ["a", 1]]
# Bytes in a planted string: small, a long prompt, and just past what a row may hold (refused at read).
HUGE = [2**10, 2**16, data.MAX_LINE_BYTES + 1]
NOT_ROWS = [b"", b"   ", b"\xff\xfe", b'{"input": "\xc3"}', b"\xef\xbb\xbf{}", b"\x00", b"{", b"}", b"[1,",
            b'{"input": NaN}', b'{"input": Infinity}', b'{"a": 1} {"b": 2}', b"\\u0000", b"\r", b"\x1b[31m",
            b'{"input": "\\ud800"}', b'{"' + b"k" * 100 + b'": 1}', b"[" * 200 + b"]" * 200,
            b'{"example_id": ' + b"9" * 5000 + b"}"]


@st.composite
def mutated_split(draw):
    """(document, ref, the split's new bytes)."""
    raw, ref = draw(st.sampled_from(USES))
    lines: list = [json.loads(line) for line in LINES[ref] if line.strip()]  # dicts, or bytes once mangled
    for _ in range(draw(st.integers(1, 3))):
        rows = [i for i, line in enumerate(lines) if isinstance(line, dict)]
        action = draw(st.sampled_from(["delete", "replace", "swap", "ids", "insert", "truncate", "empty",
                                       "duplicate", "huge"]))
        if action in ("delete", "replace", "swap", "huge", "duplicate") and not rows:
            continue
        if action == "delete":  # a column, from one row or from every row
            i = draw(st.sampled_from(rows))
            if not lines[i]:
                continue
            column = draw(st.sampled_from(sorted(lines[i])))
            for j in (rows if draw(st.booleans()) else [i]):
                lines[j].pop(column, None)
        elif action == "replace":  # anything, anywhere in a row
            row = lines[draw(st.sampled_from(rows))]
            where = draw(st.sampled_from([p for p, _ in paths(row) if p] or [("input",)]))
            _set(row, where, draw(JSON))
        elif action == "swap":  # a column that matters, in another type
            row = lines[draw(st.sampled_from(rows))]
            column = draw(st.sampled_from(sorted(set(row) | {"example_id", "input", "counterfactual_inputs"})))
            old = row.get(column)
            row[column] = copy.deepcopy(draw(st.sampled_from(ODD + [[old], {"v": old}, str(old)])))
        elif action == "ids":  # example_id of odd types, duplicates likely
            pool = draw(st.lists(st.sampled_from([0, 1, "0", "a", 1.0, True, None, [], {}, "", -0.0,
                                                  2**64, "1"]) | JSON, min_size=1, max_size=4))
            for i in rows:
                lines[i]["example_id"] = copy.deepcopy(draw(st.sampled_from(pool)))
        elif action == "insert":  # a line that is not a row
            line = draw(st.sampled_from(NOT_ROWS) | JSON.map(lambda v: json.dumps(v).encode()))
            lines.insert(draw(st.integers(0, len(lines))), line)
        elif action == "truncate":
            text = _encode(lines)
            lines = [text[: draw(st.integers(0, max(len(text) - 1, 0)))]]
        elif action == "empty":
            lines = [draw(st.sampled_from([b"", b"\n", b"\n\n  \n", b"\xef\xbb\xbf"]))]
        elif action == "duplicate":
            i = draw(st.sampled_from(rows))
            lines.insert(draw(st.integers(0, len(lines))), json.loads(json.dumps(lines[i])))
        else:  # huge: a string of up to 4 MiB in a column, or as a column's name
            row = lines[draw(st.sampled_from(rows))]
            unit = draw(st.sampled_from(["x", "Monday ", "\u00e9", "\U0001F600", " "]))
            text = unit * (draw(st.sampled_from(HUGE)) // len(unit.encode()))  # that many bytes, about
            if draw(st.booleans()):
                row[draw(st.sampled_from(sorted(row) or ["input"]))] = text
            else:
                row[text] = "x"
    newline = draw(st.sampled_from([b"\n", b"\r\n"]))
    return raw, ref, Blob(_encode(lines, newline, ascii=draw(st.booleans())))


def _set(doc, path, value):
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


def _encode(lines, newline=b"\n", ascii=False) -> bytes:
    out = []
    for line in lines:
        if isinstance(line, dict):
            line = json.dumps(line, ensure_ascii=ascii, allow_nan=True).encode("utf-8", "surrogatepass")
        out.append(line)
    return b"".join(line + newline for line in out)


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> Path:
    """A folder for the fuzzed data roots, one per example (function-scoped tmp_path is not per example)."""
    return tmp_path_factory.mktemp("fuzzed-data")


@pytest.fixture(scope="module")
def base(roots) -> Path:
    """``roots``, with the corpus compiled once against the shipped data, unmeasured."""
    warm_up(CORPUS, data=[DATA])
    return roots


@pytest.fixture(scope="module")
def facts() -> dict:
    """Each shipped model's config and tokenizer (``ModelFacts``), read once: the documents are not
    mutated here, only their data, so reading them again per example would only take time."""
    out = {}
    for raw, _ in USES:
        spec = front.points(raw)[0].spec
        if spec.model.key not in out:
            out[spec.model.key] = compiler.model_facts(spec, FUZZED, [MODELS])
    return out


@settings(max_examples=EXAMPLES, deadline=10_000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=mutated_split())
def test_a_mutated_split_compiles_or_is_refused_typed(base, facts, case):
    raw, ref, text = case
    model = facts[raw["model"]["key"]]
    root = Path(tempfile.mkdtemp(dir=base))
    try:
        shutil.copytree(DATA, root, dirs_exist_ok=True)  # the other splits, unchanged
        (root / f"{ref}.jsonl").write_bytes(text)
        data.clear_cache()  # each root is new; the cache would only grow
        bounded(lambda: compiler.compile_plan(raw, document=FUZZED, data=[root], facts=model))
    finally:
        data.clear_cache()
        shutil.rmtree(root)


# Text with the characters a line reader can trip on: the ones str.splitlines cuts at, "\r", quotes.
TEXT = st.text(st.characters(exclude_categories=["Cs"]) | st.sampled_from("\u2028\u2029\x85\x0b\x0c\x1c\x1d\x1e\r\n\"\\"),
               max_size=12)
# Finite floats: NaN and infinities are refused at read (test_hostile_inputs.py), so a row holding
# one is not well formed.
VALUE = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                     max_leaves=8)
ROW = st.dictionaries(TEXT, VALUE, max_size=5)


@settings(max_examples=max(EXAMPLES // 4, 50), deadline=2_000, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(ROW, min_size=1, max_size=5), ascii=st.booleans(), newline=st.sampled_from(["\n", "\r\n"]),
       bom=st.booleans(), blank=st.booleans())
def test_a_well_formed_split_reads_back_as_written(roots, rows, ascii, newline, bom, blank):
    """Any JSON objects, one per line — "\\n" or "\\r\\n", escaped or as themselves (U+2028 and
    U+0085 included, which a JSON string may hold), a byte-order mark, blank lines — are the rows."""
    text = ("\ufeff" if bom else "") + "".join(
        json.dumps(row, ensure_ascii=ascii) + newline + (newline if blank else "") for row in rows)
    root = Path(tempfile.mkdtemp(dir=roots))
    try:
        (root / "set").mkdir()
        (root / "set" / "train.jsonl").write_text(text, encoding="utf-8", newline="")
        data.clear_cache()
        assert data.load("set/train", [root]).rows == tuple(rows)
    finally:
        data.clear_cache()
        shutil.rmtree(root)

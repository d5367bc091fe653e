"""The engine registry (``causalab_mini/engines.py``) is the one list of engines.

Each record loads its class, and the class answers to the record's name; a run record's class
name maps back; every front end that offers engines (the CLI, ``vocab``, the public names)
offers the registry's; and no other module spells a list of engine names of its own, so adding
an engine is its module plus one record.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest
from paths import REPO
from samples import cli_command

import causalab_mini as cm
from causalab_mini import vocab
from causalab_mini import engines as registry
from causalab_mini.errors import EngineError

# Modules still spelling an engine list of their own, for their owner to point at the registry.
# pytest_causalab/session.py: its ENGINES adds "both" (run on each local engine) to the names.
NOT_YET: set = set()


@pytest.mark.parametrize("record", registry.RECORDS, ids=lambda r: r.name)
def test_each_record_loads_a_class_answering_to_its_name(record):
    cls = registry.engine_class(record.name)
    assert cls.__name__ == record.class_name
    assert cls.__module__ == record.module
    assert cls.name == record.name  # the name its compile-time refusals are asked under


@pytest.mark.parametrize("record", registry.RECORDS, ids=lambda r: r.name)
def test_the_class_a_run_records_maps_back_to_the_name(record):
    assert registry.engine_name(record.class_name) == record.name
    # Run remotely, a local engine is its remote form where the registry has one (nnterp → ndif).
    remote = [r.name for r in registry.RECORDS if r.remote_of == record.name]
    assert registry.engine_name(record.class_name, remote=True) == (remote[0] if remote else record.name)


def test_engine_names_of_classes_no_record_names():
    assert registry.engine_name("NNterpEngine", remote=True) == "ndif"
    assert registry.engine_name("SomeFutureEngine") == "SomeFutureEngine"
    assert registry.engine_name(None) == "unknown"


def test_the_lists_follow_the_records():
    assert registry.names() == registry.ENGINES == tuple(r.name for r in registry.RECORDS)
    assert registry.local_names() == registry.LOCAL_ENGINES == tuple(r.name for r in registry.RECORDS
                                                                     if r.remote_of is None)
    assert len(set(registry.ENGINES)) == len(registry.ENGINES)
    assert registry.DEFAULT in registry.LOCAL_ENGINES
    for r in registry.RECORDS:
        assert r.remote_of is None or r.remote_of in registry.LOCAL_ENGINES, r
        assert r.description and "\n" not in r.description, r


def test_the_public_names_are_the_registry_lists():
    assert cm.ENGINES == registry.ENGINES
    assert cm.LOCAL_ENGINES == registry.LOCAL_ENGINES


@pytest.mark.parametrize("name", ["bogus", "", "NNterp", ["nnterp"]])
def test_an_unknown_engine_is_refused_naming_every_known_one(name):
    with pytest.raises(EngineError) as refused:
        registry.engine_class(name)
    text = str(refused.value)
    assert f"unknown engine {name!r}" in text
    assert f"use one of: {', '.join(registry.ENGINES)}" in text


def test_reading_the_registry_imports_no_engine_library():
    code = ("import sys, causalab_mini.engines as r, causalab_mini.vocab, causalab_mini.cli; "
            "r.names(); print([m for m in ('torch', 'nnsight', 'nnterp') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _engine_choices(verb: str) -> tuple[str, ...]:
    done = subprocess.run([*cli_command(), verb, "--help"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    (choices,) = set(re.findall(r"--engine \{([^}]*)\}", done.stdout))
    return tuple(choices.split(","))


def test_the_cli_offers_the_registry():
    assert _engine_choices("run") == registry.ENGINES
    # explain compiles on this machine: the local engines' refusals.
    assert _engine_choices("explain") == registry.LOCAL_ENGINES


def test_the_cli_help_describes_every_engine():
    done = subprocess.run([*cli_command(), "run", "--help"], capture_output=True, text=True, cwd=REPO, timeout=120)
    flat = " ".join(done.stdout.split())
    for r in registry.RECORDS:
        assert f"{r.name}: {r.description}" in flat


def test_vocab_lists_the_engines_reaching_each_component():
    listed = vocab.as_json()["components"]
    for name, c in vocab.COMPONENTS.items():
        # Every local engine: a module boundary by hooks or tracing, inside attention through the
        # attention function transformers calls (where a family's attention calls it: the family table).
        expected = list(registry.LOCAL_ENGINES)
        assert listed[name]["engines"] == expected
        assert vocab.engines_reaching(c) == tuple(expected)
    json.dumps(listed)


# --------------------------------------------------------------------------- one list only

_NAME = "|".join(map(re.escape, registry.ENGINES))
# Two engine names written as a list inside one string: "nnterp, hooks", "nnterp|hooks", "{nnterp,hooks}".
_SPELLED_LIST = re.compile(rf"\b({_NAME})\s*[,|]\s*({_NAME})\b")


def _engines_held(elements) -> int:
    """How many engines a literal collection names: each engine-name string, and a list of
    engines unpacked into it (``*LOCAL_ENGINES``) counts as one more — extending the registry's
    list by hand is spelling a list too."""
    held = {e.value for e in elements if isinstance(e, ast.Constant) and e.value in registry.ENGINES}
    unpacked = [e for e in elements if isinstance(e, ast.Starred)
                and "ENGINES" in getattr(e.value, "id", getattr(e.value, "attr", ""))]
    return len(held) + len(unpacked)


def engine_lists(source: str) -> list[int]:
    """Lines where ``source`` spells a list of engine names: a tuple, list, set or dict holding two
    or more of them as literals, or one string listing two."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            held = _engines_held(node.elts)
        elif isinstance(node, ast.Dict):
            held = _engines_held([k for k in node.keys if k is not None] + node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            held = 2 if _SPELLED_LIST.search(node.value) else 0
        else:
            continue
        if held >= 2:
            found.append(node.lineno)
    return sorted(found)


@pytest.mark.parametrize("source, lines", [
    ('ENGINES = ("nnterp", "hooks")', [1]),
    ('x = {"NNterpEngine": "nnterp", "HooksEngine": "hooks"}', [1]),
    ('if e in ["hooks", "ndif"]: pass', [1]),
    ('s = "engines=nnterp, hooks"', [1]),
    ('ENGINES = (*LOCAL_ENGINES, "ndif", "both")', [1]),
    ('ENGINES = (*registry.ENGINES, "both")', []),
    ('PACKAGES = ("torch", "nnsight", "nnterp")', []),
    ('p.add_argument("--engine", default="nnterp")', []),
    ('"""Run with --engine nnterp or --engine hooks."""', []),
])
def test_the_list_finder_finds_lists_and_only_lists(source, lines):
    assert engine_lists(source) == lines


def test_no_module_but_the_registry_spells_a_list_of_engines():
    registry_file = "causalab_mini/engines.py"
    found = []
    for package in ("causalab_mini", "pytest_causalab"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == registry_file:
                continue
            lines = engine_lists(path.read_text(encoding="utf-8"))
            if rel not in NOT_YET:
                found.extend(f"{rel}:{n}" for n in lines)
    assert not found, f"engine names listed outside {registry_file} (read registry.ENGINES instead): {found}"


def test_not_yet_is_not_stale():
    """An entry of NOT_YET whose module no longer lists engines is removed from NOT_YET."""
    for rel in NOT_YET:
        path = REPO / rel
        if path.exists() and not engine_lists(path.read_text(encoding="utf-8")):
            pytest.fail(f"{rel} lists no engines any more: remove it from NOT_YET")

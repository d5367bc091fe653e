"""No import circles among the project's own modules, and no stage importing a later one.

Every module of ``causalab_mini`` and ``pytest_causalab`` is parsed with ``ast`` (nothing is
imported), and each ``import`` in it — at module level or inside a function, relative ones
resolved — becomes an edge to the project module it names. A circle in that graph is two
modules that each need the other: neither can be read, tested or moved alone, and which
one finishes importing first depends on who imported whom (a function-level import only
postpones the circle to the first call; it does not remove it).

The package's folders are the pipeline's stages, in order: ``document/`` (the front end: no
model) → ``model/`` (a checkpoint without its weights: where it is, its config, tokenizer and
facts) → ``plan/`` (the compiler) → ``engine/`` → ``running/`` → ``outputs/`` (what a run
leaves); ``cache/`` serves a run beside them. A stage may import the stages before it and the
shared modules at the package's top, never a later stage (``LATER``): each can then be read,
tested and changed knowing only what comes before it.

Two kinds of ``import`` are not edges, on purpose:

* one under ``if TYPE_CHECKING:`` — it never runs; it only names types for annotations;
* the implicit import of a module's own parent packages — every module has it, so it says
  nothing about which module depends on which.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paths import REPO

ROOT = REPO
PACKAGES = ("causalab_mini", "pytest_causalab")

# Circles that exist today and are someone's work in progress: each is one elementary circle,
# a tuple of modules starting at its alphabetically first one, as the failure message prints it,
# e.g. ("causalab_mini.api", "causalab_mini.document.read"). Empty it as they are broken;
# test_known_circles_still_exist fails on an entry that is already gone. Empty today: no
# circle remains (checked with the document front end, cli.py and pytest_causalab mid-edit).
KNOWN: set[tuple[str, ...]] = set()


# --------------------------------------------------------------------------- the graph


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under the packages."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, at any depth, except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)  # the else branch does run
            continue
        stack.extend(ast.iter_child_nodes(node))


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name ``from <base> import …`` refers to, relative levels resolved."""
    if not node.level:
        return node.module or ""
    # A package's own module is its __init__: ``from . import x`` there means the package itself.
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _owner(name: str, modules) -> str | None:
    """The project module ``name`` lives in: itself, or the nearest enclosing project module."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (never itself)."""
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        targets = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = _base(module, is_package, node)
                # ``from pkg import x`` imports the submodule pkg.x when there is one, else the
                # name x out of pkg itself.
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for name in names:
                owner = _owner(name, files)
                if owner is not None and owner != module:
                    targets.add(owner)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Every elementary circle, each as a tuple starting at its alphabetically first module.

    From each start, only modules that sort after it are walked, so each circle is found
    once, from its smallest member. The project graph is small and nearly acyclic, so
    this plain search is enough.
    """
    found = set()
    for start in sorted(graph):
        stack = [(start, (start,))]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    found.add(path)
                elif nxt > start and nxt not in path:
                    stack.append((nxt, path + (nxt,)))
    return found


def chain(circle: tuple[str, ...]) -> str:
    return " -> ".join((*circle, circle[0]))


# --------------------------------------------------------------------------- the project


@pytest.fixture(scope="module")
def project_circles():
    return circles(import_graph(module_files(ROOT)))


def test_no_import_circles(project_circles):
    new = sorted(project_circles - KNOWN)
    assert not new, "import circles (a function-level import counts):\n  " + "\n  ".join(map(chain, new))


def test_known_circles_still_exist(project_circles):
    gone = sorted(KNOWN - project_circles)
    assert not gone, ("these KNOWN circles are broken now; remove them from KNOWN:\n  "
                      + "\n  ".join(map(chain, gone)))


def test_the_graph_covers_both_packages_and_sees_every_kind_of_import():
    files = module_files(ROOT)
    for package in PACKAGES:
        assert package in files  # its __init__
    graph = import_graph(files)
    assert graph.keys() == files.keys()
    assert "causalab_mini.layouts" in graph["causalab_mini.vocab"]  # inside a function
    assert "causalab_mini.document.rules" in graph["causalab_mini.document.spec"]  # relative, module level
    # The two circles broken by moving what they shared: each pair now depends one way.
    assert "causalab_mini.document.spec" not in graph["causalab_mini.document.rules"]  # only under TYPE_CHECKING
    assert {"causalab_mini.engine.fit", "causalab_mini.engine.progress"} <= graph["causalab_mini.engine.steps"]
    assert graph["causalab_mini.engine.fit"] & {"causalab_mini.engine.steps"} == set()
    assert "causalab_mini.engine.progress" in graph["causalab_mini.engine.fit"]


# --------------------------------------------------------------------------- the stages

# Each stage's folder -> the later stages it may not import (at module level or in a function).
LATER: dict[str, tuple[str, ...]] = {
    "causalab_mini.document": ("causalab_mini.model", "causalab_mini.plan", "causalab_mini.engine",
                               "causalab_mini.running", "causalab_mini.outputs", "causalab_mini.cache"),
    "causalab_mini.model": ("causalab_mini.plan", "causalab_mini.engine", "causalab_mini.running",
                            "causalab_mini.outputs", "causalab_mini.cache"),
    "causalab_mini.plan": ("causalab_mini.engine", "causalab_mini.running", "causalab_mini.outputs",
                           "causalab_mini.cache"),
    "causalab_mini.engine": ("causalab_mini.running", "causalab_mini.outputs", "causalab_mini.cache"),
    "causalab_mini.outputs": ("causalab_mini.running",),
}


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def upward(graph: dict[str, set[str]], later=LATER) -> list[tuple[str, str]]:
    """Every (module, what it imports) where a stage's module imports a later stage's."""
    return sorted((module, target) for module, targets in graph.items() for target in targets
                  for stage, after in later.items()
                  if _inside(module, stage) and any(_inside(target, a) for a in after))


def test_no_stage_imports_a_later_one():
    found = upward(import_graph(module_files(ROOT)))
    assert not found, "a stage imports a later stage (a function-level import counts):\n  " + "\n  ".join(
        f"{module} -> {target}" for module, target in found)


def test_every_stage_named_is_a_package():
    files = module_files(ROOT)
    named = set(LATER) | {a for after in LATER.values() for a in after}
    missing = sorted(n for n in named if n not in files)
    assert not missing, f"stages in LATER that are no package (the check would pass, empty): {missing}"


# --------------------------------------------------------------------------- the tool itself


def _package(tmp_path: Path, sources: dict[str, str]) -> dict[str, Path]:
    for rel, text in sources.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return module_files(tmp_path, packages=("pkg",))


def test_a_function_level_relative_import_closes_a_circle(tmp_path):
    files = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/a.py": "from . import b\n",
        "pkg/sub/b.py": "def later():\n    from ..c import thing\n",
        "pkg/c.py": "import pkg.sub.a as a\nthing = 1\n",
        "pkg/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import thing\n",
    })
    graph = import_graph(files)
    assert graph["pkg.sub.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.sub.a"}
    assert graph["pkg.d"] == set()  # annotations only: never runs
    assert circles(graph) == {("pkg.c", "pkg.sub.a", "pkg.sub.b")}
    assert chain(("pkg.c", "pkg.sub.a", "pkg.sub.b")) == "pkg.c -> pkg.sub.a -> pkg.sub.b -> pkg.c"


def test_a_function_level_import_of_a_later_stage_is_upward(tmp_path):
    files = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/early/__init__.py": "",
        "pkg/early/a.py": "def later():\n    from ..late import b\n",
        "pkg/early/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..late.b import thing\n",
        "pkg/late/__init__.py": "",
        "pkg/late/b.py": "from ..early import a\nthing = 1\n",
    })
    graph = import_graph(files)
    assert upward(graph, {"pkg.early": ("pkg.late",)}) == [("pkg.early.a", "pkg.late.b")]
    assert upward(graph, {"pkg.late": ("pkg.early",)}) == [("pkg.late.b", "pkg.early.a")]


def test_importing_a_name_from_a_package_init_is_an_edge_to_the_package(tmp_path):
    files = _package(tmp_path, {
        "pkg/__init__.py": "from .a import helper\nVALUE = 1\n",
        "pkg/a.py": "def helper():\n    from pkg import VALUE\n    return VALUE\n",
    })
    graph = import_graph(files)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg"}}
    assert circles(graph) == {("pkg", "pkg.a")}


# --------------------------------------------------------------------------- the plugin's reach

# What the plugin may import of the library: the names of its front door and the modules the
# front door documents as public. Anything else is the library's inside, free to change.
PUBLIC_MODULES = {f"causalab_mini.{m}" for m in ("vocab", "shapes", "errors", "report", "cache", "checks", "names",
                                                 "files", "extensions", "metric_kinds")}


def _library_imports(path: Path):
    """(line, what) for every import of causalab_mini in a file: a module, or module:name."""
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "causalab_mini":
                    yield node.lineno, alias.name
        elif node.level == 0 and (node.module or "").split(".")[0] == "causalab_mini":
            for alias in node.names:
                yield node.lineno, f"{node.module}:{alias.name}"


def test_the_plugin_imports_only_the_public_api():
    import causalab_mini

    public = set(causalab_mini.__all__)
    offending = []
    for name, path in module_files(ROOT, ("pytest_causalab",)).items():
        for line, what in _library_imports(path):
            module, _, attr = what.partition(":")
            ok = (module == "causalab_mini" and (not attr or attr in public
                                                 or f"causalab_mini.{attr}" in PUBLIC_MODULES)
                  or module in PUBLIC_MODULES)
            if not ok:
                offending.append(f"{path.relative_to(ROOT)}:{line}: {what.replace(':', ' import ')}")
    assert not offending, "the plugin reaches past causalab_mini's public API:\n" + "\n".join(offending)


def test_the_public_api_resolves_every_name():
    import causalab_mini

    for name in causalab_mini.__all__:
        assert getattr(causalab_mini, name) is not None, name
    assert sorted(set(causalab_mini.__all__)) == sorted(causalab_mini.__all__), "a name listed twice"

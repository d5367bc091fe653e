"""Every refusal says what to write or do instead: no typed error is raised with a path and a
problem alone. Read from the source, every constructor call of every error class in errors.py."""
from __future__ import annotations

import ast
import inspect

from paths import REPO

import causalab_mini.errors as errors


def _error_classes() -> set[str]:
    return {name for name, obj in vars(errors).items()
            if inspect.isclass(obj) and issubclass(obj, errors.CausalabError)}


def test_every_refusal_gives_a_fix():
    classes = _error_classes()
    without = []
    for path in sorted([*(REPO / "causalab_mini").rglob("*.py"), *(REPO / "pytest_causalab").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes
                    and not any(isinstance(a, ast.Starred) for a in node.args)
                    and len(node.args) < 3 and not any(k.arg in ("fix", None) for k in node.keywords)):
                without.append(f"{path.relative_to(REPO)}:{node.lineno} {node.func.id}")
    assert without == []

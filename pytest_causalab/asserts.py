"""Assertion helpers for ordinary tests that reach a document's results through the fixture.

    from pytest_causalab.asserts import assert_result

    def test_layer0_patch_keeps_the_base_answer(causalab):
        point = causalab.run("documents/v2/patching.causalab.json").point()
        assert_result(point, "iia", mean=("<=", 0.25), eligible=1.0)

A threshold is a number (approximately equal, within ``rtol``/``atol``), a pair
``(op, x)`` with op one of ``>``, ``>=``, ``<``, ``<=``, ``approx``, a triple
``("between", low, high)``, or the JSON form ``{">": 0.8}``. The same
evaluation as a document's ``header.expect``, so the failure is the same table.
Registered for assertion rewriting by the plugin before this module is imported.
"""
from __future__ import annotations

from typing import Any, Optional

import causalab_mini

from .checks import compare_rows, evaluate, render


def _comparison(value: Any) -> Any:
    if isinstance(value, tuple):
        op, *args = value
        if op == "between":
            return {"between": list(args[0]) if len(args) == 1 else list(args)}
        (x,) = args
        return {op: x}
    return value


def expectation(name: str, *, step: Optional[str] = None, rtol: Optional[float] = None,
                atol: Optional[float] = None, **aggregates: Any) -> causalab_mini.Expectation:
    """An ``Expectation`` from keyword arguments: ``expectation("iia", mean=(">", 0.8))``."""
    raw: dict = {"result": name, **{k: _comparison(v) for k, v in aggregates.items() if v is not None}}
    if step is not None:
        raw["step"] = step
    if rtol is not None:
        raw["rtol"] = rtol
    if atol is not None:
        raw["atol"] = atol
    try:
        return causalab_mini.expectation(raw, where="assert_result")
    except causalab_mini.DocumentError as err:
        raise ValueError(str(err)) from None


def assert_result(point, name: str, *, step: Optional[str] = None, rtol: Optional[float] = None,
                  atol: Optional[float] = None, mean: Any = None, min: Any = None, max: Any = None,
                  all: Any = None, eligible: Any = None) -> None:
    """Assert aggregates of ``point``'s metric ``name``; fails with the table of what missed."""
    __tracebackhide__ = True
    exp = expectation(name, step=step, rtol=rtol, atol=atol, mean=mean, min=min, max=max, all=all,
                      eligible=eligible)
    checks = evaluate([exp], None, (), point.lookup(), label=f"{point.name} [{point.engine}]")
    failed = [c for c in checks if not c.ok]
    assert not failed, "\n" + render(failed)


def assert_same(point, other, name: str, *, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Assert two points (two engines, two documents) agree row by row on metric ``name``."""
    __tracebackhide__ = True
    checks = compare_rows(point.name, name, f"{point.engine}", point.result(name).pairs(),
                                 other.result(name).pairs(), rtol, atol)
    assert not checks, "\n" + render(checks)

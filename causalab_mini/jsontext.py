"""JSON text as documents and data rows are read: parsed, then held to what the project can use.

Shared by ``document.read.read`` and ``data``'s JSON Lines reader, which wrap a ``Problem``
in their own typed refusal. Python's ``json`` accepts things that fail later and far
away: nesting deep enough to exhaust the stack, integers past the interpreter's
4,300-digit conversion limit, ``"\\ud800"`` escapes that decode to lone surrogates,
which no UTF-8 file or tokenizer can hold, ``NaN`` / ``Infinity`` literals and numbers past
a float's range (``1e400`` reads as infinity), which would pass every field's bounds and
surface only once the model has run, and an object that writes one key twice, of which
``json`` silently keeps the last. Each is refused here, where the file is read, naming the
field's path. No field of a document or a row means infinity: an open bound is written
by leaving the bound out.
"""
from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 64  # objects and arrays inside each other; a document is about six deep


class Problem(ValueError):
    """What is wrong with the text, and where (a JSON path like ``steps.score.rows``, or a line)."""

    def __init__(self, problem: str, where: str = "", fix: str = "", syntax=None):
        super().__init__(problem)
        self.problem, self.where, self.fix = problem, where, fix
        self.syntax = syntax  # the json.JSONDecodeError, when the text is not JSON at all


class _Repeated(dict):
    """An object that wrote ``repeated`` twice: marked while parsing, refused by ``check``, which
    knows where in the document the object is."""

    repeated: str = ""


def _object(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set = set()
    for key, _ in pairs:
        if key in seen:
            break
        seen.add(key)
    marked = _Repeated(obj)
    marked.repeated = key
    return marked


def loads(text: str) -> Any:
    try:
        value = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as err:
        raise Problem(f"not valid JSON: {err.msg}", f"{err.lineno}:{err.colno}",
                      "fix the syntax at that line and column", syntax=err) from None
    except RecursionError:
        raise Problem(f"nested deeper than {MAX_DEPTH} levels", "", "flatten the structure") from None
    except ValueError as err:  # an integer past the interpreter's digit limit
        raise Problem(f"a value cannot be read ({str(err).split(';')[0]})", "",
                      "write numbers of ordinary size") from None
    check(value)
    return value


def check(value: Any) -> None:
    """Refuse nesting over ``MAX_DEPTH``, strings that are not Unicode text (lone surrogates),
    numbers that are not finite and objects that repeat a key (as ``loads`` parses them).
    Also run on a document given as a Python dict, which no JSON parser has seen."""
    stack = [(value, (), 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            shown = _spelled(path[:6]) + f"… ({len(path)} deep)"
            raise Problem(f"nested deeper than {MAX_DEPTH} levels", shown, "flatten the structure")
        if isinstance(node, str):
            _text(node, path)
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise Problem(_not_finite(node), _spelled(path),
                              "write a finite number (JSON has no NaN or Infinity; leave a bound out "
                              "rather than make it infinite)")
        elif isinstance(node, dict):
            if isinstance(node, _Repeated):
                which = "this object" if path else "the top-level object"
                raise Problem(f"{which} writes the key {node.repeated!r} twice, and JSON would "
                              "silently keep only the last one", _spelled(path),
                              "write each key once, with the value you mean")
            for key, child in node.items():
                if isinstance(key, str):
                    _text(key, path + (key,))
                stack.append((child, path + (key,), depth + 1))
        elif isinstance(node, list):
            stack.extend((child, path + (i,), depth + 1) for i, child in enumerate(node))


def _text(s: str, path: tuple) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as err:
        raise Problem(f"a string holds {s[err.start]!r}, half of a UTF-16 pair (a lone surrogate), "
                      "which is not text", _spelled(path), "write the character itself, or its full pair") from None


def _not_finite(x: float) -> str:
    if math.isnan(x):
        return "the number is NaN, which is not a number any field can hold"
    sign = "-" if x < 0 else ""
    return (f"the number is {'minus ' if sign else ''}infinity ({sign}Infinity, or a literal past a "
            f"float's range such as {sign}1e400), which no field can hold")


def _spelled(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def array_as_tuple(value: Any) -> Any:
    """A JSON array where a model field is a fixed-length tuple (a ``(weight, term)`` pair,
    ``[low, high]``): pydantic's strict mode takes only a real tuple there, and JSON has none."""
    return tuple(value) if isinstance(value, list) else value

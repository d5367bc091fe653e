"""JSON text indented by one space, exactly as ``json.dumps(value, indent=1, ensure_ascii=False,
allow_nan=False)`` writes it, in a fraction of its time.

Every file a run writes is that text (``formats.json_bytes``). The standard library's C encoder
takes no indent, so with one ``json.dumps`` falls back to its pure-Python generator, which made
the bytes of a 1,000-point sweep's metric files cost more than committing them. This writer
walks the value once into a list of strings, with the standard library's own string encoder
and the same number spellings (``int.__repr__``, ``float.__repr__``), so the bytes are the same;
``tests/test_jsonindent.py`` holds it to ``json.dumps`` on drawn values.
"""
from __future__ import annotations

import json.encoder
import math
from typing import Any

_string = json.encoder.encode_basestring  # the C encoder where there is one, as json.dumps uses


def dumps(value: Any) -> str:
    """``json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False)``; a ValueError for a NaN
    or an infinity, a TypeError for what JSON cannot hold, as it raises them."""
    parts: list[str] = []
    _write(value, "\n", parts, {})
    return "".join(parts)


def _float(x: float) -> str:
    if not math.isfinite(x):
        raise ValueError(f"Out of range float values are not JSON compliant: {x!r}")
    return float.__repr__(x)


def _key(key: Any) -> str:
    """A key as json.dumps writes it: a string, or a float, bool, None or int spelled as one."""
    if isinstance(key, str):
        return _string(key)
    if isinstance(key, float):
        return _string(_float(key))
    if key is True or key is False or key is None:
        return _string({True: "true", False: "false", None: "null"}[key])
    if isinstance(key, int):
        return _string(int.__repr__(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {key.__class__.__name__}")


# Exact types to their spelling: one dict lookup for the leaves that are nearly all of a run's
# files; a subclass (an IntEnum, a float subclass) takes the isinstance path below, as in json.
_LEAVES = {str: _string, int: int.__repr__, float: _float, bool: lambda b: "true" if b else "false",
           type(None): lambda _: "null"}


def _write(value: Any, newline: str, parts: list, heads: dict) -> None:
    """``heads``: per indentation, each key's text with what goes before it ("{" or "," and the
    line's indent) and the ": " after — made once per call of ``dumps``, since a run's files repeat
    the same few keys on every row."""
    leaf = _LEAVES.get(type(value))
    if leaf is not None:
        parts.append(leaf(value))
    elif isinstance(value, (list, tuple)):
        if not value:
            parts.append("[]")
            return
        inner = newline + " "
        between, rest = "[" + inner, "," + inner
        for item in value:
            leaf = _LEAVES.get(type(item))
            if leaf is not None:
                parts.append(between + leaf(item))
            else:
                parts.append(between)
                _write(item, inner, parts, heads)
            between = rest
        parts.append(newline + "]")
    elif isinstance(value, dict):
        if not value:
            parts.append("{}")
            return
        inner = newline + " "
        known = heads.get(inner)
        if known is None:
            known = heads[inner] = ({}, {})  # (the first key's heads, every later key's)
        first, later = known
        table, opening = first, "{"
        for key, item in value.items():
            if type(key) is str:
                head = table.get(key)
                if head is None:
                    head = table[key] = opening + inner + _string(key) + ": "
            else:  # not cached: 1, 1.0 and True are one dict key, and three spellings
                head = opening + inner + _key(key) + ": "
            leaf = _LEAVES.get(type(item))
            if leaf is not None:
                parts.append(head + leaf(item))
            else:
                parts.append(head)
                _write(item, inner, parts, heads)
            table, opening = later, ","
        parts.append(newline + "}")
    else:
        _write_subclass(value, newline, parts, heads)


def _write_subclass(value: Any, newline: str, parts: list, heads: dict) -> None:
    """A value of no exact JSON type, checked in json's own order (str, None, True, False, int,
    float): a subclass of one is spelled by its base's rule."""
    if isinstance(value, str):
        parts.append(_string(value))
    elif isinstance(value, int):
        parts.append(int.__repr__(value))
    elif isinstance(value, float):
        parts.append(_float(value))
    elif isinstance(value, (list, tuple, dict)):
        _write(list(value) if not isinstance(value, dict) else dict(value), newline, parts, heads)
    else:
        raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")

"""pydantic's validation errors as ``DocumentError``s naming the document path.

Separate from ``spec.py`` because it is a translation, not a shape: it reads a
``ValidationError`` (and the document that raised it) and says where in the document
the problem is and how to fix it, leading with the name a misspelling likely meant.
To find the keys an object takes it walks any model's field annotations, so every
document model (``Spec``, ``ProtocolDocument``, …) reports through it without this
module importing them.
"""
from __future__ import annotations

import json
import re
import types
import typing
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ValidationError

from ..errors import DocumentError
from ..suggest import close_matches, join, phrase


_FIXES = {
    "extra_forbidden": "remove it, or check its spelling against `causalab-mini schema`",
    "missing": "add it",
    "literal_error": "use one of the values listed",
    "union_tag_invalid": 'a step\'s "kind" is "observe", "fit" or "weights"',
}


# Strict types: what JSON value each pydantic type error wanted, to say so with the value given.
_TYPE_FIXES = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
               "string_type": "a string", "list_type": "an array", "tuple_type": "an array",
               "dict_type": "an object", "model_type": "an object"}


def _type_error(kind: str, given: Any) -> tuple[str, str]:
    wanted = _TYPE_FIXES[kind]
    shown = json.dumps(given) if isinstance(given, (str, bool, int, float, type(None))) else \
        ("an array" if isinstance(given, (list, tuple)) else "an object")
    msg = f"expected {wanted}, not {shown[:60]}"
    if kind in ("int_type", "float_type") and isinstance(given, str):
        try:
            float(given)
            return msg, f"write {given.strip()} without quotes"
        except ValueError:
            pass
    if kind == "int_type" and isinstance(given, float) and given.is_integer():
        return msg, f"write {int(given)}"
    return msg, f"write {wanted}"


def document_error(err: ValidationError, prefix: str = "", raw: Any = None,
                   model: Optional[type] = None) -> DocumentError:
    """pydantic's ValidationError as one DocumentError at the first error's document path.

    ``raw`` is the document validated: with it, a union member's name in a location is
    dropped only where the document has no such key, so a step *called* ``fit`` or
    ``observe`` keeps its name in the path.

    A misspelt name leads its fix with the name it likely meant (``suggest.did_you_mean``):
    an unknown key, the keys its object takes (read from ``model``, the class validated —
    found by the error's title when not given — walking the error's location); a value
    outside a closed vocabulary (a component, a mechanism, a metric or featurizer kind), the
    values listed; a step's kind, the kinds; a validator that raised a
    ``suggest.HintedValueError`` (a position's key, a mechanism's parameter), its own fix.
    An unknown key that is the misspelling of a required key also reported missing is
    reported first: it is the cause, and the missing key its consequence.
    """
    root = model if model is not None else _model_named(err.title)
    lines = []  # (path, problem, fix, the names suggested, the document location)
    missing = set()
    for e in err.errors():
        loc = _document_loc(e["loc"], raw)
        path = ".".join(filter(None, [prefix, *loc]))
        msg = e["msg"].removeprefix("Value error, ")
        fix = _FIXES.get(e["type"], "")
        ctx = e.get("ctx") or {}
        meant: list[str] = []
        if e["type"] in _TYPE_FIXES:
            msg, fix = _type_error(e["type"], e.get("input"))
        if e["type"] == "missing":
            missing.add(tuple(loc))
        elif e["type"] == "extra_forbidden":
            msg = f"unknown key {loc[-1]!r}" if loc else "unknown key"
            if loc:
                here = _raw_at(raw, e["loc"][:-1])
                meant = close_matches(e["loc"][-1], [k for k in _keys_at(root, e["loc"][:-1])
                                                     if not (isinstance(here, dict) and k in here)])
        elif e["type"] == "literal_error":
            meant = close_matches(e.get("input"), _listed(ctx.get("expected", "")))
        elif e["type"] == "union_tag_invalid":
            meant = close_matches(ctx.get("tag"), _listed(ctx.get("expected_tags", "")))
        elif e["type"] == "value_error":
            fix = getattr(ctx.get("error"), "fix", "") or fix
        lines.append((path, msg, join(phrase(meant), fix), meant, loc))
    for i, (_, _, _, meant, loc) in enumerate(lines):
        if loc and any((*loc[:-1], name) in missing for name in meant):
            lines.insert(0, lines.pop(i))  # the misspelt key first: the missing one follows from it
            break
    path, msg, fix = lines[0][:3]
    if len(lines) > 1:
        msg += "".join(f"\n  also {p}: {m}" + (f"; {f}" if f else "") for p, m, f, _, _ in lines[1:])
    return DocumentError(path, msg, fix)


def _listed(expected: str) -> list[str]:
    """The values pydantic lists in a literal or tag error (``"'a', 'b' or 'c'"``)."""
    return re.findall(r"'([^']*)'", str(expected))


def _model_named(title: str) -> Optional[type]:
    """The project's pydantic model a ValidationError's title names (Spec, ProtocolDocument, …)."""
    found, stack = [], [BaseModel]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__name__ == title and cls.__module__.startswith("causalab_mini."):
            found.append(cls)
    return found[0] if len(set(found)) == 1 else None


def _raw_at(raw: Any, loc: tuple) -> Any:
    """What the document holds at a pydantic location (union member names skipped), or None."""
    here = raw
    for part in loc:
        if isinstance(here, dict) and part in here:
            here = here[part]
        elif isinstance(here, list) and isinstance(part, int) and 0 <= part < len(here):
            here = here[part]
        elif isinstance(part, str) and part in _TAG_NOISE:
            continue
        else:
            return None
    return here


def _keys_at(model: Optional[type], loc: tuple) -> list[str]:
    """The keys the object at ``loc`` takes, when it is a pydantic model; [] when unknown.

    Walks the field annotations from ``model``: a model's field, a dict's value, a list's
    item, and a union's member by the name pydantic put in the location (its tag or class).
    """
    tp: Any = model
    for part in loc:
        tp = _step(tp, part)
        if tp is None:
            return []
    tp = _only_member(tp)
    if not (isinstance(tp, type) and issubclass(tp, BaseModel)):
        return []
    keys = []
    for name, field in tp.model_fields.items():
        if field.alias:
            keys.append(field.alias)
        if not field.alias or tp.model_config.get("populate_by_name"):
            keys.append(name)
    return keys


def _strip(tp: Any) -> Any:
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _members(tp: Any) -> list:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return [_strip(a) for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def _only_member(tp: Any) -> Any:
    members = _members(_strip(tp))
    return members[0] if len(members) == 1 else tp


def _tagged(member: Any, part: Any) -> bool:
    """Is ``part`` the name pydantic gives union member ``member`` in a location?"""
    if not isinstance(part, str):
        return False
    if getattr(member, "__name__", None) == part:
        return True
    if isinstance(member, type) and issubclass(member, BaseModel):
        return any(typing.get_origin(f.annotation) is Literal and part in typing.get_args(f.annotation)
                   for f in member.model_fields.values())
    return False


def _step(tp: Any, part: Any) -> Any:
    tp = _strip(tp)
    members = _members(tp)
    if len(members) > 1:
        chosen = [m for m in members if _tagged(m, part)]
        return chosen[0] if chosen else None  # the location names the member it tried
    tp = members[0]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        for name, field in tp.model_fields.items():
            if part in (name, field.alias):
                return field.annotation
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict and len(args) == 2:
        return args[1]
    if origin in (list, tuple) and args and isinstance(part, int):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return args[part] if part < len(args) else None
        return args[0]
    return None


_MISSING = object()
# pydantic names the union member it tried inside a location; a document path does not.
_TAG_NOISE = {"observe", "fit", "weights", "ObserveStep", "FitStep", "WeightsStep",
              "Ref", "float", "str", "function-before[_output(), Output]", "int"}


def _document_loc(loc: tuple, raw: Any) -> list[str]:
    """A pydantic location as document path parts, without the union members it tried."""
    out: list[str] = []
    here = raw if raw is not None else _MISSING
    for part in loc:
        if isinstance(part, str) and part in _TAG_NOISE:
            present = isinstance(here, dict) and part in here
            if not present:
                continue  # pydantic's name for the union member, not a key of the document
        out.append(str(part))
        if isinstance(here, dict):
            here = here.get(part, _MISSING) if isinstance(part, str) else _MISSING
        elif isinstance(here, list) and isinstance(part, int) and 0 <= part < len(here):
            here = here[part]
        else:
            here = _MISSING
    return out

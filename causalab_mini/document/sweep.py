"""Sweep lowering: one swept document becomes its points, on the raw JSON.

Spec: shared/spec/sweeps.md and "Sweeps" in reads-writes-metrics.md. This runs
during pytest collection, so it is stdlib only and touches nothing but dicts,
lists and scalars. Every point is an ordinary document; nothing downstream
knows a sweep happened.

Decisions where the spec is silent:

* A wrapper needs the ``sweep`` key; ``{"as": "x"}`` alone is an ordinary object.
  An object holding ``sweep`` beside any key other than ``as`` is ordinary too
  (it is walked like any object), except ``at_once`` (a run option here:
  ``--at-once``) and ``cohorts`` (not implemented), which are refused by name
  rather than silently ignored.
* Wrappers sharing an ``as`` name need equally many values, not equal values:
  reading at p and writing at p+1 is a legitimate pairing. The axis's values,
  and so the point names, are those of its first wrapper in reading order.
* Unnamed axes with the same label (two bare ``pos`` sweeps) are allowed; they
  are the N-squared cross product the spec warns about, and their names stay
  unique. Only an actual clash of point names is refused.
* Range bounds must be real ints (``True`` and ``16.0`` are refused), as Python.
* A point name is a directory name, so besides ``/``, ``\\`` and NUL a name over
  255 bytes (a long compact-JSON list) is refused here rather than by the OS
  mid-run. An ``as`` name may not hold ``=`` or ``,``, the name's own syntax.
* A wrapper whose path has no string key (the document itself) is refused: a
  point has no field name to be called by.
"""
from __future__ import annotations

import copy
import itertools
import json
import math
from dataclasses import dataclass, field

from causalab_mini.errors import SweepError, join_path
from causalab_mini.names import label

_REFUSED_OPTIONS = ("at_once", "cohorts")  # protocol sweep options a document may not carry here
_REFUSALS = {
    # How many points share one model call changes how a run computes, not what the experiment is
    # (a document's digest must not move with it): a run option, not a field of the document.
    "at_once": ("'at_once' is how many points a run stacks into one model call, a choice of the run "
                "here, not of the document",
                "drop it from the sweep and run with causalab-mini run --at-once N, "
                "causalab_mini.run(..., at_once=N) or pytest --causalab-at-once=N"),
    "cohorts": ("'cohorts' is a protocol sweep option causalab-mini does not implement",
                "write a plain {\"sweep\": [...]} (with \"as\" to tie fields together), "
                "or run the points as separate documents"),
}
_FORBIDDEN_IN_NAME = ("/", "\\", "\0")
_MAX_NAME_BYTES = 255  # one path component on every common filesystem


@dataclass(frozen=True)
class Axis:
    name: str  # the "as" name, else the last string key on the path
    paths: tuple[str, ...]  # dotted path of every wrapper moving on this axis
    values: tuple  # the first wrapper's values, ranges expanded
    # Values of each wrapper, aligned with ``paths`` (same length as ``values``).
    path_values: tuple[tuple, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class Point:
    name: str | None  # None for an unswept document, else "layers=3,pos=-1"
    document: dict  # deep copy, every wrapper replaced by its value here (lower(share=True): see there)
    coords: tuple[tuple[str, object], ...]  # ((axis name, raw value), ...)


def _is_wrapper(obj) -> bool:
    return isinstance(obj, dict) and "sweep" in obj and set(obj) <= {"sweep", "as"}


def _walk(obj, path: tuple = ()):
    """Yield (key path, wrapper) in reading order; do not descend into wrappers."""
    if isinstance(obj, dict):
        if "sweep" in obj:
            for option in _REFUSED_OPTIONS:
                if option in obj:
                    raise SweepError(join_path(*path), *_REFUSALS[option])
            if _is_wrapper(obj):
                yield path, obj
                return
        for key, value in obj.items():
            yield from _walk(value, path + (key,))
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            yield from _walk(value, path + (index,))


def find_wrappers(raw) -> list[tuple[str, dict]]:
    """Every wrapper in ``raw`` as (dotted path, wrapper), in reading order."""
    return [(join_path(*p), w) for p, w in _walk(raw)]


def _values(key_path: tuple, wrapper: dict) -> tuple:
    """The wrapper's values, ranges expanded; refuses every malformed spelling."""
    path, spec = join_path(*key_path), wrapper["sweep"]
    if isinstance(spec, dict) and set(spec) == {"range"}:
        bounds = spec["range"]
        if not (
            isinstance(bounds, list)
            and len(bounds) in (2, 3)
            and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
        ):
            raise SweepError(path, f"range {json.dumps(bounds)} is not [start, stop] or [start, stop, step] in integers",
                             "write e.g. {\"range\": [0, 16]} for 0..15, as Python's range")
        if len(bounds) == 3 and bounds[2] == 0:
            raise SweepError(path, "range step is 0", "use a positive or negative step")
        start, stop, step = (*bounds, 1) if len(bounds) == 2 else bounds
        count = max(0, -((start - stop) // step))  # range's length, computed: len() overflows past 2**63
        if count > MAX_POINTS:
            raise SweepError(path, f"range {json.dumps(bounds)} has {count} values, over the limit of "
                             f"{MAX_POINTS} points a document may have", "sweep a narrower range, or a step")
        values = tuple(range(*bounds))
        if not values:
            raise SweepError(path, f"range {json.dumps(bounds)} is empty",
                             "ranges are half-open like Python's; check start, stop and the step's sign")
        return values
    if isinstance(spec, list):
        if not spec:
            raise SweepError(path, "sweep has no values", "give at least one value, or write the field unswept")
        for i, value in enumerate(spec):
            for inner, _ in _walk(value, key_path + ("sweep", i)):
                where = join_path(*inner[len(key_path):])
                raise SweepError(path, f"sweep value {i} holds another sweep wrapper (at {where})",
                                 "sweeps do not nest; put the inner sweep on its own field, or list every combination")
        return tuple(copy.deepcopy(spec))
    if _is_wrapper(spec):
        raise SweepError(path, "sweep holds another sweep wrapper",
                         "sweeps do not nest; write one {\"sweep\": [...]} with all the values")
    raise SweepError(path, f"sweep must be a list of values or {{\"range\": [...]}}, not {json.dumps(spec)[:60]}",
                     "write {\"sweep\": [a, b, c]} or {\"sweep\": {\"range\": [start, stop]}}")


def _axis_name(key_path: tuple, wrapper: dict) -> str:
    path = join_path(*key_path)
    if "as" in wrapper:
        name = wrapper["as"]
        if not isinstance(name, str) or not name:
            raise SweepError(path, f"\"as\" must be a non-empty string, not {json.dumps(name)}",
                             "name the axis, e.g. \"as\": \"pos\"")
        bad = [c for c in ("=", ",", *_FORBIDDEN_IN_NAME) if c in name]
        if bad:
            raise SweepError(path, f"axis name {name!r} contains {bad[0]!r}",
                             "axis names appear in point names and directories; use letters, digits, '_' or '-'")
        return name
    keys = [k for k in key_path if isinstance(k, str)]
    if not keys:
        raise SweepError(path, "the document itself is a sweep wrapper", "sweep a field inside the document")
    return keys[-1]


def _check_names(axis: Axis) -> None:
    """Each value's name segment must be a usable, distinct directory name."""
    seen: dict[str, int] = {}
    for i, value in enumerate(axis.values):
        segment = f"{axis.name}={label(value)}"
        bad = [c for c in _FORBIDDEN_IN_NAME if c in segment]
        if bad:
            raise SweepError(axis.paths[0], f"point name {segment!r} contains {bad[0]!r}, and point names are directory names",
                             "sweep values whose spelling has no '/', '\\' or NUL, or run separate documents")
        size = len(segment.encode())
        if size > _MAX_NAME_BYTES:
            raise SweepError(axis.paths[0], f"point name {segment[:40]!r}... is {size} bytes, over a directory name's {_MAX_NAME_BYTES}",
                             "sweep shorter values, or run separate documents")
        if segment in seen:
            raise SweepError(axis.paths[0], f"values {seen[segment]} and {i} are both named {segment!r}",
                             "each point needs its own name and directory; drop the repeat or spell the values apart")
        seen[segment] = i


def _collect(raw) -> list[tuple[Axis, list[tuple]]]:
    """Axes in order of first appearance, each with its wrappers' key paths."""
    groups: dict[tuple, tuple[str, list[tuple], list[tuple]]] = {}
    for key_path, wrapper in _walk(raw):
        path = join_path(*key_path)
        if key_path and key_path[0] == "model":
            # The engine loads the model once per document; every point runs on it.
            raise SweepError(path, "a point may not ask for a different model: the model is loaded once and every point runs against it",
                             "run one document per model instead of sweeping it")
        name = _axis_name(key_path, wrapper)
        values = _values(key_path, wrapper)
        # Unnamed wrappers are independent axes even when their labels coincide.
        group = ("as", name) if "as" in wrapper else ("path", key_path)
        if group not in groups:
            groups[group] = (name, [key_path], [values])
            continue
        _, key_paths, per_path = groups[group]
        if len(values) != len(per_path[0]):
            raise SweepError(path, f"axis '{name}' has {len(per_path[0])} values at {join_path(*key_paths[0])} and {len(values)} here",
                             "fields that move together need a value each per point")
        key_paths.append(key_path)
        per_path.append(values)
    result = []
    named: dict[str, Axis] = {}
    for name, key_paths, per_path in groups.values():
        axis = Axis(name, tuple(join_path(*p) for p in key_paths), per_path[0], tuple(per_path))
        _check_names(axis)
        if name in named:
            # Two axes called alike make points named "pos=-3,pos=-1", which no point(pos=...)
            # selector can tell apart: refused rather than renamed behind the author's back.
            first = named[name].paths[0]
            raise SweepError(axis.paths[0], f"this sweep and the one at {first} are two axes both named "
                             f"{name!r}, so their points cannot be told apart by name",
                             f'give this one an "as" of its own (e.g. "as": "{name}_2"), or give both '
                             'the same "as" to move them together')
        named[name] = axis
        result.append((axis, key_paths))
    return result


def axes(raw) -> list[Axis]:
    """The document's axes in order of first appearance; wrappers sharing "as" are one axis."""
    return [axis for axis, _ in _collect(raw)]


def _set(doc, key_path: tuple, value) -> None:
    target = doc
    for key in key_path[:-1]:
        target = target[key]
    target[key_path[-1]] = value  # same key, so dict order is kept


def _spine(collected) -> dict:
    """The wrappers' key paths as a tree: key -> subtree, or (axis, wrapper) where a wrapper sits."""
    tree: dict = {}
    for a, (_, key_paths) in enumerate(collected):
        for w, key_path in enumerate(key_paths):
            node = tree
            for key in key_path[:-1]:
                node = node.setdefault(key, {})
            node[key_path[-1]] = (a, w)
    return tree


def _rebuilt(node, spine: dict, index: tuple, collected):
    """``node`` copied along ``spine`` only (same keys, so dict order is kept), each wrapper
    replaced by its value at ``index``; every subtree off the spine is ``node``'s own."""
    out = node.copy() if type(node) in (dict, list) else copy.copy(node)
    for key, below in spine.items():
        if isinstance(below, tuple):
            a, w = below
            out[key] = collected[a][0].path_values[w][index[a]]
        else:
            out[key] = _rebuilt(node[key], below, index, collected)
    return out


# The most points one document may lower to: each point is a document, validated and compiled
# (milliseconds each) and, under pytest, an item. 10,000 is a 100 x 100 layer x position grid.
MAX_POINTS = 10_000


def lower(raw: dict, *, share: bool = False) -> list[Point]:
    """One Point per combination of axis values; the first axis varies slowest.

    Every point's document is a deep copy sharing nothing, with the input or another point.
    ``share=True`` (``document.read.points``, which validates them and hands them on read-only):
    a point's document is fresh only along the paths to its wrappers, which hold its values,
    and shares every other subtree with ``raw`` and the other points (a header of 2,000
    expectations is not copied once per point); the documents are equal to the copies."""
    if not isinstance(raw, dict):
        raise SweepError("", f"a document is a JSON object, not {type(raw).__name__}",
                         "write the document as one object: {\"model\": …, \"steps\": …}")
    collected = _collect(raw)
    if not collected:
        return [Point(None, copy.deepcopy(raw), ())]
    found = [axis for axis, _ in collected]
    total = math.prod(len(a.values) for a in found)
    if total > MAX_POINTS:
        sizes = " x ".join(f"{a.name} {len(a.values)}" for a in found)
        raise SweepError(found[0].paths[0], f"the sweep has {sizes} = {total} points, over the limit of "
                         f"{MAX_POINTS} points a document may have",
                         "split the document, or sweep fewer values per axis")
    labels = [[label(v) for v in a.values] for a in found]  # each value's spelling, once per axis
    spine = _spine(collected) if share else None
    points, names = [], {}
    for index in itertools.product(*(range(len(a.values)) for a in found)):
        if share:
            doc = _rebuilt(raw, spine, index, collected)
        else:
            doc = copy.deepcopy(raw)
            for (axis, key_paths), i in zip(collected, index):
                for key_path, values in zip(key_paths, axis.path_values):
                    _set(doc, key_path, copy.deepcopy(values[i]))
        coords = tuple((a.name, a.values[i]) for a, i in zip(found, index))
        name = ",".join(f"{a.name}={spelled[i]}" for a, spelled, i in zip(found, labels, index))
        if name in names:
            # Only reachable when two axes share a name and labels hold ',' or '='.
            raise SweepError(found[0].paths[0], f"two points are both named {name!r}: {names[name]} and {coords}",
                             "give one of the axes its own name with \"as\"")
        names[name] = coords
        points.append(Point(name, doc, coords))
    return points


def is_swept(raw) -> bool:
    return next(_walk(raw), None) is not None


def _may_hold_wrapper(obj) -> bool:
    """False when no object in ``obj`` has a ``sweep`` key, so ``_walk`` would find nothing: a
    lowered point (every one a sweep validates) is cleared without walking it node by node.
    Past a depth no document reaches, True, and ``_walk`` decides (and fails) as it would."""
    level, depth = [obj], 0
    while level:  # breadth first, a level at a time
        if depth > 100:
            return True
        below = []
        for node in level:
            if isinstance(node, dict):
                if "sweep" in node:
                    return True
                below.extend(node.values())
            elif isinstance(node, list):
                below.extend(node)
        level, depth = below, depth + 1
    return False


def refuse_unlowered(doc: dict, front_end: str) -> None:
    """Front ends call this: a document and a plan are each one point."""
    if not _may_hold_wrapper(doc):
        return
    for key_path, _ in _walk(doc):
        raise SweepError(join_path(*key_path), f"{front_end} got a sweep wrapper; a document and a plan are each one point",
                         "lower the sweep first (causalab_mini.document.sweep.lower) and pass one point")

"""From a file on disk to validated sweep points: the front door every verb and the plugin use.

``read`` parses JSON, and ``points`` lowers the sweep and validates each point with the front
end its shape calls for (``spec.py`` for a plan-shaped document, ``protocol.py`` for a protocol
one), expectations included. No model, no data, no torch: ``plan.compile.compile_plan`` takes
the points from here to a Plan.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from ..errors import DocumentError
from . import sweep


MAX_DOCUMENT_BYTES = 16 << 20  # a document is a few kilobytes; data belongs in datasets


def read(path: Union[str, Path]) -> dict:
    from .. import jsontext, reading

    path = Path(path)
    try:
        data = reading.read_bytes(path, MAX_DOCUMENT_BYTES)
    except reading.TooLarge as err:
        raise DocumentError(str(path), f"the document is {err}, over the limit of "
                            f"{MAX_DOCUMENT_BYTES >> 20} MiB", "keep rows in a dataset, not in the document") from None
    except reading.NotRegular as err:
        raise DocumentError(str(path), f"the document {err}", "name the .causalab.json file itself") from None
    except OSError as err:
        raise DocumentError(str(path), f"cannot read the document ({err.strerror})",
                            "check the path") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise DocumentError(str(path), f"the document is not UTF-8 ({err.reason} at byte {err.start})",
                            "save it as UTF-8") from None
    try:
        raw = jsontext.loads(text)
    except jsontext.Problem as err:
        if err.syntax is not None:  # path:line:column, as editors jump to it
            raise DocumentError(f"{path}:{err.where}", err.problem, err.fix) from None
        raise DocumentError(err.where or str(path), err.problem, err.fix) from None
    if not isinstance(raw, dict):
        raise DocumentError(str(path), "a document is a JSON object", "wrap it in { }")
    return raw


def validate_point(raw: dict):
    from .protocol import validate_point as _validate
    return _validate(raw)


@dataclass(frozen=True)
class ValidPoint:
    name: Optional[str]
    spec: Any  # document.spec.Spec
    # Read-only: a swept point's document shares every subtree its sweep does not change with the
    # document read and the other points (see points()); copy.deepcopy it to edit it.
    document: dict
    coords: tuple


def points(raw: dict) -> list[ValidPoint]:
    """Every sweep point of a document, validated (no model, no data), its expectations included:
    a result, point or axis they name that the document does not have is refused here, so
    ``validate``, ``explain`` and pytest's collection refuse the same documents alike."""
    from .. import jsontext
    from . import expect

    try:  # a dict handed over from Python (cm.read(dict)) has met no JSON reader's checks
        jsontext.check(raw)
    except jsontext.Problem as err:
        raise DocumentError(err.where or "document", err.problem, err.fix) from None
    _extensions(raw)
    found = _validated(sweep.lower(raw, share=True))
    expect.check_points(found)
    if _one_header(found):
        return _own_expectations_shared(found)
    return [_own_expectations(p) for p in found]


def _extensions(raw) -> None:
    """The installed extensions loaded (their kinds known to validation), and those the document
    names each present and usable — refused first, so a kind one provides is not reported unknown."""
    from .. import extensions

    extensions.discover()
    named = raw.get("extensions") if isinstance(raw, dict) else None
    if isinstance(named, list) and all(isinstance(n, str) for n in named):
        extensions.check_named(named)


# A point's document shares every subtree no sweep wrapper changes with the document read and with
# the other points (sweep.lower(share=True)), and a later point's validation reuses the first's
# models for those subtrees (_Reuse): reading costs what the points differ in plus the document
# once, not points x the document (a header of 2,000 expectations is validated once, not per
# point; tests/test_huge_documents.py holds the counts, benchmarks/huge_documents.py the time).
# So a point's document is read-only: copy it to edit it (the plugin's hooks get a deep copy).


def _validated(lowered) -> list[ValidPoint]:
    """Each point validated in order, refusing as validating each whole would.

    The first point is validated whole. A later point shares with it (the same objects,
    ``sweep.lower(share=True)``) every subtree no wrapper changes; each such subtree that
    validated to a model (the header and its expectations, the model, a site, a read, a
    step, ...) is handed to the point's validation as the model it became, which pydantic
    takes as it is (``_Reuse``): only what the sweep changes is validated again, and the
    rules relating fields (``Spec``'s own validator) run on every point. The refusal a later
    point gets cannot change: what is handed over validated without error, to what fresh
    validation of the same JSON gives, and no field's validation reads another model's input.
    """
    from .protocol import is_protocol

    found: list[ValidPoint] = []
    reuse: Optional[_Reuse] = None
    for p in lowered:
        doc = p.document
        if reuse is None:
            spec = validate_point(doc)
            reuse = _Reuse(doc, spec, _PROTOCOL_REUSED if is_protocol(doc) else None)
        else:
            spec = validate_point(reuse(doc) if is_protocol(doc) == reuse.protocol else doc)
        found.append(ValidPoint(p.name, spec, doc, p.coords))
    return found


# A protocol document's fields the Spec has under the same name and model; the rest (data,
# method) is rewritten into the plan shape before the Spec sees it, so it is validated per point.
_PROTOCOL_REUSED = frozenset({"header", "model"})
_MODEL, _MODELS_IN = 1, 2  # what a field validated to: a model; a dict or list of models


class _Reuse:
    """The first point's validation, handed to the later points' where they share its JSON.

    For each object of the first point's document on the way to a model (the document, a
    dict of sites, an intervention, ...), ``_plan`` lists once its keys whose values validated
    to a model or to a dict or list of models, with the value there and what it became. A later
    point's document is then rebuilt only where it is not the first's (the sweep's paths): a
    value that is the first's own object is replaced by what it became; one that is not is
    walked into where models lie below it, else left to be validated."""

    def __init__(self, document: dict, spec, keys=None):
        self.document, self.spec, self.keys = document, spec, keys
        self.protocol = keys is not None
        self._plans: dict[tuple, list] = {}  # ids of a first point's object and its model -> plan

    def __call__(self, raw: dict) -> dict:
        return self._rebuilt(raw, self.document, self.spec, _MODEL)

    def _plan(self, before, validated, kind: int) -> list:
        plan = self._plans.get((id(before), id(validated)))  # the first point's: they live as long
        if plan is None:
            plan = []
            if kind == _MODEL:
                fields = _fields(type(validated))
                for key, item in before.items():
                    name = fields.get(key)
                    if name is not None and (self.keys is None or validated is not self.spec or key in self.keys):
                        plan.append((key, item, getattr(validated, name)))
            elif type(validated) is dict:
                plan = [(key, item, validated[key]) for key, item in before.items() if key in validated]
            plan = [(key, item, value, _kind(value)) for key, item, value in plan]
            plan = [entry for entry in plan if entry[3]]
            self._plans[id(before), id(validated)] = plan
        return plan

    def _rebuilt(self, raw, before, validated, kind: int):
        out = None
        for key, item, value, inner in self._plan(before, validated, kind):
            here = raw.get(key, _ABSENT)
            if here is item:
                new = value
            elif type(here) is dict and type(item) is dict and (inner == _MODEL or type(value) is dict):
                new = self._rebuilt(here, item, value, inner)
            else:
                continue
            if new is not here:
                if out is None:
                    out = copy.copy(raw)
                out[key] = new  # the same key: the order pydantic meets the fields in is kept
        return raw if out is None else out


_ABSENT = object()
_FIELDS: dict = {}  # a model class -> the keys it takes -> the field's name
_IS_MODEL: dict = {}  # a type -> whether it is a pydantic model


def _is_model(value) -> bool:
    cls = type(value)
    if cls not in _IS_MODEL:
        from pydantic import BaseModel

        _IS_MODEL[cls] = issubclass(cls, BaseModel)
    return _IS_MODEL[cls]


def _kind(value) -> int:
    """_MODEL, _MODELS_IN, or 0 for what is validated as written (a name, a list of layers, params)."""
    if _is_model(value):
        return _MODEL
    if type(value) is dict and value and all(map(_is_model, value.values())):
        return _MODELS_IN
    if type(value) is list and value and all(map(_is_model, value)):
        return _MODELS_IN
    return 0


def _fields(cls) -> dict:
    """The keys a model takes (its fields' names and aliases) -> the field's name."""
    if cls not in _FIELDS:
        found = {}
        for name, field in cls.model_fields.items():
            found[name] = name
            if field.alias:
                found[field.alias] = name
        _FIELDS[cls] = found
    return _FIELDS[cls]


def _one_header(found: list[ValidPoint]) -> bool:
    """Whether every point holds the first's header, validated once (no wrapper inside it)."""
    header = found[0].spec.header
    return type(found[0].document.get("header")) is dict and all(p.spec.header is header for p in found)


def _own_expectations_shared(found: list[ValidPoint]) -> list[ValidPoint]:
    """``_own_expectations`` of every point, for points that share one header: each expectation
    is stripped of its ``points`` once and shared by the points it applies to (which
    ``expect.applying`` finds per expectation, not per point and expectation)."""
    from . import expect

    exps = found[0].spec.header.expect
    if found[0].name is None or all(e.points is None for e in exps):
        return found
    written = found[0].document["header"]["expect"]  # the same list, in the same order, as the spec's
    stripped = [{k: v for k, v in w.items() if k != "points"} for w in written]
    models = [e.model_copy(update={"points": None}) for e in exps]
    kept: list[list[int]] = [[] for _ in found]
    for i, where in enumerate(expect.applying(exps, [(p.name, p.coords) for p in found])):
        for j in where:
            kept[j].append(i)
    # Points that keep the same expectations share one header (a dict, and the Header it is).
    headers: dict[tuple, tuple[dict, Any]] = {}
    written_header, header_model = found[0].document["header"], found[0].spec.header
    out = []
    for p, keep in zip(found, kept):
        keep = tuple(keep)
        if keep not in headers:
            headers[keep] = ({**written_header, "expect": [stripped[i] for i in keep]},
                             header_model.model_copy(update={"expect": [models[i] for i in keep]}))
        header_json, header = headers[keep]
        document = copy.copy(p.document)
        document["header"] = header_json
        out.append(ValidPoint(p.name, p.spec.model_copy(update={"header": header}), document, p.coords))
    return out


def _own_expectations(point: ValidPoint) -> ValidPoint:
    """A swept point keeps only the expectations that apply to it, without their ``points``:
    its document is then a valid document on its own (what the plugin compiles when a hook
    changed one point, what its folder's document.json reads back as)."""
    exps = point.spec.header.expect
    if point.name is None or all(e.points is None for e in exps):
        return point
    keep = [i for i, e in enumerate(exps) if e.applies(point.name, point.coords)]
    document = copy.deepcopy(point.document)
    written = document["header"]["expect"]  # the same list, in the same order, as the spec's
    document["header"]["expect"] = [{k: v for k, v in written[i].items() if k != "points"} for i in keep]
    header = point.spec.header.model_copy(update={"expect": [exps[i].model_copy(update={"points": None})
                                                             for i in keep]})
    return ValidPoint(point.name, point.spec.model_copy(update={"header": header}), document, point.coords)


def shape(raw: dict) -> str:
    from .protocol import is_protocol
    return "protocol" if is_protocol(raw) else "plan-shaped"

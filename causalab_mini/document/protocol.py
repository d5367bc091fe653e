"""The protocol-shaped front end: header / model / data / method, lowered to a Spec.

The protocol writes one intervention per document and names its mechanism as a
key (``"do": {"swap": "v_cf"}``). The plan shape names the mechanism as a value,
because a key that is itself the mechanism's name cannot be enumerated by a
schema. Lowering is a pure rewrite of JSON; the Spec's validator then applies
every rule, and a refusal's path is translated back to where the protocol
document wrote the field.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import DocumentError
from ..suggest import suggest_fix
from .errors import document_error
from .spec import Header, ModelRef, Spec, validate_spec

INTERVENTION = "method"  # the one intervention of a protocol document
STEP = "observe"  # the one step it runs


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class DataRole(_Strict):
    dataset: str = Field(description='"name/split", e.g. "weekdays/train"')
    field: str


class ProtocolWrite(_Strict):
    site: str
    pos: Any
    do: dict[str, Any] = Field(description='One key, the mechanism: {"swap": "v_cf"}, '
                                           '{"add_scaled": {"operand": "v", "scale": 4.0}}, '
                                           '{"renormalize": {}}')
    featurizer: Optional[str] = None
    features: Optional[list[int]] = None


class IntervenedModel(_Strict):
    input: str
    writes: list[str] = Field(default_factory=list)


class ProtocolSave(_Strict):
    value: str
    file_path: str
    model: Optional[str] = None
    input: Optional[str] = None


class Method(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False, strict=True)
    sites: dict[str, Any]
    featurizers: dict[str, Any] = Field(default_factory=dict)
    reads: dict[str, Any] = Field(default_factory=dict)
    writes: dict[str, ProtocolWrite] = Field(default_factory=dict)
    intervened_models: dict[str, IntervenedModel] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    outputs: dict[str, Any] = Field(default_factory=dict)
    # "save" is the protocol's key; as a Python name it would shadow BaseModel's deprecated .save().
    saves: list[ProtocolSave] = Field(default_factory=list, alias="save")
    decode: Optional[int] = None


class ProtocolDocument(_Strict):
    """A protocol-shaped point. Field shapes only; the rules run on the Spec it lowers to."""

    header: Header = Field(default_factory=Header)
    model: ModelRef
    data: dict[str, DataRole]
    method: Method


def is_protocol(raw: Any) -> bool:
    return isinstance(raw, dict) and "method" in raw


def _lower_write(path: str, write: ProtocolWrite) -> dict:
    from ..vocab import MECHANISMS

    if len(write.do) != 1:
        raise DocumentError(f"{path}.do", f"do names {len(write.do)} mechanisms",
                            'write exactly one: {"swap": "v_cf"}')
    (mechanism, arg), = write.do.items()
    if mechanism not in MECHANISMS:
        raise DocumentError(f"{path}.do", f"unknown mechanism {mechanism!r}",
                            suggest_fix(mechanism, MECHANISMS, f"use one of: {', '.join(sorted(MECHANISMS))}"))
    out: dict[str, Any] = {"site": write.site, "pos": write.pos, "mechanism": mechanism}
    if isinstance(arg, dict) and "ref" not in arg:
        params = dict(arg)
        if "operand" in params:
            out["operand"] = params.pop("operand")
        out["params"] = params
    elif arg is not None:
        out["operand"] = arg
    for key in ("featurizer", "features"):
        if getattr(write, key) is not None:
            out[key] = getattr(write, key)
    return out


def lower(raw: dict) -> dict:
    """A protocol-shaped point as plan-shaped JSON (not yet validated)."""
    from .sweep import refuse_unlowered

    refuse_unlowered(raw, "Document")
    try:
        doc = ProtocolDocument.model_validate(raw)
    except ValidationError as err:
        raise document_error(err, raw=raw) from None
    m = doc.method
    intervention: dict[str, Any] = {
        "reads": m.reads,
        "writes": {n: _lower_write(f"method.writes.{n}", w) for n, w in m.writes.items()},
        "models": {n: im.model_dump() for n, im in m.intervened_models.items()},
        "metrics": m.metrics,
    }
    if m.decode is not None:
        intervention["decode"] = m.decode
    step: dict[str, Any] = {
        "kind": "observe",
        "interventions": INTERVENTION,
        "rows": {role: d.dataset for role, d in doc.data.items()},
        "saves": [s.model_dump(exclude_none=True) for s in m.saves],
    }
    if m.outputs:
        step["outputs"] = m.outputs
    return {
        "header": raw.get("header", {}),
        "model": raw["model"],
        "roles": {role: {"field": d.field} for role, d in doc.data.items()},
        "sites": m.sites,
        "featurizers": m.featurizers,
        "interventions": {INTERVENTION: intervention},
        "steps": {STEP: step},
    }


# Plan-shaped path prefixes → where the protocol document wrote the field.
_PATHS = (
    (f"interventions.{INTERVENTION}.models", "method.intervened_models"),
    (f"interventions.{INTERVENTION}", "method"),
    (f"steps.{STEP}.saves", "method.save"),
    (f"steps.{STEP}.outputs", "method.outputs"),
    (f"steps.{STEP}.rows", "data"),
    (f"steps.{STEP}", "data"),
    ("roles", "data"),
    ("sites", "method.sites"),
    ("featurizers", "method.featurizers"),
)


# Plan-shaped fields the protocol writes inside one other field.
_DO = re.compile(rf"^interventions\.{INTERVENTION}\.writes\.([^.]+)\.(?:mechanism|operand|params)(?:\..*)?$")
_ROWS = re.compile(rf"^steps\.{STEP}\.rows\.([^.]+)$")


def protocol_path(path: str) -> str:
    # The mechanism, its operand and its parameters are all the protocol's one "do" key,
    # and a role's rows are its "dataset".
    match = _DO.match(path)
    if match:
        return f"method.writes.{match.group(1)}.do"
    match = _ROWS.match(path)
    if match:
        return f"data.{match.group(1)}.dataset"
    for plan, proto in _PATHS:
        if path == plan or path.startswith(plan + "."):
            return proto + path[len(plan):]
    return path


def validate_document(raw: dict) -> Spec:
    """Validate a protocol-shaped point, refusing at the protocol's own paths."""
    lowered = lower(raw)
    try:
        return validate_spec(lowered)
    except DocumentError as err:
        raise type(err)(protocol_path(err.path), err.problem, err.fix) from None


def validate_point(raw: Any) -> Spec:
    """Either front end: the protocol shape if the point has a ``method``, else the plan shape."""
    return validate_document(raw) if is_protocol(raw) else validate_spec(raw)

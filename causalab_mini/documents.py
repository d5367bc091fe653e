"""From a file on disk to a compiled Plan: the front door every verb and the plugin use.

``read`` parses JSON, ``points`` lowers the sweep and validates each point with
the front end its shape calls for, and ``compile_plan`` resolves the model,
reads its config and tokenizer (never its weights) and builds the plan tree.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from .errors import DocumentError
from .plan import sweep

SUFFIX = ".causalab.json"


MAX_DOCUMENT_BYTES = 16 << 20  # a document is a few kilobytes; data belongs in datasets


def read(path: Union[str, Path]) -> dict:
    from . import jsontext, reading

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
    from .plan.document import validate_point as _validate
    return _validate(raw)


@dataclass(frozen=True)
class ValidPoint:
    name: Optional[str]
    spec: Any  # plan.spec.Spec
    document: dict
    coords: tuple


def points(raw: dict) -> list[ValidPoint]:
    """Every sweep point of a document, validated (no model, no data), its expectations included:
    a result, point or axis they name that the document does not have is refused here, so
    ``validate``, ``explain`` and pytest's collection refuse the same documents alike."""
    from . import jsontext
    from .plan import expect

    try:  # a dict handed over from Python (cm.read(dict)) has met no JSON reader's checks
        jsontext.check(raw)
    except jsontext.Problem as err:
        raise DocumentError(err.where or "document", err.problem, err.fix) from None
    found = [ValidPoint(p.name, validate_point(p.document), p.document, p.coords) for p in sweep.lower(raw)]
    expect.check_points(found)
    return [_own_expectations(p) for p in found]


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
    from .plan.document import is_protocol
    return "protocol" if is_protocol(raw) else "plan-shaped"


def model_facts(spec, document: Optional[Path], models=None, *, check_revision: bool = True,
                trust_remote_code: bool = False):
    """The model's config and tokenizer as ModelFacts; weights are never read, and no code of the
    model directory's own is run unless ``trust_remote_code``."""
    from .engine import loading
    from .engine.facts import ModelFacts

    resolved = loading.resolve(spec.model.key, spec.model.revision, document=document, roots=models,
                               check_revision=check_revision)
    roots = loading.model_roots(models, document)
    config = loading.load_config(resolved, roots, trust_remote_code=trust_remote_code)
    tokenizer = loading.load_tokenizer(resolved, roots, trust_remote_code=trust_remote_code)
    return ModelFacts.from_config(config, tokenizer, key=spec.model.key, revision=resolved.revision,
                                  modules=spec.model.modules)


def compile_plan(raw: dict, *, document: Optional[Path] = None, models=None, data=None,
                 engine: str = "nnterp", facts=None, trust_remote_code: bool = False,
                 valid: Optional[list] = None, share: bool = True):
    """The document's plan tree, compiled against the model's config and tokenizer.

    ``facts``: a loaded engine, which answers the compile-time questions itself (with its own
    refusals; its name is then the engine compiled for), or ``ModelFacts``; None reads the
    model's config and tokenizer (never its weights).
    ``valid``: the document's points as ``points(raw)`` gave them, when the caller already has
    them, so a document is lowered and validated once.
    ``share``: run the forwards several sweep points run identically once, ahead of them
    (``plan/share.py``); False compiles every point to run its own."""
    from . import data as data_mod
    from .plan.build import Context, build

    if valid is None:
        valid = points(raw)
    if facts is None:
        # A sweep may not change the model, so the first point names it.
        facts = model_facts(valid[0].spec, document, models, trust_remote_code=trust_remote_code)
    else:
        engine = getattr(facts, "name", engine)
    ctx = Context(facts=facts, data_roots=data_mod.data_roots(data, document),
                  document_dir=(Path(document).resolve().parent if document else Path.cwd()),
                  engine=engine, share=share)
    return build(raw, valid, ctx)

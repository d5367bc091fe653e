"""From a document's validated points to a compiled Plan: the compiler's front door.

``compile_plan`` resolves the model, reads its config and tokenizer (never its weights, through
``model.recipe``, the engines' own first step) and builds the plan tree (``build.py``) from the
points ``document.read.points`` validated.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional


def model_facts(spec, document: Optional[Path], models=None, *, check_revision: bool = True,
                trust_remote_code: bool = False):
    """The model's config and tokenizer as ModelFacts (``model.recipe``, the engines' own first
    steps); weights are never read, and no code of the model directory's own is run unless
    ``trust_remote_code``."""
    from ..model.recipe import describe_model

    return describe_model(spec.model, document=document, models=models, trust_remote_code=trust_remote_code,
                          check_revision=check_revision).facts


def compile_plan(raw: dict, *, document: Optional[Path] = None, models=None, data=None,
                 engine: str = "nnterp", facts=None, trust_remote_code: bool = False,
                 valid: Optional[list] = None, share: bool = True):
    """The document's plan tree, compiled against the model's config and tokenizer.

    ``facts``: a loaded engine, which answers the compile-time questions itself (with its own
    refusals; its name is then the engine compiled for), or ``ModelFacts``; None reads the
    model's config and tokenizer (never its weights).
    ``valid``: the document's points as ``document.read.points(raw)`` gave them, when the caller
    already has them, so a document is lowered and validated once.
    ``share``: run the forwards several sweep points run identically once, ahead of them
    (``share.py``); False compiles every point to run its own."""
    from .. import data as data_mod
    from ..document.read import points
    from ..engines import remote_names
    from . import stock
    from .build import Context, build

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
    plan = build(raw, valid, ctx)
    if engine in remote_names() and getattr(facts, "request", "kernel") == "kernel":
        stock.refusals(plan)  # what a request a stock server runs cannot carry (plan/stock.py)
    return plan

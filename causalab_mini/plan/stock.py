"""What a request to a stock NDIF server cannot carry, refused at compile time by document path.

An ``ndif`` run by default sends the kernel (``kernel.py``) and a program of forwards
(``engine/request.py``) to a server that has torch, transformers and nnsight only. What needs code
the kernel does not have is refused here, before anything runs: a fit, and an extension's
mechanism or featurizer kind. Each refusal says how to run it instead.
"""
from __future__ import annotations

from .. import vocab
from ..errors import CompileError
from .plan import Featurizers, Fit, Plan

PACKAGE = "send the request to a server with causalab-mini installed (--ndif-request package)"


def refusals(plan: Plan) -> None:
    """What a request to a stock server cannot carry, refused by its document path before anything runs."""
    for _, step in plan.walk():
        if isinstance(step, Fit):
            raise CompileError(f"steps.{step.name}", "a fit trains through the model step after step in the "
                               "walk, and a request a stock NDIF server runs carries forwards only",
                               "fit locally (--engine hooks or nnterp) and apply the saved featurizer in a "
                               f"document run on ndif, or {PACKAGE}")
        if isinstance(step, Featurizers):
            for spec in step.specs:
                record = vocab.FEATURIZERS.get(spec.kind)
                if record is not None and record.make is not None:
                    raise CompileError(f"featurizers.{spec.name}.kind", f"{spec.kind!r} is an extension's "
                                       f"featurizer kind ({record.origin}), whose code a stock server does not "
                                       "have", f"use a built-in kind, or {PACKAGE} and the extension")
        for forward in getattr(step, "forwards", ()):
            for tap in forward.taps:
                for w in tap.writes:
                    spec = vocab.MECHANISMS[w.mechanism]
                    if spec.apply is not None:
                        where = f"interventions.{step.intervention}.writes.{w.name}.mechanism" \
                            if hasattr(step, "intervention") else w.name
                        raise CompileError(where, f"{w.mechanism!r} is an extension's mechanism ({spec.origin}), "
                                           "whose code a stock server does not have",
                                           f"write with a built-in mechanism, or {PACKAGE} and the extension")



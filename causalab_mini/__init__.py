"""causalab-mini: causal experiments on transformer language models, written as JSON documents.

The pipeline, one function a stage::

    import causalab_mini as cm

    doc = cm.read("documents/v2/pos_sweep.causalab.json")   # lowered into sweep points, validated
    plan = cm.compile(doc)                                   # against config + tokenizer, no weights
    engine = cm.load(doc, engine="hooks")                    # the model, loaded once
    run = cm.run(doc, loaded=engine, out="runs/pos_sweep")   # computed, committed to disk whole
    run.point("pos=-1").result("iia").mean()
    run.table("iia"); run.grid("iia", "pos")
    cm.open("runs/pos_sweep")                                # the same Run, read back from disk

Every refusal is a ``CausalabError`` (``DocumentError``, ``CompileError``, …) naming
the document path of the field, what is wrong, and what to write instead.

Besides these names, eight modules are public: ``causalab_mini.vocab`` (the closed
vocabularies: components, mechanisms, metrics, featurizer kinds, position forms),
``causalab_mini.shapes`` (the position value types and ``cut``), ``causalab_mini.errors``,
``causalab_mini.report`` (an HTML page of runs), ``causalab_mini.cache`` (results by key),
``causalab_mini.checks`` (results held to expectations and references: ``compare_rows``,
``close``, ``default_tolerance``), ``causalab_mini.names`` (a document's stem, a point's
name, a swept value's label) and ``causalab_mini.files`` (``write_atomic``: a file written whole).

Importing this package imports nothing but itself — each name loads its module when first
used — and no stage before ``load`` imports torch: reading, validating and opening a run's
metrics do not need it (compiling reads a tokenizer; loading and running need torch).
"""
from __future__ import annotations

import importlib
from typing import Any

# name → the module that defines it. Resolved on first use (PEP 562), so `import causalab_mini`
# stays cheap: pytest's collection and the hypothesis strategies import it without pydantic.
_HOME = {
    **dict.fromkeys(("Document", "read", "points", "compile", "load", "run", "open", "expectation",
                     "resolve_model", "family_layout"), ".api"),
    **dict.fromkeys(("Run", "Point", "Result", "Grid"), ".outputs.results"),
    "SUFFIX": ".names",
    **dict.fromkeys(("CausalabError", "DocumentError", "SweepError", "DataError", "ModelError", "CompileError",
                     "MissingArtifact", "PlanError", "DamagedRun", "BaselineError", "WriteError",
                     "EngineError", "Unsupported", "HubUnreachable", "ExtensionError"), ".errors"),
    **dict.fromkeys(("Expectation", "Comparison"), ".document.expect"),
    **dict.fromkeys(("ENGINES", "LOCAL_ENGINES"), ".engines"),
    "revision_digest": ".model.loading",
    "run_points": ".together",
    "run_together": ".together",
    "RunOptions": ".running.options",
    "Execution": ".running.execution",
    **dict.fromkeys(("document_run", "point_run"), ".running.assemble"),
    "stand_in": ".remote",
    "CacheError": ".cache",
    "plot": ".plots",
    **dict.fromkeys(("Check", "evaluate", "verdicts"), ".checks"),
}
# Public modules, loaded as attributes on first use too (``cm.report.write(...)``).
_MODULES = ("vocab", "shapes", "errors", "report", "cache", "checks", "names", "files", "extensions",
            "metric_kinds")

__all__ = [
    # the pipeline
    "read", "points", "compile", "load", "run", "open", "Document", "resolve_model", "revision_digest",
    "expectation", "family_layout", "plot", "run_points", "run_together", "stand_in",
    # the one run path the verbs above specialise: selected points on a loaded model, computed when asked for
    "RunOptions", "Execution", "document_run", "point_run",
    # results
    "Run", "Point", "Result", "Grid",
    # verdicts: results held to expectations and references
    "Check", "evaluate", "verdicts",
    # documents
    "SUFFIX", "Expectation", "Comparison", "ENGINES", "LOCAL_ENGINES",
    # refusals
    "CausalabError", "DocumentError", "SweepError", "DataError", "ModelError", "CompileError",
    "MissingArtifact", "PlanError", "DamagedRun", "BaselineError", "WriteError", "EngineError", "Unsupported",
    "HubUnreachable", "CacheError", "ExtensionError",
]


def __getattr__(name: str) -> Any:
    if name in _HOME:
        module, attr = _HOME[name], name
    elif name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'causalab_mini' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value  # once: the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

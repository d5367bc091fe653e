"""Every refusal the project makes is one of these.

A refusal names three things: the document path of the offending field
(``interventions.patching.writes.patch.pos``), what is wrong there, and what to
write instead. The CLI prints ``str(error)`` without a traceback and exits 2;
the pytest plugin shows the same text as a collection or run-time failure.
"""
from __future__ import annotations


class CausalabError(Exception):
    """Base of every typed refusal: ``path: problem; fix``."""

    def __init__(self, path: str, problem: str, fix: str = "") -> None:
        self.path = path
        self.problem = problem
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.path}: {self.problem}" if self.path else self.problem
        return f"{text}; {self.fix}" if self.fix else text

    def __reduce__(self):  # keep path/problem/fix across pickling (xdist, nnsight)
        return (type(self), (self.path, self.problem, self.fix))


class DocumentError(CausalabError):
    """The document is malformed: a field is missing, unknown, or of the wrong shape."""


class SweepError(DocumentError):
    """A sweep wrapper cannot be lowered, or reached a front end unlowered."""


class DataError(CausalabError):
    """A dataset, split, row field or column the document names does not exist."""


class ModelError(CausalabError):
    """A model cannot be resolved, or its weights are not the revision the document names."""


class HubUnreachable(ModelError):
    """The model is a hub id, not cached here, and the hub cannot be reached: not the document's
    fault, so the pytest plugin skips its items (with this reason) instead of failing them."""


class CompileError(CausalabError):
    """The document is well formed but cannot be compiled against this model and data."""


class MissingArtifact(CompileError):
    """A file the document loads (a featurizer bundle) is not there yet: another document makes it."""


class PlanError(CausalabError):
    """A question asked of a plan has no single answer (an ambiguous result name, say)."""


class DamagedRun(PlanError):
    """A finished run's folder (its run.json present) cannot be read back: run.json, or a file it
    lists, is missing or damaged. ``path`` is the file; the fix is always to run the document again
    into the folder. A ``PlanError``, as ``open``'s refusal of a damaged run.json always was."""


class BaselineError(CausalabError):
    """A stored baseline file cannot be read as one (corrupt, another format, the wrong shape)."""


class WriteError(CausalabError):
    """The results could not be written (a full disk, a folder that stopped being writable);
    ``path`` is the file, and the problem says what the output folder holds now."""


class ExtensionError(CausalabError):
    """An extension that cannot be used: it does not import, or what it registers is not a kind."""


class EngineError(CausalabError):
    """An engine refuses what the plan asks of it, or a run-time check failed."""


def join_path(*parts: object) -> str:
    """``join_path("interventions", "p", "writes")`` → ``interventions.p.writes``; ints stay as list indices."""
    return ".".join(str(p) for p in parts if p is not None and p != "")


class Unsupported(EngineError):
    """The plan asks for something this engine or this version does not do yet; nothing ran."""

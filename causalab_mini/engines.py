"""Every engine by name: the one list of engines the project reads.

An engine is a module under ``causalab_mini/engine/`` whose class loads a model and executes a
plan. The CLI's ``--engine`` choices and help, ``vocab``, ``causalab_mini.load``, the compiler's refusals and
the pytest plugin all read the records below, so adding an engine is: write its module, add its
record to ``RECORDS``.

The class is imported only when asked for (``engine_class``): reading this list — for help text,
``causalab-mini vocab``, pytest collection — imports no torch, nnsight or nnterp.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

from .errors import EngineError


@dataclass(frozen=True)
class EngineRecord:
    name: str  # what --engine and the API's ``engine=`` call it, and what the class's ``.name`` says
    module: str  # the dotted module that defines the class (an engine of a researcher's own: theirs)
    class_name: str  # the class; run.json records this name (provenance.record), engine_name maps it back
    # Traces the forward through nnsight: it reaches values inside a module's forward (not only
    # module boundaries, where a forward hook stops), and nnterp's own refusals apply to it.
    traced: bool
    description: str  # one line, for help text
    # The local engine this one is, run where the weights are (NDIF) from a weightless shell:
    # None for an engine that computes on this machine.
    remote_of: Optional[str] = None

    @property
    def remote(self) -> bool:
        return self.remote_of is not None

    def load_class(self) -> type:
        """The engine class (imports its module, and with it torch)."""
        return getattr(importlib.import_module(self.module), self.class_name)


RECORDS: tuple[EngineRecord, ...] = (
    EngineRecord("nnterp", "causalab_mini.engine.nnterp", "NNterpEngine", traced=True,
                 description="nnsight through nnterp's standardized names"),
    EngineRecord("hooks", "causalab_mini.engine.hooks", "HooksEngine", traced=False,
                 description="plain torch forward hooks"),
    EngineRecord("ndif", "causalab_mini.engine.ndif", "NDIFEngine", traced=True, remote_of="nnterp",
                 description="the nnterp engine on a weightless shell, run on NDIF"),
)
DEFAULT = "nnterp"  # the engine a caller that names none gets

_BY_NAME = {r.name: r for r in RECORDS}
_BY_CLASS = {r.class_name: r for r in RECORDS}

# The lists as constants too: ``causalab_mini.ENGINES`` and ``LOCAL_ENGINES`` are these.
ENGINES: tuple[str, ...] = tuple(_BY_NAME)
LOCAL_ENGINES: tuple[str, ...] = tuple(r.name for r in RECORDS if not r.remote)


def names() -> tuple[str, ...]:
    """Every engine name, in registry order."""
    return ENGINES


def local_names() -> tuple[str, ...]:
    """The engines that compute on this machine (load the weights here)."""
    return LOCAL_ENGINES


# What a remote engine's request carries: the kernel and a program a stock server runs
# (engine/request.py), or the walk itself by reference, for a server with this package installed.
REQUESTS: tuple[str, ...] = ("kernel", "package")


def remote_names() -> tuple[str, ...]:
    """The engines whose forwards run on a server (from a weightless shell here)."""
    return tuple(r.name for r in RECORDS if r.remote)


def traced_names() -> tuple[str, ...]:
    """The engines that trace through nnsight: nnterp's reach and its refusals."""
    return tuple(r.name for r in RECORDS if r.traced)


def record(name: str) -> EngineRecord:
    """The record of ``name``; an unknown name is refused naming every known one."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):  # TypeError: an unhashable value passed as a name
        raise EngineError("engine", f"unknown engine {name!r}", f"use one of: {', '.join(names())}") from None


def engine_class(name: str) -> type:
    """The class of engine ``name`` (imports its module)."""
    return record(name).load_class()


def engine_name(class_name: Optional[str], *, remote: bool = False) -> str:
    """The engine name of a run record's engine class (``NNterpEngine`` run remotely: ``ndif``).

    A class no record names is returned as it is (a run written by a newer or older version).
    """
    found = _BY_CLASS.get(class_name or "")
    if found is None:
        return class_name or "unknown"
    if remote and not found.remote:
        return next((r.name for r in RECORDS if r.remote_of == found.name), found.name)
    return found.name


def help_text() -> str:
    """``name: description; ...`` for every engine, with the default named (``--engine``'s help)."""
    return "; ".join(f"{n}: {_BY_NAME[n].description}" for n in ENGINES) + f" (default {DEFAULT})"

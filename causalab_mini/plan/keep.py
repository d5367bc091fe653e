"""Reads kept in memory: the activations a researcher asks ``cm.run(..., reads=[...])`` for.

A read is taken to be written into a forward or scored, then dropped: keeping every read of
every point would hold a sweep's activations alive at once. ``reads=`` names the ones to keep
(TransformerLens' ``run_with_cache(names_filter=...)``, nnsight's ``.save()``); each pass that
reads one of them leaves it in its results, where ``point.value(name)`` finds it. Keeping is
not part of the experiment: it changes no digest, and a plan compiled once serves both.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Optional, Union

from ..errors import PlanError
from .plan import Fit, Observe, Plan

ALL = "all"  # reads="all": every read of every pass


def read_names(obs: Observe) -> set[str]:
    """The reads a pass has in hand after its forwards: its own, and those it borrows."""
    return {r.name for f in obs.forwards for r in f.reads} | {mine for mine, _ in obs.borrowed}


def _reserved(obs: Observe) -> set[str]:
    """Result names a kept read may not take: the metrics, outputs and records the pass writes."""
    return ({m.name for m in obs.metrics} | {o.name for o in obs.outputs} | {"eligible", "positions", "excluded"}
            | {f"{f.model}.generated" for f in obs.forwards})


def keep_reads(plan: Plan, reads: Union[str, Iterable[str], None]) -> Plan:
    """``plan`` with every pass keeping the named reads it has (``"all"``: every read). A name
    no pass reads is refused, listing the reads there are."""
    if reads is None:
        return plan
    wanted: Optional[set] = None if reads == ALL else set([reads] if isinstance(reads, str) else reads)
    found: set[str] = set()
    kept = _kept(plan, wanted, found)
    if wanted is not None and wanted - found:
        every = sorted({n for _, s in plan.walk() if isinstance(s, Observe) for n in read_names(s)})
        raise PlanError("reads", f"no pass reads {sorted(wanted - found)[0]!r}",
                        f"name reads the document declares: {every}, or reads=\"all\"")
    return kept


def _kept(plan: Plan, wanted: Optional[set], found: set) -> Plan:
    steps = {}
    for name, step in plan.steps.items():
        if isinstance(step, Plan):
            step = _kept(step, wanted, found)
        elif isinstance(step, Observe):
            step = _observe(step, wanted, found)
        elif isinstance(step, Fit) and step.evaluation is not None:
            step = replace(step, evaluation=_observe(step.evaluation, wanted, found))
        steps[name] = step
    return replace(plan, steps=steps)


def _observe(obs: Observe, wanted: Optional[set], found: set) -> Observe:
    names = read_names(obs) if wanted is None else read_names(obs) & wanted
    clash = names & _reserved(obs)
    if clash:
        name = sorted(clash)[0]
        raise PlanError(f"reads.{name}", f"step {obs.name!r} already has a result named {name!r} "
                        "(a metric, an output or a record)", "rename the read in the document")
    found |= names
    return replace(obs, kept=tuple(sorted(names)))

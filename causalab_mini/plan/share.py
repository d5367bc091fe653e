"""Shared forwards: a forward that several sweep points run identically is run once, ahead of them.

Across the points of a swept document, a forward with the same model, the same rows (ids,
mask, texts), no writes, no decode and nothing read through a featurizer (a point builds its
own featurizers, so a featurized read may differ from point to point) computes the same
activations for every point: in practice the unpatched ``original`` pass on the
counterfactual prompts that each point of a patching sweep reads its source values from.
``share`` moves such forwards into one ``Shared`` step of the root plan, with the union of the
reads the points take from it (a read taken by several points is read once), and each point's
``Observe`` names what it borrows (``Observe.borrowed``: its own read name, the shared one) in
place of running the forward. A P-point patching sweep then runs P + 1 forwards, not 2P, and
the plan is still pure data: ``explain`` shows the shared step and each point's borrowing.

Nothing a point computes changes: the shared forward is the same computation on the same
rows, windowed by the same batch size, and its reads are the same ops under other names.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from .plan import Forward, Observe, Plan, Shared, group_taps

SHARED = "shared"  # the root plan's step; a point is never called this (a point's name has "=")


def shareable(forward: Forward) -> bool:
    """Whether a forward computes the same for every point that runs it: no writes, no decode, and
    every read taken without a featurizer."""
    return (not forward.writes and not forward.decode and bool(forward.reads)
            and all(r.featurizer is None for r in forward.reads))


def forward_identity(forward: Forward) -> tuple:
    """What makes two forwards the same computation (their reads aside)."""
    # A chat's segments are dicts (turn -> character span): made hashable, as the key must be.
    segments = None if forward.segments is None else tuple(tuple(sorted(s.items())) for s in forward.segments)
    return (forward.model, forward.input, forward.dataset, forward.ids, forward.mask, forward.texts, segments)


def read_identity(read) -> tuple:
    """What makes two reads the same value: where and how, not their names."""
    return (read.address, read.where, read.anchors, read.view, read.width, read.step)


def _anchored(obs: Observe) -> bool:
    """Whether the pass resolves some position against its prompt's text (and so records every
    op's positions, the borrowed ones included)."""
    return any(not op.where.fixed for f in obs.forwards for op in (*f.writes, *f.reads))


def share(root: Plan) -> Plan:
    """``root`` with the forwards its points share moved into one ``Shared`` step, run first; the
    same plan when fewer than two points share any forward (an unswept plan among them)."""
    points = {name: p for name, p in root.steps.items() if isinstance(p, Plan)}
    groups: dict[tuple, list[tuple[str, str, int]]] = {}
    for pname, point in points.items():
        for sname, step in point.steps.items():
            if isinstance(step, Observe):
                for i, f in enumerate(step.forwards):
                    if shareable(f):
                        groups.setdefault(forward_identity(f), []).append((pname, sname, i))
    groups = {k: users for k, users in groups.items() if len({u[0] for u in users}) > 1}
    if not groups:
        return root
    forwards: list[Forward] = []
    borrowed: dict[tuple[str, str], list[tuple[str, str]]] = {}
    dropped: dict[tuple[str, str], set] = {}
    users_of: dict[str, list[str]] = {}  # shared read -> the points that borrow it, in run order
    record = False
    for users in groups.values():
        reads: dict[tuple, object] = {}
        for pname, sname, i in users:
            obs = points[pname].steps[sname]
            record = record or _anchored(obs)
            for r in obs.forwards[i].reads:
                ident = read_identity(r)
                if ident not in reads:  # named after the first point that reads it: errors stay readable
                    reads[ident] = replace(r, name=f"{pname}/{sname}/{r.name}")
                shared_name = reads[ident].name
                borrowed.setdefault((pname, sname), []).append((r.name, shared_name))
                if pname not in users_of.setdefault(shared_name, []):
                    users_of[shared_name].append(pname)
            dropped.setdefault((pname, sname), set()).add(i)
        first = points[users[0][0]].steps[users[0][1]].forwards[users[0][2]]
        forwards.append(replace(first, taps=group_taps(list(reads.values())), windows=()))
    steps: dict = {SHARED: Shared(SHARED, tuple(forwards), tuple((n, tuple(u)) for n, u in users_of.items()),
                                  record)}
    for name, step in root.steps.items():
        steps[name] = _borrowing(name, step, borrowed, dropped) if isinstance(step, Plan) else step
    return replace(root, steps=steps, results={}, provenance={})


def _borrowing(pname: str, point: Plan, borrowed: dict, dropped: dict) -> Plan:
    steps = {}
    for sname, step in point.steps.items():
        key = (pname, sname)
        if key in dropped:
            kept = tuple(f for i, f in enumerate(step.forwards) if i not in dropped[key])
            step = replace(step, forwards=kept, borrowed=tuple(borrowed[key]), results={})
        steps[sname] = step
    return replace(point, steps=steps, results={}, provenance={})


def shared_step(root: Plan) -> Optional[Shared]:
    step = root.steps.get(SHARED)
    return step if isinstance(step, Shared) else None

"""Points at once: several sweep points' forwards stacked into one model call, rows × points.

A sweep point is usually one pass — its patched forward, after the counterfactual one it
shares with the others (``plan/share.py``) — over the same rows as every other point. Run one
after the other, P points make P model calls of ``rows`` each; on an accelerator that is
launch-bound long before it is compute-bound. Stacked, ``at_once`` points make one call of
``rows × at_once``: each point's ops act on its own slice of the batch (``ReadOp.rows`` /
``WriteOp.rows``, honoured by ``taps.run_tap`` on both engines), so a write lands only in its
point's rows and a read takes only them.

Only points that are one ``Observe`` over the same prompts (the same ids and mask in every
forward, in the same order) stack; their ops may not go through a featurizer (a point builds
its own) nor take a value an earlier step published, and no forward decodes. Anything else
runs as it would alone. Positions are resolved per point exactly as alone; each point's
metrics and outputs are computed from its own values as alone.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ..plan.plan import Forward, Observe, Plan, group_taps
from . import progress


def stackable(point: Plan) -> Optional[Observe]:
    """The point's one Observe when it can run stacked with others, else None."""
    steps = list(point.steps.values())
    if len(steps) != 1 or not isinstance(steps[0], Observe):
        return None
    obs = steps[0]
    for f in obs.forwards:
        if f.decode:
            return None
        for op in (*f.writes, *f.reads):
            if op.featurizer is not None:
                return None
            if getattr(op, "operand", None) is not None and op.operand.kind == "ref":
                return None
    return obs


def _shape(obs: Observe) -> tuple:
    """What two stacked points must agree on: the same passes over the same prompts."""
    return tuple((f.model, f.input, f.ids, f.mask, f.forced) for f in obs.forwards) + (obs.rows,)


def groups(points: list[tuple[str, Plan]], at_once: int, rows_allowed: Optional[int]) -> list[list]:
    """Consecutive points cut into runs of up to ``at_once`` that stack (a point that cannot is a
    run of one), with no run's stacked rows above ``rows_allowed`` (the batch size)."""
    out: list[list] = []
    for name, point in points:
        obs = stackable(point)
        last = out[-1] if out else None
        fits = (last is not None and obs is not None and last[0][2] is not None
                and _shape(last[0][2]) == _shape(obs) and len(last) < at_once
                and (rows_allowed is None or obs.rows * (len(last) + 1) <= rows_allowed))
        if fits:
            last.append((name, point, obs))
        else:
            out.append([(name, point, obs)])
    return out


def _renamed(op, point: str, rows: tuple[int, int]):
    """An op of one point in the stacked forward: a name no other point's op has, its rows, and
    an operand read of this pass renamed with it."""
    op = replace(op, name=f"{op.name}@{point}", rows=rows)
    operand = getattr(op, "operand", None)
    if operand is not None and operand.kind == "read":
        op = replace(op, operand=replace(operand, value=f"{operand.value}@{point}"))
    return op


def stack(forwards: list[tuple[str, Forward]], rows: int) -> Forward:
    """One forward of ``rows`` per point, stacked: ids and mask repeated, every point's ops renamed
    and held to its own rows, each op's resolved window kept."""
    first = forwards[0][1]
    ops, windows = [], []
    for i, (point, f) in enumerate(forwards):
        span = (i * rows, (i + 1) * rows)
        ops += [_renamed(op, point, span) for op in (*f.writes, *f.reads)]
        windows += [(f"{name}@{point}", window, ragged) for name, window, ragged in f.windows]
    k = len(forwards)
    return replace(first, ids=first.ids * k, mask=first.mask * k, texts=first.texts * k,
                   segments=first.segments * k if first.segments else None, taps=group_taps(ops),
                   forced=first.forced * k if first.forced is not None else None,
                   windows=tuple(windows))


def run_group(engine, group: list, state, *, prepare, finish, sub_state) -> None:
    """The points of ``group`` (name, plan, Observe), stacked into one call per pass; then each
    point's metrics and outputs from its own values, onto its own Observe."""
    ready = [(name, obs, sub_state(), None) for name, _, obs in group]
    ready = [(name, obs, sub, prepare(engine, obs, sub)) for name, obs, sub, _ in ready]
    rows = ready[0][1].rows
    values: dict = {}
    for name, _, _, r in ready:
        values.update((f"{mine}@{name}", lent.value.value) for mine, lent in r.lent.items())
    for j in range(len(ready[0][3].forwards)):
        stacked = stack([(name, r.forwards[j]) for name, _, _, r in ready], rows)
        engine.forward(stacked, values, state.featurizers)
    progress.announce_batch(ready[0][1].name, rows * len(ready), rows * len(ready), rows * len(ready))
    for name, obs, sub, r in ready:
        own = {key[: -len(name) - 1]: v for key, v in values.items() if key.endswith(f"@{name}")
               and key[: -len(name) - 1] not in r.lent}
        finish(engine, obs, sub, r, own)

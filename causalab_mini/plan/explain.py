"""The plan tree as text (``causalab-mini explain``) and as JSON (``explain --json``)."""
from __future__ import annotations

import os
from typing import Any

from . import show_tokens
from .plan import Attribution, Featurizers, Fit, Forward, Observe, Plan, ReadOp, Shared, Weights


def _at(op) -> str:
    text = f"at {op.address.spelling()}"
    if op.step == "stack":
        return text + " over {decode} steps"
    if op.step is not None:
        return text + f" @step {op.step}"
    return text


def _op_line(op, decode) -> str:
    via = f"via {op.featurizer or 'identity'!r}"
    at = _at(op).replace("{decode}", str(decode))
    if isinstance(op, ReadOp):
        view = f" as {op.view}" if op.view else ""
        return f"read  {op.name!r} {at} pos={op.where.spelling()} {via}{view}"
    args = [op.operand.spelling()] if op.operand is not None else []
    args += [f"{k}={v}" for k, v in op.params if v is not None]
    features = f" on its features {list(op.features)}" if op.features is not None else ""
    return f"write {op.name!r} {at} pos={op.where.spelling()} {op.mechanism}({', '.join(args)}) {via}{features}"


def _forward_lines(f: Forward, indent: str, show=None) -> list[str]:
    decode = f"  decode={f.decode}" if f.decode else ""
    if f.forced is not None:
        lengths = [len(a) for a in f.forced if a]
        column = (f.forced_read or "").partition("~")[2]
        decode += (f"  + {column!r} teacher-forced ({min(lengths, default=0)}–{max(lengths, default=0)} "
                   f"tokens; positions of the prompt)")
    lines = [f"{indent}forward {f.model!r} on {f.input!r}  ({f.rows} rows x {f.tokens} tokens){decode}"]
    for tap in f.taps:
        lines += [f"{indent}  {_op_line(op, f.decode)}" for op in (*tap.writes, *tap.reads)]
    if show is not None:
        lines += show_tokens.forward_rows(f, show[0], show[1], indent + "    ")
    return lines


def _estimate_spelling(est) -> str:
    if not est.verifies:
        return f"estimated by {est.by}"
    chosen = "every point" if est.all else " + ".join(
        part for part in (f"the top {est.top}" if est.top else "",
                          f"{est.random} at random (seed {est.seed})" if est.random else "") if part)
    return f"estimated by {est.by}; {chosen} also run exactly, ranked by {est.metric!r}"


def _observe_lines(name: str, obs: Observe, indent: str, show=None) -> list[str]:
    head = f"{indent}{name}: Observe  metrics={[f'{m.name}/{m.kind}' for m in obs.metrics]}"
    if obs.estimate is not None:
        head += f"  ({_estimate_spelling(obs.estimate)}: the written forward runs only to verify)"
    if obs.outputs:
        head += f"  outputs={[o.spelling() for o in obs.outputs]}"
    if obs.saves:
        head += f"  saves={[s.file_path for s in obs.saves]}"
    lines = [head]
    lines += [f"{indent}    borrow {mine!r} = shared read {theirs!r}" for mine, theirs in obs.borrowed]
    for f in obs.forwards:
        lines += _forward_lines(f, indent + "    ", show)
    for m in obs.metrics:
        lines += show_tokens.metric_summary(m, obs.example_ids, indent + "    ")
    if show is not None:
        lines += show_tokens.metric_rows(obs, show[1], indent + "    ")
    return lines


def _shown_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _step_lines(name: str, step: Any, indent: str, show=None) -> list[str]:
    if isinstance(step, Plan):
        lines = [f"{indent}{name}: Plan"]
        for child, sub in step.steps.items():
            lines += _step_lines(child, sub, indent + "  ", show)
        return lines
    if isinstance(step, Observe):
        return _observe_lines(name, step, indent, show)
    if isinstance(step, Shared):
        users = {p for _, points in step.users for p in points}
        lines = [f"{indent}{name}: Shared  {len(step.forwards)} forward{'s' if len(step.forwards) != 1 else ''} "
                 f"run once for {len(users)} points, which borrow their reads"]
        for f in step.forwards:
            lines += _forward_lines(f, indent + "    ", show)
        return lines
    if isinstance(step, Attribution):
        lines = [f"{indent}{name}: Attribution  {len(step.users)} points {_estimate_spelling(step.estimate)}: "
                 f"the base forward once, d/d{{{', '.join(m.name for m in step.metrics)}}} at "
                 f"{len(step.grads)} site{'s' if len(step.grads) != 1 else ''}"]
        return lines + _forward_lines(step.forward, indent + "    ", show)
    if isinstance(step, Featurizers):
        lines = [f"{indent}{name}: Featurizers"]
        for s in step.specs:
            k = f" k={s.k}" if s.k is not None else ""
            how = f"loaded from {_shown_path(s.file_path)}" if s.file_path else \
                ("cayley " if s.kind == "subspace" else "") + f"seed={s.seed}"
            lines.append(f"{indent}    {s.name}: {s.kind}{k} d={s.d} at {s.address.spelling()} "
                         f"{how} trained={s.trained}")
        return lines
    if isinstance(step, Fit):
        updates = step.epochs.updates
        stop = (f"  early_stop={step.early_stop[0]!r} mode={step.early_stop[1]} "
                f"patience={step.early_stop[2]}") if step.early_stop else ""
        anneal = f"  anneal={step.anneal}" if step.anneal else ""
        lines = [f"{indent}{name}: Fit  {len(step.epochs)} epochs x {updates} "
                 f"update{'s' if updates != 1 else ''}  lr={step.lr} objective={step.objective} "
                 f"params={step.params}{stop}{anneal}"]
        if step.epochs:
            lines += _observe_lines("epochs[0][0]", step.epochs[0][0], indent + "    ", show)
            more = len(step.epochs) * updates - 1
            if more:
                lines.append(f"{indent}    … {more} more update{'s' if more != 1 else ''}, the same pass "
                             "over other rows")
        if step.evaluation is not None:
            ev = step.evaluation
            ev = Observe(**{**ev.__dict__, "saves": step.saves})
            lines += _observe_lines("evaluation", ev, indent + "    ", show)
        return lines
    if isinstance(step, Weights):
        return [f"{indent}{name}: Weights  names={list(step.names)}  "
                f"saves={[s.file_path for s in step.saves]}"]
    raise TypeError(f"unknown step {type(step).__name__}")


def explain(plan: Plan, *, tokenizer=None, rows: int = 3) -> str:
    """The plan as text; with ``tokenizer`` (``explain --tokens``), the first ``rows`` rows of every
    forward as tokens with where each op lands, and each metric's scored tokens per row."""
    show = (tokenizer, rows) if tokenizer is not None else None
    lines = [f"{plan.name}: Plan"]
    for name, step in plan.steps.items():
        lines += _step_lines(name, step, "  ", show)
    return "\n".join(lines)


def _op_json(op) -> dict:
    out = {"name": op.name, "address": op.address.spelling(), "pos": op.where.to_json(),
           "featurizer": op.featurizer or "identity", "step": op.step}
    if isinstance(op, ReadOp):
        out.update(op="read", view=op.view, width=op.width)
    else:
        out.update(op="write", mechanism=op.mechanism,
                   operand=None if op.operand is None else {"kind": op.operand.kind, "value": op.operand.value},
                   params=dict(op.params), features=op.features)
    return out


def _forward_json(f: Forward) -> dict:
    return {"model": f.model, "input": f.input, "rows": f.rows, "tokens": f.tokens, "decode": f.decode,
            "ops": [_op_json(op) for t in f.taps for op in (*t.writes, *t.reads)]}


def plan_json(step: Any) -> dict:
    """A JSON view of the plan tree for programs (ids and per-row data left out)."""
    if isinstance(step, Plan):
        return {"kind": "plan", "name": step.name, "produced_by": step.produced_by,
                "steps": {n: plan_json(s) for n, s in step.steps.items()}}
    if isinstance(step, Shared):
        return {"kind": "shared", "forwards": [_forward_json(f) for f in step.forwards],
                "users": {name: list(points) for name, points in step.users}}
    if isinstance(step, Observe):
        return {"kind": "observe", "rows": step.rows, "borrowed": dict(step.borrowed),
                "estimate": None if step.estimate is None else dict(step.estimate.__dict__),
                "metrics": [{"name": m.name, "kind": m.kind, "of": m.of, "unit": m.unit} for m in step.metrics],
                "outputs": [o.spelling() for o in step.outputs],
                "saves": [s.file_path for s in step.saves],
                "forwards": [_forward_json(f) for f in step.forwards]}
    if isinstance(step, Attribution):
        return {"kind": "attribution", "users": [list(u) for u in step.users],
                "metrics": [m.name for m in step.metrics], "estimate": dict(step.estimate.__dict__),
                "forward": _forward_json(step.forward)}
    if isinstance(step, Featurizers):
        return {"kind": "featurizers", "specs": [
            {"name": s.name, "kind": s.kind, "address": s.address.spelling(), "d": s.d, "k": s.k,
             "seed": s.seed, "file_path": s.file_path, "trained": s.trained} for s in step.specs]}
    if isinstance(step, Fit):
        return {"kind": "fit", "epochs": len(step.epochs), "updates": step.epochs.updates,
                "lr": step.lr, "objective": step.objective, "params": step.params,
                "early_stop": step.early_stop, "saves": [s.file_path for s in step.saves],
                "update": plan_json(step.epochs[0][0]) if step.epochs else None,
                "evaluation": plan_json(step.evaluation) if step.evaluation else None}
    if isinstance(step, Weights):
        return {"kind": "weights", "names": step.names, "saves": [s.file_path for s in step.saves]}
    raise TypeError(type(step).__name__)

"""Attribution patching, the compiler's half: what can be estimated, and the one step that estimates it.

An exact patching sweep runs one written forward per point. Attribution (Nanda 2023; AtP in
Kramár et al. 2024) estimates every point's effect from what the un-written base run already
knows: each write's change to its activation, ``Δ = write(a_base) − a_base``, dotted with the
gradient of the metric at the base run, ``∂metric/∂a``. So the metric a point would score is
estimated as ``metric(base) + Σ Δ·∂metric/∂a`` over its writes' positions and units, per row.

``check`` refuses, at compile time, what that first-order estimate cannot stand for:
  * a metric without a gradient (match, token_rank, top_k; an extension's kind that does not
    declare one) — named with the differentiable kind to use instead — and the KL divergence from
    the un-written base run, whose gradient there is 0 (the base is its minimum);
  * a whole answer (``score: sequence``: its teacher-forced copies are not built for gradients),
    a pass that decodes, a step that publishes outputs (an estimate has no activations to publish);
  * a pass with more than one written forward, a metric of a model no write changes, a metric
    comparing two written reads, a write whose operand is read from a written model (the
    estimate takes operands from un-written runs);
  * writes inside attention's softmax (query, key, scores, pattern): the first-order estimate
    through a softmax is what AtP*'s "QK fix" replaces with the exact softmax of the patched
    scores; that correction is not built, so these sites are refused rather than estimated badly.

``attribute`` adds one ``Attribution`` step to the root plan per group of estimated steps that run
the same base forward with the same metrics: the base forward, its writes removed, with a
zero-valued perturbation added (``add_scaled`` of a leaf tensor, through the same write path every
intervention takes, so both engines differentiate exactly what they patch) and a read at the full
width of every address some point writes. The walk runs it once (2 forwards with the shared
counterfactual one, 1 backward per metric per batch window, whatever the number of points), and
each estimated point is then a few tensor products (``engine/attribution.py``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ..components import Address
from ..errors import CompileError
from ..metric_kinds import METRICS
from ..shapes import Where
from .plan import Attribution, Estimate, Forward, Observe, Operand, Plan, ReadOp, WriteOp, group_taps
from .share import forward_identity, read_identity

STEP = "attribution"  # the root plan's step (a point's name always has "=", so never this)
# Sites inside the softmax: a first-order estimate there is the one AtP*'s QK fix corrects.
INSIDE_SOFTMAX = ("attention_query", "attention_key", "attention_scores", "attention_probs")
DIFFERENTIABLE_INSTEAD = {
    "match": "logit_diff (a and b: the answer and the one it competes with) or token_prob",
    "token_rank": "logit_diff or token_prob of the same token",
    "top_k": "token_prob of the same token",
}
PERTURB, AT = "∂", "∂at:"  # the gradient forward's op names: a document's names are identifiers


def plan_estimate(step, metrics: tuple) -> Optional[Estimate]:
    """The document's ``estimate`` as the plan carries it (the ranking metric defaulted)."""
    if step.estimate is None:
        return None
    v = step.estimate.verify
    if v is None:
        return Estimate(by=step.estimate.by)
    return Estimate(by=step.estimate.by, top=v.top, random=v.random, all=v.all, seed=v.seed,
                    metric=v.metric or (metrics[0].name if metrics else None))


def estimated(path: str, step, obs: Observe, spec, engine: str) -> Observe:
    """``obs``, the compiled observe step at ``path``, scored by attribution — once the document and
    the engine it compiles for allow it, and what it asks can be estimated (``check``)."""
    from ..document.spec import FitStep
    from ..engines import remote_names

    if any(isinstance(s, FitStep) for s in spec.steps.values()):
        raise CompileError(f"{path}.estimate", "this document trains (a fit step), and the points an "
                           "estimate verifies are run exactly after every point has been estimated, "
                           "when a fit would have moved its featurizers on", "estimate in a document that "
                           "loads the trained featurizer (its weights step's file) instead")
    if engine in remote_names():
        raise CompileError(f"{path}.estimate", f"the {engine} engine runs its forwards on a server, "
                           "and attribution's gradients are taken in this process's walk",
                           "estimate with a local engine (hooks or nnterp), or run the sweep exactly")
    obs = replace(obs, estimate=plan_estimate(step, obs.metrics))
    check(path, obs, spec.interventions[step.interventions], f"interventions.{step.interventions}")
    return obs


def check(path: str, obs: Observe, iv, ipath: str) -> None:
    """Refuse an estimated observe step whose estimate would not stand for its exact run (above)."""
    est = obs.estimate
    if obs.outputs:
        raise CompileError(f"{path}.outputs", "an estimated step publishes no outputs: attribution estimates "
                           "metrics, and an output is a read's value, which an estimate never computes",
                           "publish the outputs from a step without \"estimate\"")
    if not obs.metrics:
        raise CompileError(f"{path}.estimate", "the intervention has no metrics: attribution estimates "
                           "metrics, so there is nothing to estimate", "add a metric, or remove \"estimate\"")
    if iv.decode:
        raise CompileError(f"{ipath}.decode", "an estimated pass cannot decode: a continuation is chosen "
                           "token by token, and the estimate is of one forward's metric",
                           "estimate a pass without decode, or run it exactly")
    names = [m.name for m in obs.metrics]
    if est.metric is not None and est.metric not in names:
        raise CompileError(f"{path}.estimate.verify.metric", f"no metric named {est.metric!r}",
                           f"metrics here: {names}")
    for m in obs.metrics:
        kind = METRICS[m.kind]
        if not kind.differentiable:
            instead = DIFFERENTIABLE_INSTEAD.get(m.kind, "a kind with a gradient (`causalab-mini vocab` "
                                                 "marks the ones without with *)")
            raise CompileError(f"{ipath}.metrics.{m.name}.kind", f"{m.kind} has no gradient, so attribution "
                               "cannot estimate it (a first-order estimate is a derivative)",
                               f"estimate {instead}, or run this metric exactly")
        if m.sequence is not None:
            raise CompileError(f"{ipath}.metrics.{m.name}.score", "a whole answer is scored on teacher-forced "
                               "copies of the pass, which attribution does not differentiate",
                               "estimate the first token (leave \"score\" out), or run it exactly")
    written = [f for f in obs.forwards if f.writes]
    if len(written) != 1:
        raise CompileError(f"{path}.estimate", f"attribution estimates what one written model's writes do to "
                           f"its metrics; this pass has {len(written)} written forwards "
                           f"({', '.join(f.model for f in written) or 'none'})",
                           "estimate a pass with one written model (and any un-written ones)")
    target = written[0]
    mine = {r.name for r in target.reads}
    others = {r.name: f.model for f in obs.forwards if f.writes for r in f.reads}
    for m in obs.metrics:
        if m.of not in mine:
            raise CompileError(f"{ipath}.metrics.{m.name}.of", f"{m.name} scores {m.of!r}, read from a "
                               "model no write changes: its estimate would be its exact value",
                               f"score a read of the written model {target.model!r}")
        if m.kind == "kl_div" and _is_base(dict(m.reads)["reference"], m.of, obs.forwards, target):
            raise CompileError(f"{ipath}.metrics.{m.name}.reference", f"{m.name} is the KL divergence from the "
                               "un-written base run, which is at its minimum (0) there: its gradient is 0, so "
                               "the first-order estimate of every patch would be 0",
                               "estimate logit_diff or prob_diff, or run the KL exactly")
        for slot, read in m.reads:
            if read in mine:
                raise CompileError(f"{ipath}.metrics.{m.name}.{slot}", f"{read!r} is read from the written "
                                   f"model {target.model!r}: attribution compares the written run with "
                                   "un-written ones", "compare with a read of an un-written model")
    for w in target.writes:
        wpath = f"{ipath}.writes.{w.name}"
        if w.address.component in INSIDE_SOFTMAX:
            raise CompileError(f"{wpath}.site", f"{w.address.component} is inside attention's softmax, where "
                               "a first-order estimate is unreliable and AtP*'s correction (the exact softmax "
                               "of the patched scores, its \"QK fix\") is not built",
                               "estimate attention_z, attention_value or attention_output, or run this "
                               "site exactly")
        if w.operand is not None and w.operand.kind == "read" and (w.operand.value in mine
                                                                   or w.operand.value in others):
            raise CompileError(f"{wpath}.operand", f"the operand {w.operand.value!r} is read from a written "
                               "model: attribution takes every write's value from un-written runs",
                               "read the operand from a model without writes (\"model\": \"original\")")


def _is_base(reference: str, of: str, forwards, target: Forward) -> bool:
    """Whether read ``reference`` is ``of`` as the un-written model reads it on the same prompts."""
    mine = next(r for r in target.reads if r.name == of)
    for f in forwards:
        for r in f.reads:
            if r.name == reference and not f.writes:
                return (f.input, f.ids, r.address, r.where, r.view) == (target.input, target.ids, mine.address,
                                                                        mine.where, mine.view)
    return False


def _full(address: Address) -> Address:
    """The whole tensor at a write's site: every head and unit (a point's selection is cut from it)."""
    return replace(address, heads=None, units=None, width=address.full_width, columns=None)


def _written(obs: Observe) -> Forward:
    return next(f for f in obs.forwards if f.writes)


def _group_key(sname: str, obs: Observe) -> tuple:
    """What makes estimated steps one attribution pass: the same base forward (as ``share`` tells two
    forwards apart), the same reads under the same names (the metrics name them), the same metrics
    and the same verification."""
    f = _written(obs)
    reads = tuple((r.name, read_identity(r)) for r in f.reads)
    return (sname, forward_identity(f), reads, repr(obs.metrics), obs.estimate)


def estimated_steps(plan: Plan) -> list[tuple[str, str, Observe]]:
    """(point name, step name, observe) of every estimated step: the root's points', or the root's own
    when it is unswept (point name "")."""
    points = [(n, p) for n, p in plan.steps.items() if isinstance(p, Plan)] or [("", plan)]
    return [(pname, sname, s) for pname, point in points for sname, s in point.steps.items()
            if isinstance(s, Observe) and s.estimate is not None]


def attribute(root: Plan) -> Plan:
    """``root`` with one Attribution step per group of estimated steps, placed before the points
    (after the shared forwards they borrow operands from); the same plan when nothing is estimated."""
    found = estimated_steps(root)
    if not found:
        return root
    groups: dict[tuple, list[tuple[str, str, Observe]]] = {}
    for entry in found:
        groups.setdefault(_group_key(entry[1], entry[2]), []).append(entry)
    made: dict = {}
    for i, members in enumerate(groups.values()):
        name = STEP if len(groups) == 1 else f"{STEP}.{i}"
        made[name] = _attribution(name, members)
    # Before the first point (a swept root) or the first estimated step (an unswept one): after
    # the shared forwards and the featurizers, which the estimate's operands come from.
    first = next(k for k, s in root.steps.items() if isinstance(s, Plan) or (isinstance(s, Observe)
                                                                              and s.estimate is not None))
    steps: dict = {}
    for key, step in root.steps.items():
        if key == first:
            steps.update(made)
        steps[key] = step
    return replace(root, steps=steps, results={}, provenance={})


def _attribution(name: str, members: list[tuple[str, str, Observe]]) -> Attribution:
    first = _written(members[0][2])
    addresses: dict[tuple, Address] = {}
    for _, _, obs in members:
        for w in _written(obs).writes:
            full = _full(w.address)
            addresses.setdefault(full.site_key, full)
    everywhere = Where(all=True)
    ops: list = list(first.reads)
    grads = []
    for full in addresses.values():
        perturb, at = f"{PERTURB}{full.spelling()}", f"{AT}{full.spelling()}"
        ops.append(WriteOp(name=perturb, address=full, where=everywhere, anchors=None, mechanism="add_scaled",
                           operand=Operand("ref", perturb), params=(("scale", 1.0),), featurizer=None,
                           features=None))
        ops.append(ReadOp(name=at, address=full, where=everywhere, anchors=None, featurizer=None, view=None,
                          width=full.width))
        grads.append((perturb, at))
    forward = replace(first, taps=group_taps(ops), windows=())
    obs = members[0][2]
    return Attribution(name=name, forward=forward, metrics=obs.metrics, grads=tuple(grads),
                       users=tuple((p, s) for p, s, _ in members), estimate=obs.estimate)


def attribution_steps(root: Plan) -> list[Attribution]:
    return [s for s in root.steps.values() if isinstance(s, Attribution)]

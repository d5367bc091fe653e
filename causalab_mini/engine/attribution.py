"""Attribution patching, the walk's half: one gradient pass, then every point a few tensor products.

``lend`` runs the root plan's ``Attribution`` step (plan/attribution.py): per batch window, the
base forward with a zero perturbation ``δ`` added at every address some point writes (through
the same write path every intervention takes, on either engine), each metric at the base run,
and ``torch.autograd.grad`` of its sum over scored rows with respect to the ``δ``s — the
gradient of each row's metric at each of its own positions (rows of a batch never mix). Only
those gradients are kept: ``autograd.grad`` computes what it is asked for, not the weights'.

``estimate`` then scores one point without running its written forward: each write's change
``Δ = write(a_base) − a_base`` (the write applied by ``intervene.apply_write`` to the base
activation, with its operand from the un-written runs and its featurizer), dotted with the
gradient at the same rows, positions and units; a row's estimate is the base metric plus the
sum over its writes. The table has the exact sweep's shape, so everything downstream reads it.

``verify`` runs the chosen points exactly (the same compiled pass an exact sweep runs) once every
point is estimated, and records how the estimate held: Spearman's rank correlation between
estimated and exact effects (a point's mean change from the base metric), the recall of the exact
top-k among the estimated top-k, and the worst absolute error on a row.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from ..ops import intervene
from ..ops.featurizers import IDENTITY
from ..plan.plan import Attribution, Featurizers, Observe, Plan
from ..vocab import MECHANISMS
from . import passes as walk
from . import progress, taps


@dataclass
class Gradients:
    """What one attribution pass leaves for the points it estimates, over every row."""

    base: dict  # metric -> (rows,) float32 at the base run (0 where the metric scores no value)
    rows: dict  # metric -> per row, whether the base run scored it
    excluded: dict  # metric -> per-row reasons where the kind left a row undefined
    at: dict  # site key -> (rows, seq, width) the base activation at the full site
    grad: dict  # (metric, site key) -> (rows, seq, width) ∂metric/∂activation at the base run
    calls: dict = field(default_factory=lambda: {"forwards": 0, "backwards": 0})


def lend(engine, step: Attribution, root: Plan, state, *, batch_size: Optional[int] = None) -> None:
    """Run the attribution pass; leave its gradients in ``state`` for every point it estimates."""
    pname, sname = step.users[0]
    first = (root.steps[pname] if pname else root).steps[sname]
    ready = walk.prepare(engine, first, state)
    values = {mine: b.value.value for mine, b in ready.lent.items()}
    windows = {mine: (b.window, b.ragged) for mine, b in ready.lent.items()}
    values.update(_own_values(engine, first, ready, state, batch_size))
    windows.update((n, (w, r)) for f in ready.forwards if not f.writes for n, w, r in f.windows)
    (forward,), _ = walk.resolve(engine, (step.forward,))
    # The perturbations and their reads cover the whole padded sequence, rectangular: a point's
    # window (resolved against the same rows) indexes them as it indexes the activation.
    every = tuple(tuple(range(forward.tokens)) for _ in range(forward.rows))
    ours = {n for pair in step.grads for n in pair}
    forward = replace(forward, windows=tuple((n, every, False) if n in ours else (n, w, r)
                                             for n, w, r in forward.windows))
    windows.update((n, (w, r)) for n, w, r in forward.windows)
    rows = forward.rows
    placed = {m.name: walk.placed(m, windows) for m in step.metrics}
    size = batch_size or rows
    widths = {p: a.width for p, a in ((p, _address(step, p)) for p, _ in step.grads)}
    pieces: dict = {}
    base = {m.name: torch.zeros(rows, dtype=torch.float32) for m in step.metrics}
    rows_ok = {m.name: list(placed[m.name]) for m in step.metrics}
    excluded: dict = {}
    calls = {"forwards": 0, "backwards": 0}
    for a in range(0, rows, size):
        b = min(rows, a + size)
        part = walk.slice_forward(forward, a, b) if size < rows else forward
        deltas = {p: torch.zeros(b - a, forward.tokens, widths[p], dtype=torch.float32, requires_grad=True)
                  for p, _ in step.grads}
        got: dict = dict(deltas)
        with torch.enable_grad():
            engine.forward(part, got, state.featurizers)
            calls["forwards"] += 1
            got.update((n, _rows_of(v, windows[n], a, b)) for n, v in values.items())
            window_of = {n: (w[a:b], r) for n, (w, r) in windows.items()}
            scored = [m for m in step.metrics if any(placed[m.name][a:b])]
            for i, m in enumerate(scored):
                s = walk.score(m, got, window_of)
                where = [a + j for j, ok in enumerate(s.rows) if ok]
                base[m.name][where] = s.value.detach().to("cpu", torch.float32)
                for j, ok in enumerate(s.rows):
                    rows_ok[m.name][a + j] = ok
                if s.excluded is not None:
                    excluded.setdefault(m.name, [""] * rows)[a:b] = s.excluded
                order = list(deltas)
                grads = torch.autograd.grad(s.value.sum(), [deltas[p] for p in order],
                                            retain_graph=i < len(scored) - 1, allow_unused=True)
                calls["backwards"] += 1
                for p, g in zip(order, grads):
                    g = torch.zeros_like(deltas[p]) if g is None else g.detach()
                    pieces.setdefault((m.name, p), []).append(g.to("cpu", torch.float32))
        for p, at in step.grads:
            pieces.setdefault(at, []).append(got[at].detach().to("cpu", torch.float32))
        progress.announce_batch(step.name, b - a, b, rows)
        for m in step.metrics:  # a window where the metric scores no row: no gradient, zeros
            if m not in scored:
                for p in deltas:
                    pieces.setdefault((m.name, p), []).append(torch.zeros(b - a, forward.tokens, widths[p]))
    site = {p: _address(step, p).site_key for p, _ in step.grads}
    gradients = Gradients(
        base=base, rows={m: tuple(r) for m, r in rows_ok.items()},
        excluded={m: tuple(r) for m, r in excluded.items()},
        at={site[p]: torch.cat(pieces[at]) for p, at in step.grads},
        grad={(m.name, site[p]): torch.cat(pieces[(m.name, p)]) for m in step.metrics for p, _ in step.grads},
        calls=calls)
    for p, s in step.users:
        obs = (root.steps[p] if p else root).steps[s]
        state.estimates[id(obs)] = gradients
    step.results["calls"] = dict(calls)


def _address(step: Attribution, perturb: str):
    return next(w.address for w in step.forward.writes if w.name == perturb)


def _rows_of(value, window, a: int, b: int):
    """Rows [a, b) of an un-written read, as a window of the walk slices it (flat: by its rows' counts)."""
    win, ragged = window
    counts = tuple(len(w) for w in win) if ragged else None
    return walk.slice_published(walk.Published(value, per_row=True, counts=counts), a, b)


def _own_values(engine, obs: Observe, ready, state, batch_size: Optional[int]) -> dict:
    """The values of a point's own un-written forwards (none where a sweep shares them: the compared
    reads a metric needs, a reference run's logits, may be there) — run once for the attribution
    pass and the point's estimate alike."""
    plain = tuple(f for f in ready.forwards if not f.writes)
    if not plain:
        return {}
    key = (id(obs), "own")
    if key not in state.estimates:
        with torch.no_grad():
            state.estimates[key] = walk.run_forwards(engine, plain, state, obs.rows, batch_size, obs.name)
    return state.estimates[key]


def estimate(engine, obs: Observe, state, *, batch_size: Optional[int] = None) -> None:
    """Score ``obs`` from its attribution pass's gradients: the base metric plus, per write, Δ·∂metric/∂a."""
    gradients: Gradients = state.estimates[id(obs)]
    ready = walk.prepare(engine, obs, state)
    values = {mine: b.value.value for mine, b in ready.lent.items()}
    values.update(_own_values(engine, obs, ready, state, batch_size))
    state.estimates.pop((id(obs), "own"), None)  # read: not kept past the point
    written = next(f for f in ready.forwards if f.writes)
    windows = {n: (w, r) for f in ready.forwards for n, w, r in f.windows}
    # What earlier steps of the point published (a mean to ablate with), as tensors over every row;
    # kept for verification, which runs this pass exactly after the point's own walk has ended.
    published = {n: walk.slice_published(p, 0, obs.rows) for n, p in state.outputs.items()}
    state.estimates[(id(obs), "outputs")] = dict(state.outputs)
    changes = []
    with torch.no_grad():
        for w in written.writes:
            window, ragged = windows[w.name]
            key = w.address.site_key
            at = gradients.at[key]
            x = intervene.gather(at, window, ragged=ragged, features=w.address.columns, path=w.name)
            f0 = x if MECHANISMS[w.mechanism].needs_f0 else None
            new = intervene.apply_write(
                x, featurizer=state.featurizers.get(w.featurizer, IDENTITY) if w.featurizer else IDENTITY,
                mechanism=w.mechanism, params=dict(w.params),
                operand=taps.conform(_cpu(taps.operand_value(w.operand, {**published, **values})), x),
                f0=f0, features=w.features, path=w.name)
            changes.append((w, window, ragged, (new - x).to(torch.float32)))
        if ready.positions is not None:
            obs.results["positions"] = ready.positions
        eligible, excluded = {}, {}
        for m in obs.metrics:
            total = gradients.base[m.name].clone()
            for w, window, ragged, change in changes:
                g = intervene.gather(gradients.grad[(m.name, w.address.site_key)], window, ragged=ragged,
                                     features=w.address.columns, path=w.name)
                total += _per_row(change.mul(g).sum(-1), window, ragged)
            rows = gradients.rows[m.name]
            obs.results[m.name] = total[[i for i, ok in enumerate(rows) if ok]]
            eligible[m.name] = rows
            if m.name in gradients.excluded:
                excluded[m.name] = gradients.excluded[m.name]
    obs.results["eligible"] = eligible
    if excluded:
        obs.results["excluded"] = excluded


def _cpu(operand):
    return operand.detach().to("cpu") if isinstance(operand, torch.Tensor) else operand


def _per_row(products: torch.Tensor, window, ragged: bool) -> torch.Tensor:
    """Each row's sum over its positions: ``(rows, w)`` summed, or a flat ``(total,)`` summed by row."""
    if not ragged:
        return products.sum(-1)
    owner = torch.tensor([r for r, ps in enumerate(window) for _ in ps], dtype=torch.long)
    return torch.zeros(len(window), dtype=products.dtype).index_add_(0, owner, products)


# --- verification -----------------------------------------------------------------------------

def verify(engine, root: Plan, step: Attribution, state, *, batch_size: Optional[int] = None) -> None:
    """Run the points ``step.estimate`` chooses exactly and record how the estimate held, on the
    root (``results["attribution"]``) and on every estimated point (``results["verification"]``)."""
    est = step.estimate
    users = [(p, s, (root.steps[p] if p else root).steps[s]) for p, s in step.users]
    gradients: Gradients = state.estimates[id(users[0][2])]
    ranked = est.metric or step.metrics[0].name
    base = _base_by_row(gradients, ranked)
    effects = {p: _effect(_by_row(obs.results, ranked), base) for p, _, obs in users}
    by_estimate = sorted(effects, key=lambda p: -abs(effects[p]))
    if est.all:
        chosen = [p for p, _, _ in users]
    else:
        chosen = by_estimate[:est.top]
        rest = [p for p, _, _ in users if p not in chosen]
        chosen += random.Random(est.seed).sample(rest, min(est.random, len(rest)))
    exact = {}
    for p, s, obs in users:
        if p not in chosen:
            continue
        point = root.steps[p] if p else root
        featurizers = next((f for f in point.steps.values() if isinstance(f, Featurizers)), None)
        if featurizers is not None:  # this point's own featurizers, as they were when it was estimated
            from . import fit as fitting
            fitting.construct(featurizers, state)
        again = replace(obs, estimate=None, results={})
        with torch.no_grad():
            walk.observe(engine, again, walk.State(outputs=dict(state.estimates[(id(obs), "outputs")]),
                                                   featurizers=state.featurizers, shared=state.shared),
                         batch_size=batch_size)
        exact[p] = again.results
    k = est.top or max(1, round(len(users) / 10))
    figures = {}
    for m in step.metrics:
        figures[m.name] = _figures(m.name, users, exact, gradients, k, by_estimate if m.name == ranked else None)
    record = {"by": est.by, "step": step.users[0][1], "metric": ranked, "points": len(users), "verified": [p or None for p in chosen],
              "top": est.top, "random": est.random, "all": est.all, "seed": est.seed, "k": k,
              "calls": dict(gradients.calls), "figures": figures}
    root.results.setdefault("attribution", {})[step.name] = record
    for _, _, obs in users:
        obs.results["verification"] = figures


def _by_row(results: dict, name: str) -> dict:
    """A pass's values of metric ``name``, by the index of each row it scored."""
    rows = [i for i, ok in enumerate(results["eligible"][name]) if ok]
    return dict(zip(rows, results[name].tolist()))


def _base_by_row(gradients: Gradients, name: str) -> dict:
    rows = [i for i, ok in enumerate(gradients.rows[name]) if ok]
    return dict(zip(rows, gradients.base[name][rows].tolist()))


def _effect(values: dict, base: dict, rows=None) -> float:
    """The mean change from the base metric over ``rows`` (default: every row ``values`` has)."""
    rows = list(values) if rows is None else rows
    return math.fsum(values[i] - base[i] for i in rows) / len(rows) if rows else 0.0


def _figures(name: str, users, exact: dict, gradients: Gradients, k: int, by_estimate) -> dict:
    """Spearman between estimated and exact effects over the verified points (each over the rows
    both scored); recall of the exact top-k among the estimated top-k (on the ranking metric); the
    worst absolute error on a row."""
    base = _base_by_row(gradients, name)
    est_effects, exact_effects = [], []
    exact_effect = {}  # verified point -> its exact effect
    worst, worst_at = 0.0, None
    for p, _, obs in users:
        if p not in exact:
            continue
        estimated, exactly = _by_row(obs.results, name), _by_row(exact[p], name)
        both = [i for i in estimated if i in exactly]
        if not both:
            continue
        est_effects.append(_effect(estimated, base, both))
        exact_effects.append(_effect(exactly, base, both))
        exact_effect[p] = exact_effects[-1]
        for i in both:
            err = abs(estimated[i] - exactly[i])
            if err > worst or worst_at is None:
                worst, worst_at = err, {"point": p or None, "row": i}
    out = {"spearman": spearman(est_effects, exact_effects), "error": worst if worst_at else None,
           "error_at": worst_at, "verified": len(est_effects)}
    if by_estimate is not None:
        top_exact = sorted(exact_effect, key=lambda p: -abs(exact_effect[p]))[:k]
        top_est = set(by_estimate[:k])
        out["recall"] = sum(p in top_est for p in top_exact) / len(top_exact) if top_exact else None
    return out


def spearman(x: list, y: list) -> Optional[float]:
    """Spearman's rank correlation (ties get their average rank); None under two points or when one
    side is constant (no ranking to compare)."""
    if len(x) < 2:
        return None
    rx, ry = _ranks(x), _ranks(y)
    mx, my = math.fsum(rx) / len(rx), math.fsum(ry) / len(ry)
    cov = math.fsum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = math.fsum((a - mx) ** 2 for a in rx)
    vy = math.fsum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return None
    return cov / math.sqrt(vx * vy)


def _ranks(values: list) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return ranks

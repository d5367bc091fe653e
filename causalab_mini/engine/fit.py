"""The featurizer steps of the walk: construct, fit, and turn fitted parameters into results.

Nothing here is a second engine. A Fit holds every update it will make as an
Observe over one minibatch — already batched, tokenized and ordered by the
seed on the client — so an update is the walk's one pass (``steps.observe``,
which ``steps.run`` hands to ``fit``) with gradients on, and the only things
between updates are an optimizer step and the held-out pass. The pass is handed
over rather than imported so that the walk imports this module and not the
other way round.
Parameters are constructed here, where the run runs: a tensor drawn on the
client would not be the tensor the block rotates by.
"""
from __future__ import annotations

import copy
from typing import Callable, Optional

import torch

from ..errors import EngineError, MissingArtifact
from ..ops import featurizers as feat_ops
from ..ops import intervene
from ..plan.plan import Featurizers, Fit, Weights
from ..vocab import FEATURIZERS
from . import progress


def construct(step: Featurizers, state) -> None:
    """Every declared featurizer, fresh (from its seed or start) or loaded from its bundle.

    Always constructed anew: a sweep point's fit starts from the document's
    initial parameters, not from the previous point's fitted ones.
    """
    for spec in step.specs:
        tensors = None
        if spec.file_path is not None:
            tensors = load_bundle(spec.file_path, spec.name)
        with intervene.exact():
            state.featurizers[spec.name] = feat_ops.build(spec.kind, spec.d, spec.k, seed=spec.seed,
                                                          start=spec.start, tensors=tensors)


def load_bundle(path: str, name: str) -> dict:
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except FileNotFoundError:
        raise MissingArtifact(f"featurizers.{name}.file_path", f"{path} is gone since the plan was compiled",
                              "run the document that saves it") from None


# --- fit -------------------------------------------------------------------------------

def _term(name: str, scored: dict, state) -> torch.Tensor:
    """One objective term: a metric's mean over the update's rows, or ``<gate>.mask``'s soft mean."""
    if name.endswith(".mask") and name[:-5] in state.featurizers:
        return state.featurizers[name[:-5]].soft_mask().mean()
    return scored[name].mean()


def _set_training(state, names, on: bool) -> None:
    for name in names:
        state.featurizers[name].training = on


def _temperature(start: float, end: float, u: int, total: int) -> float:
    """Geometric from ``start`` on the first update to ``end`` on the last."""
    return start if total <= 1 else start * (end / start) ** (u / (total - 1))


def fit(engine, step: Fit, state, *, observe: Callable, batch_size: Optional[int] = None) -> None:
    """Epochs of AdamW updates over exactly ``step.params``; held-out pass and early stopping per epoch.

    ``observe(engine, obs, state, batch_size=, live=)`` runs one pass (``steps.observe``).

    The objective Σ wᵢ·termᵢ is minimized (the sign of a weight is the direction).
    Featurizers are in training mode only during updates. With early stopping the
    parameters and held-out results of the best epoch are what the fit leaves
    behind — the state the watched metric chose, not the last one tried.
    """
    live = [state.featurizers[n] for n in step.params]
    params = [p for f in live for p in f.parameters()]
    # No weight decay: the objective is the only pressure on the parameters (a gate's
    # sparsity is its explicit ``<gate>.mask`` term, with the weight the document gives).
    optimizer = torch.optim.AdamW(params, lr=step.lr, weight_decay=0.0)
    total = len(step.epochs) * step.epochs.updates
    anneal = {g: (a, b) for g, a, b in step.anneal}
    losses, update_losses, curves, best, stale, u = [], [], {}, None, 0, 0
    best_state = best_results = None
    for e, epoch in enumerate(step.epochs):
        epoch_loss = []
        for update in epoch:
            for gate, (a, b) in anneal.items():
                state.featurizers[gate].temperature = _temperature(a, b, u, total)
            _set_training(state, step.params, True)
            try:
                with torch.enable_grad(), intervene.exact():
                    scored = observe(engine, update, state, batch_size=batch_size, live=True)
                    loss = sum(w * _term(t, scored, state) for w, t in step.objective)
                    if not loss.requires_grad:
                        raise EngineError(step.name, "the objective does not depend on the trained "
                                          "parameters", "train a featurizer the scored pass writes through")
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
            finally:
                _set_training(state, step.params, False)
            if not torch.isfinite(loss):
                raise EngineError(step.name, f"the objective became {loss.item()} at epoch {e}",
                                  "lower lr, or check the objective's terms")
            update.results["loss"] = loss.detach().cpu()
            epoch_loss.append(loss.item())
            update_losses.append(loss.item())
            u += 1
        losses.append(sum(epoch_loss) / len(epoch_loss))
        means = _held_out(engine, step, state, e, batch_size, observe)
        for name, mean in means.items():
            curves.setdefault(name, []).append(mean)
        for name, f in zip(step.params, live):
            if FEATURIZERS[f.kind].mask:  # the sparsity curve's other axis: units the hard mask keeps
                curves.setdefault(f"{name}.kept", []).append(float(f.kept_units()))
        value = means[step.early_stop[0]] if step.early_stop else None
        said = f"{step.name}: epoch {e + 1}, loss {losses[-1]:.4g}"
        if value is not None:
            said += f", {step.early_stop[0]} {value:.3g}"
        progress.announce(said, e + 1, len(step.epochs))
        if step.early_stop is None or value is None:
            continue
        _, mode, patience = step.early_stop
        if best is None or (value > best if mode == "max" else value < best):
            best, stale = value, 0
            best_state = [{k: v.clone() for k, v in f.tensors().items()} for f in live]
            best_results = copy.copy(step.evaluation.results) if step.evaluation is not None else None
        else:
            stale += 1
            if stale >= patience:
                if len(step.epochs) > e + 1:
                    progress.announce(f"{step.name}: stopped early at epoch {e + 1}", len(step.epochs),
                                      len(step.epochs))
                break
    if best_state is not None:
        _restore(live, best_state)
        if best_results is not None:
            step.evaluation.results.clear()
            step.evaluation.results.update(best_results)
    # Per epoch: the mean training objective, each metric's mean on the held-out rows (on
    # the updates' rows when there are none), and each trained gate's kept units — the
    # curves to plot a fit by.
    step.results["loss"] = torch.tensor(losses)
    step.results["update_loss"] = torch.tensor(update_losses)  # every update's objective, in order
    for name, curve in curves.items():
        step.results[name] = torch.tensor(curve)
    step.results["epochs"] = torch.tensor(len(losses))


def _held_out(engine, step: Fit, state, epoch: int, batch_size, observe: Callable) -> dict[str, float]:
    """Each metric's mean this epoch: on the held-out pass if there is one, else over the epoch's updates."""
    if step.evaluation is not None:
        with torch.no_grad():
            observe(engine, step.evaluation, state, batch_size=batch_size)
        return {m.name: float(step.evaluation.results[m.name].float().mean()) for m in step.evaluation.metrics}
    updates = step.epochs[epoch]
    return {m.name: float(torch.stack([u.results[m.name].float().mean() for u in updates]).mean())
            for m in updates[0].metrics}


def _restore(live, saved) -> None:
    with torch.no_grad():
        for f, tensors in zip(live, saved):
            for param, name in zip(f.parameters(), tensors):
                param.copy_(tensors[name])


# --- weights ----------------------------------------------------------------------------

def weights(step: Weights, state) -> None:
    """Each named featurizer's tensors as a result: ``{name: {tensor name: tensor}}``, detached."""
    for name in step.names:
        if name not in state.featurizers:
            raise EngineError(f"{step.name}.names", f"no featurizer {name!r} was constructed in this run",
                              "name a featurizer the document declares")
        step.results[name] = {k: v.detach().cpu().clone() for k, v in state.featurizers[name].tensors().items()}

"""What ``plot`` draws for a run, chosen from what the run has: its swept axes, its metrics (with
their units) and the tensors it saves (an attention pattern, a gate's mask), read from each
point's own document. Every refusal is a ``PlanError`` naming the choices."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import PlanError
from ..formats import TENSORS, format_of

KINDS = ("heatmap", "line", "bars", "gate", "fit", "attention")


@dataclass(frozen=True)
class Choice:
    """What ``plot`` draws: the kind, the result (a metric key, or a saved tensor file), the axes."""

    kind: str
    result: Optional[str]
    x: Optional[str] = None
    y: Optional[str] = None


# --- what a run has ---------------------------------------------------------------------------

def spec_of(point):
    """The validated spec of one point (its own document: in memory, or ``document.json`` beside its files)."""
    from .. import api

    if point.plan is not None:
        raw, where = point.plan.document, point.document
    elif point.out is not None and (point.out / "document.json").is_file():
        where = point.out / "document.json"
        raw = json.loads(where.read_text(encoding="utf-8"))
    else:
        raise PlanError(f"point {point.name!r}", "neither in memory nor at a run folder",
                        "plot a Run from cm.run(...) or cm.open(DIR)")
    return api.read(raw, path=where).points[0].spec


def tensor_saves(spec) -> dict[str, tuple[str, Any]]:
    """Saved tensor files → ("attention", (site, tensor name)) | ("gate", tensor name) | ("other", None)."""
    from ..vocab import FEATURIZERS

    found: dict[str, tuple[str, Any]] = {}
    for step in spec.steps.values():
        outputs = getattr(step, "outputs", {})
        for save in step.saves:
            if format_of(save.file_path).holds != TENSORS:
                continue
            what: tuple[str, Any] = ("other", None)
            if save.value in outputs and step.kind == "observe":
                read = spec.interventions[step.interventions].reads[outputs[save.value].read]
                site = spec.sites[read.site]
                if site.component == "attention_probs" and outputs[save.value].reduce is None:
                    what = ("attention", (site, save.value))
            elif step.kind == "weights" and save.value in spec.featurizers:
                kind = FEATURIZERS[spec.featurizers[save.value].kind]
                if kind.mask:
                    what = ("gate", kind.tensor)
            found[save.file_path] = what
    return found


def metric_results(point) -> dict:
    """Metric key → Result: what the point saves first (in the document's order), then (in memory) the rest."""
    return {**point.saved(), **point.results()}


def result_of(point, key: str):
    """The Result a key names (``iia``, ``score/iia``); ambiguous or unknown keys refused with the choices."""
    found = metric_results(point)
    if key in found:
        return found[key]
    name, step = split_key(key)
    hits = [s for s in point.scored if s.name == name and (step is None or s.step == step)]
    if len(hits) == 1:
        return hits[0].result
    if hits:
        raise PlanError(f"result {key!r}", f"scored by {len(hits)} steps",
                        f"name the step: {', '.join(f'{s.step}/{name}' for s in hits)}")
    kept = " (a run opened from disk has what it saved)" if point.plan is None else ""
    raise PlanError(f"result {key!r}", f"not a result of this run{kept}", f"results: {', '.join(found) or 'none'}")


def split_key(key: str) -> tuple[str, Optional[str]]:
    step, _, name = key.rpartition("/")
    return name, step or None


def varying_axes(run) -> list[str]:
    from ..outputs.results import _distinct

    return [a for a in run.axes if len(_distinct(p.coords[a] for p in run.points)) > 1]


def coordinate(value) -> str:
    from ..names import label

    return label(value)


def unit_of(run, name: str) -> str:
    for p in run.points:
        rows = result_of(p, name).rows
        if rows:
            return str(rows[0].get("unit", ""))
    return ""


def choose(run, result: Optional[str] = None, *, x: Optional[str] = None, y: Optional[str] = None,
           kind: Optional[str] = None) -> Choice:
    """What ``plot`` would draw for these arguments; every refusal names the choices."""
    if not run.points:
        raise PlanError("plot", "the run has no points", "plot a run that has some")
    if kind is not None and kind not in KINDS:
        raise PlanError(f"kind {kind!r}", "not a kind of plot", f"kinds: {', '.join(KINDS)}")
    for flag, axis in (("x", x), ("y", y)):
        if axis is not None and axis not in run.axes:
            fix = f"axes: {', '.join(run.axes)}" if run.axes else "this run is not swept: leave x and y out"
            raise PlanError(f"plot({flag}={axis!r})", "not an axis of this run", fix)
    if x is not None and x == y:
        raise PlanError(f"plot(x={x!r}, y={y!r})", "one axis twice", "give two different axes")
    first = run.points[0]
    metrics, tensors = metric_results(first), tensor_saves(spec_of(first))
    attention = {f: w[1][1] for f, w in tensors.items() if w[0] == "attention"}  # file → output name
    gate = next((f for f, w in tensors.items() if w[0] == "gate"), None)
    result = _named(first, result, metrics, tensors, attention)
    if kind == "attention" or result in attention or (kind is None and result is None and not metrics and attention):
        if result is not None and result not in attention:
            raise PlanError(f"result {result!r}", "not an attention pattern",
                            f"attention patterns saved: {', '.join(attention) or 'none'}")
        if kind not in (None, "attention"):
            raise PlanError(f"result {result!r}", f"an attention pattern, drawn as kind 'attention', not {kind!r}",
                            "leave kind out")
        if not attention:
            raise PlanError("kind 'attention'", "this run saves no attention_probs output",
                            "save an observe step's output of an attention_probs read as .safetensors")
        return Choice("attention", result or next(iter(attention)))
    if result is not None and result == gate:
        result, kind = None, kind or "gate"  # the mask: the sparsity curve, on the first metric
    if not metrics:
        raise PlanError("plot", "nothing to plot: this run saves no metric",
                        "save a metric as .json (or an attention_probs output as .safetensors)")
    varying = varying_axes(run)
    given = [a for a in (x, y) if a is not None]
    if kind is None:
        if gate is not None and len(varying) <= 1 and not given:
            kind = "gate"
        elif len(given) == 2 or (given and len(varying) >= 2) or (not given and len(varying) == 2):
            kind = "heatmap"
        elif given or len(varying) == 1:
            kind = "line"
        elif not varying:
            kind = "bars"
        else:
            raise PlanError("plot", f"{len(varying)} axes vary ({', '.join(varying)}); a figure shows two",
                            "give x and y, and fix the rest: plot(run.select(axis=value), ...)")
    if kind == "bars":
        return Choice("bars", result)  # none asked: every saved metric, a panel each
    result = result or next(iter(metrics))
    if kind == "heatmap":
        free = [a for a in varying if a not in given]
        y = y or next((a for a in free if a != x), None)
        x = x or next((a for a in free if a != y), None)
        if x is None or y is None:
            raise PlanError("kind 'heatmap'", f"needs two axes, and {len(varying)} vary here",
                            "give x and y, or draw a line (one axis) or bars (none)")
    elif kind == "line":
        x, y = x or y or (varying[0] if varying else None), None
        if x is None:
            raise PlanError("kind 'line'", "needs a swept axis, and this run has none", "draw bars")
    elif kind == "gate" and gate is None:
        raise PlanError("kind 'gate'", "no gate's mask is saved, so the units kept are not known",
                        "save the gate with a weights step: {\"kind\": \"weights\", \"names\": [GATE], "
                        "\"saves\": [{\"value\": GATE, \"file_path\": \"mask.safetensors\"}]}")
    elif kind == "fit" and first.plan is None:
        raise PlanError("kind 'fit'", "a fit's per-epoch curves (loss, held-out metrics, units kept) are not on "
                        "disk: a fit's saves hold only its final held-out metric rows",
                        "plot the Run that cm.run(...) returns, in the process that ran it")
    return Choice(kind, result, x, y)


def _named(first, result: Optional[str], metrics: dict, tensors: dict, attention: dict) -> Optional[str]:
    """``result`` checked: a metric key, a saved tensor file (an attention output may go by its name)."""
    if result is None or result in metrics or result in tensors:
        if result in tensors and tensors[result][0] == "other":
            raise PlanError(f"result {result!r}", "a saved tensor, but not an attention pattern or a gate's mask",
                            f"results: {', '.join([*metrics, *attention]) or 'none'}")
        return result
    by_output = {name: file for file, name in attention.items()}
    if result in by_output:
        return by_output[result]
    choices = ", ".join([*metrics, *(f for f, w in tensors.items() if w[0] != "other")]) or "none"
    try:
        result_of(first, result)
    except PlanError as err:
        raise PlanError(err.path, err.problem, f"results: {choices}" if "results:" in err.fix else err.fix) from None
    return result



"""The figures a report shows for one document's run: what ``plots.choose`` would draw for each
saved metric (a heatmap for two swept axes, a line for one, bars for none, the sparsity curve of
a gate) and each saved attention pattern, as PNG bytes. A figure that cannot be drawn leaves a
note saying why instead, never a half-drawn one."""
from __future__ import annotations

from ..errors import PlanError
from .model import Figure

SHOWN_ATTENTION = 2  # attention patterns drawn per document: the first points' first row


def figures(run) -> tuple[list[Figure], list[str]]:
    """(figures, notes) for ``run``: its points opened or in memory, skipped points left out."""
    from ..plots import choose, encode, plot
    from ..plots.choose import metric_results, spec_of, tensor_saves, varying_axes
    from ..plots.style import matplotlib_or_refuse

    if not run.points:
        return [], []
    try:
        matplotlib_or_refuse()
    except PlanError as err:
        return [], [f"no figures: {err.problem} ({err.fix})"]
    first = run.points[0]
    metrics = list(first.saved() or metric_results(first))
    asks: list[dict] = []
    varying = varying_axes(run)
    if len(varying) > 2:
        return [], [f"no figures: {len(varying)} axes vary ({', '.join(varying)}); a figure shows two "
                    "(causalab-mini plot on a run.select(...) of it draws one)"]
    if metrics:
        kind = choose(run).kind
        asks += [{}] if kind == "bars" else [{"result": name} for name in metrics]
    try:
        saves = tensor_saves(spec_of(first))
    except PlanError:
        saves = {}
    patterns = [file for file, (what, _) in saves.items() if what == "attention"]
    for p in run.points[:SHOWN_ATTENTION]:
        asks += [{"result": file, "point": p.name} for file in patterns]
    out, notes = [], []
    for ask in asks:
        try:
            chosen = choose(run, ask.get("result"))
            fig = plot(run, **ask)
        except PlanError as err:
            notes.append(f"no figure of {ask.get('result') or 'the metrics'}: {err}")
            continue
        out.append(Figure(_caption(chosen, ask), encode(fig, "png"), chosen.kind, chosen.result))
    return out, notes


def _caption(chosen, ask: dict) -> str:
    if chosen.kind == "heatmap":
        return f"{chosen.result}: mean per point, {chosen.y} (rows) × {chosen.x} (columns)"
    if chosen.kind == "line":
        return f"{chosen.result}: mean per point over {chosen.x}, with its 95% bootstrap interval"
    if chosen.kind == "bars":
        return "each saved metric's mean, with its 95% bootstrap interval"
    if chosen.kind == "gate":
        return f"{chosen.result}: the gate's units kept against the metric (the sparsity curve)"
    return f"attention pattern {chosen.result} at {ask['point']}, row 0, mean over heads"

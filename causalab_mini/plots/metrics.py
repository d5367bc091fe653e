"""The figures of a metric over a sweep: a heatmap (two axes), a line with its bootstrap band (one
axis), bars with their intervals (no axis)."""
from __future__ import annotations

import math

from ..errors import PlanError
from .choose import Choice, coordinate, metric_results, result_of, split_key, unit_of, varying_axes
from .style import DIVERGING_UNITS, SEQUENTIAL_UNITS, SIZE, figure, colour_limits, title
from .ticks import tick_labels

LABEL_ROOM = 70  # characters of x tick text a heatmap's width holds level (~7 px each at 9 pt)


def heatmap(run, chosen: Choice, **_):
    import numpy as np
    from matplotlib.colors import Normalize

    metric, step = split_key(chosen.result)
    grid = run.grid(metric, chosen.y, chosen.x, step=step)
    values = np.array(grid.values, dtype=float)
    unit = unit_of(run, chosen.result)
    cmap, low, high = colour_limits(unit, values.ravel().tolist())
    fig, (ax,) = figure()
    # Row 0 at the top, rows going down in sweep order: layer 0 drawn first, as TransformerLens'
    # and nnsight's tutorials draw a layer x position grid (and as the grid's own values read).
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=low, vmax=high, origin="upper",
                      aspect="auto", interpolation="nearest")
    image.set_gid("heatmap")
    columns = tick_labels(run, chosen.x, grid.columns)
    ax.set_xticks(range(len(grid.columns)), columns)
    ax.set_yticks(range(len(grid.rows)), tick_labels(run, chosen.y, grid.rows))
    if max(map(len, columns), default=0) * len(columns) > LABEL_ROOM:
        # Tokens make long ticks: slanted, each ends under its own column instead of overlapping.
        ax.tick_params(axis="x", labelrotation=30)
        for text in ax.get_xticklabels():
            text.set_horizontalalignment("right")
            text.set_rotation_mode("anchor")
    ax.set_xlabel(chosen.x)
    ax.set_ylabel(chosen.y)
    colours, norm = image.get_cmap(), Normalize(low, high)
    for i, line in enumerate(values):
        for j, v in enumerate(line):
            if math.isnan(v):
                continue
            r, g, b, _ = colours(norm(v))
            ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", color=ink, fontsize=8)
    fig.colorbar(image, ax=ax, label=f"{chosen.result} ({unit})" if unit else chosen.result)
    ax.set_title(title(run, f"mean {chosen.result} per point"))
    return fig


def line(run, chosen: Choice, *, level: float, **_):
    from ..outputs.results import _distinct

    axis, name = chosen.x, chosen.result
    others = [a for a in varying_axes(run) if a != axis]
    if others:
        raise PlanError(f"plot(x={axis!r})", f"axis {others[0]!r} varies too, so a position would hold several "
                        "points", f"fix it: plot(run.select({others[0]}=...), ...), or give y for a heatmap")
    coords = _distinct(p.coords[axis] for p in run.points)
    results = [result_of(next(p for p in run.points if p.coords[axis] == c), name) for c in coords]
    means = [r.mean() for r in results]
    bands = [r.ci(level) for r in results]
    unit = unit_of(run, name)
    fig, (ax,) = figure()
    at = list(range(len(coords)))
    ax.fill_between(at, [b[0] for b in bands], [b[1] for b in bands], alpha=0.25, color="C0", linewidth=0,
                    gid="ci", label=f"{level:.0%} bootstrap CI")
    ax.plot(at, means, marker="o", color="C0", gid="mean", label="mean")
    if unit in DIVERGING_UNITS:
        ax.axhline(0.0, color="0.5", linewidth=0.8, linestyle="--")
    if unit in SEQUENTIAL_UNITS:
        ax.set_ylim(-0.05, 1.05)
    ax.set_xticks(at, [coordinate(c) for c in coords])
    ax.set_xlabel(axis)
    ax.set_ylabel(f"{name} ({unit})" if unit else name)
    ax.legend(loc="best")
    ax.set_title(title(run, f"mean {name} per point"))
    return fig


def bars(run, chosen: Choice, *, level: float, **_):
    p = run.point() if len(run.points) == 1 else None
    if p is None:
        raise PlanError("kind 'bars'", f"{len(run.points)} points; bars show one",
                        f"select one: plot(run.select(...), kind='bars'), points: {[q.name for q in run.points]}")
    names = [chosen.result] if chosen.result else list(p.saved() or metric_results(p))
    fig, axes = figure(ncols=len(names), size=(max(SIZE[0], 2.2 * len(names)), SIZE[1]))
    for ax, name in zip(axes, names):
        r = result_of(p, name)
        mean, (low, high) = r.mean(), r.ci(level)
        error = None if math.isnan(low) else [[mean - low], [high - mean]]
        ax.bar([0], [mean], yerr=error, capsize=6, color="C0", width=0.6, gid=f"bar:{name}")
        unit = unit_of(run, name)
        if unit in SEQUENTIAL_UNITS:
            ax.set_ylim(0, 1.05)
        ax.axhline(0.0, color="0.5", linewidth=0.8)
        ax.set_xticks([0], [name])
        ax.set_xlim(-0.8, 0.8)
        ax.set_ylabel(unit)
        ax.set_title(f"{mean:.3g} [{low:.3g}, {high:.3g}]", fontsize=8)
    fig.suptitle(title(run, f"mean and {level:.0%} bootstrap CI of each saved metric"))
    return fig



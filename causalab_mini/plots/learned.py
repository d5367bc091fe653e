"""The figures of what a run learned or looked at: a gate's sparsity curve (units kept against the
metric, from the saved mask), a fit's curves per epoch (in memory only: they are never on disk)
and one row of a saved attention pattern."""
from __future__ import annotations

import math
from typing import Optional

from ..errors import PlanError
from .choose import Choice, coordinate, result_of, spec_of, split_key, tensor_saves, unit_of, varying_axes
from .style import SEQUENTIAL_UNITS, SIZE, figure, title


def _kept(p) -> tuple[int, int]:
    """(units kept, units) of the gate mask the point saved: θ > 0 is kept (the hard mask)."""
    gates = [(f, w[1]) for f, w in tensor_saves(spec_of(p)).items() if w[0] == "gate"]
    saved = p.saved_tensors()
    for file, tensor in gates:
        if file in saved and tensor in saved[file]:
            theta = saved[file][tensor]
            return int((theta > 0).sum()), int(theta.numel())
    raise PlanError(f"point {p.name!r}", "its gate mask is not among the saved tensors",
                    "run the document again, with its weights step saving the gate")


def gate(run, chosen: Choice, *, level: float, **_):
    name = chosen.result
    kept = [_kept(p) for p in run.points]
    results = [result_of(p, name) for p in run.points]
    means = [r.mean() for r in results]
    bands = [r.ci(level) for r in results]
    unit = unit_of(run, name)
    fig, (ax,) = figure()
    xs = [k for k, _ in kept]
    order = sorted(range(len(xs)), key=lambda i: (xs[i], i))
    ax.plot([xs[i] for i in order], [means[i] for i in order], color="C0", linewidth=1, alpha=0.6)
    errors = [[m - b[0] if not math.isnan(b[0]) else 0.0 for m, b in zip(means, bands)],
              [b[1] - m if not math.isnan(b[1]) else 0.0 for m, b in zip(means, bands)]]
    ax.errorbar(xs, means, yerr=errors, fmt="o", color="C0", capsize=4, gid="gate")
    varying = varying_axes(run)
    width = max(n for _, n in kept)
    for p, x_, m in zip(run.points, xs, means):
        text = coordinate(p.coords[varying[0]]) if len(varying) == 1 else p.name
        right = x_ > width / 2  # labels lean inwards, so none leaves the axes
        ax.annotate(text, (x_, m), textcoords="offset points", xytext=(-4 if right else 4, 6), fontsize=7,
                    ha="right" if right else "left")
    ax.set_xlim(-0.5, width + 0.5)
    if unit in SEQUENTIAL_UNITS:
        ax.set_ylim(-0.05, 1.1)
    ax.set_xlabel(f"units the mask keeps (of {width})")
    ax.set_ylabel(f"{name} ({unit})" if unit else name)
    by = f", points labelled by {varying[0]}" if len(varying) == 1 else ""
    ax.set_title(title(run, f"{name} against units kept ({level:.0%} CI{by})"))
    return fig


def _fit_step(p):
    from ..plan.plan import Fit

    fits = [s for s in p.plan.steps.values() if isinstance(s, Fit) and "loss" in s.results]
    if not fits:
        raise PlanError("kind 'fit'", f"no fit ran at {p.name}", "plot a run of a document with a fit step")
    return fits[0]


def fit(run, chosen: Choice, **_):
    """Per epoch, one line per point: the mean training objective, the watched (or asked) metric on
    the held-out rows, and the units each trained gate keeps; the epoch early stopping kept, dotted."""
    from matplotlib.ticker import MaxNLocator

    fits = [(p, _fit_step(p)) for p in run.points]
    first = fits[0][1]
    curves = [k for k in first.results if k not in ("loss", "update_loss", "epochs") and not k.endswith(".kept")]
    metric = split_key(chosen.result)[0] if chosen.result else None
    if metric not in curves:
        metric = first.early_stop[0] if first.early_stop else (curves[0] if curves else None)
    source = first.evaluation.metrics if first.evaluation is not None else ()
    unit = next((m.unit for m in source if m.name == metric), "")
    panels = [("loss", "training objective (mean per epoch)")]
    if metric is not None:
        panels.append((metric, f"{metric} per epoch" + (" (held-out rows)" if first.evaluation else "")))
    panels += [(k, f"units {k[:-len('.kept')]} keeps") for k in first.results if k.endswith(".kept")]
    fig, axes = figure(ncols=len(panels), size=(max(SIZE[0], 3.2 * len(panels)), SIZE[1]))
    for ax, (key, label) in zip(axes, panels):
        for i, (p, f) in enumerate(fits):
            curve = f.results[key].tolist()
            ax.plot(range(1, len(curve) + 1), curve, marker=".", color=f"C{i % 10}", gid=f"{key}:{p.name}",
                    label=p.name)
            if f.early_stop is not None and f.early_stop[0] in f.results:
                watched = f.results[f.early_stop[0]].tolist()
                best = (max if f.early_stop[1] == "max" else min)(watched)
                ax.axvline(watched.index(best) + 1, color=f"C{i % 10}", linestyle=":", linewidth=1,
                           gid=f"kept:{p.name}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_title(label, fontsize=9)
        if key == metric and unit in SEQUENTIAL_UNITS:
            ax.set_ylim(-0.05, 1.05)
    if len(fits) > 1:
        axes[0].legend(fontsize=7, loc="best")
    stopped = " (dotted: the epoch early stopping kept)" if first.early_stop else ""
    fig.suptitle(title(run, f"fit per epoch{stopped}"))
    return fig


def attention(run, chosen: Choice, *, point: Optional[str], row: int, head: Optional[int], **_):
    p = run.point(point) if point is not None or len(run.points) == 1 else None
    if p is None:
        raise PlanError("kind 'attention'", f"{len(run.points)} points; a pattern is one point's",
                        f"name one (point=...): {[q.name for q in run.points]}")
    site, tensor = tensor_saves(spec_of(p))[chosen.result][1]
    value = p.saved_tensors()[chosen.result][tensor].float().numpy()
    if value.ndim != 3:
        raise PlanError(chosen.result, "the pattern was read over a ragged window (a different count of "
                        "positions per row), and the rows' boundaries are not saved",
                        "read a window every row has, like {\"last\": 6} or a bare index")
    if not 0 <= row < value.shape[0]:
        raise PlanError(f"row {row}", f"not a row of this pattern ({value.shape[0]} rows)",
                        f"give 0 to {value.shape[0] - 1}")
    pattern = value[row]  # (queries, heads·keys), heads-major
    # The site's heads when it names them; else all of the model's, which the pattern itself
    # says: each head's row of probabilities sums to 1.
    heads = len(site.heads) if site.heads is not None else int(round(float(pattern[-1].sum())))
    if heads < 1 or pattern.shape[1] % heads:
        raise PlanError(chosen.result, "cannot tell its heads from its keys (a written pattern?)",
                        "read the model's own pattern")
    keys = pattern.shape[1] // heads
    per_head = pattern.reshape(pattern.shape[0], heads, keys).transpose(1, 0, 2)
    names = list(site.heads) if site.heads is not None else list(range(heads))
    if head is None:
        shown, what = per_head.mean(axis=0), f"mean of heads {names}"
    elif head in names:
        shown, what = per_head[names.index(head)], f"head {head}"
    else:
        raise PlanError(f"head {head}", "not a head of this pattern", f"heads: {names}")
    fig, (ax,) = figure()
    image = ax.imshow(shown, cmap="viridis", vmin=0.0, vmax=float(max(shown.max(), 1e-9)), aspect="auto",
                      interpolation="nearest")
    image.set_gid("attention")
    ax.set_xticks(range(keys), [str(k) for k in range(keys)])
    ax.set_yticks(range(shown.shape[0]), [str(q) for q in range(shown.shape[0])])
    ax.set_xlabel("key (position in the padded batch)")
    ax.set_ylabel("query (position in the read's window)")
    fig.colorbar(image, ax=ax, label="attention probability")
    layer = f" layer {site.layers[0]}" if site.layers else ""
    ax.set_title(title(run, f"{chosen.result}{layer}, row {row}, {what}"), fontsize=9)
    return fig

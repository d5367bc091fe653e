"""The look every figure shares, fixed so that the same run gives the same bytes: Agg, one size and
DPI, DejaVu Sans, a fixed SVG hash salt, no timestamp or software stamp in the file."""
from __future__ import annotations

import math

from ..errors import PlanError

FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
DPI = 100
SIZE = (6.4, 4.8)
RC = {"font.family": "DejaVu Sans", "font.size": 9, "svg.hashsalt": "causalab-mini", "svg.fonttype": "path",
      "pdf.fonttype": 42, "figure.dpi": DPI, "savefig.dpi": DPI, "axes.titlesize": 10}
# No timestamp, no "Software: matplotlib x.y" stamp: bytes depend on the data and matplotlib's drawing only.
METADATA = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None},
            "pdf": {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}}
SEQUENTIAL_UNITS = ("fraction", "probability")  # bounded in [0, 1]
DIVERGING_UNITS = ("logit",)  # signed, 0 meaning "no preference"


def matplotlib_or_refuse():
    """matplotlib, or a refusal naming the extra that installs it."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        raise PlanError("plot", "matplotlib is not installed",
                        'pip install "causalab-mini[plots]" (or matplotlib), or use run.grid() / run.table()') from None
    return matplotlib


def figure(ncols: int = 1, nrows: int = 1, size=SIZE):
    """A new figure on its own Agg canvas (never pyplot's global state) and its axes, flat."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [a for line in axes for a in line]


def title(run, what: str) -> str:
    """The figure's title: the document's name (never a path: the same run gives the same bytes anywhere)."""
    from ..names import stem

    name = (run.record or {}).get("document") or (stem(run.document) if run.document else None)
    return f"{name}: {what}" if name else what


def colour_limits(unit: str, values) -> tuple[str, float, float]:
    """(colour map, low, high): 0–1 for a fraction or probability, symmetric about 0 for logits."""
    finite = [v for v in values if not math.isnan(v)]
    if unit in SEQUENTIAL_UNITS:
        return "viridis", 0.0, 1.0
    if unit in DIVERGING_UNITS:
        bound = max((abs(v) for v in finite), default=0.0) or 1.0
        return "RdBu_r", -bound, bound
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    return "viridis", low, high if high > low else low + 1.0

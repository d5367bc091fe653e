"""Figures of a run: ``plot(run)`` → a matplotlib ``Figure``; ``causalab-mini plot OUT_DIR`` on the command line.

::

    import causalab_mini as cm
    from causalab_mini.plots import plot

    run = cm.open("runs/layer_pos")
    plot(run, "iia", path="iia.png")            # two swept axes: a heatmap of the mean per point
    plot(run.select(layers=1), "logit_diff")     # one axis left: the mean with its bootstrap band

What is drawn when ``kind`` is not given (``choose`` says, without drawing):

* ``heatmap`` — two swept axes (``y`` the rows, ``x`` the columns; by default in the document's
  order): ``Run.grid``'s mean per point, each cell annotated; a diverging map centred on 0 for
  a metric in logits, 0–1 for fractions and probabilities, the data's range otherwise. Rows go
  down in sweep order, so layer 0 is at the top. A position axis's tick is the coordinate and
  the token every row lands on (``-1 ' is'``), or the position alone where rows differ or the
  run does not say (``-4``, ``-1 entity``): ``ticks`` and ``landed`` say how that is decided.
* ``line`` — one swept axis: the mean per point, in sweep order, with ``Result.ci`` as a band.
* ``bars`` — an unswept run: one panel per saved metric (or the one asked for), mean and CI.
* ``gate`` — a run whose ``weights`` step saves a gate (DBM's mask): per point, the units the
  saved mask keeps (θ > 0) against the metric's mean and CI — the sparsity curve.
* ``fit`` (only when asked) — a fit's training objective, watched metric and units kept per
  epoch. Those curves are never written to disk (a fit's ``saves`` hold its final held-out
  metric rows), so this draws the ``Run`` that ``cm.run`` returned and refuses an opened one.
* ``attention`` — a saved ``attention_probs`` output (``result`` names its file or output):
  one row's pattern, queries (the read's window) × keys (positions of the padded batch), the
  mean over heads or one ``head``. The prompt's tokens are not on disk: the axes are indices.

The result, when not given, is the first metric the run saves. Output is deterministic (see
``style``): the same run gives the same bytes. matplotlib is optional and imported only when a
figure is made: ``pip install "causalab-mini[plots]"``.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Optional

from ..errors import PlanError
from .choose import KINDS, Choice, choose
from .style import DPI, FORMATS, METADATA, RC, matplotlib_or_refuse

__all__ = ["plot", "save", "encode", "choose", "file_name", "Choice", "KINDS"]


def plot(run, result: Optional[str] = None, *, x: Optional[str] = None, y: Optional[str] = None,
         kind: Optional[str] = None, point: Optional[str] = None, row: int = 0, head: Optional[int] = None,
         level: float = 0.95, path=None):
    """The figure of ``run`` (a ``Run`` from ``cm.run`` or ``cm.open``), written to ``path`` if given
    (``.png``, ``.svg`` or ``.pdf``). ``result``: a metric (``"iia"``, ``"score/iia"``) or a saved
    attention pattern (its file or output name); ``x``/``y``: sweep axes (columns, rows);
    ``kind``: one of ``KINDS``; ``point``, ``row``, ``head``: which attention pattern;
    ``level``: the confidence of the bootstrap bands and bars."""
    from .learned import attention, fit, gate
    from .metrics import bars, heatmap, line

    matplotlib = matplotlib_or_refuse()
    _format(path)
    chosen = choose(run, result, x=x, y=y, kind=kind)
    draw = {"heatmap": heatmap, "line": line, "bars": bars, "gate": gate, "fit": fit, "attention": attention}
    with matplotlib.rc_context(RC):
        fig = draw[chosen.kind](run, chosen, point=point, row=row, head=head, level=level)
    if path is not None:
        save(fig, path)
    return fig


def save(fig, path) -> Path:
    """Write ``fig`` to ``path`` (the format by its suffix), the same bytes for the same figure."""
    from ..files import write_atomic

    path = Path(path)
    write_atomic(path, encode(fig, _format(path)))
    return path


def encode(fig, fmt: str = "png") -> bytes:
    """``fig`` as the bytes of a ``png``, ``svg`` or ``pdf`` file: deterministic, as ``save`` writes."""
    matplotlib = matplotlib_or_refuse()
    buffer = io.BytesIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buffer, format=fmt, dpi=DPI, metadata=METADATA[fmt])
    return buffer.getvalue()


def _format(path) -> Optional[str]:
    if path is None:
        return None
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise PlanError(str(path), "not a figure file this writes", f"end it in {', '.join(FORMATS)}")
    return fmt


def file_name(run, chosen: Choice) -> str:
    """A figure's default file: ``<document>-<result or kind>.png`` (``layer_pos_sweep-iia.png``)."""
    name = (run.record or {}).get("document") or (Path(run.out).resolve().name if run.out else "run")
    what = Path(chosen.result).stem if chosen.kind == "attention" else (chosen.result or chosen.kind)
    return f"{name}-{what}.png".replace("/", "_")

"""An observe step's ``estimate``: score a patching sweep by attribution instead of running every patch.

Written on the step, it applies to every point of the sweep::

    "score": {"kind": "observe", "interventions": "patching", "rows": {...},
              "estimate": {"by": "attribution",
                           "verify": {"top": 5, "random": 5, "seed": 0, "metric": "logit_diff"}}}

Each point's table is then its rows' *estimated* metric: the metric of the un-written base run
plus the first-order change its writes would make, ``(a_written − a_base) · ∂metric/∂a`` at the
base run (Nanda 2023; AtP, Kramár et al. 2024). ``verify`` runs the exact patch on the points
whose estimated effect is largest (``top``), on a seeded random sample of the rest (``random``, a
control), or on every point (``all``), and records how well the estimate ranked them.

The compiler decides what can be estimated (``plan/attribution.py``); this is only the shape.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Verify(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    top: int = Field(0, ge=0, description="Run exactly the points whose estimated effect on `metric` is "
                                          "largest in magnitude, this many; it is also the k of the recall "
                                          "recorded (with `all`, k alone; default a tenth of the points).")
    random: int = Field(0, ge=0, description="And this many more, drawn at random from the rest (a control).")
    all: bool = Field(False, description="Run every point exactly (what the benchmark and a first check do).")
    seed: int = Field(0, ge=0, lt=2**63, description="The random sample's seed.")
    metric: Optional[str] = Field(None, description="The metric the points are ranked by (default: the "
                                                    "intervention's first).")

    @model_validator(mode="after")
    def _something(self) -> "Verify":
        if not self.all and not self.top and not self.random:
            raise ValueError('verify runs some points exactly: give "top", "random" or "all": true '
                             '(or leave "verify" out)')
        if self.all and self.random:
            raise ValueError('"all": true runs every point, and "random" draws some of them: write one or the other')
        return self


class Estimate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    by: Literal["attribution"] = Field(description="How the step's metrics are estimated: `attribution`, "
                                                   "the first-order effect of each point's writes at the base run.")
    verify: Optional[Verify] = Field(None, description="Which points to also run exactly, to measure the estimate.")

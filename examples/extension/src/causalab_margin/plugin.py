"""A metric and a mechanism for causalab-mini, registered through its pluggy hooks.

- ``logit_margin`` (column ``token``): logit[token] − the largest logit of any other token. It is
  positive exactly where token is the model's top prediction, and says by how much it leads.
- ``scale`` (no operand; parameter ``factor``): multiplies the feature value — a dial between
  zero ablation (factor 0) and the activation itself (factor 1).

Each sees torch tensors only, so it runs the same on either engine and in the pytest plugin.
"""
from pydantic import Field

from causalab_mini.extensions import hookimpl
from causalab_mini.metric_kinds import MetricKind, Params
from causalab_mini.vocab import Mechanism


def logit_margin(logits, token):
    """logit[token] − max over the other tokens' logits."""
    own = logits.gather(-1, token[:, None]).squeeze(-1)
    others = logits.scatter(-1, token[:, None], float("-inf"))
    return own - others.max(dim=-1).values


class Scale(Params):
    factor: float = Field(description="what the feature value is multiplied by")


def scale(f, operand, params, f0=None):
    """factor · f."""
    return f * params["factor"]


@hookimpl
def causalab_mini_metric_kinds():
    return [MetricKind("logit_margin", ("token",), unit="logit", differentiable=True, compute=logit_margin,
                       doc=logit_margin.__doc__)]


@hookimpl
def causalab_mini_mechanisms():
    return [Mechanism("scale", operand=False, params=Scale, apply=scale, doc="factor * x")]

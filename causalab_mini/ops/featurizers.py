"""The featurizer protocol, and the one featurizer that is never declared.

A featurizer is the space a write acts in. It is two functions:

    featurize(x)        -> (f, err)   f: the feature value; err: what the map threw away
    inverse(f, err, x)  -> x'         back to the activation, given the error term and
                                      the pre-write activation x

and ``ops.intervene.apply_write`` composes them around a mechanism:
``write = inverse(do(featurize(x)), err, x)``. Both run in float32 inside
``intervene.exact()``; a featurizer never sees autocast.

Selecting part of the feature space (a write's ``features``) is not the
featurizer's job: ``apply_write`` cuts the feature vector with
``select_features`` and puts it back with ``merge_features``. A featurizer whose
feature space has a cheaper or different notion of "these coordinates only"
(an SAE that would rather encode only some latents, say) may define methods of
the same two names, and ``apply_write`` uses them instead of the module
functions — that is the one place a featurizer's own selection plugs in.
"""
from __future__ import annotations

from typing import Optional, Protocol, runtime_checkable

import torch
from torch import Tensor


@runtime_checkable
class Featurizer(Protocol):
    """What ``apply_write`` and a read need of a featurizer.

    Optional, looked up with ``getattr``: ``select_features(f, features)`` and
    ``merge_features(f, sub, features)``, with the signatures of this module's
    functions of those names.
    """

    def featurize(self, x: Tensor) -> tuple[Tensor, Optional[Tensor]]: ...

    def inverse(self, f: Tensor, err: Optional[Tensor], x: Tensor) -> Tensor: ...


class Identity:
    """No featurizer key: the features are the activation, and nothing is thrown away.

    With it the write line collapses to "replace the tensor" — activation patching.
    """

    name = "identity"

    def featurize(self, x: Tensor) -> tuple[Tensor, None]:
        return x, None

    def inverse(self, f: Tensor, err: None, x: Tensor) -> Tensor:
        return f

    def __repr__(self) -> str:
        return "Identity()"


IDENTITY = Identity()


def _index(features: tuple[int, ...], f: Tensor) -> Tensor:
    return torch.as_tensor(features, dtype=torch.long, device=f.device)


def select_features(f: Tensor, features: tuple[int, ...]) -> Tensor:
    """The coordinates ``features`` of the last axis of ``f``, in that order."""
    return f.index_select(f.dim() - 1, _index(features, f))


def merge_features(f: Tensor, sub: Tensor, features: tuple[int, ...]) -> Tensor:
    """``f`` with its coordinates ``features`` replaced by ``sub``; ``f`` itself is untouched.

    Out of place (``index_copy``), so gradients reach both ``sub`` and the
    coordinates of ``f`` that pass through.
    """
    return f.index_copy(f.dim() - 1, _index(features, f), sub.to(f.dtype))

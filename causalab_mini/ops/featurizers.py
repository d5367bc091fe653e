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

import math
from typing import Optional, Protocol, runtime_checkable

import torch
from torch import Tensor

from .. import kernel


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


# The maps below are the kernel's functions (kernel.py): what a stock server computes for a remote
# write is what these classes compute here.
select_features = kernel.select_features  # the coordinates ``features`` of f's last axis, in that order
merge_features = kernel.merge_features  # f with those coordinates replaced by ``sub``, out of place


# --------------------------------------------------------------------------- declarable kinds
#
# Every kind below returns the activation to the bit when the mechanism leaves the
# features alone: ``inverse`` adds the *change* in feature space, mapped back, to
# ``x`` — ``x + back(f') - back(f)`` — which equals ``back(f') + err`` in exact
# arithmetic and is exactly ``x`` when ``f' == f``. The error term (what the map
# throws away) is therefore never rounded into the write.


_on = kernel.on
cayley = kernel.cayley  # Q = (I − A)⁻¹ (I + A) E, A = W Eᵀ − E Wᵀ, by Woodbury (its docstring says how)


def cayley_direct(weight: Tensor) -> Tensor:
    """The same Q by the d × d solve: the definition, for tests and the benchmark."""
    d, k = weight.shape
    eye_dk = torch.eye(d, k, dtype=weight.dtype, device=weight.device)
    a = weight @ eye_dk.T - eye_dk @ weight.T
    eye = torch.eye(d, dtype=weight.dtype, device=weight.device)
    return torch.linalg.solve(eye - a, (eye + a) @ eye_dk)


class _Basis:
    """featurize(x) = (x Q, x − x Q Qᵀ); inverse adds (f′ − f) Qᵀ to x."""

    def featurize(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return kernel.basis_featurize(self.basis(), x)

    def inverse(self, f: Tensor, err: Optional[Tensor], x: Tensor) -> Tensor:
        return kernel.basis_inverse(self.basis(), f, x)


class Subspace(_Basis):
    """DAS's rotation: a (d, k) parameter W, and Q = cayley(W) recomputed on every access.

    Recomputed, because a cached basis would be stale the moment an optimizer
    stepped. Unfitted, W is a reproducible draw from ``seed`` scaled by 1/√d:
    unscaled, the skew matrix's singular values grow like √d and the transform
    saturates toward −I, a rotation no gradient can move.
    """

    kind = "subspace"

    def __init__(self, d: int, k: int, *, seed: int = 0, weight: Optional[Tensor] = None):
        if weight is None:
            gen = torch.Generator().manual_seed(seed)
            weight = torch.randn(d, k, generator=gen, dtype=torch.float32) / math.sqrt(d)
        self.weight = torch.nn.Parameter(weight.detach().to(torch.float32).clone())
        self.training = False

    def basis(self) -> Tensor:
        return cayley(self.weight)

    def parameters(self) -> list[Tensor]:
        return [self.weight]

    def tensors(self) -> dict[str, Tensor]:
        return {"weight": self.weight.detach()}


class PCA(_Basis):
    """A stored orthonormal basis Q (d, k): always loaded, never trained — the control for DAS."""

    kind = "pca"

    def __init__(self, q: Tensor):
        self.q = q.detach().to(torch.float32)
        self.training = False

    def basis(self) -> Tensor:
        return self.q

    def parameters(self) -> list[Tensor]:
        return []

    def tensors(self) -> dict[str, Tensor]:
        return {"Q": self.q}


class Dictionary:
    """An SAE (``sae``: ReLU) or a linear dictionary (``linear``), with SAELens's names and orientations.

    f = act((x − b_dec) W_enc + b_enc), decode(f) = f W_dec + b_dec, err = x − decode(f).
    W_enc is (d, k), W_dec (k, d); a missing W_dec is tied, W_encᵀ. A write changes
    what the dictionary explains and leaves what it does not explain as it was: with
    f′ = f the activation comes back to the bit, however bad the reconstruction.
    """

    def __init__(self, kind: str, w_enc: Tensor, b_enc: Optional[Tensor] = None,
                 w_dec: Optional[Tensor] = None, b_dec: Optional[Tensor] = None):
        d, k = w_enc.shape
        self.kind = kind
        self.w_enc = w_enc.detach().to(torch.float32)
        self.w_dec = (w_dec.detach().to(torch.float32) if w_dec is not None else self.w_enc.T)
        self.tied = w_dec is None
        self.b_enc = b_enc.detach().to(torch.float32) if b_enc is not None else torch.zeros(k)
        self.b_dec = b_dec.detach().to(torch.float32) if b_dec is not None else torch.zeros(d)
        self.training = False

    def encode(self, x: Tensor) -> Tensor:
        return kernel.dictionary_encode(self.kind, self.w_enc, self.b_enc, self.b_dec, x)

    def decode(self, f: Tensor) -> Tensor:
        return kernel.dictionary_decode(self.w_dec, self.b_dec, f)

    def featurize(self, x: Tensor) -> tuple[Tensor, Tensor]:
        f = self.encode(x)
        return f, x - self.decode(f)

    def inverse(self, f: Tensor, err: Optional[Tensor], x: Tensor) -> Tensor:
        return kernel.dictionary_inverse(self.decode(f), self.decode(self.encode(x)), x)

    def parameters(self) -> list[Tensor]:
        return []

    def tensors(self) -> dict[str, Tensor]:
        out = {"W_enc": self.w_enc, "b_enc": self.b_enc, "b_dec": self.b_dec}
        if not self.tied:
            out["W_dec"] = self.w_dec
        return out


class Gate:
    """DBM's learned mask over the site's units: featurize(x) = (x, 0); inverse = m ⊙ f + (1 − m) ⊙ x.

    One parameter θ, two readings — the only mode in the library: while a fit
    trains it (``training``) the mask is soft, σ(θ / T); otherwise it is hard,
    θ > 0, including for a gate loaded from a file, which is a mask and nothing
    else. ``start`` puts every θ at that value (default 0: σ = ½ while training,
    every unit off until a fit says otherwise).
    """

    kind = "gate"

    def __init__(self, d: int, *, start: Optional[float] = None, theta: Optional[Tensor] = None):
        if theta is None:
            theta = torch.full((d,), 0.0 if start is None else float(start), dtype=torch.float32)
        self.theta = torch.nn.Parameter(theta.detach().to(torch.float32).clone())
        self.training = False
        self.temperature = 1.0

    def soft_mask(self) -> Tensor:
        return torch.sigmoid(self.theta / self.temperature)

    def kept_units(self) -> int:
        """How many units the hard mask (θ > 0) lets the write through at."""
        return int((self.theta > 0).sum())

    def featurize(self, x: Tensor) -> tuple[Tensor, None]:
        return x, None

    def inverse(self, f: Tensor, err: Optional[Tensor], x: Tensor) -> Tensor:
        if self.training:
            m = _on(self.soft_mask(), x)
            return m * f + (1 - m) * x
        return kernel.hard_gate(self.theta, f, x)

    def parameters(self) -> list[Tensor]:
        return [self.theta]

    def tensors(self) -> dict[str, Tensor]:
        return {"theta": self.theta.detach()}


def _loaded(kind: str, tensors: dict, name: str, *, lone: bool = False) -> Tensor:
    """The bundle tensor ``name`` a kind that is only ever loaded is made of (``lone``: or the only one)."""
    if name in tensors:
        return tensors[name]
    if lone and len(tensors) == 1:
        return next(iter(tensors.values()))  # what a ``reduce: pca`` output saves, whatever it is called
    raise ValueError(f"a {kind} is built from a bundle's {name!r} tensor, and the bundle given has "
                     f"{sorted(tensors) or 'no tensors'}")


def build(kind: str, d: int, k: Optional[int], *, seed: int = 0, start: Optional[float] = None,
          tensors: Optional[dict] = None):
    """A featurizer of ``kind`` for a ``d``-wide site: from a bundle's ``tensors``, or fresh.

    What each kind is (trainable, loaded, its fields) is recorded in ``vocab.FEATURIZERS``;
    tests/test_featurizer_kinds.py holds that record to what this builds.
    """
    t = tensors or {}
    from ..vocab import FEATURIZERS

    record = FEATURIZERS.get(kind)
    if record is not None and record.make is not None:
        return _extension(record, d, k, t)
    if kind == "subspace":
        return Subspace(d, k, seed=seed, weight=t.get("weight"))
    if kind == "gate":
        return Gate(d, start=start, theta=t.get("theta"))
    if kind == "pca":
        return PCA(_loaded(kind, t, "Q", lone=True))
    if kind in ("sae", "linear"):  # one class, two activations (Dictionary.encode)
        return Dictionary(kind, _loaded(kind, t, "W_enc"), t.get("b_enc"), t.get("W_dec"), t.get("b_dec"))
    raise ValueError(f"unknown featurizer kind {kind!r}")


def _extension(record, d: int, k: Optional[int], tensors: dict):
    """An extension's featurizer, made by its own function and held to the protocol the walk uses:
    what it returns is checked once, here, for the two methods; their outputs are checked where a
    write uses them (``apply_write``: the inverse's shape)."""
    from ..errors import EngineError

    whose = f"featurizer kind {record.name!r} (registered by {record.origin})"
    try:
        made = record.make(d, k, tensors)
    except Exception as err:  # noqa: BLE001 — the extension's own failure, by name
        raise EngineError(f"featurizers.{record.name}", f"{whose} raised {type(err).__name__}: {err}",
                          f"fix or upgrade {record.origin}") from None
    if not (callable(getattr(made, "featurize", None)) and callable(getattr(made, "inverse", None))):
        raise EngineError(f"featurizers.{record.name}", f"{whose} made {type(made).__name__}, which has no "
                          "featurize(x) and inverse(f, err, x)", f"fix or upgrade {record.origin}")
    return made

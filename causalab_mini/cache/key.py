"""A sweep point's cache key: a sha256 over everything that decides its results, as the run used it.

The parts (``parts``), each taken from what runs — the compiled plan, the loaded engine, the
run's provenance record — never from what the document merely says:

- ``produced_by``: the plan's digest of the point's experiment (the document's header aside);
- ``inputs``: a digest of the point as compiled: its rows as tokenized (so the dataset files and
  the tokenizer), the answers' token ids, the bytes of every featurizer file it loads —
  ``produced_by`` names a dataset, not what the file holds today;
- ``revision``: the weights the engine loaded (a local folder's weights digest, or the hub
  commit transformers resolved);
- ``model_config``: the loaded model's config (norm epsilons, rope, the attention implementation
  — eager rounds differently) — files beside the weights that the revision does not cover;
- ``runtime``: the devices the weights sit on and torch's CPU thread count (a different count
  sums in a different order: other bits);
- ``record``: the run record (``engine/provenance.py``): the engine, remote, the package
  versions, this package's source digest, the dtype the model was served in, and the batch size
  — a batch is padded to its longest row, so other windows can give other numbers.

The point's name is not a part: a point run alone (``doc.point(name)``) and the same point
inside its sweep have one key. Sharing a forward across points is not one either (``share.py``:
the same computation on the same rows), so keys are taken from the plan compiled unshared.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from ..errors import CausalabError
from ..plan.plan import Epochs, FeaturizerSpec, Plan

FORMAT = 2  # bumped when an entry's layout or the key's parts change: every older entry then misses


class CacheError(CausalabError):
    """The result cache cannot be used: its folder is not a writable folder, or a run's results
    cannot be keyed (a model whose revision is unknown, a remote run). Refused before any compute."""


def digest(parts: Mapping) -> str:
    """The key: sha256 of the parts as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(_canonical(parts)).hexdigest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def parts(point: Plan, inputs: str, model: Mapping, record: Mapping) -> dict:
    """A point's key parts: ``inputs`` from ``inputs_digest``, ``model`` from ``model_parts``,
    ``record`` the run record (the whole of it: a field provenance gains later joins the key)."""
    return json.loads(_canonical({"format": FORMAT, "produced_by": point.produced_by, "inputs": inputs,
                                  **model, "record": dict(record)}))  # as it reads back from an entry


def model_parts(loaded) -> dict:
    """What the loaded engine runs on, beyond the document: revision, config and runtime."""
    import torch

    torch_model = getattr(loaded.model, "_model", loaded.model)  # nnterp wraps the transformers model
    config = torch_model.config
    # The engines keep the revision they resolved at load in their ModelFacts (the engine
    # contract has no member for it): a local folder's weights digest, or the hub revision asked for.
    revision = getattr(getattr(loaded, "_facts", None), "revision", None)
    if not (isinstance(revision, str) and revision.startswith("sha256:")):
        # A hub model: the commit transformers resolved, whatever branch or tag was asked for.
        revision = getattr(config, "_commit_hash", None)
    if not revision:
        raise CacheError("model.revision", "the loaded model's revision is not known (a hub model with no "
                         "resolved commit), so its results cannot be keyed",
                         "pin model.revision to a commit, use a local model folder, or run without a cache")
    settings = config.to_dict()
    settings.pop("_name_or_path", None)  # where the folder is, not what it holds
    settings["_attn_implementation"] = getattr(config, "_attn_implementation", None)
    devices = sorted({str(p.device) for p in torch_model.parameters()})
    gpus = sorted({torch.cuda.get_device_name(d) for d in devices if d.startswith("cuda")})
    return {"revision": revision, "model_config": hashlib.sha256(_canonical(settings)).hexdigest(),
            "runtime": {"devices": devices, "gpus": gpus, "threads": torch.get_num_threads()}}


def inputs_digest(point: Plan) -> str:
    """sha256 of a compiled (not yet run) point plan: every step's forwards, rows and metrics.

    Left out: what names or places the point (its name, coordinates, document — a point run
    alone is the same point), and results. A featurizer file stands in by its bytes' digest,
    not its absolute path.
    """
    return hashlib.sha256(_canonical(_plain(point))).hexdigest()


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Plan):
        return {"steps": {name: _plain(step) for name, step in value.steps.items()},
                "produced_by": value.produced_by}
    if isinstance(value, Epochs):
        # The count and the seed give every epoch's order; epoch 0 holds every row once.
        return {"count": value.count, "rows": value.rows, "batch_size": value.batch_size, "seed": value.seed,
                "first": _plain(value[0]) if value.count else None}
    if isinstance(value, FeaturizerSpec) and value.file_path is not None:
        from ..model.loading import file_digest

        fields = _plain(dataclasses.replace(value, file_path=None))
        return {**fields, "file": file_digest(Path(value.file_path)).hex()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"@": type(value).__name__,
                **{f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "results"}}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    # Nothing else is expected in a plan; a repr that names an address keys no second run alike
    # (a miss, never a wrong hit).
    return repr(value)

"""A checkpoint loaded whole, or refused: no tensor initialised at random behind the run's back.

``from_pretrained`` initialises a tensor the checkpoint lacks (or holds at another shape, with
``ignore_mismatched_sizes``) at random, and says so only in a load report on stderr; a run on
such a model computes numbers that change from load to load. Both engines load through
``load_causal_lm``, which asks transformers for that report and refuses any tensor missing,
unexpected or mismatched — naming the file and the tensor — before anything is computed.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

from ..errors import ModelError
from ..model import checkpoint, loading

FIX = ("restore the checkpoint (save_pretrained writes every tensor the model has) or point model.key at a "
       "complete one")


def load_causal_lm(resolved, options: dict):
    """``AutoModelForCausalLM.from_pretrained(resolved.source, **options)`` with its load report
    checked; a shape that disagrees with the config is refused as the report's mismatch is."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if getattr(resolved, "local", False):  # headers and sizes checked before a byte is allocated
        held = checkpoint.check_weight_files(Path(resolved.source))
        config = AutoConfig.from_pretrained(resolved.source, trust_remote_code=bool(options.get("trust_remote_code")))
        checkpoint.check_fits(resolved, config, held)
    try:
        # transformers logs its load report (and what follows from a tensor missing, such as
        # layers left unsharded) as warnings; the report is checked below instead, and a refusal
        # says what it found: a report printed above a refusal is two messages for one problem.
        with loading.held_logs(("transformers",), logging.ERROR):
            # ignore_mismatched_sizes: a mismatch comes back in the report (and is refused below
            # naming the tensor and both shapes) instead of as transformers' RuntimeError.
            model, report = AutoModelForCausalLM.from_pretrained(resolved.source, output_loading_info=True,
                                                                 ignore_mismatched_sizes=True, **options)
    except RuntimeError as err:  # "size mismatch for ...": the config and the weights disagree
        if "size mismatch" not in str(err) and "mismatched" not in str(err):
            raise
        raise ModelError("model.key", f"the weights at {resolved.key!r} do not fit the model its config.json "
                         f"describes ({_first_line(err)})", "use the config.json saved with these weights "
                         "(save_pretrained writes both)") from None
    check(report, resolved)
    return model


def check(report: dict, resolved) -> None:
    """Refuse a load report that names any tensor not loaded from the checkpoint as it is."""
    missing = sorted(report.get("missing_keys") or ())
    unexpected = sorted(report.get("unexpected_keys") or ())
    mismatched = sorted(report.get("mismatched_keys") or ())
    errors = [e for e in report.get("error_msgs") or () if e]
    where = _files(resolved)
    if missing:
        raise ModelError("model.key", f"the weights at {resolved.key!r} ({where}) lack {_some(missing)}, which "
                         "transformers would initialise at random", FIX)
    if mismatched:
        name, found, wanted = mismatched[0]
        raise ModelError("model.key", f"{_holder(resolved, name) or where} holds {name} with shape "
                         f"{list(found)}, and the model's config.json asks for {list(wanted)}"
                         + (f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""),
                         "use the config.json saved with these weights (save_pretrained writes both)")
    if unexpected:
        raise ModelError("model.key", f"{_holder(resolved, unexpected[0]) or where} holds "
                         f"{_some(unexpected)}, which the model its config.json describes has no place for",
                         "use the config.json saved with these weights, or remove the extra tensors")
    if errors:
        raise ModelError("model.key", f"the weights at {resolved.key!r} did not load cleanly ({_first_line(errors[0])})",
                         FIX)


def _some(names: list) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" (and {len(names) - 3} more)" if len(names) > 3 else "")


def _first_line(err) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _files(resolved) -> str:
    """The weight files a local checkpoint has, as a refusal names them; a hub id as itself."""
    if not getattr(resolved, "local", False):
        return resolved.key
    names = sorted(p.name for p in Path(resolved.source).glob("*.safetensors"))
    return ", ".join(names) or "no .safetensors file"


def _holder(resolved, tensor: str) -> Optional[str]:
    """The file of a local sharded checkpoint whose index places ``tensor`` there, or the one file."""
    if not getattr(resolved, "local", False):
        return None
    folder = Path(resolved.source)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            where = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).get(tensor)
        except (OSError, ValueError, AttributeError):
            where = None
        return str(where) if where else None
    files = sorted(folder.glob("*.safetensors"))
    return files[0].name if len(files) == 1 else None

"""What many tests start from: the smallest real document, and the command line as installed.

Torch-free, so front-end tests that import it stay weightless.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path


def patching_document() -> dict:
    """Activation patching at layer 0, the last token (documents/v2/patching.causalab.json), fresh each call."""
    return {
        "header": {"description": "patching"},
        "model": {"key": "tiny-llama", "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"component": "block_output", "layers": [0]}, "head": {"component": "lm_head"}},
        "interventions": {
            "patching": {
                "reads": {
                    "v_cf": {"site": "target", "pos": -1, "model": "original", "input": "counterfactual"},
                    "logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"},
                },
                "writes": {"patch": {"site": "target", "pos": -1, "mechanism": "swap", "operand": "v_cf"}},
                "models": {"patched": {"input": "base", "writes": ["patch"]}},
                "metrics": {
                    "iia": {"kind": "match", "of": "logits", "expected": "cf_answer"},
                    "logit_diff": {"kind": "logit_diff", "of": "logits", "a": "cf_answer", "b": "base_answer"},
                },
            }
        },
        "steps": {
            "score": {
                "kind": "observe",
                "interventions": "patching",
                "rows": {"base": "weekdays/train", "counterfactual": "weekdays/train"},
                "saves": [{"value": "iia", "file_path": "iia.json"},
                          {"value": "logit_diff", "file_path": "logit_diff.json"}],
            }
        },
    }


def saving_cf_resid(folder: Path) -> Path:
    """patching.causalab.json with its counterfactual read published and saved as
    cf_resid.safetensors beside its metrics, written into ``folder``; its path."""
    import json

    from paths import V2
    doc = json.loads((V2 / "patching.causalab.json").read_text())
    doc["steps"]["score"]["outputs"] = {"cf_resid": "v_cf"}
    doc["steps"]["score"]["saves"].append({"value": "cf_resid", "file_path": "cf_resid.safetensors"})
    path = Path(folder) / "saving.causalab.json"
    path.write_text(json.dumps(doc))
    return path


def with_pattern(raw: dict) -> dict:
    """A patching document (``raw``, changed in place and returned) that also reads layer 1's
    attention pattern over the last 6 queries and saves it as attention.safetensors."""
    raw["sites"]["pattern"] = {"component": "attention_probs", "layers": [1]}
    raw["interventions"]["patching"]["reads"]["attn"] = {"site": "pattern", "pos": {"last": 6},
                                                         "model": "original", "input": "base"}
    raw["steps"]["score"]["outputs"] = {"attn_out": "attn"}
    raw["steps"]["score"]["saves"].append({"value": "attn_out", "file_path": "attention.safetensors"})
    return raw


def cli_command() -> list[str]:
    """``causalab-mini`` as a user runs it: the venv's script, else the one on PATH, else the module."""
    script = Path(sys.executable).parent / "causalab-mini"
    if script.exists():
        return [str(script)]
    found = shutil.which("causalab-mini")
    return [found] if found else [sys.executable, "-m", "causalab_mini.cli"]

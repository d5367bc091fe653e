"""Which device a session loads its models on: one worker per accelerator under pytest-xdist.

``--causalab-device-map`` is one of:

- ``auto`` — on xdist worker ``gwN``, the Nth of the accelerators this process sees (N modulo
  their number), so ``-n 4`` on a 4-GPU host gives each worker a GPU of its own; with none
  visible, ``cpu``. Outside xdist, transformers' own ``"auto"`` (accelerate): a model too big for
  one device is spread over all of them.
- a comma-separated list (``cuda:0,cuda:2`` or ``cpu,cpu``) — worker ``gwN`` takes entry N modulo
  its length; outside xdist, the first.
- anything else (``cpu``, ``cuda:1``, ``balanced``, ``sequential``) — as written, on every worker.

Resolved at run time (it asks torch what it sees), never at collection.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

_WORKER = re.compile(r"gw(\d+)$")


def worker_index(worker: Optional[str]) -> Optional[int]:
    """N of an xdist worker id ``gwN``; None outside xdist (the controller, a plain run)."""
    found = _WORKER.match(worker or "")
    return int(found.group(1)) if found else None


def resolve(spec: str, worker: Optional[str], visible: Sequence[str]) -> str:
    """The device map this process loads with, for ``spec`` as the option gives it."""
    index = worker_index(worker)
    if spec == "auto":
        if index is None:
            return "auto"
        return visible[index % len(visible)] if visible else "cpu"
    if "," in spec:
        choices = [c.strip() for c in spec.split(",") if c.strip()]
        return choices[0 if index is None else index % len(choices)]
    return spec


def visible_accelerators() -> list[str]:
    """The accelerators torch sees in this process (``CUDA_VISIBLE_DEVICES`` already applied)."""
    import torch

    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return []

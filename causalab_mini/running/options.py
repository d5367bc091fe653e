"""How a run runs: one object for the settings every entry point takes alike.

``cm.run``, ``cm.run_points``, ``cm.run_together``, the cache, the CLI and the pytest plugin
all run points through one ``Execution`` (``execution.py``); what varies between them is
which points, on which loaded model, and where the files go. The rest is this.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


@dataclass(frozen=True)
class RunOptions:
    """``batch_size``: rows per model call (None: the whole batch). ``at_once``: sweep points'
    passes stacked into one call, within the batch size. ``share``: a forward several points run
    identically runs once (False: each point its own; the same numbers). ``device_map``,
    ``trust_remote_code``, ``models`` (model search folders): how the model is found and loaded.
    ``data``: dataset search folders. ``cache``: a result cache folder (None: none). ``reads``:
    read names (or ``"all"``) whose activations each point keeps in memory."""

    batch_size: Optional[int] = None
    at_once: int = 1
    share: bool = True
    device_map: str = "cpu"
    trust_remote_code: bool = False
    models: Any = None
    data: Any = None
    cache: Optional[Path] = None
    reads: Any = field(default=None)

    def check(self) -> None:
        """Refuse a batch size or at_once that is not a positive integer, and a cache with kept
        reads (a served point ran no forward), before anything loads."""
        from ..engine.steps import check_options
        from ..errors import PlanError

        check_options(self.batch_size, self.at_once)
        if self.reads is not None and self.cache is not None:
            raise PlanError("reads", "a point served from the cache ran no forward, so it has no activations "
                            "to keep", "leave out cache= to keep reads, or save them with the step's "
                            "outputs and saves")

"""``--dist loadgroup`` for documents, whatever the installed xdist does with the mark.

Each point carries ``xdist_group(name=<model key>)``, which xdist turns into a
``@<group>`` suffix on the node id on the worker. pytest 9.2 made node ids
structured and xdist 3.8 still writes the old field, so the suffix silently
never appears and groups are ignored (pytest-dev/pytest-xdist#1386). This
scheduler reads the group where the node id has none: a point's scope is its
document's model key, read from the document on the controller (JSON only: a
sweep may not change the model). Node ids that do carry a suffix, and every
other test, are scheduled exactly as xdist's own loadgroup does.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from causalab_mini import SUFFIX


def make_scheduler(config, log):
    from xdist.scheduler import LoadGroupScheduling

    root = Path(config.rootpath)

    @lru_cache(maxsize=None)
    def model_key(document: str):
        try:
            raw = json.loads((root / document).read_text(encoding="utf-8"))
            return raw["model"]["key"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    class DocumentGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):
                return super()._split_scope(nodeid)
            document = nodeid.split("::", 1)[0]
            key = model_key(document) if document.endswith(SUFFIX) else None
            return key if key is not None else super()._split_scope(nodeid)

    return DocumentGroups(config, log)

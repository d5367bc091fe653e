"""How many models the suite loads: ``CAUSALAB_COUNT_LOADS=FILE pytest ...`` appends one JSON line per process.

Counts every ``PreTrainedModel.from_pretrained`` made in the test processes (both engines and
plain transformers go through it, and so do in-process ``cli.main`` runs), by test module and
by folder; not the loads of subprocesses a test starts. One line per process because under
xdist each worker is its own session:
``{"worker": "gw0", "total": 41, "by_module": {"tests/test_run.py": 3, ...}, "by_folder": {...}}``.
Off unless the variable is set.
"""
from __future__ import annotations

import json
import os
from collections import Counter

VARIABLE = "CAUSALAB_COUNT_LOADS"
_by_module: Counter = Counter()
_by_folder: Counter = Counter()


def install() -> None:
    if not os.environ.get(VARIABLE):
        return
    from transformers import modeling_utils

    original = modeling_utils.PreTrainedModel.from_pretrained.__func__

    def counted(cls, source, *args, **kwargs):
        # pytest names the running test here: "tests/test_run.py::test_x (call)"; none while collecting
        _by_module[os.environ.get("PYTEST_CURRENT_TEST", "(collection)").split("::")[0]] += 1
        _by_folder[str(source)] += 1
        return original(cls, source, *args, **kwargs)

    modeling_utils.PreTrainedModel.from_pretrained = classmethod(counted)


def report() -> None:
    path = os.environ.get(VARIABLE)
    if path:
        line = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "total": sum(_by_folder.values()),
                "by_module": dict(_by_module), "by_folder": dict(_by_folder)}
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

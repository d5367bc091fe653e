"""The plugin's own hooks, for a ``conftest.py`` (or another plugin) to implement.

Registered through ``pytest_addhooks``. Each is called on the process that runs
the item (an xdist worker, under ``-n``).
"""
from __future__ import annotations

import pytest


@pytest.hookspec()
def pytest_causalab_modify_point(point, config) -> None:
    """Adjust a point before it runs on an engine; once per point per engine per session.

    Called for a document's points when the first of them runs: the points no hook changed
    then run together, the forwards they share once (``causalab_mini.run_points``); a changed
    point runs alone.

    ``point`` is a ``pytest_causalab.session.PendingPoint``: ``path``, ``name``, ``coords``
    and ``engine`` to read, and ``document`` (the point's own JSON, a copy) and
    ``batch_size`` to change in place. A changed ``document`` is compiled on its own,
    so its ``produced_by`` — and the baseline check — follow the change::

        def pytest_causalab_modify_point(point, config):
            if point.engine == "hooks":
                point.batch_size = 2
    """


@pytest.hookspec()
def pytest_causalab_summary_columns(point, config) -> "dict[str, str] | None":
    """Extra columns for the terminal summary (and junit properties) of a point that ran.

    ``point`` is a ``pytest_causalab.results.Point``. Return ``{column: text}``;
    every implementation's columns are shown, in registration order::

        def pytest_causalab_summary_columns(point, config):
            return {"rows": str(len(point.result("iia").rows))}
    """


@pytest.hookspec()
def pytest_causalab_model_loaded(key, engine, config) -> None:
    """A model was loaded into the session's cache (so each call is one load).

    ``key`` is the cache key: (model source, revision, dtype, engine, device map,
    attention probabilities); ``engine`` the loaded engine object.
    """

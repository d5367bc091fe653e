"""Fixtures shared by the family tests (tests/test_families.py and its neighbours)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def family_root(tmp_path_factory) -> Path:
    """One folder per session for the tiny family checkpoints ``families.build`` writes."""
    return tmp_path_factory.mktemp("families")

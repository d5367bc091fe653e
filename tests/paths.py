"""Where the repository keeps what the tests read: one spelling of each path for every test module.

A plain module rather than fixtures because the paths are needed at import time (in
``parametrize`` lists and module constants). Imported as ``from paths import ...``: tests/
has no ``__init__.py``, so pytest puts it on ``sys.path`` as it does for reference.py.
Imports nothing from causalab_mini, so families.py can use it too.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = REPO / "documents"
MODELS = DOCUMENTS / "models"  # the shipped tiny checkpoints: tiny-llama, tiny-gpt2, tiny-gemma2
DATA = DOCUMENTS / "data"
V2 = DOCUMENTS / "v2"  # the document corpus proper
ARTIFACTS = DOCUMENTS / "v2" / "artifacts"
# Every document under documents/, sorted so parametrized ids keep their order.
CORPUS = sorted(DOCUMENTS.rglob("*.causalab.json"))

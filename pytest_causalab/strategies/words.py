"""The words and paths the strategies draw from: the weekdays and the prompt template
of the shipped ``weekdays`` dataset, filler words the shipped tokenizers decode back
unchanged, the punctuation that may follow an inserted value, and the repository
root (where ``documents/models`` and ``documents/data`` are found by default).
"""
from __future__ import annotations

from pathlib import Path

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
WEEKDAY_PROMPT = "If today is {entity}, tomorrow is"
# Words the shipped tokenizers were trained on, so decoding reproduces them.
FILLER_WORDS = ("If", "today", "is", "tomorrow", "Q:", "What", "day", "days", "after", "A:",
                "one", "two", "three", "Name", "a", "weekday.")
_PUNCTUATION = ("", ",", ".", "?")
_REPO = Path(__file__).resolve().parents[2]  # pytest_causalab/strategies/words.py -> the repository

""""Did you mean …?": the one helper every refusal of a name uses.

A document that writes ``"component": "block_outptu"``, an unknown key ``"stpes"`` or
``"rows": {"base": "weekdays/trian"}`` is refused with a ``CausalabError`` whose fix starts
with the name it most likely meant: ``did you mean 'block_output'? …``. Standard library
only (shapes.py and vocab.py use it, and they import nothing heavy).

How a suggestion is chosen:

* ``difflib.get_close_matches`` keeps the choices whose similarity ratio to the word is at
  least ``CUTOFF``, compared case-insensitively (``Block_Output`` is ``block_output``);
* of those, the ones fewest edits away win — an edit is an insertion, a deletion, a
  substitution or a swap of two neighbouring letters — so ``stpes`` (one swap from
  ``steps``, two edits from ``sites``) suggests ``steps`` although difflib scores both
  0.8; choices as close as each other are all named (``mlp_out``: ``mlp_output`` or
  ``mlp_input``), at most ``MAX``.

``CUTOFF`` is difflib's own default, 0.6, on purpose: it is the lowest ratio that still
catches the typos short names get — a swap in three letters (``iai`` → ``iia``, 0.67), one
slip in four (``swpa`` → ``swap``, 0.75; ``v_fc`` → ``v_cf``) — while names that merely
share a length or a letter or two stay below it (``split``/``field`` 0.2, ``bogus``/``roles``
0.4, ``mean``/``min`` 0.57). A suggestion only leads the fix; the problem text, which names
the word refused, is unchanged, so a far-fetched one costs a reader a glance.
"""
from __future__ import annotations

import difflib
from typing import Iterable

CUTOFF = 0.6
MAX = 3


def close_matches(word: object, choices: Iterable, *, n: int = MAX) -> list[str]:
    """The choices ``word`` most likely misspells, best first; ``[]`` when none is close."""
    word = str(word)
    names = list(dict.fromkeys(str(c) for c in choices))
    folded: dict[str, str] = {}
    for name in names:
        folded.setdefault(name.casefold(), name)
    key = word.casefold()
    near = difflib.get_close_matches(key, list(folded), n=len(folded) or 1, cutoff=CUTOFF)
    if not near:
        return []
    ratio = {c: difflib.SequenceMatcher(None, key, c).ratio() for c in near}
    edits = {c: _edits(key, c) for c in near}
    fewest = min(edits.values())
    best = sorted((c for c in near if edits[c] == fewest), key=lambda c: -ratio[c])
    return [folded[c] for c in best[:n]]


def did_you_mean(word: object, choices: Iterable) -> str:
    """``did you mean 'block_output'?`` (``… 'a' or 'b'?`` on a tie), or ``""`` when nothing is close."""
    return phrase(close_matches(word, choices))


def phrase(matches: Iterable[str], note: str = "") -> str:
    """The question for matches already chosen; ``note`` follows each name (``" (local)"``)."""
    matches = [f"{m!r}{note}" for m in matches]
    return "did you mean " + " or ".join(matches) + "?" if matches else ""


def suggest_fix(word: object, choices: Iterable, fix: str = "") -> str:
    """``fix`` with the suggestion in front of it: ``did you mean 'steps'? <fix>``; ``fix`` alone
    when nothing is close."""
    return join(did_you_mean(word, choices), fix)


def join(suggestion: str, fix: str) -> str:
    """A suggestion placed before the rest of a fix (either may be empty)."""
    return " ".join(p for p in (suggestion, fix) if p)


class HintedValueError(ValueError):
    """A ``ValueError`` that also carries a fix: raised inside a pydantic validator (a position,
    a mechanism's parameters), its ``fix`` becomes the DocumentError's fix
    (``document.errors.document_error``) while ``str()`` stays the problem alone."""

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(problem)
        self.fix = fix


def _edits(a: str, b: str) -> int:
    """Edit distance counting a swap of two neighbouring characters as one edit
    (optimal string alignment)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[len(b)]

"""Strategies for positions: ``Where`` specs valid for a run of tokens (``positions``),
the same as a document spells them (``position_json``), and ``(text, value)`` pairs
for a variable anchor drawn by how the resolver will find the value
(``anchored_texts``), with the resolver's search rule itself (``anchor_hits``).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from causalab_mini import shapes
from causalab_mini.shapes import CHAT_ROLES, CUTS, EOS, FRAMES, Anchor, Where

from .words import _PUNCTUATION, FILLER_WORDS, WEEKDAYS


# --------------------------------------------------------------------------- positions


def _scopes(frame: str, variables: Optional[Sequence[str]], segments: bool) -> st.SearchStrategy:
    names = st.sampled_from(tuple(variables)) if variables else st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)
    if frame == "generated":
        # The continuation has one segment, eos; a chat turn belongs to the prompt.
        seg = st.just(EOS)
    else:
        seg = st.sampled_from(CHAT_ROLES) | st.builds(
            lambda role, k: f"{role}[{k}]", st.sampled_from(CHAT_ROLES), st.integers(0, 3))
    if not segments:
        return st.builds(lambda v: Anchor(variable=v), names)
    return st.one_of(
        st.builds(lambda v: Anchor(variable=v), names),
        st.builds(lambda s: Anchor(segment=s), seg),
        st.builds(lambda v, s: Anchor(variable=v, segment=s), names, seg),
    )


def _allowed_cuts(frame: str, cuts: Sequence[str], writable: bool) -> tuple[str, ...]:
    if writable and frame == "generated":
        # A write in the continuation acts at a decode step: {"index": k >= 0} or {"all": true}.
        return tuple(c for c in cuts if c in ("index", "all"))
    return tuple(cuts)


@st.composite
def _cut(draw, cut: str, n: Optional[int], max_index: int, steps_only: bool) -> dict:
    if cut == "all":
        return {"all": True}
    if cut == "last":
        return {"last": draw(st.integers(1, n if n is not None else max_index))}
    if cut == "index":
        if n is None:
            return {"index": draw(st.integers(0 if steps_only else -max_index, max_index))}
        return {"index": draw(st.integers(0 if steps_only else -n, n - 1))}
    # span: draw the resolved half-open window [a, b) first, then how each end is spelled —
    # from the start (a) or from the end (a - n) — so spans that mix signs are covered.
    if n is None:
        n = draw(st.integers(1, max_index))  # "fits some run of at most max_index tokens"
    a = draw(st.integers(0, n - 1))
    b = draw(st.integers(a + 1, n))
    a_spelled = draw(st.sampled_from((a, a - n)))
    b_spelled = draw(st.sampled_from((b, b - n))) if b < n else b
    return {"span": (a_spelled, b_spelled)}


@st.composite
def _where(draw, length, frames, scopes, cuts, variables, segments, writable, max_index) -> Where:
    frame = draw(st.sampled_from(frames))
    usable = _allowed_cuts(frame, cuts, writable)
    scope = None
    if scopes and not (writable and frame == "generated"):
        anchors = _scopes(frame, variables, segments)
        scope = draw(anchors if scopes == "always" else st.none() | anchors)
    cut = draw(st.sampled_from(usable))
    fields = draw(_cut(cut, length, max_index, steps_only=writable and frame == "generated"))
    return Where(frame=frame, scope=scope, **fields)


def positions(length: Union[int, Sequence[int], None] = None, *, frames: Sequence[str] = ("prompt",),
              scopes: Union[bool, str] = False, cuts: Sequence[str] = CUTS,
              variables: Optional[Sequence[str]] = None, segments: bool = True,
              writable: bool = False, max_index: int = 64) -> st.SearchStrategy[Where]:
    """Position specs (``causalab_mini.shapes.Where``) valid for a run of ``length`` tokens.

    The run is what the cut is applied to: the row's prompt content when there is
    no scope, the anchor's tokens inside one. With ``length`` every drawn spec
    fits it — ``shapes.cut(start, start + length, where)`` is never None — and
    every integer spelling is covered: negative indices, spans whose ends mix
    signs (``[2, -1]``), ``last`` up to the whole run, ``all``. ``length`` may be
    a sequence of lengths (a batch's rows): every drawn spec then fits each of
    them. Fitting the shortest is not enough — ``{"span": [-7, 1]}`` fits 7
    tokens and no longer run. With ``length=None`` indices are bounded by
    ``max_index`` and every span fits some run of at most ``max_index`` tokens.

    ``frames`` is drawn from (``"prompt"``, ``"generated"``); in the generated
    frame ``length`` is the number of decode steps kept. ``scopes``: ``False``
    (none), ``True`` (sometimes) or ``"always"``; a scope names a variable
    (from ``variables``, else a drawn identifier) and/or, when ``segments``, a
    chat segment (``user``, ``assistant[1]``, …; ``eos`` in the generated frame).
    ``cuts`` restricts the four cuts. ``writable=True`` draws only what a write
    may name: in the generated frame a decode step (``index >= 0`` or ``all``,
    no scope).
    """
    frames = tuple(frames)
    cuts = tuple(cuts)
    if not frames or set(frames) - set(FRAMES):
        raise InvalidArgument(f"frames={frames!r}: draw from {FRAMES}")
    if not cuts or set(cuts) - set(CUTS):
        raise InvalidArgument(f"cuts={cuts!r}: draw from {CUTS}")
    if scopes not in (False, True, "always"):
        raise InvalidArgument(f"scopes={scopes!r} is False, True or 'always'")
    lengths: Optional[tuple[int, ...]] = None
    if length is not None:
        lengths = (length,) if isinstance(length, int) and not isinstance(length, bool) else tuple(length)
        if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths):
            raise InvalidArgument(f"length={length!r}: a run of at least one token, a sequence of "
                                  "such lengths, or None")
        lengths = tuple(sorted(set(lengths)))
    if max_index < 1:
        raise InvalidArgument(f"max_index={max_index!r} must be >= 1")
    if variables is not None and not list(variables):
        raise InvalidArgument("variables is None (drawn names) or a non-empty list of names")
    frames = tuple(f for f in frames if _allowed_cuts(f, cuts, writable))
    if not frames:
        raise InvalidArgument(f"no frame in the request admits a writable cut among {cuts!r}")
    drawn = _where(lengths[0] if lengths else None, frames, scopes, cuts,
                   tuple(variables) if variables else None, segments, writable, max_index)
    if lengths is None or len(lengths) == 1:
        return drawn
    return drawn.filter(lambda w: all(shapes.cut(0, n, w) is not None for n in lengths))


@st.composite
def _spelled(draw, where: Where) -> Any:
    """One of the document spellings of ``where`` (key order drawn too)."""
    canonical = where.to_json()
    if isinstance(canonical, int):
        options = [canonical, {"index": canonical}, {"frame": "prompt", "index": canonical}]
        return draw(st.sampled_from(options))
    out = dict(canonical)
    if where.frame == "prompt" and draw(st.booleans()):
        out["frame"] = "prompt"
    keys = draw(st.permutations(list(out)))
    return {k: out[k] for k in keys}


def position_json(length: Union[int, Sequence[int], None] = None, **kwargs) -> st.SearchStrategy[Any]:
    """``positions(length, **kwargs)`` as a document spells them.

    An unscoped prompt-frame index comes out as a bare integer (the one sugar),
    as ``{"index": i}`` or with ``"frame": "prompt"`` written; every other spec
    as its object, with ``frame`` written out or not and its keys in drawn order.
    ``Where.from_json`` of a drawn value is the spec it was drawn from.
    """
    return positions(length, **kwargs).flatmap(_spelled)


# --------------------------------------------------------------------------- anchored texts


def _count_overlapping(text: str, sub: str) -> int:
    count, start = 0, text.find(sub)
    while start != -1:
        count += 1
        start = text.find(sub, start + 1)
    return count


def anchor_hits(text: str, value: str) -> int:
    """How many times the resolver's search rule finds ``value`` in ``text``.

    The rule (shared/spec/positions.md): try ``value``, then ``" " + value``, then
    the stripped value, and the first spelling that hits at all decides; its
    occurrences are counted overlapping. 1 is unique, 0 is ``alignment_missing``,
    more is ``alignment_ambiguous``.
    """
    for spelling in (value, " " + value, value.strip()):
        if spelling and spelling in text:
            return _count_overlapping(text, spelling)
    return 0


_OUTCOMES = {"unique": (1, 1), "missing": (0, 0), "ambiguous": (2, 3)}


@st.composite
def _anchored(draw, outcome: str, values, words: tuple, max_words: int):
    value = draw(values)
    needle = value.strip() or value
    fillers = tuple(w for w in words if needle not in w)
    lo, hi = _OUTCOMES[outcome]
    copies = draw(st.integers(lo, hi))
    min_fill = 1 if copies == 0 else 0
    if not fillers:
        assume(min_fill == 0)
        filler = []
    else:
        filler = draw(st.lists(st.sampled_from(fillers), min_size=min_fill, max_size=max_words))
    tokens = list(filler)
    for _ in range(copies):
        at = draw(st.integers(0, len(tokens)))
        tokens.insert(at, value.strip() + draw(st.sampled_from(_PUNCTUATION)))
    text = " ".join(tokens)
    hits = anchor_hits(text, value)
    # Words joined by spaces can still make a multi-word value occur across a boundary.
    assume(hits == copies if outcome != "ambiguous" else hits >= 2)
    return text, value


def anchored_texts(outcome: str = "unique", *, values: Union[Sequence[str], st.SearchStrategy[str]] = WEEKDAYS,
                   words: Sequence[str] = FILLER_WORDS, max_words: int = 8
                   ) -> st.SearchStrategy[tuple[str, str]]:
    """``(text, value)`` pairs for a variable anchor, by how the resolver will find the value.

    ``outcome="unique"``: the value occurs exactly once (``anchor_hits == 1``), so
    an anchored position resolves. ``"missing"``: it does not occur at all
    (``alignment_missing``). ``"ambiguous"``: two or three times
    (``alignment_ambiguous``). ``text`` is words from ``words`` joined by single
    spaces, with the value inserted as a word (sometimes followed by punctuation);
    filler words that contain the value are left out.
    ``values`` is a list of values or a strategy of them (default: the weekdays).
    """
    if outcome not in _OUTCOMES:
        raise InvalidArgument(f"outcome={outcome!r} is one of {sorted(_OUTCOMES)}")
    if not isinstance(values, st.SearchStrategy):
        values = tuple(values)
        if not values or not all(isinstance(v, str) and v.strip() for v in values):
            raise InvalidArgument("values are non-blank strings")
        values = st.sampled_from(values)
    return _anchored(outcome, values, tuple(words), max_words)

"""Position resolution: find the run, cut it, check the cut is inside it.

Imports nothing but the standard library and ``shapes``, because it runs
wherever the model is — on a server that has this package and the checkpoint's
tokenizer but neither the document nor the dataset. The compiler carries the
one thing it cannot find for itself: each row's anchor text.

The three questions are independent and answered in order. The run is a row's
whole content (no scope), the tokens overlapping a chat turn's characters
(``segment``), or the tokens overlapping the row's own value of a variable
(``variable``, searched inside the segment when both are given). The cut
(``index`` / ``span`` / ``last`` / ``all``) counts negatives from the end of the
run, not of the row. A cut that does not fit its run is an empty window with a
reason; what an empty window means — a skipped read, a refused write, a wrong
document — is the caller's policy, not this module's.

Text is searched in the *decoded* ids, through a character map built from the
ids the run feeds the model (never a re-encoding), so no fast tokenizer and no
``offset_mapping`` is needed.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional, Sequence

from ..shapes import CHAT_ROLES, EOS, Where, cut

Window = tuple[int, ...]  # absolute positions in a row

MISSING = "alignment_missing"  # the anchor's text (or the segment) is not in this row
AMBIGUOUS = "alignment_ambiguous"  # it is there more than once: scope it to make it one
OUTSIDE = "cut_outside_scope"  # the run was found and the cut names tokens it does not have


# --- the cut (``shapes.cut`` cuts one run) ---------------------------------------

def cut_rows(spans: Sequence[tuple[int, int]], where: Where) -> tuple[Optional[Window], ...]:
    """The fixed cut of every row's run (the prompt frame with no scope)."""
    return tuple(cut(a, b, where) for a, b in spans)


@lru_cache(maxsize=1024)
def fixed_windows(spans: tuple[tuple[int, int], ...], where: Where) -> tuple[Window, tuple[str, ...]]:
    """(window per row, reason per row) of a fixed cut: ``cut_rows``, a row it does not fit given
    an empty window and ``OUTSIDE``. A sweep's passes cut the same prompts at the same few places,
    so the answers are kept: they are tuples, made of nothing but these two arguments."""
    windows = cut_rows(spans, where)
    return tuple(w or () for w in windows), tuple("" if w else OUTSIDE for w in windows)


def misfit(name: str, where: Where, spans: Sequence[tuple[int, int]], rows: Sequence[int]) -> tuple[str, str]:
    """(problem, fix) for a fixed cut that does not fit some rows — one wording for the
    compiler (its tokenizer) and the run (the served one)."""
    lengths = sorted({spans[r][1] - spans[r][0] for r in rows})
    return (f"{name!r} at {where.spelling()} does not fit row(s) {sorted(rows)}: {OUTSIDE} (their "
            f"prompts are {lengths} token(s) long)",
            "a fixed cut names the same tokens on every row; cut inside the shortest prompt, "
            "or scope it to a variable")


# --- rows as the model sees them -------------------------------------------------

def special_prefix(tok) -> tuple[int, ...]:
    """What the tokenizer puts before every prompt, asked rather than guessed: encode the empty string.

    Llama's sentencepiece prepends a BOS and GPT-2's BPE nothing; without asking,
    ``{"index": 0}`` would be ``<s>`` on one family and the first word on the other.
    """
    return tuple(tok("")["input_ids"])


def pad_id(tok) -> int:
    for candidate in (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id, 0):
        if candidate is not None:
            return candidate
    return 0


def encode_rows(tok, texts: Sequence[str]) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(ids, mask): each text encoded on its own and padded on the left by hand.

    Alone, so a row's ids do not depend on its batch; by hand, so they do not depend
    on the tokenizer's padding defaults; on the left, so every row's last token sits
    at the same index.
    """
    encoded = encode_each(tok, texts)
    width = max((len(e) for e in encoded), default=0)
    pad = pad_id(tok)
    ids = tuple(tuple([pad] * (width - len(e)) + e) for e in encoded)
    mask = tuple(tuple([0] * (width - len(e)) + [1] * len(e)) for e in encoded)
    return ids, mask


def encode_each(tok, texts: Sequence[str], **kwargs) -> list[list[int]]:
    """Each text's ids exactly as ``tok(text, **kwargs)`` gives them alone. A fast tokenizer encodes
    a list (unpadded) text by text in one call of its backend — the call it makes for one text — so
    the texts are asked for together; any other tokenizer is asked text by text."""
    if getattr(tok, "is_fast", False) is True and len(texts) > 1:
        return [list(ids) for ids in tok(list(texts), **kwargs)["input_ids"]]
    return [list(tok(t, **kwargs)["input_ids"]) for t in texts]


def content_spans(mask: Sequence[Sequence[int]], prefix: int) -> tuple[tuple[int, int], ...]:
    """Each row's run: its real tokens after the prefix the tokenizer adds to everything (BOS).

    From the mask, so it does not matter which side the padding is on. A plan's masks are tuples,
    asked about by every op of every point of a sweep: those answers are kept.
    """
    if isinstance(mask, tuple) and all(isinstance(row, tuple) for row in mask):
        return _content_spans(mask, prefix)
    return _spans(mask, prefix)


@lru_cache(maxsize=512)
def _content_spans(mask: tuple, prefix: int) -> tuple[tuple[int, int], ...]:
    return _spans(mask, prefix)


def _spans(mask, prefix: int) -> tuple[tuple[int, int], ...]:
    spans = []
    for row in mask:
        first = next((i for i, m in enumerate(row) if m), len(row))
        last = max((i for i, m in enumerate(row) if m), default=first - 1) + 1
        spans.append((min(first + prefix, last), last))
    return tuple(spans)


def decode(tok, ids: Sequence[int]) -> str:
    return tok.decode(list(ids), skip_special_tokens=False)


def content_text(tok, ids: Sequence[int], mask: Sequence[int], prefix: int) -> str:
    """One row's content decoded: the text positions are found in (what the client records too)."""
    (start, end), = content_spans([mask], prefix)
    return decode(tok, ids[start:end])


# --- the character map -------------------------------------------------------------

class _Pieces:
    """Each token's surface text as it reads after an ordinary word, cached per id.

    Decoding a token alone is wrong at the start of a text (sentencepiece drops the
    leading space of the first piece), so each id is decoded after a fixed plain
    token (``lead``) and the plain token's own text taken off: O(1) work per distinct id.
    """

    def __init__(self, tok):
        self.tok = tok
        lead = tok("a", add_special_tokens=False)["input_ids"]
        self.lead = list(lead[:1])
        self.lead_text = decode(tok, self.lead) if self.lead else ""
        self.cache: dict[int, Optional[str]] = {}

    def __call__(self, token: int) -> Optional[str]:
        if token not in self.cache:
            both = decode(self.tok, [*self.lead, token]) if self.lead else None
            ok = both is not None and both.startswith(self.lead_text)
            self.cache[token] = both[len(self.lead_text):] if ok else None
        return self.cache[token]


class _Definition:
    """Text of growing prefixes of ``ids``: at the start of a text, or continuing one.

    A prompt's content is the start of a text. A continuation is not — what a model
    generates follows the prompt, so its first token keeps its leading space — and is
    decoded after the plain lead token, whose text is then taken off.
    """

    def __init__(self, tok, ids: Sequence[int], pieces: _Pieces, continues: bool):
        self.tok, self.ids = tok, list(ids)
        self.lead = pieces.lead if continues and pieces.lead else []
        self.cut = len(pieces.lead_text) if self.lead else 0

    def text(self, j: Optional[int] = None) -> str:
        full = decode(self.tok, [*self.lead, *self.ids[:j]])
        return full[self.cut:]


def char_map_naive(tok, ids: Sequence[int], *, continues: bool = False) -> tuple[str, tuple[int, ...]]:
    """(text, offsets) by decoding every growing prefix: O(L) decodes of O(L) work.

    ``offsets[k]`` is the character at which token ``k`` starts and ``offsets[L]`` is
    ``len(text)``. The definition; :func:`char_map` is the fast road to the same answer.
    ``continues``: the ids continue a text (a continuation), so the first keeps its space.
    """
    text = _Definition(tok, ids, _Pieces(tok), continues).text
    return text(), tuple(len(text(k)) for k in range(len(ids) + 1))


def _clean(part: Optional[str]) -> bool:
    return part is not None and "\ufffd" not in part


def _offsets_from_pieces(tok, ids: Sequence[int], text: str, pieces: _Pieces,
                         continues: bool = False) -> Optional[tuple[int, ...]]:
    """Offsets from per-token pieces, or None when they do not spell the decoded text.

    A token whose text depends on its neighbours — one byte of a multi-byte
    character, which alone decodes to U+FFFD — is placed by the definition
    itself, locally: a run of such tokens is decoded as growing prefixes starting
    from the clean token before it. Every clean piece is then checked against the
    text where its offsets put it; a mismatch anywhere hands the row to the caller's
    fallback.
    """
    n = len(ids)
    if not ids:
        return (0,) if text == "" else None
    definition = _Definition(tok, ids, pieces, continues)
    first = pieces(ids[0]) if definition.lead else decode(tok, ids[:1])
    parts = [first] + [pieces(t) for t in ids[1:]]
    offsets = [0]
    k = 0
    while k < n:
        if _clean(parts[k]):
            offsets.append(offsets[-1] + len(parts[k]))
            k += 1
            continue
        s = k
        while k < n and not _clean(parts[k]):
            k += 1
        if s == 0:  # from the start of the text: the definition as it stands
            offsets[1:] = [len(definition.text(j)) for j in range(1, k + 1)]
            continue
        # From the clean token before the run, so a decoder's start-of-text rule (a dropped
        # leading space) applies alike to both decodes and cancels.
        base = offsets[s] - len(decode(tok, ids[s - 1:s]))
        offsets.extend(base + len(decode(tok, ids[s - 1:j])) for j in range(s + 1, k + 1))
    if offsets[-1] != len(text):
        return None
    for k, part in enumerate(parts):
        if _clean(part) and text[offsets[k]:offsets[k + 1]] != part:
            return None
    return tuple(offsets)


def char_map(tok, ids: Sequence[int], *, pieces: Optional[_Pieces] = None,
             continues: bool = False) -> tuple[str, tuple[int, ...]]:
    """(text, offsets) of ``ids``: equal to :func:`char_map_naive`, in O(L) decode work.

    Each token's piece is decoded once per distinct id and the pieces are checked
    to spell the decoded text exactly; a row where they do not falls back to the
    growing-prefix definition.
    """
    ids = list(ids)
    pieces = pieces or _Pieces(tok)
    text = _Definition(tok, ids, pieces, continues).text()
    offsets = _offsets_from_pieces(tok, ids, text, pieces, continues)
    if offsets is None:
        return char_map_naive(tok, ids, continues=continues)
    return text, offsets


# --- the frame ------------------------------------------------------------------------

@dataclass(frozen=True)
class Frame:
    """One forward's rows as the resolver sees them; every tap of the forward shares it.

    ``starts``/``ends`` are each row's content span in the padded sequence (after
    the tokenizer's prefix). ``texts[r]`` is that content decoded and
    ``offsets[r][k]`` the character where content token ``k`` starts (one more
    entry than tokens). ``segments[r]`` maps a segment name to a character span
    of ``texts[r]``: the chat turns the compiler found, or ``eos`` in a continuation.
    """

    ids: tuple[tuple[int, ...], ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    texts: tuple[str, ...]
    offsets: tuple[tuple[int, ...], ...]
    segments: Optional[tuple[dict, ...]] = None

    @property
    def rows(self) -> int:
        return len(self.ids)


def build_frame(tok, ids: Sequence[Sequence[int]], mask: Sequence[Sequence[int]],
                segments: Optional[Sequence[dict]] = None, *, prefix: Optional[int] = None,
                continues: bool = False) -> Frame:
    """The frame of a padded batch: content spans from the mask, a character map per row.

    ``continues``: each row continues a text (a continuation), so its first token keeps
    the space it was generated with."""
    prefix = len(special_prefix(tok)) if prefix is None else prefix
    spans = content_spans(mask, prefix)
    pieces = _Pieces(tok)
    texts, offsets = [], []
    for row, (a, b) in zip(ids, spans):
        text, offs = char_map(tok, row[a:b], pieces=pieces, continues=continues)
        texts.append(text)
        offsets.append(offs)
    return Frame(ids=tuple(tuple(r) for r in ids), starts=tuple(a for a, _ in spans),
                 ends=tuple(b for _, b in spans), texts=tuple(texts), offsets=tuple(offsets),
                 segments=tuple(dict(s) for s in segments) if segments is not None else None)


def frame_of_texts(tok, texts: Sequence[str], segments: Optional[Sequence[dict]] = None):
    """(ids, mask, frame) for plain prompts: encoded as the compiler encodes them, then framed."""
    ids, mask = encode_rows(tok, texts)
    return ids, mask, build_frame(tok, ids, mask, segments)


# --- finding the run -------------------------------------------------------------------

def find_text(text: str, value: str, lo: int = 0, hi: Optional[int] = None):
    """((start, end), "") where ``value`` is in ``text[lo:hi]`` once; (None, reason) otherwise.

    Tries the value, then ``" " + value``, then the stripped value; the first
    spelling that hits at all decides, so ``" Thursday"`` found once is one hit even
    though ``"Thursday"`` is also inside it.
    """
    hi = len(text) if hi is None else hi
    for spelling in dict.fromkeys((value, " " + value, value.strip())):
        if not spelling:
            continue
        hits = []
        at = text.find(spelling, lo, hi)
        while at >= 0 and len(hits) < 2:
            hits.append(at)
            at = text.find(spelling, at + 1, hi)
        if len(hits) == 1:
            return (hits[0], hits[0] + len(spelling)), ""
        if hits:
            return None, AMBIGUOUS
    return None, MISSING


def tokens_over(offsets: Sequence[int], a: int, b: int) -> Optional[tuple[int, int]]:
    """Content tokens ``[i, j)`` overlapping characters ``[a, b)``: every token that overlaps, not
    only those inside — the addressed thing is a token, so ``' Th'`` is in the window of ``"Thursday"``."""
    n = len(offsets) - 1
    i = max(bisect_right(offsets, a) - 1, 0)
    while i < n and offsets[i + 1] <= a:  # skip tokens that end at or before a (zero-width included)
        i += 1
    j = bisect_left(offsets, b, 0, n)  # tokens starting before b
    while j < n and offsets[j] == offsets[j + 1] == b and j > i:
        j += 1  # zero-width tokens right after: the rest of the bytes of the span's last character
    return (i, j) if i < j else None


def _segment(frame: Frame, row: int, name: str):
    found = frame.segments[row] if frame.segments is not None else None
    if found is not None and name in found:
        return tuple(found[name]), ""
    if found is not None and name in CHAT_ROLES and f"{name}[1]" in found:
        return None, AMBIGUOUS  # the bare name is recorded only for a role that spoke once
    return None, MISSING


def run_of(frame: Frame, row: int, where: Where, anchor: Optional[str]):
    """((start, end), "") the absolute token run ``where``'s scope names on ``row``; (None, reason) if none."""
    start, end = frame.starts[row], frame.ends[row]
    scope = where.scope
    if scope is None:
        return (start, end), ""
    text, offsets = frame.texts[row], frame.offsets[row]
    lo, hi = 0, len(text)
    if scope.segment is not None:
        span, reason = _segment(frame, row, scope.segment)
        if span is None:
            return None, reason
        lo, hi = span
    if scope.variable is not None:
        if anchor is None:
            return None, MISSING
        span, reason = find_text(text, anchor, lo, hi)
        if span is None:
            return None, reason
        lo, hi = span
    tokens = tokens_over(offsets, lo, hi)
    if tokens is None:
        return None, MISSING
    return (start + tokens[0], start + tokens[1]), ""


def locate(frame: Frame, where: Where, anchors: Optional[Sequence[Optional[str]]] = None):
    """(windows, reasons) of ``where`` on every row of ``frame``: an empty window has a reason."""
    windows, reasons = [], []
    for row in range(frame.rows):
        run, reason = run_of(frame, row, where, anchors[row] if anchors is not None else None)
        window = cut(*run, where) if run is not None else None
        if run is not None and window is None:
            reason = OUTSIDE
        windows.append(window or ())
        reasons.append(reason)
    return tuple(windows), tuple(reasons)


def tokens_of(frame: Frame, window: Sequence[int], row: int) -> str:
    """What ``window`` addresses on ``row``, as the repr of its text ('' for an empty window)."""
    if not window:
        return ""
    start, offsets = frame.starts[row], frame.offsets[row]
    a, b = min(window) - start, max(window) - start + 1
    if a < 0 or b > len(offsets) - 1:  # the prefix or padding: outside the text the map covers
        return repr("".join(f"<{frame.ids[row][p]}>" for p in window))
    return repr(frame.texts[row][offsets[a]:offsets[b]])


# --- the continuation ------------------------------------------------------------------

def continuation_frame(tok, generated: Sequence[Sequence[int]], stop_ids) -> Frame:
    """The generated frame: each row's produced ids, cut at its first stop token (kept, last).

    Built from the ids the decode produced, never by re-encoding their text: a
    tokenizer is free to merge across a boundary the decode never saw. Its text
    continues the prompt, so the first produced token keeps its leading space. A row that
    stopped has an ``eos`` segment (its stop token); a row that never stopped has
    the whole bound and none. Positions in this frame are decode steps.
    """
    stops = set(stop_ids)
    rows = [list(r) for r in generated]
    ends = [next((i + 1 for i, t in enumerate(r) if t in stops), len(r)) for r in rows]
    mask = [[1] * e + [0] * (len(r) - e) for r, e in zip(rows, ends)]
    frame = build_frame(tok, rows, mask, prefix=0, continues=True)
    segments = []
    for r, e, offsets in zip(rows, ends, frame.offsets):
        stopped = e > 0 and r[e - 1] in stops
        segments.append({EOS: (offsets[e - 1], offsets[e])} if stopped else {})
    return replace(frame, segments=tuple(segments))

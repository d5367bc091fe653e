"""Where a read or write landed at one point, per row: the text of the token(s) its window addressed.

Asked in this order, the first that knows answering:

1. The run's own record (in memory): a pass with any position the document does not fix (an
   anchored one, a decode step) records, per op, each row's window and its tokens
   (``results["positions"]``) — a borrowed read's record included.
2. The metric rows (in memory or from disk): a row carries ``positions`` and ``tokens`` for the
   read its metric scores, when that pass recorded them.
3. The model's tokenizer (in memory, a position the document fixes): such a pass records nothing,
   because the integers are the document's; the forward's ids are in the plan, and the tokenizer
   that decodes them is loaded from where the run found its model (a local folder or the Hugging
   Face cache, never the network). It must read row 0 as the run recorded it, or it is not used.

A run opened from disk has neither the prompts' ids nor a tokenizer's view of them: for a fixed
position it knows no token, and the tick names the position alone. Every answer is the
``repr`` of the text as the run's character map cuts it (``"' is'"``, leading space kept), the
same string a recorded pass writes to a metric row's ``tokens``.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Optional

from ..errors import ModelError
from ..ops import locate
from ..plan.plan import Observe, Shared


class Landing:
    """Tokens per (point, op) for one figure; the tokenizer and character maps are shared."""

    def __init__(self, run):
        self.run = run
        self._frames: dict = {}
        self._tokenizer = None
        self._looked = False

    def tokens(self, point, op) -> Optional[list[str]]:
        """The token text of every row the op landed on (rows it missed left out); None: unknown."""
        found = self._from_plan(point, op) if point.plan is not None else None
        return found if found is not None else _from_rows(point, op)

    # --- in memory -----------------------------------------------------------------------

    def _from_plan(self, point, op) -> Optional[list[str]]:
        steps = [s for _, s in point.plan.walk() if isinstance(s, Observe) and s.intervention == op.intervention]
        if not steps:
            return None
        out: list[str] = []
        for step in steps:
            record = step.results.get("positions", {}).get(op.name)
            found = _landed(record) if record is not None else self._resolved(point, step, op.name)
            if found is None:
                return None
            out += found
        return out

    def _resolved(self, point, step, name: str) -> Optional[list[str]]:
        """The op's tokens from its forward's ids, through the tokenizer (a fixed position's pass)."""
        held = self._forward_of(step, name)
        tok = self.tokenizer(point) if held is not None else None
        if tok is None:
            return None
        forward, op = held
        if op.where.frame != "prompt" or not self._reads_as_recorded(tok, forward):
            return None
        frame = self._frame(tok, forward)
        windows, _ = locate.locate(frame, op.where, op.anchors)
        return [locate.tokens_of(frame, w, r) for r, w in enumerate(windows) if w]

    def _forward_of(self, step, name: str):
        """(forward, op) holding the op: the step's own, or the shared step's for a borrowed read."""
        forwards, wanted = step.forwards, name
        borrowed = dict(step.borrowed).get(name)
        if borrowed is not None:
            if self.run.plan is None:
                return None  # a selection of a run keeps its points, not the shared forwards
            wanted = borrowed
            forwards = [f for _, s in self.run.plan.walk() if isinstance(s, Shared) for f in s.forwards]
        for forward in forwards:
            for op in (*forward.writes, *forward.reads):
                if op.name == wanted and op.step is None:
                    return forward, op
        return None

    def _reads_as_recorded(self, tok, forward) -> bool:
        """The engine's own check: a tokenizer that decodes row 0 otherwise would place every token wrong."""
        row = [t for t, m in zip(forward.ids[0], forward.mask[0]) if m]
        return locate.decode(tok, row) == forward.sample

    def _frame(self, tok, forward):
        """The forward's character map, built once per distinct batch (every point shares its prompts)."""
        key = (forward.ids, forward.mask)
        if key not in self._frames:
            self._frames[key] = locate.build_frame(tok, forward.ids, forward.mask, forward.segments)
        return self._frames[key]

    def tokenizer(self, point):
        """The tokenizer of the point's model, looked for once per figure (every point has one model)."""
        if not self._looked:
            self._looked = True
            model = point.plan.document.get("model") or {}
            document = point.document or self.run.document
            if isinstance(model.get("key"), str):
                self._tokenizer = _tokenizer(model["key"], model.get("revision"),
                                             str(document) if document else None)
        return self._tokenizer


def _landed(record: dict) -> list[str]:
    """A recorded op's tokens on the rows it landed on (an empty window is a row it missed)."""
    return [t for t, w in zip(record["tokens"], record["rows"]) if w]


@lru_cache(maxsize=8)
def _tokenizer(key: str, revision: Optional[str], document: Optional[str]):
    """The model's tokenizer from where the run found it, or None: a label is never worth a download,
    nor a refusal (a folder gone, a hub model not cached, a tokenizer that needs its own code)."""
    from ..model import loading

    try:
        from transformers import AutoTokenizer

        resolved = loading.resolve(key, revision, document=document, hash_weights=False)
        options = {"trust_remote_code": False}
        if resolved.local:
            return AutoTokenizer.from_pretrained(resolved.source, **options)
        return AutoTokenizer.from_pretrained(resolved.source, revision=resolved.revision,
                                             local_files_only=True, **options)
    except (ImportError, OSError, ValueError, ModelError):
        return None


# --- what the metric rows say (in memory or from disk) -----------------------------------------

def _from_rows(point, op) -> Optional[list[str]]:
    """The tokens the rows of a metric scoring this read carry; None when none does, or they carry none."""
    raw = _point_document(point)
    if raw is None or op.kind != "reads":
        return None
    metrics = ((raw.get("interventions") or {}).get(op.intervention) or {}).get("metrics") or {}
    for scored in point.scored:
        step = (raw.get("steps") or {}).get(scored.step) or {}
        if step.get("interventions") != op.intervention or (metrics.get(scored.name) or {}).get("of") != op.name:
            continue
        rows = scored.result.rows
        if rows and all("tokens" in r for r in rows):
            return [r["tokens"] for r in rows if r.get("positions")]
    return None


def _point_document(point) -> Optional[dict]:
    if point.plan is not None:
        return point.plan.document
    where = point.out / "document.json" if point.out is not None else None
    if where is None or not where.is_file():
        return None
    return json.loads(where.read_text(encoding="utf-8"))

"""Teacher-forced copies of a pass's forwards: what a whole-answer metric ("score": "sequence") reads.

Per answer column, the same model and writes on the prompt with each row's answer tokens put after
it (``Forward.forced``); the engines lay the tokens out (``engine/taps.forced_rows``) and read the
positions that predict them (``forced_window``). Positions still resolve against the prompt alone.
"""
from __future__ import annotations

from dataclasses import replace

from ..components import PATTERNS
from ..errors import CompileError


def name(read: str, column: str) -> str:
    """The name a read takes in the teacher-forced forward of a data ``column``'s answers: not a
    name a document can give (``~``), so it never meets a read of the document."""
    return f"{read}~{column}"


def with_forced(ipath: str, forwards: tuple, metrics: tuple) -> tuple:
    """The pass's forwards, each followed by the teacher-forced copies its whole-answer metrics
    need: per answer column, the same model and writes on the prompt with that column's answers
    put after it, reading only the scored read (renamed). One copy per (read, data column),
    however many metrics score it."""
    wanted: dict = {}
    for m in metrics:
        for k, name in enumerate(m.forced_reads):
            # Every row's answer tokens in this column (the metric's own pieces, by column).
            wanted.setdefault((m.of, name), tuple(p if p is not None else () for p in m.pieces[k]))
    if not wanted:
        return forwards
    out = []
    for f in forwards:
        out.append(f)
        reads = {r.name: r for r in f.reads}
        for (of, name), answers in wanted.items():
            if of not in reads:
                continue
            patterns = [op for op in (*f.writes, *f.reads) if op.address.component in PATTERNS]
            if patterns:
                raise CompileError(f"{ipath}.metrics", f"{patterns[0].name!r} taps an attention pattern, whose "
                                   "keys a teacher-forced copy of its forward would lengthen",
                                   "score this pass's metrics by their first token, or tap the pattern in "
                                   "another pass")
            own = [w for w in f.writes if w.operand is not None and w.operand.kind == "read"
                   and w.operand.value in reads]
            if own:
                raise CompileError(f"{ipath}.writes.{own[0].name}.operand",
                                   f"the write takes its operand from read {own[0].operand.value!r} of its own "
                                   "forward, which a teacher-forced copy of that forward would not read",
                                   "read the operand in another pass, or score this metric by its first token")
            read = replace(reads[of], name=name)
            taps = tuple(replace(t, reads=tuple(read for r in t.reads if r.name == of))
                         for t in f.taps)
            taps = tuple(t for t in taps if t.writes or t.reads)
            out.append(replace(f, taps=taps, forced=answers, forced_read=name))
    return tuple(out)

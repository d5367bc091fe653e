"""Position value types: ``Anchor``, ``Where`` and ``Selection``, and ``cut``, what a cut names.

Standard library only. The resolver (``ops/locate.py``) runs wherever the model
is, possibly a server that has this package but not the document, so the types
it consumes must be importable with nothing but Python.

A position is three independent questions: which sequence (``frame``), which run
of it (``scope``) and how much of that run (exactly one of ``index``, ``span``,
``last``, ``all``). A bare integer in a document is ``Where(index=i)``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from .suggest import HintedValueError, did_you_mean

FRAMES = ("prompt", "generated")
# Segment names a frame can locate. ``role[k]`` (``user[1]``) is also accepted.
CHAT_ROLES = ("system", "user", "assistant")
EOS = "eos"
_ROLE_INDEX = re.compile(r"^(system|user|assistant)\[(\d+)\]$")
CUTS = ("index", "span", "last", "all")


def segment_is_valid(name: str) -> bool:
    return name in CHAT_ROLES or name == EOS or bool(_ROLE_INDEX.match(name))


@dataclass(frozen=True)
class Anchor:
    """Which run of the frame a cut applies to: a row's variable text, a chat segment, or both."""

    variable: Optional[str] = None
    segment: Optional[str] = None

    def __post_init__(self) -> None:
        if self.variable is None and self.segment is None:
            raise ValueError('a scope names a "variable", a "segment", or both')
        if self.segment is not None and not segment_is_valid(self.segment):
            raise HintedValueError(
                f"segment {self.segment!r} is not one of system, user, assistant, "
                "role[k] (e.g. user[1]) or eos", did_you_mean(self.segment, (*CHAT_ROLES, EOS))
            )

    def spelling(self) -> str:
        parts = []
        if self.segment is not None:
            parts.append(f"segment:{self.segment}")
        if self.variable is not None:
            parts.append(f"variable:{self.variable}")
        return "{" + " ".join(parts) + "}"

    def to_json(self) -> dict:
        out: dict = {}
        if self.variable is not None:
            out["variable"] = self.variable
        if self.segment is not None:
            out["segment"] = self.segment
        return out


@dataclass(frozen=True)
class Where:
    """A position spec: frame, optional scope, exactly one cut."""

    index: Optional[int] = None
    span: Optional[tuple[int, int]] = None
    last: Optional[int] = None
    all: Optional[bool] = None
    scope: Optional[Anchor] = None
    frame: str = "prompt"

    def __post_init__(self) -> None:
        given = [c for c in CUTS if getattr(self, c) is not None]
        if len(given) != 1:
            raise ValueError(
                "a position has exactly one cut — index, span, last or all — "
                f"and this one has {len(given)}" + (f" ({', '.join(given)})" if given else "")
            )
        if self.frame not in FRAMES:
            raise HintedValueError(f"frame {self.frame!r} is not 'prompt' or 'generated'",
                                   did_you_mean(self.frame, FRAMES))
        if self.span is not None:
            if len(self.span) != 2:
                raise ValueError("span is [start, stop], two integers")
            object.__setattr__(self, "span", (int(self.span[0]), int(self.span[1])))
            a, b = self.span
            # Half-open like a Python slice of the run; negatives count from its end.
            if (a >= 0) == (b >= 0) and b <= a:
                raise ValueError(f"span [{a}, {b}] is empty: stop must be after start")
        if self.last is not None and self.last < 1:
            raise ValueError(f"last {self.last} is not a positive number of tokens")
        if self.all is not None and self.all is not True:
            raise ValueError('all is written "all": true')
        seg = self.scope.segment if self.scope else None
        if seg == EOS and self.frame == "prompt":
            raise ValueError(
                "segment 'eos' is a run of the generated frame; a prompt has none — "
                'write {"frame": "generated", ...} or scope a chat turn'
            )
        if seg is not None and seg != EOS and self.frame == "generated":
            raise ValueError(
                f"segment {seg!r} is a chat turn of the prompt; the generated frame has only 'eos'"
            )

    # --- what the compiler can know without a row -------------------------
    @property
    def width(self) -> Optional[int]:
        """Number of positions the cut names on every row, or None when only a row can say."""
        if self.index is not None:
            return 1
        if self.last is not None:
            return self.last
        if self.span is not None:
            a, b = self.span
            # Mixed signs ([2, -1]): the width depends on the row's length.
            return b - a if (a >= 0) == (b >= 0) else None
        return None

    @property
    def ragged(self) -> bool:
        """True when rows may differ in how many positions they get (so a gather comes back flat)."""
        return self.scope is not None or self.width is None

    @property
    def fixed(self) -> bool:
        """True when the document alone fixes the integers: prompt frame, no scope."""
        return self.frame == "prompt" and self.scope is None

    @property
    def is_step(self) -> bool:
        """A generated-frame tap that fires at a decode step the run reaches (``index >= 0`` or ``all``)."""
        return self.frame == "generated" and self.scope is None and (
            (self.index is not None and self.index >= 0) or self.all is True
        )

    # --- spelling --------------------------------------------------------
    def spelling(self) -> str:
        parts = []
        if self.frame == "generated":
            parts.append("generated")
        if self.index is not None:
            parts.append(f"index:{self.index}")
        elif self.span is not None:
            parts.append(f"span:[{self.span[0]},{self.span[1]}]")
        elif self.last is not None:
            parts.append(f"last:{self.last}")
        else:
            parts.append("all")
        if self.scope is not None:
            parts.append(f"scope:{self.scope.spelling()}")
        return "{" + " ".join(parts) + "}"

    def __str__(self) -> str:
        return self.spelling()

    def to_json(self) -> Any:
        if self.index is not None and self.scope is None and self.frame == "prompt":
            return self.index
        out: dict = {}
        if self.frame != "prompt":
            out["frame"] = self.frame
        for cut in CUTS:
            value = getattr(self, cut)
            if value is not None:
                out[cut] = list(value) if cut == "span" else value
        if self.scope is not None:
            out["scope"] = self.scope.to_json()
        return out

    @classmethod
    def from_json(cls, value: Any) -> "Where":
        """Parse a document's ``pos``: a bare integer, or an object with frame/scope/one cut."""
        if isinstance(value, bool):
            raise ValueError("a position is an integer or an object, not a boolean")
        if isinstance(value, int):
            return cls(index=value)
        if not isinstance(value, dict):
            raise ValueError(
                f"a position is an integer or an object like {{\"index\": -1}}, not {type(value).__name__}"
            )
        keys = ("frame", "scope", *CUTS)
        unknown = sorted(set(value) - set(keys))
        if unknown:
            free = [k for k in keys if k not in value]
            raise HintedValueError(
                f"unknown position key(s) {unknown}; a position has frame, scope and one of {list(CUTS)}",
                " ".join(filter(None, (did_you_mean(k, free) for k in unknown)))
            )
        scope = value.get("scope")
        if scope is not None:
            if not isinstance(scope, dict) or set(scope) - {"variable", "segment"}:
                extra = sorted(set(scope) - {"variable", "segment"}) if isinstance(scope, dict) else []
                raise HintedValueError('scope is {"variable": name} and/or {"segment": name}',
                                       " ".join(filter(None, (did_you_mean(k, ("variable", "segment"))
                                                              for k in extra))))
            for key in ("variable", "segment"):
                if key in scope and not (isinstance(scope[key], str) and scope[key]):
                    raise ValueError(f'scope {key} is a name (a non-empty string), not {scope[key]!r}')
            scope = Anchor(variable=scope.get("variable"), segment=scope.get("segment"))
        for cut in ("index", "last"):
            v = value.get(cut)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"{cut} is an integer, not {v!r}")
        span = value.get("span")
        if span is not None:
            if not (isinstance(span, (list, tuple)) and len(span) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in span)):
                raise ValueError(f"span is [start, stop], two integers, not {span!r}")
            span = (span[0], span[1])
        return cls(
            index=value.get("index"),
            span=span,
            last=value.get("last"),
            all=value.get("all"),
            scope=scope,
            frame=value.get("frame", "prompt"),
        )


@dataclass(frozen=True)
class Selection:
    """A position spec together with the per-row texts its anchor binds to.

    ``anchors`` has one entry per row (``None`` where the spec has no variable);
    the resolver has no dataset, so the compiler carries the text to it.
    """

    where: Where
    anchors: Optional[tuple[Optional[str], ...]] = None


def cut(start: int, end: int, where: Where) -> Optional[tuple[int, ...]]:
    """The absolute positions ``where``'s cut names in the run ``[start, end)``; None if it does not fit.

    Negative indices and span bounds count from the run's end, not the row's. The resolver
    (``ops/locate.py``) cuts every run with it; property tests of positions call it directly."""
    n = end - start
    if where.index is not None:
        i = where.index + n if where.index < 0 else where.index
        return (start + i,) if 0 <= i < n else None
    if where.last is not None:
        return tuple(range(end - where.last, end)) if where.last <= n else None
    if where.all:
        return tuple(range(start, end)) if n > 0 else None
    a, b = where.span
    a = a + n if a < 0 else a
    b = b + n if b < 0 else b
    if not (0 <= a < b <= n):
        return None
    return tuple(range(start + a, start + b))

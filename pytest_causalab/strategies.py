"""Hypothesis strategies for property tests of causal experiments.

Everything a researcher needs to write a property test of a position, a write or
a whole document, drawn valid by construction::

    from hypothesis import given
    from pytest_causalab import strategies as cst

    @given(cst.positions(length=9))
    def test_cut_fits(where):
        assert locate.cut(0, 9, where) is not None

=========================  ===============================================================
``positions``              ``Where`` values, valid for a run of ``length`` tokens
``position_json``          the same, as a document spells them (bare-integer sugar included)
``anchored_texts``         ``(text, value)`` with ``value`` in ``text`` once, never, or twice+
``anchor_hits``            how many hits the resolver's search rule finds (not a strategy)
``mechanisms``             ``(name, params)`` that ``vocab.check_params`` accepts
``activations``            float32 tensors of a given shape, finite and bounded
``orthonormal_bases``      ``(d, k)`` float32 tensors with orthonormal columns
``sae_weights``            SAELens-named tensors: ``W_enc``, ``W_dec``, ``b_enc``, ``b_dec``
``rows``                   dataset rows shaped like ``weekdays`` (see documents/data/README.md)
``documents``              whole valid plan-shaped documents for a shipped model
``model_bounds``           a shipped model's layer/head/unit bounds, from its config.json
``prompt_lengths``         a dataset's prompt lengths on a model's tokenizer (not a strategy)
=========================  ===============================================================

Importing this module imports neither torch, transformers nor pydantic, so a
property test pays only for what it draws: strategies that build tensors import
torch when they draw.

Hypothesis's entry point (``pytest_causalab.hypothesis_profile:setup``) registers
the settings profile ``"causalab"``
(``deadline=None`` — a first call into torch or a tokenizer is slow, and a
deadline would flag it — and ``too_slow`` not treated as a failure). Select it
with ``pytest --hypothesis-profile=causalab`` or ``settings.load_profile``; it is
registered, never loaded, so it changes nothing by itself.
"""
from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from causalab_mini import vocab
from causalab_mini.engine.loading import weights_digest  # stdlib only: no torch at import
from causalab_mini.ops import locate
from causalab_mini.shapes import CHAT_ROLES, CUTS, EOS, FRAMES, Anchor, Where

__all__ = [
    "PROFILE", "WEEKDAYS", "WEEKDAY_PROMPT", "FILLER_WORDS",
    "positions", "position_json", "anchored_texts", "anchor_hits", "mechanisms",
    "activations", "orthonormal_bases", "sae_weights", "rows", "documents",
    "model_bounds", "prompt_lengths",
]

from .hypothesis_profile import PROFILE  # noqa: E402  (the profile the entry point registers)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
WEEKDAY_PROMPT = "If today is {entity}, tomorrow is"
# Words the shipped tokenizers were trained on, so decoding reproduces them.
FILLER_WORDS = ("If", "today", "is", "tomorrow", "Q:", "What", "day", "days", "after", "A:",
                "one", "two", "three", "Name", "a", "weekday.")
_PUNCTUATION = ("", ",", ".", "?")
_REPO = Path(__file__).resolve().parent.parent


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
    fits it — ``locate.cut(start, start + length, where)`` is never None — and
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
    return drawn.filter(lambda w: all(locate.cut(0, n, w) is not None for n in lengths))


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


# --------------------------------------------------------------------------- mechanisms


def _floats(lo: float, hi: float, **kw) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False, **kw)


def _number(lo: float, hi: float) -> st.SearchStrategy:
    # An int is a valid float parameter (check_params coerces it); a document may write 2.
    return _floats(lo, hi) | st.integers(math.ceil(lo), math.floor(hi))


def _optional(key: str, values: st.SearchStrategy) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional={key: values})


@st.composite
def _clamp(draw) -> dict:
    which = draw(st.sampled_from(("min", "max", "both")))
    if which == "both":
        lo, hi = sorted((draw(_number(-10, 10)), draw(_number(-10, 10))))
        return {"min": lo, "max": hi}
    return {which: draw(_number(-10, 10))}


_PARAMS = {
    "swap": st.just({}),
    "add_scaled": _optional("scale", _number(-8, 8)),
    "lerp": st.fixed_dictionaries({"t": st.sampled_from((0.0, 1.0, 0, 1)) | _floats(0, 1)}),
    "clamp": _clamp(),
    "gaussian": st.fixed_dictionaries({"std": _floats(1e-3, 4) | st.integers(1, 4)},
                                      optional={"seed": st.integers(0, 2**63 - 1)}),
    "renormalize": st.just({}),
}


def mechanisms(names: Optional[Sequence[str]] = None) -> st.SearchStrategy[tuple[str, dict]]:
    """``(name, params)`` for the mechanisms of ``vocab.MECHANISMS`` (or ``names`` of them).

    Every drawn pair passes ``vocab.check_params``; defaults are sometimes written
    and sometimes omitted, numbers are sometimes ints, and no value is None, so a
    pair is also a valid ``"mechanism"``/``"params"`` of a document's write.
    Whether the mechanism takes an operand is ``vocab.MECHANISMS[name].operand``;
    whether it measures against the pre-write value is ``.needs_f0``. Values are
    bounded (|scale| <= 8, 0 <= t <= 1, std <= 4) so a write stays finite.
    """
    names = tuple(vocab.MECHANISMS) if names is None else tuple(names)
    unknown = sorted(set(names) - set(vocab.MECHANISMS))
    if not names or unknown:
        raise InvalidArgument(f"names={names!r}: draw from {sorted(vocab.MECHANISMS)}")
    missing = sorted(set(names) - set(_PARAMS))
    if missing:  # the vocabulary grew and these strategies did not
        raise InvalidArgument(f"no parameter strategy for mechanism(s) {missing}")
    return st.one_of([st.tuples(st.just(n), _PARAMS[n]) for n in names])


# --------------------------------------------------------------------------- tensors


def _float32_values(n: int, bound: float) -> st.SearchStrategy[list]:
    return st.lists(_floats(-bound, bound, width=32), min_size=n, max_size=n)


@st.composite
def _activations(draw, shape: tuple, bound: float, seeded_above: int):
    import torch

    n = math.prod(shape)
    if n <= seeded_above:
        return torch.tensor(draw(_float32_values(n, bound)), dtype=torch.float32).reshape(shape)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    scale = draw(_floats(1e-3, bound))
    return (torch.rand(shape, generator=g, dtype=torch.float32) * 2 - 1) * scale


def activations(shape: Sequence[int], *, bound: float = 10.0, seeded_above: int = 256):
    """float32 torch tensors of ``shape`` with finite values in ``[-bound, bound]``.

    Up to ``seeded_above`` elements every value is drawn by hypothesis (and
    shrinks); a larger tensor is drawn from a seeded generator at a drawn scale.
    """
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise InvalidArgument(f"shape={shape!r} has a negative size")
    return _activations(shape, float(bound), int(seeded_above))


@st.composite
def _basis(draw, d: int, k: int, seeded_above: int):
    import torch

    if d * k <= seeded_above:
        m = torch.tensor(draw(_float32_values(d * k, 1.0)), dtype=torch.float64).reshape(d, k)
    else:
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
        m = torch.randn(d, k, generator=g, dtype=torch.float64)
    s = torch.linalg.svdvals(m)
    if s[-1] <= 1e-3 * max(float(s[0]), 1.0):
        # A degenerate draw (all zeros is hypothesis's favourite) is lifted by c·E, E the
        # first k columns of I: with c = 2‖M‖ + 1 the top k×k block has singular values
        # >= ‖M‖ + 1, so the columns are independent and the condition number is <= 3.
        m = m + (2 * float(s[0]) + 1) * torch.eye(d, k, dtype=torch.float64)
    q, r = torch.linalg.qr(m)
    signs = torch.sign(torch.diagonal(r))
    q = q * torch.where(signs == 0, torch.ones_like(signs), signs)
    return q.to(torch.float32).contiguous()


def orthonormal_bases(d: int, k: int, *, seeded_above: int = 256):
    """``(d, k)`` float32 torch tensors Q with orthonormal columns (QᵀQ = I to float32 precision).

    Q is the QR factor (signs fixed so R's diagonal is positive) of a drawn
    matrix, computed in float64: entries drawn by hypothesis up to
    ``seeded_above`` of them, else from a seeded generator. A rank-deficient
    draw is lifted by a multiple of the identity's first k columns rather than
    rejected, so no example is wasted. This is the parameter a ``subspace`` or
    ``pca`` featurizer holds: featurize is Qᵀx, inverse Qf + (x − QQᵀx).
    """
    if not (isinstance(d, int) and isinstance(k, int) and 1 <= k <= d):
        raise InvalidArgument(f"orthonormal_bases needs 1 <= k <= d, got d={d!r}, k={k!r}")
    return _basis(d, k, seeded_above)


@st.composite
def _sae(draw, d: int, k: int, tied: Optional[bool], unit_norm_decoder: bool):
    import torch

    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    enc_scale = draw(_floats(0.1, 2.0)) / math.sqrt(d)
    w_enc = torch.randn(d, k, generator=g) * enc_scale
    zero_biases = draw(st.booleans())
    b_enc = torch.zeros(k) if zero_biases else torch.randn(k, generator=g) * 0.1
    b_dec = torch.zeros(d) if zero_biases else torch.randn(d, generator=g) * 0.1
    out = {"W_enc": w_enc.contiguous(), "b_enc": b_enc, "b_dec": b_dec}
    is_tied = draw(st.booleans()) if tied is None else tied
    if not is_tied:
        w_dec = torch.randn(k, d, generator=g)
        if unit_norm_decoder:
            w_dec = w_dec / w_dec.norm(dim=1, keepdim=True).clamp_min(1e-6)
        else:
            w_dec = w_dec / math.sqrt(k)
        out["W_dec"] = w_dec.contiguous()
    return {name: t.to(torch.float32) for name, t in out.items()}


def sae_weights(d: int, k: int, *, tied: Optional[bool] = False, unit_norm_decoder: bool = True):
    """A dict of SAELens-named float32 tensors for a ``d``-wide site and ``k`` latents.

    ``W_enc`` ``(d, k)``, ``b_enc`` ``(k,)``, ``b_dec`` ``(d,)`` and, unless tied,
    ``W_dec`` ``(k, d)`` — a missing ``W_dec`` means tied weights, ``W_encᵀ``, as
    the ``sae`` featurizer reads a bundle. ``tied=None`` draws whether. Values come
    from a seeded generator at a drawn encoder scale; biases are zero on about half
    the draws; decoder rows are unit-norm when ``unit_norm_decoder`` (SAELens's
    convention). The encoding is ``act((x − b_dec) W_enc + b_enc)``.
    """
    if not (isinstance(d, int) and isinstance(k, int) and d >= 1 and k >= 1):
        raise InvalidArgument(f"sae_weights needs d >= 1 and k >= 1, got d={d!r}, k={k!r}")
    if tied not in (True, False, None):
        raise InvalidArgument(f"tied={tied!r} is True, False or None (drawn)")
    return _sae(d, k, tied, unit_norm_decoder)


# --------------------------------------------------------------------------- rows


def _row(base: str, cf: str, days: tuple, template: str, chat: bool, split: str) -> dict:
    def after(day: str) -> str:
        return " " + days[(days.index(day) + 1) % len(days)]

    def prompt(day: str):
        text = template.format(entity=day)
        if not chat:
            return text
        return [{"role": "user", "content": "Name a weekday."},
                {"role": "assistant", "content": f"{day}."},
                {"role": "user", "content": text}]

    row = {
        "input": prompt(base),
        "counterfactual_inputs": [prompt(cf)],
        "counterfactual_inputs_variables": [{"entity": cf}],
        "entity": base,
        "base_answer": after(base),
        "cf_answer": after(cf),
        "split": split,
    }
    if not chat:
        row["answer"] = row["base_answer"]
        row["label"] = row["cf_answer"]
    return row


@st.composite
def _rows(draw, min_rows: int, max_rows: int, days: tuple, template: str, chat: bool, split: str):
    pair = st.tuples(st.sampled_from(days), st.sampled_from(days)).filter(lambda p: p[0] != p[1])
    pairs = draw(st.lists(pair, min_size=min_rows, max_size=max_rows))
    return [_row(b, c, days, template, chat, split) for b, c in pairs]


def rows(min_rows: int = 1, max_rows: int = 8, *, days: Sequence[str] = WEEKDAYS,
         template: str = WEEKDAY_PROMPT, chat: bool = False, split: str = "all"
         ) -> st.SearchStrategy[list[dict]]:
    """Lists of dataset rows with the columns of ``weekdays/train`` (or ``weekdays/chat``).

    Each row is a drawn (base, counterfactual) pair of distinct days:
    ``input`` = ``template`` with the base day as ``{entity}``,
    ``counterfactual_inputs`` = ``[the same on the counterfactual day]``,
    ``counterfactual_inputs_variables`` = ``[{"entity": cf}]``, ``entity`` (the
    base day), ``base_answer``/``answer`` and ``cf_answer``/``label`` (" " + the
    next day in ``days``' cyclic order), ``split``. With ``chat=True`` both
    prompts are message lists (user asks for a weekday, the assistant names it,
    the user asks the question) and there is no ``answer``/``label``, as in
    ``weekdays/chat``. Write them one JSON object a line to
    ``<root>/<name>/<split>.jsonl`` and a document can name ``"name/split"``.
    """
    days = tuple(days)
    if len(set(days)) < 2:
        raise InvalidArgument("days needs at least two distinct days to make a counterfactual pair")
    if "{entity}" not in template:
        raise InvalidArgument("template must contain {entity}")
    if not 0 <= min_rows <= max_rows:
        raise InvalidArgument(f"need 0 <= min_rows <= max_rows, got {min_rows}, {max_rows}")
    return _rows(min_rows, max_rows, days, template, chat, split)


# --------------------------------------------------------------------------- documents


def _search(explicit, env: str, default: Path) -> list[Path]:
    found: list[Path] = []
    if explicit is not None:
        found += [Path(p) for p in ([explicit] if isinstance(explicit, (str, os.PathLike)) else explicit)]
    found += [Path(p) for p in os.environ.get(env, "").split(os.pathsep) if p]
    return found + [default, Path.cwd() / "documents" / default.name]


def _model_dir(model: str, models) -> Path:
    for root in _search(models, "CAUSALAB_MODELS", _REPO / "documents" / "models"):
        if (root / model / "config.json").is_file():
            return (root / model).resolve()
    raise InvalidArgument(f"no model directory {model!r} with a config.json under the model search path")


def _data_file(ref: str, data) -> Path:
    name, split = ref.split("/")
    for root in _search(data, "CAUSALAB_DATA", _REPO / "documents" / "data"):
        if (root / name / f"{split}.jsonl").is_file():
            return (root / name / f"{split}.jsonl").resolve()
    raise InvalidArgument(f"no dataset {ref!r} under the data search path")


@functools.lru_cache(maxsize=None)
def _bounds(model_dir: Path) -> dict:
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config") or config

    def first(*keys, default=None):
        return next((text[k] for k in keys if text.get(k) is not None), default)

    d_model = first("hidden_size", "n_embd")
    n_heads = first("num_attention_heads", "n_head")
    return {
        "family": text.get("model_type"),
        "num_layers": first("num_hidden_layers", "n_layer"),
        "d_model": d_model,
        "n_heads": n_heads,
        "n_kv_heads": first("num_key_value_heads", default=n_heads),
        "head_dim": first("head_dim", default=d_model // n_heads),
        "d_mlp": first("intermediate_size", "n_inner", default=4 * d_model),
        "vocab_size": text.get("vocab_size"),
        "revision": weights_digest(model_dir),
    }


def model_bounds(model: str = "tiny-llama", *, models=None) -> dict:
    """What ``documents`` draws a site within, read from ``<model>/config.json`` without transformers.

    ``num_layers``, ``d_model``, ``n_heads``, ``n_kv_heads``, ``head_dim``,
    ``d_mlp``, ``vocab_size``, ``family``, and ``revision`` (the local weights'
    ``sha256:`` digest, as a document pins it).
    """
    return dict(_bounds(_model_dir(model, models)))


def _head_count(b: dict, component: str) -> int:
    return b["n_kv_heads"] if component in ("attention_key", "attention_value") else b["n_heads"]


def _width(b: dict, component: str) -> int:
    if component == "mlp_hidden":
        return b["d_mlp"]
    if vocab.COMPONENTS[component].selector == "heads":
        return _head_count(b, component) * b["head_dim"]
    return b["d_model"]


def _prompt_text(row: dict, field: str):
    value = row
    for part in field.replace("]", "").replace("[", ".").split("."):
        value = value[int(part)] if part.isdigit() else value[part]
    return value


@functools.lru_cache(maxsize=None)
def _lengths(model_dir: Path, data_file: Path, fields: tuple) -> tuple[int, ...]:
    from tokenizers import Tokenizer  # the Rust library only: no torch, no transformers

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prefix = len(tok.encode("").ids)
    lengths = []
    for line in data_file.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        for field in fields:
            text = _prompt_text(row, field)
            if not isinstance(text, str):
                raise InvalidArgument(f"{data_file}: {field} is a chat; documents() draws over plain prompts")
            lengths.append(len(tok.encode(text).ids) - prefix)
    if not lengths:
        raise InvalidArgument(f"{data_file} has no rows")
    return tuple(sorted(set(lengths)))


def prompt_lengths(model: str = "tiny-llama", data: str = "weekdays/train", *,
                   fields: Sequence[str] = ("input", "counterfactual_inputs[0]"),
                   models=None, data_roots=None) -> tuple[int, ...]:
    """The distinct content lengths, in tokens, of the prompts among ``fields`` of ``data``.

    Content is what the resolver cuts: the ids after the prefix the tokenizer puts
    before every prompt (BOS). ``positions(prompt_lengths(...))`` draws fixed
    positions that fit every row. Tokenized with the ``tokenizers`` library from
    ``<model>/tokenizer.json`` (no torch, no transformers).
    """
    return _lengths(_model_dir(model, models), _data_file(data, data_roots), tuple(fields))


_METRIC_NAMES = {"match": "iia", "logit_diff": "logit_diff", "cross_entropy": "ce",
                 "token_logit": "answer_logit", "token_prob": "p_answer"}
_ANSWER_COLUMNS = ("cf_answer", "base_answer", "answer", "label")


@functools.lru_cache(maxsize=None)
def _columns(data_file: Path) -> tuple:
    first = json.loads(next(line for line in data_file.read_text().splitlines() if line.strip()))
    return tuple(c for c in _ANSWER_COLUMNS if isinstance(first.get(c), str))


def _subset(n: int, max_size: int) -> st.SearchStrategy[list]:
    return st.lists(st.integers(0, n - 1), min_size=1, max_size=min(n, max_size), unique=True)


@st.composite
def _document(draw, model: str, data: str, models, data_roots, sweeps: bool, scopes: bool,
              engine: Optional[str], header: bool) -> dict:
    model_dir = _model_dir(model, models)
    data_file = _data_file(data, data_roots)
    b = _bounds(model_dir)
    lengths = _lengths(model_dir, data_file, ("input", "counterfactual_inputs[0]"))
    answers = _columns(data_file)
    if not answers:
        raise InvalidArgument(f"{data} has none of the answer columns {_ANSWER_COLUMNS}")

    # --- the site a patch writes at, within the model's bounds
    components = sorted(
        name for name, c in vocab.COMPONENTS.items()
        if name not in vocab.VOCAB_WIDE and name != "attention_probs"
        and (engine != "hooks" or c.hooks))
    component = draw(st.sampled_from(components))
    comp = vocab.COMPONENTS[component]
    site: dict = {"component": component}
    layer_sweep = None
    if comp.layered:
        site["layers"] = [draw(st.integers(0, b["num_layers"] - 1))]
        if sweeps and draw(st.booleans()):
            layers = draw(st.lists(st.integers(0, b["num_layers"] - 1), min_size=1, max_size=3, unique=True))
            layer_sweep = {"sweep": [[l] for l in layers]}
    space = _width(b, component)
    if comp.selector == "heads" and draw(st.booleans()):
        site["heads"] = draw(_subset(_head_count(b, component), 4))
        space = len(site["heads"]) * b["head_dim"]
    elif comp.selector == "units" and draw(st.booleans()):
        site["units"] = draw(_subset(_width(b, component), 8))
        space = len(site["units"])
    if layer_sweep is not None:
        site["layers"] = layer_sweep

    # --- what the write does
    mechanism, params = draw(mechanisms())
    takes_operand = vocab.MECHANISMS[mechanism].operand
    operand: Any = None
    if takes_operand:
        operand = draw(st.sampled_from(("read", "number")))
    if operand == "read":
        # A read operand is as wide as the write's window on every row: a known width.
        fixed = positions(lengths, cuts=("index", "last", "span")).filter(lambda w: w.width is not None)
        pos_where = draw(fixed | positions(1, scopes="always", variables=("entity",), segments=False,
                                           cuts=("index",)) if scopes else fixed)
    else:
        pos_where = draw(positions(lengths) | positions(1, scopes="always", variables=("entity",),
                                                         segments=False) if scopes else positions(lengths))
    pos = draw(_spelled(pos_where))
    pos_sweep = None
    if sweeps and layer_sweep is None and pos_where.fixed and draw(st.booleans()):
        others = positions(lengths).filter(lambda w: operand != "read" or w.width is not None)
        extra = draw(st.lists(others, min_size=1, max_size=2, unique_by=lambda w: json.dumps(w.to_json())))
        values = list(dict.fromkeys(json.dumps(w.to_json()) for w in [pos_where, *extra]))
        pos_sweep = {"sweep": [json.loads(v) for v in values], "as": "pos"}

    write: dict = {"site": "target", "pos": pos_sweep or pos, "mechanism": mechanism}
    if params or draw(st.booleans()):
        write["params"] = params
    if operand == "read":
        write["operand"] = "v_cf"
    elif operand == "number":
        write["operand"] = draw(_number(-4, 4))
    if draw(st.integers(0, 3)) == 0:
        write["features"] = draw(_subset(space, 4))

    reads: dict = {}
    if operand == "read":
        reads["v_cf"] = {"site": "target", "pos": pos_sweep or pos, "input": "counterfactual"}
        if draw(st.booleans()):
            reads["v_cf"]["model"] = "original"
    head_component = draw(st.sampled_from(("lm_head", "logits")))
    reads["logits"] = {"site": "head", "pos": draw(position_json(lengths, cuts=("index",))),
                       "model": "patched", "input": "base"}

    # --- metrics on the patched logits, and which of them are saved
    kinds = draw(st.lists(st.sampled_from(sorted(vocab.METRICS)), min_size=1, max_size=3, unique=True))
    metrics: dict = {}
    for kind in kinds:
        metric: dict = {"kind": kind, "of": "logits"}
        for column in vocab.METRICS[kind].columns:
            metric[column] = draw(st.sampled_from(answers))
        metrics[_METRIC_NAMES[kind]] = metric
    saved = draw(st.lists(st.sampled_from(sorted(metrics)), unique=True, max_size=len(metrics)))
    saves = []
    for name in saved:
        save = {"value": name, "file_path": f"{name}.json"}
        if draw(st.booleans()):  # written out or omitted: the same experiment
            save.update(model="patched", input="base")
        saves.append(save)

    roles = {"base": {"field": "input"}}
    rows_of = {"base": data}
    if operand == "read":
        roles["counterfactual"] = {"field": "counterfactual_inputs[0]"}
        rows_of["counterfactual"] = data

    doc: dict = {}
    if header:
        doc["header"] = {"description": draw(st.text(max_size=40))}
    model_ref = {"key": model, "revision": b["revision"]}
    if draw(st.booleans()):
        model_ref["dtype"] = "fp32"
    doc.update({
        "model": model_ref,
        "roles": roles,
        "sites": {"target": site, "head": {"component": head_component}},
        "interventions": {"patching": {
            "reads": reads,
            "writes": {"patch": write},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": metrics,
        }},
        "steps": {"score": {"kind": "observe", "interventions": "patching", "rows": rows_of,
                            "saves": saves}},
    })
    return doc


def documents(model: str = "tiny-llama", *, data: str = "weekdays/train", sweeps: bool = True,
              scopes: bool = False, engine: Optional[str] = None, header: bool = True,
              models=None, data_roots=None) -> st.SearchStrategy[dict]:
    """Whole valid plan-shaped documents (JSON dicts) for a shipped model, patching-like.

    One intervention ``patching``: a write ``patch`` at a drawn site ``target`` —
    any component but the vocabulary-wide ones and ``attention_probs``, at a layer
    inside the model, optionally narrowed to drawn heads or units inside its
    bounds — with a drawn mechanism and parameters (``mechanisms()``), its
    operand (when it takes one) a read ``v_cf`` of the counterfactual prompt at
    the same position, or a number; sometimes ``features`` inside the write's
    space. A read ``logits`` of the patched model at a drawn index, one to three
    metrics on it over the data's answer columns, a drawn subset of them saved.

    Bounds come from ``documents/models/<model>/config.json`` (the model search
    path: ``models``, ``CAUSALAB_MODELS``, the repository's ``documents/models``),
    read as JSON; the revision is the weights' ``sha256:`` digest. Fixed positions
    fit every prompt of ``data`` on the model's tokenizer (``prompt_lengths``); with ``scopes`` a position may instead be
    ``{"index": 0 | -1, "scope": {"variable": "entity"}}`` (any cut of it when the
    operand is a number). ``sweeps`` sometimes sweeps the layer, or the position
    of the read and the write together (``"as": "pos"``). ``engine="hooks"``
    keeps to components a forward hook reaches. Every drawn document passes
    ``causalab_mini.documents.points``, and the files it reads are read once per
    process.
    """
    if engine not in (None, "nnterp", "hooks"):
        raise InvalidArgument(f"engine={engine!r} is None, 'nnterp' or 'hooks'")
    if not isinstance(data, str) or data.count("/") != 1:
        raise InvalidArgument(f"data={data!r} is a dataset reference \"name/split\"")
    return _document(model, data, models, data_roots, sweeps, scopes, engine, header)

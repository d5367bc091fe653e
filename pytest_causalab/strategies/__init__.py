"""Hypothesis strategies for property tests of causal experiments.

Everything a researcher needs to write a property test of a position, a write or
a whole document, drawn valid by construction::

    from hypothesis import given
    from causalab_mini.shapes import cut
    from pytest_causalab import strategies as cst

    @given(cst.positions(length=9))
    def test_cut_fits(where):
        assert cut(0, 9, where) is not None

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

from ..hypothesis_profile import PROFILE  # the profile the entry point registers
from .documents import documents, model_bounds, prompt_lengths, rows
from .positions import anchor_hits, anchored_texts, position_json, positions
from .tensors import activations, mechanisms, orthonormal_bases, sae_weights
from .words import FILLER_WORDS, WEEKDAY_PROMPT, WEEKDAYS

__all__ = [
    "PROFILE", "WEEKDAYS", "WEEKDAY_PROMPT", "FILLER_WORDS",
    "positions", "position_json", "anchored_texts", "anchor_hits", "mechanisms",
    "activations", "orthonormal_bases", "sae_weights", "rows", "documents",
    "model_bounds", "prompt_lengths",
]

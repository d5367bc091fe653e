"""The session's loaded models: each loaded once per way of loading it, shared by every module that only reads it.

conftest.py hands these out as session fixtures (``engines``, ``hf_model``). Before them, about
ten modules loaded tiny-llama and friends again for themselves, as engines and as plain
transformers models for their hand-written references.

A cached model is shared, so only a test that leaves it as it found it may use one: hooks it
registers are removed, weights and config are never written. A test that changes a model, or
tests loading itself (a revision check, a refused checkpoint, which attention a load picks),
loads its own.

causalab_mini and transformers are imported when a model is first asked for, not with this
module: conftest.py imports it, and a library that fails to import should fail the tests that
use it, not the collection of every test.
"""
from __future__ import annotations

from pathlib import Path

from paths import MODELS


class EngineCache:
    """causalab_mini engines, keyed on everything that changes what a load makes.

    That is the engine, the model section as the loader reads it (key, dtype, ``modules``), the
    weights it resolves to (folder and digest) and whether attention probabilities are tapped
    (nnterp loads eager attention for them, which rounds differently). Not the document's own
    path: every document naming the same weights the same way shares one engine.
    """

    def __init__(self) -> None:
        self._loaded: dict[tuple, object] = {}

    def __call__(self, source, engine: str, *, document: Path | None = None, models=(MODELS,),
                 attention_probs: bool = False, attention_seam: bool = False):
        """The ``engine`` ("hooks", "nnterp") loaded with ``source``'s model.

        ``source``: a document's path, a raw document (its first point names the model, as
        ``causalab_mini.load`` reads it; pass ``document`` when its model key is relative to
        where it lives), or a bare model section (``{"key": "tiny-llama", "dtype": "fp32"}``).
        A document decides ``attention_probs`` and ``attention_seam`` itself (on where a point
        taps the pattern, or inside attention); for a model section they are the arguments. ``models``: model folders searched, as
        ``--models``.
        """
        from causalab_mini import api
        from causalab_mini.document import read as front
        from causalab_mini import engines as registry
        from causalab_mini.model import loading

        if isinstance(source, Path):
            document = source if document is None else document
            source = front.read(source)
        if "model" in source:
            points = front.points(source)
            model = points[0].spec.model
            attention_probs = api.uses_attention_probs(points)
            attention_seam = api.uses_attention_seam(points)
        else:
            model = loading.model_ref(source)
        resolved = loading.resolve(model.key, model.revision, document=document, roots=list(models))
        # The revision a section writes is checked by resolve and then is the digest, or absent:
        # the resolved digest stands for it, so a pinned and an unpinned section share an engine.
        where = str(Path(resolved.source).resolve()) if resolved.local else resolved.source
        key = (engine, model.model_dump_json(exclude={"revision"}), where, resolved.revision, attention_probs,
               attention_seam)
        if key not in self._loaded:
            self._loaded[key] = registry.engine_class(engine).load(
                model, document=document, models=list(models), attention_probs=attention_probs,
                attention_seam=attention_seam)
        return self._loaded[key]

    def clear(self) -> None:
        self._loaded.clear()


class TransformersCache:
    """Plain transformers ``(model, tokenizer)`` pairs of the shipped checkpoints, for hand-written references.

    fp32 (the checkpoints' own dtype, so the same as a load that names none) and in eval mode.
    Keyed on the attention implementation: eager rounds differently from the default.
    """

    def __init__(self) -> None:
        self._loaded: dict[tuple, tuple] = {}

    def __call__(self, name: str, *, attn_implementation: str | None = None) -> tuple:
        """``(model, tokenizer)`` of ``documents/models/<name>``."""
        key = (name, attn_implementation)
        if key not in self._loaded:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            options = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
            model = AutoModelForCausalLM.from_pretrained(MODELS / name, dtype=torch.float32, **options).eval()
            self._loaded[key] = (model, AutoTokenizer.from_pretrained(MODELS / name))
        return self._loaded[key]

    def clear(self) -> None:
        self._loaded.clear()

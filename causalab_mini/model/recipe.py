"""The one way a document's model is read: resolve → config → tokenizer → ModelFacts.

The compiler (``plan.compile.model_facts``, which never reads weights), the hooks engine and
the nnterp engine (and the ndif shell through it) all start here, so a model is found,
read and refused the same way whichever of them asks. What each engine adds — its weights,
loaded from ``resolved`` — is its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from . import loading
from .facts import ModelFacts


@dataclass(frozen=True)
class ModelDescription:
    """Everything about a document's model but its weights."""

    ref: Any  # the document's model section, as a document.spec.ModelRef
    resolved: loading.ResolvedModel  # where it is, and the revision (and digests) found there
    roots: list[Path]  # the model search roots, which a failed weight load names as searched
    config: Any  # transformers' config, as AutoConfig reads it
    tokenizer: Any
    facts: ModelFacts  # what the compiler may know: built from the config and the tokenizer


def describe_model(model_ref, *, document: Optional[Path] = None, models=None, trust_remote_code: bool = False,
                   check_revision: bool = True, hash_weights: bool = True) -> ModelDescription:
    """The document's model (``model_ref``: its ``model`` section, a dict or a ModelRef) found,
    its config and tokenizer read, and its ModelFacts built; no weight tensor is loaded.

    ``document``: the document's path (a model key is looked up beside it first); ``models``: the
    model search roots (``--models``). ``check_revision``: refuse a local checkpoint whose digest is
    not the revision the document pins. ``hash_weights=False`` (the ndif shell, whose weights are the
    server's) reads no weight file's bytes. No code of the model's own runs unless ``trust_remote_code``.
    """
    ref = loading.model_ref(model_ref)
    resolved = loading.resolve(ref.key, ref.revision, document=document, roots=models,
                               check_revision=check_revision, hash_weights=hash_weights)
    roots = loading.model_roots(models, document)
    # Config, then tokenizer, each through loading's refusals (a model directory's own code, a
    # hub id that cannot be reached, a config transformers cannot read), before any weight is
    # read, so a model that is not there is refused naming its key rather than inside a loader.
    config = loading.load_config(resolved, roots, trust_remote_code=trust_remote_code)
    tokenizer = loading.load_tokenizer(resolved, roots, trust_remote_code=trust_remote_code)
    facts = ModelFacts.from_config(config, tokenizer, key=ref.key, revision=resolved.revision,
                                   modules=ref.modules, weights=resolved.weights,
                                   config_digest=resolved.config)
    return ModelDescription(ref=ref, resolved=resolved, roots=roots, config=config, tokenizer=tokenizer,
                            facts=facts)

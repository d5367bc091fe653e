"""``--engine ndif``: the nnterp engine on a model whose weights the client never holds.

NDIF serves models too big for the machine a researcher runs from (Llama-70B, 405B). The
client therefore builds only the model's structure, on the meta device — nnsight's
``dispatch=False``, with nnterp's standardized names and its renaming checked by a scan —
compiles from the config and tokenizer exactly as every engine does, and sends the whole
walk as one ``model.session(remote=True)``: one request. What comes home is the plan's
results (strings and tensors by step path) and the dtype the server ran in. No weight file
is opened here and no parameter leaves the meta device; ``tests/test_ndif.py`` audits both.

The key is NDIF's: nnsight reads it from ``NDIF_API_KEY`` (and the server from ``NDIF_HOST``);
it is never in a document, a plan or a run record. NDIF serves hub ids, so a model named by a
local directory is refused before anything is sent.

What the request carries (``request``): by default the kernel — ``kernel.py``, torch only, shipped
by value — and the walk's forwards compiled to a program of plain data (``engine/request.py``), which
a stock server (torch, transformers, nnsight: NDIF's) runs, scoring the built-in metric kinds where
the logits are; the walk itself, positions and outputs stay here. ``request = "package"`` sends the walk itself, by reference: the server must have
this causalab-mini (checked first, in the session) and nnterp; a fit needs it.

``causalab_mini.stand_in(document)`` (``remote.py``) is a server on this machine for checking a
document before sending it. With ``shell.server = stand_in(...)`` every run of the shell
(``cm.run(doc, loaded=shell)``, the pytest plugin's) is the remote run, here.
"""
from __future__ import annotations

from typing import ClassVar

from ..errors import EngineError
from .. import engines
from . import provenance, request
from .nnterp import NNterpEngine, _plain_errors, _session_options


class NDIFEngine(NNterpEngine):
    name: ClassVar[str] = "ndif"

    @classmethod
    def load(cls, model_ref, *, document=None, models=None, device_map="cpu",
             trust_remote_code=False, attention_probs: bool = False,
             attention_seam: bool = False) -> "NDIFEngine":
        """The document's model as a shell: structure and names, no weights (meta device)."""
        return cls._standardized(model_ref, document=document, models=models, device_map=device_map,
                                 trust_remote_code=trust_remote_code, attention_probs=attention_probs,
                                 weights=False)

    # Where a session goes when ``execute`` is not told: NDIF (True), or an nnsight backend set here
    # (``shell.server = stand_in(doc)``; a pytest conftest can set it in pytest_causalab_model_loaded).
    server = True

    # The walk's state lives on the server for one request: a plan's points go in one request.
    incremental = False

    # What a request carries: "kernel" (a stock server runs it) or "package" (the walk by reference;
    # the server has this causalab-mini and nnterp). Set on a shell, or by ``--ndif-request``.
    request = "kernel"

    def plain_model(self):
        """nnsight's plain ``LanguageModel`` over the shell's meta module: what a kernel request's session
        is opened on, so that no nnterp object is on the wire (a stock server cannot unpickle one)."""
        plain = self.__dict__.get("_plain")
        if plain is None:
            from nnsight import LanguageModel

            plain = self._plain = LanguageModel(self.model._model, tokenizer=self.tokenizer, dispatch=False)
        return plain

    def execute(self, plan, *, remote=None, batch_size=None, at_once=1, state=None):
        """The walk as one session, sent to ``remote`` — NDIF (True) or a backend standing in for it —
        or, by default, to ``self.server``."""
        if state is not None:
            raise EngineError("state", "a remote walk cannot carry a state from an earlier request",
                              "run the plan's points in one execute")
        target = self.server if remote is None else remote
        # The session carries this engine to the server; a stand-in set on it (its model, its weights'
        # envoys) is not part of the request NDIF would get, so it is taken off while the request is made.
        own = self.__dict__.pop("server", None)
        try:
            if self.request == "package":
                return super().execute(plan, remote=target, batch_size=batch_size, at_once=at_once)
            if self.request != "kernel":
                raise EngineError("request", f"{self.request!r} is not what a request carries",
                                  f"one of {', '.join(engines.REQUESTS)}")
            options = _session_options(self.model, target)  # the shell's own checks (a local directory)
            plan.provenance.update(provenance.record(self, target, batch_size, at_once))
            with _plain_errors():
                request.send(self, plan, batch_size=batch_size, at_once=at_once, options=options)
            wire = getattr(options.get("backend"), "wire", None)  # a stand-in measures what crossed
            if wire is not None:
                plan.provenance["wire"] = dict(wire)
            return plan
        finally:
            if own is not None:
                self.server = own

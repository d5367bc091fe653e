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

``stand_in(document)`` is a server on this machine for checking a document before sending it:
nnsight's local simulation of the remote path (the request serialized, deserialized with the
client's own modules blocked, run) against a second copy of the model that does hold the
weights. With ``shell.server = stand_in(...)`` every run of the shell (``cm.run(doc, loaded=shell)``,
the pytest plugin's) is the remote run, here.
"""
from __future__ import annotations

from typing import ClassVar

from .nnterp import NNterpEngine


class NDIFEngine(NNterpEngine):
    name: ClassVar[str] = "ndif"

    @classmethod
    def load(cls, model_ref, *, document=None, models=None, device_map="cpu",
             trust_remote_code=False, attention_probs: bool = False) -> "NDIFEngine":
        """The document's model as a shell: structure and names, no weights (meta device)."""
        return cls._standardized(model_ref, document=document, models=models, device_map=device_map,
                                 trust_remote_code=trust_remote_code, attention_probs=attention_probs,
                                 weights=False)

    # Where a session goes when ``execute`` is not told: NDIF (True), or an nnsight backend set here
    # (``shell.server = stand_in(doc)``; a pytest conftest can set it in pytest_causalab_model_loaded).
    server = True

    def execute(self, plan, *, remote=None, batch_size=None, at_once=1):
        """The walk as one session, sent to ``remote`` — NDIF (True) or a backend standing in for it —
        or, by default, to ``self.server``."""
        return super().execute(plan, remote=self.server if remote is None else remote, batch_size=batch_size,
                               at_once=at_once)


def stand_in(document, *, models=None, trust_remote_code: bool = False):
    """An nnsight backend that runs a session here the way NDIF runs it: serialized, deserialized with
    the client's modules blocked against a server-side copy of the model that holds the weights,
    executed, and only the saved values handed back to the client."""
    from nnsight.intervention.backends.base import Backend
    from nnsight.intervention.backends.local_simulation import LocalSimulationBackend
    from nnsight.intervention.tracing.globals import save as mark_saved
    from nnsight.schema.request import RequestModel

    from .. import api

    doc = api.read(document)
    server = NNterpEngine.load(doc.model, document=doc.path, models=models, trust_remote_code=trust_remote_code,
                               attention_probs=doc.attention_probs).model

    class StandIn(LocalSimulationBackend):
        records_as = "local"  # run.json's "remote": nnsight's local simulation
        requests = 0  # sessions received: one per execute

        def __call__(self, tracer):
            self.requests += 1
            interventions = Backend.__call__(self, tracer)
            payload = RequestModel(interventions=interventions, tracer=tracer).serialize(compress=False)
            blocked = self._block_user_modules()  # as on the server: the client's code is not there
            try:
                restored = RequestModel.deserialize(payload, self.model._remoteable_persistent_objects(),
                                                    compress=False)
            finally:
                self._restore_modules(blocked)
            saves = restored.tracer.execute(restored.interventions)  # on the server's modules
            for value in saves.values():  # as NDIF's client does: what came home counts as saved
                mark_saved(value)
            tracer.push(saves)

    return StandIn(server)

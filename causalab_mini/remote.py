"""A stand-in for NDIF on this machine: send a ``--engine ndif`` shell's session here to check a
document before it goes to the server.

nnsight's local simulation of the remote path — the request serialized, deserialized with the
client's own modules blocked (as on the server, where the client's code is not), run — against a
second copy of the model that does hold the weights, loaded here. Only the saved values come
back to the client, as from NDIF; the client's shell still holds no weights.
"""
from __future__ import annotations

from . import api
from .engine.nnterp import NNterpEngine


def stand_in(document, *, models=None, trust_remote_code: bool = False):
    """An nnsight backend that runs a session here the way NDIF runs it: serialized, deserialized with
    the client's modules blocked against a server-side copy of the model that holds the weights,
    executed, and only the saved values handed back to the client."""
    from nnsight.intervention.backends.base import Backend
    from nnsight.intervention.backends.local_simulation import LocalSimulationBackend
    from nnsight.intervention.tracing.globals import save as mark_saved
    from nnsight.schema.request import RequestModel

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

"""A stand-in for NDIF on this machine: send a ``--engine ndif`` shell's session here to check a
document before it goes to the server.

nnsight's local simulation of the remote path — the request serialized, deserialized with the
client's own modules blocked (as on the server, where the client's code is not), run — against a
second copy of the model that does hold the weights, loaded here. Only the saved values come
back to the client, as from NDIF; the client's shell still holds no weights.

Two servers can be stood in for. By default, one that has causalab-mini and nnterp installed at
the client's versions, holding the model as nnterp does: a package request (the walk by reference)
runs there, and so does a kernel request. With ``stock=True``, one that has torch, transformers and
nnsight and nothing of this project's — as a server NDIF runs does: it holds the checkpoint as
transformers loads it in nnsight's plain ``LanguageModel``, and ``causalab_mini``, ``nnterp`` and
``pytest_causalab`` are taken out of ``sys.modules`` and refused on ``sys.meta_path`` while the
request is read and run (and put back after). A kernel request (the default) runs there; a request
that needs the packages is refused here by name, as it would fail there.

Every request's size is measured as NDIF's client and server would send it (the request as
``RequestModel.serialize`` writes it, the response as ``torch.save`` writes the saved values, each
zstd-compressed where nnsight's ``CONFIG.API.COMPRESS`` says so): ``wire`` on the backend after a
request, and ``run.json``'s ``wire`` for a run sent to a stand-in.
"""
from __future__ import annotations

import importlib.abc
import io
import sys
from contextlib import contextmanager

from . import api
from .engine.nnterp import NNterpEngine
from .errors import EngineError

# What a stock server does not have: this project and the library its engine stands on.
NOT_ON_A_STOCK_SERVER = ("causalab_mini", "nnterp", "pytest_causalab")


def stand_in(document, *, models=None, trust_remote_code: bool = False, stock: bool = False):
    """An nnsight backend that runs a session here the way NDIF runs it: serialized, deserialized with
    the client's modules blocked against a server-side copy of the model that holds the weights,
    executed, and only the saved values handed back to the client. ``stock``: the server has none
    of this project's packages (nor nnterp)."""
    from nnsight import CONFIG
    from nnsight.intervention.backends.base import Backend
    from nnsight.intervention.backends.local_simulation import LocalSimulationBackend
    from nnsight.intervention.tracing.globals import save as mark_saved
    from nnsight.schema.request import RequestModel

    doc = api.read(document)
    if stock:
        server = _stock_model(doc, models, trust_remote_code)
    else:
        server = NNterpEngine.load(doc.model, document=doc.path, models=models, trust_remote_code=trust_remote_code,
                                   attention_probs=doc.attention_probs).model

    class StandIn(LocalSimulationBackend):
        records_as = "local"  # run.json's "remote": nnsight's local simulation
        requests = 0  # sessions received: one per execute
        wire = None  # the last request's bytes: {"sent": n, "received": n, "compressed": bool}
        exchanged = None  # the last request and response themselves, as bytes (to inspect them)

        def __call__(self, tracer):
            self.requests += 1
            compress = bool(CONFIG.API.COMPRESS)
            interventions = Backend.__call__(self, tracer)
            payload = RequestModel(interventions=interventions, tracer=tracer).serialize(compress=compress)
            blocked = self._block_user_modules()  # as on the server: the client's code is not there
            try:
                with _stock_server(stock):
                    restored = RequestModel.deserialize(payload, self.model._remoteable_persistent_objects(),
                                                        compress=compress)
                    self._restore_modules(blocked)
                    blocked = None
                    saves = restored.tracer.execute(restored.interventions)  # on the server's modules
            finally:
                if blocked is not None:
                    self._restore_modules(blocked)
            response = _response_bytes(saves, compress)
            self.exchanged = (payload, response)
            self.wire = {"sent": len(payload), "received": len(response), "compressed": compress}
            for value in saves.values():  # as NDIF's client does: what came home counts as saved
                mark_saved(value)
            tracer.push(saves)

    backend = StandIn(server)
    backend.stock = stock
    return backend


def _stock_model(doc, models, trust_remote_code: bool):
    """What a stock server holds: the checkpoint as transformers loads it, in nnsight's plain
    ``LanguageModel`` — nothing of this project's or nnterp's on its modules (eager attention where
    the document reads the pattern, as a server asked for it would serve it)."""
    from nnsight import LanguageModel

    from .engine.complete import load_causal_lm
    from .model import loading
    from .model.recipe import describe_model

    loading.quiet_loading()
    described = describe_model(doc.model, document=doc.path, models=models, trust_remote_code=trust_remote_code)
    options = dict(dtype=loading.torch_dtype(described.ref), device_map="cpu", use_safetensors=True,
                   trust_remote_code=bool(trust_remote_code))
    if doc.attention_probs:
        options["attn_implementation"] = "eager"
    model = load_causal_lm(described.resolved, options)
    loading.freeze(model)
    return LanguageModel(model, tokenizer=described.tokenizer)


def _response_bytes(saves: dict, compress: bool) -> bytes:
    """What NDIF sends back for ``saves``: ``torch.save`` of the values, zstd-compressed when the
    client asked for compression (nnsight's RemoteBackend reads it with ``torch.load``)."""
    import torch

    buffer = io.BytesIO()
    torch.save(saves, buffer)
    data = buffer.getvalue()
    if compress:
        import zstandard

        data = zstandard.ZstdCompressor(level=6).compress(data)
    return data


class _Absent(importlib.abc.MetaPathFinder):
    """A stock server's import of a package it does not have."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in NOT_ON_A_STOCK_SERVER:
            raise ModuleNotFoundError(f"No module named {name!r} (a stock server has none of "
                                      f"{', '.join(NOT_ON_A_STOCK_SERVER)})", name=name)
        return None


@contextmanager
def _stock_server(stock: bool):
    """While the request is read and run: none of this project's packages importable (``stock``),
    every module put back afterwards however it ends. A request that needs them is refused by name."""
    if not stock:
        yield
        return
    taken = {n: m for n, m in sys.modules.items() if n.split(".")[0] in NOT_ON_A_STOCK_SERVER}
    for name in taken:
        del sys.modules[name]
    finder = _Absent()
    sys.meta_path.insert(0, finder)
    try:
        yield
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in NOT_ON_A_STOCK_SERVER:
            raise
        raise EngineError("ndif", f"a stock server (torch, transformers and nnsight; no "
                          f"{', '.join(NOT_ON_A_STOCK_SERVER)}) cannot run this request: {err.args[0]} — "
                          "a package request names the walk's code by reference, and such a server has "
                          "nothing to import it from", "send a kernel request (the default; --ndif-request "
                          "kernel), or send it to a server with causalab-mini and nnterp installed at this "
                          "client's versions (NDIF's own servers have neither)") from None
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(taken)

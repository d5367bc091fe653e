"""What crosses the wire to a server, and a server without this project's packages.

The stand-in (``cm.stand_in``) measures each request as NDIF's client sends it and each response as
the server sends it back; the bytes it reports are the bytes themselves (read back here: the
request deserializes as nnsight's ``RequestModel``, the response loads with ``torch.load`` into the
results the run filled in). ``stock=True`` stands in for a server with torch, transformers and
nnsight only: the walk's code travels by reference today, so such a server cannot run a request,
and the stand-in refuses it by name — leaving every module of the client's as it was.
"""
from __future__ import annotations

import io
import sys

import pytest
import torch
import zstandard
from paths import DATA, MODELS, V2

import causalab_mini as cm
from causalab_mini.errors import EngineError

DOC = V2 / "patching.causalab.json"


@pytest.fixture(scope="module")
def sent():
    """patching.causalab.json run on an ndif shell sent to a stand-in: (run, the stand-in)."""
    server = cm.stand_in(DOC, models=[MODELS])
    shell = cm.load(DOC, engine="ndif", models=[MODELS])
    shell.server = server
    return cm.run(DOC, loaded=shell, data=[DATA]), server


def test_the_bytes_reported_are_the_request_and_the_response(sent):
    run, server = sent
    payload, response = server.exchanged
    assert run.record["wire"] == server.wire == {"sent": len(payload), "received": len(response),
                                                  "compressed": server.wire["compressed"]}
    if server.wire["compressed"]:
        payload = zstandard.ZstdDecompressor().decompress(payload)
        response = zstandard.ZstdDecompressor().decompress(response)
    # The response is what the client fills its plan from: every step's results, and the dtype served.
    home = torch.load(io.BytesIO(response), map_location="cpu", weights_only=False)
    (saved,) = [v for v in home.values() if isinstance(v, dict) and "served_dtype" in v]
    assert saved["served_dtype"] == run.record["served_dtype"]
    step = run.plan.steps["score"]
    assert torch.equal(saved["score"]["iia"], step.results["iia"])
    assert torch.equal(saved["score"]["logit_diff"], step.results["logit_diff"])
    # The request is nnsight's own: the session's body as its source, the walk named by reference
    # (what a stock server cannot import), and not the stand-in the shell was pointed at.
    assert b"__nnsight_tracer_" in payload and b"walk(engine, plan" in payload
    assert b"causalab_mini.engine.steps" in payload
    assert b"StandIn" not in payload


def test_a_stock_server_refuses_the_request_by_name_and_the_client_is_untouched(sent):
    server = cm.stand_in(DOC, models=[MODELS], stock=True)
    shell = cm.load(DOC, engine="ndif", models=[MODELS])
    shell.server = server
    before = {n for n in sys.modules if n.split(".")[0] in ("causalab_mini", "nnterp")}
    with pytest.raises(EngineError) as refused:
        cm.run(DOC, loaded=shell, data=[DATA])
    assert refused.value.path == "ndif"
    assert "stock server" in refused.value.problem and "'causalab_mini'" in refused.value.problem
    assert "installed" in refused.value.fix
    assert {n for n in sys.modules if n.split(".")[0] in ("causalab_mini", "nnterp")} == before
    assert not any(type(f).__name__ == "_Absent" for f in sys.meta_path)
    # The same shell, sent to a server that has the packages, runs and equals the first run.
    shell.server = sent[1]
    again = cm.run(DOC, loaded=shell, data=[DATA])
    assert torch.equal(again.plan.steps["score"].results["logit_diff"],
                       sent[0].plan.steps["score"].results["logit_diff"])


def test_a_server_whose_causalab_mini_differs_is_refused_before_the_walk(sent, monkeypatch):
    """The session's first act on the server: its own causalab-mini (version, source digest) against
    the client's; a different one is refused by name and no forward runs. A matching one is recorded."""
    run, server = sent
    from causalab_mini.engine import provenance

    assert run.record["server"] == provenance.identity() and run.record["server"]["source"]
    calls = []
    hook = server.model._model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        shell = cm.load(DOC, engine="ndif", models=[MODELS])
        shell.server = server
        cm.run(DOC, loaded=shell, data=[DATA])
        matching = len(calls)
        skewed = dict(provenance.identity(), source="0" * 64)  # this client, as if its source differed
        monkeypatch.setattr(provenance, "identity", lambda: skewed)
        with pytest.raises(EngineError) as refused:
            cm.run(DOC, loaded=shell, data=[DATA])
    finally:
        hook.remove()
    assert refused.value.path == "server" and "000000000000" in refused.value.problem
    assert "install the client's causalab-mini" in refused.value.fix
    assert matching > 0 and len(calls) == matching  # the server's model ran for the match, not for the skew

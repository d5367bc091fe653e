"""What crosses the wire to a server, and a server without this project's packages.

The stand-in (``cm.stand_in``) measures each request as NDIF's client sends it and each response as
the server sends it back; the bytes it reports are the bytes themselves (read back here: the
request deserializes as nnsight's ``RequestModel``, the response loads with ``torch.load`` into the
values the run's replay filled in). ``stock=True`` stands in for a server with torch, transformers and
nnsight only: a kernel request (the default) runs there and names nothing of this project's; a
package request (the walk by reference) cannot, and the stand-in refuses it by name — leaving every
module of the client's as it was. A package request checks the server's causalab-mini first.
"""
from __future__ import annotations

import io
import json
import sys

import pytest
import torch
import zstandard
from paths import DATA, MODELS, V2
from pickles import imported_modules

import causalab_mini as cm
from causalab_mini.errors import EngineError

DOC = V2 / "patching.causalab.json"


@pytest.fixture(scope="module")
def server():
    """A stand-in with the packages installed (the walk by reference can run there)."""
    return cm.stand_in(DOC, models=[MODELS])


@pytest.fixture(scope="module")
def sent(server):
    """patching.causalab.json run on an ndif shell sent to a stand-in, the walk by reference: (run, the stand-in)."""
    shell = cm.load(DOC, engine="ndif", models=[MODELS], request="package")
    shell.server = server
    return cm.run(DOC, loaded=shell, data=[DATA]), server


@pytest.fixture(scope="module")
def stock():
    """A stand-in for a stock server: torch, transformers and nnsight only."""
    return cm.stand_in(DOC, models=[MODELS], stock=True)


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


def test_a_stock_server_refuses_a_package_request_by_name_and_the_client_is_untouched(sent, stock):
    shell = cm.load(DOC, engine="ndif", models=[MODELS], request="package")
    shell.server = stock
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
        shell = cm.load(DOC, engine="ndif", models=[MODELS], request="package")
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


def test_a_kernel_request_runs_on_a_stock_server_and_carries_nothing_of_the_package(stock):
    """The default request: the kernel's source and a program of plain data. It runs where nothing of
    causalab-mini or nnterp can be imported, equals the local run, and what comes home is the metrics'
    values, scored where the logits are."""
    shell = cm.load(DOC, engine="ndif", models=[MODELS])
    shell.server = stock
    before = stock.requests
    there = cm.run(DOC, loaded=shell, data=[DATA])
    here = cm.run(DOC, engine="nnterp", models=[MODELS], data=[DATA])
    assert stock.requests == before + 1
    for metric in ("iia", "logit_diff"):
        assert torch.equal(there.plan.steps["score"].results[metric], here.plan.steps["score"].results[metric])
    payload, response = (zstandard.ZstdDecompressor().decompress(b) if stock.wire["compressed"] else b
                         for b in stock.exchanged)
    # Nothing is imported by reference from this project or nnterp (a module's name may appear as text:
    # the body's own ``__module__``); the kernel travels as its source.
    imported = imported_modules(payload)
    assert imported and not [m for m in imported if m.split(".")[0] in ("causalab_mini", "nnterp", "causalab_kernel")]
    assert b"def apply_groups(model, fw, store, feats, step)" in payload
    assert there.record["request"]["kind"] == "kernel" and "server" not in there.record
    assert there.record["wire"] == stock.wire
    home = torch.load(io.BytesIO(response), map_location="cpu", weights_only=False)
    (saved,) = [v for v in home.values() if isinstance(v, dict) and "served_dtype" in v]
    assert saved["served_dtype"] == there.record["served_dtype"] == "torch.float32"
    # What came home: the metrics, scored on the server (no logit row): each of the run's results is one.
    came = {k: v for k, v in saved.items() if k != "served_dtype"}
    assert all(k.startswith("score/") and v.dim() == 1 for k, v in came.items())
    step = there.plan.steps["score"]
    for metric in ("iia", "logit_diff"):
        assert any(torch.equal(v, step.results[metric]) for v in came.values())


def test_what_a_stock_server_cannot_run_is_refused_at_compile_time_by_name():
    """A fit trains through the model in the walk: refused for a kernel request at its step, with how
    to run it; the same document compiles for a package request."""
    das = V2 / "das.causalab.json"
    shell = cm.load(das, engine="ndif", models=[MODELS])
    with pytest.raises(cm.CompileError) as refused:
        cm.compile(das, loaded=shell, data=[DATA])
    assert refused.value.path == "steps.fit" and "--ndif-request package" in refused.value.fix
    with pytest.raises(cm.CompileError):
        cm.compile(das, engine="ndif", models=[MODELS], data=[DATA])  # weightless: a kernel request
    shell.request = "package"
    cm.compile(das, loaded=shell, data=[DATA])
    with pytest.raises(EngineError, match="not one of kernel, package"):
        cm.load(DOC, engine="ndif", models=[MODELS], request="walk")
    with pytest.raises(EngineError, match="for a remote engine"):
        cm.load(DOC, engine="hooks", models=[MODELS], request="kernel")


def test_a_mean_published_across_batches_is_derived_where_the_reads_are(tmp_path):
    """mean_ablation in batches of 3 rows: the harvested read comes back in pieces, the walk concatenates
    them and publishes their mean, and a later write takes it as its operand — on a stock server that
    operand is derived there (``derive``: the pieces concatenated, reshaped, cast, averaged), and the run
    equals the local one."""
    doc = V2 / "mean_ablation.causalab.json"
    shell = cm.load(doc, engine="ndif", models=[MODELS])
    shell.server = cm.stand_in(doc, models=[MODELS], stock=True)
    there = cm.run(doc, loaded=shell, data=[DATA], batch_size=3, out=tmp_path / "there")
    here = cm.run(doc, engine="nnterp", models=[MODELS], data=[DATA], batch_size=3, out=tmp_path / "here")
    (derived,) = [s for s in shell.last_request["steps"] if s["op"] == "derive"]
    expr = derived["expr"]
    assert expr[:2] == ("call", "mean") and expr[2][:2] == ("call", "to") and expr[2][2][:2] == ("call", "reshape")
    assert expr[2][2][2][0] == "cat" and len(expr[2][2][2][1]) > 1  # the batches' pieces
    operands = [w["operand"] for s in shell.last_request["steps"] if s["op"] == "forward"
                for g in s["groups"] for t in g["taps"] for w in t["writes"] if w["operand"]]
    assert {"key": derived["key"]} in operands
    assert json.loads((tmp_path / "there" / "run.json").read_text())["request"]["kind"] == "kernel"
    assert {p.name: {k: r.rows for k, r in p.results().items()} for p in there.points} == \
        {p.name: {k: r.rows for k, r in p.results().items()} for p in here.points}


def test_rows_a_kind_leaves_undefined_on_the_server_are_excluded_as_here(stock, tmp_path):
    """normalized_effect scored on the server with a min_denominator that leaves some rows out: the rows
    it defines come home with its values, and the files equal the local run's (the excluded rows
    with their reason)."""
    path = V2 / "effect_metrics.causalab.json"
    raw = json.loads(path.read_text())
    # The denominators, by hand from the two reads it compares: the bound leaves the smallest out.
    kept = cm.run(path, engine="nnterp", models=[MODELS], data=[DATA], reads=["clean", "cf_logits"])
    point = kept.points[0]
    (recovered,) = [m for m in point.plan.steps["score"].metrics if m.name == "recovered"]
    a, b = (torch.tensor(column) for column in recovered.token_ids)

    def diff(logits):
        last = logits[:, -1].float()
        return last.gather(1, a[:, None])[:, 0] - last.gather(1, b[:, None])[:, 0]
    denominators = (diff(point.value("cf_logits")) - diff(point.value("clean"))).abs()
    smallest, next_ = torch.unique(denominators)[:2]  # sorted: two distinct sizes at least
    metric = raw["interventions"]["patching"]["metrics"]["recovered"]
    metric["params"] = {"min_denominator": float(smallest + next_) / 2}
    local = cm.run(cm.read(raw, path=path), engine="nnterp", models=[MODELS], data=[DATA])
    reasons = [r["reason"] for p in local.points for r in p.result("recovered").rows]
    left_out = int((denominators == smallest).sum())  # the rows of the smallest, at every point
    assert reasons.count("effect_denominator_near_zero") == left_out * len(local.points)
    doc = cm.read(raw, path=path)
    shell = cm.load(doc, engine="ndif", models=[MODELS])
    shell.server = stock
    there = cm.run(doc, loaded=shell, data=[DATA])
    scores = [s for s in shell.last_request["steps"] if s["op"] == "score" and s["kind"] == "normalized_effect"]
    assert scores and all(s["params"]["min_denominator"] == metric["params"]["min_denominator"] for s in scores)
    assert {p.name: p.result("recovered").rows for p in there.points} == \
        {p.name: p.result("recovered").rows for p in local.points}


def test_whole_answers_are_scored_where_their_forced_reads_are():
    """whole_answer scores answers of several tokens (teacher-forced): the server scores them per answer
    column, and what comes home is those scores, equal to the local run's — no logit row."""
    doc = V2 / "whole_answer.causalab.json"
    shell = cm.load(doc, engine="ndif", models=[MODELS])
    shell.server = cm.stand_in(doc, models=[MODELS], stock=True)
    there = cm.run(doc, loaded=shell, data=[DATA])
    here = cm.run(doc, engine="nnterp", models=[MODELS], data=[DATA])
    program = shell.last_request
    kinds = {s["kind"] for s in program["steps"] if s["op"] == "score_sequence"}
    assert kinds == {"token_prob", "cross_entropy", "logit_diff", "match"}
    assert program["home"] and all(key.startswith("score/") for key in program["home"])
    assert {p.name: {k: r.rows for k, r in p.results().items()} for p in there.points} == \
        {p.name: {k: r.rows for k, r in p.results().items()} for p in here.points}

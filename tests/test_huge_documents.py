"""Reading a document costs what its points and its expectations are, added, not multiplied.

A sweep of P points whose header holds E expectations is lowered and validated with work that
grows as P + E: the header is validated once, not once per point, no point's document is a deep
copy of the whole document, and the expectations that apply at each point are found from each
expectation's selector. Timing that is a benchmark (benchmarks/huge_documents.py: 1,000 points x
2,000 expectations, 10,000 points); here the real ``causalab_mini.read`` runs with counting
wrappers around the functions whose calls are the work (each wrapper calls the real function),
on a 2 x 2 grid of sizes. A count that grows as a*P + b*E + c has a mixed difference
f(2P, 2E) - f(2P, E) - f(P, 2E) + f(P, E) of exactly 0; a per-point pass over the expectations
(the P*E term) makes it P*E (times what each costs).

What a point's header lists is not counted: an expectation without ``points`` applies at every
point, so each point's list of them is output, P x E references by what it says.
"""
from __future__ import annotations

import copy
import json
from collections import Counter

import pytest

import causalab_mini as cm
from causalab_mini.document import expect, sweep
from causalab_mini.document.expect import Expectation
from paths import CORPUS, V2

SOURCE = V2 / "pos_sweep.causalab.json"
SIZES = (10, 20)  # points
EXPECTATIONS = (12, 24)


def document(points: int, expectations: int) -> dict:
    """pos_sweep with its write swept over ``points`` positions and ``expectations`` expectations:
    by point name, by axis value, and everywhere, in turn (each the same size whatever P is)."""
    raw = json.loads(SOURCE.read_text())
    raw["interventions"]["patching"]["writes"]["patch"]["pos"] = {"sweep": list(range(-1, -points - 1, -1))}
    exps = []
    for i in range(expectations):
        pos = -(i % points) - 1
        exps.append([{"result": "iia", "mean": {">=": 0}, "points": [f"pos={pos}"]},
                     {"result": "logit_diff", "max": {"<=": 1}, "points": {"pos": pos}},
                     {"result": "iia", "eligible": {">": 0}}][i % 3])
    raw["header"]["expect"] = exps
    return raw


def nodes(value) -> int:
    """The JSON nodes in ``value`` (objects, arrays and scalars)."""
    if isinstance(value, dict):
        return 1 + sum(nodes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return 1 + sum(nodes(v) for v in value)
    return 1


def counting(monkeypatch, counts: Counter, owner, name: str, key: str, weight=lambda *args: 1) -> None:
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        counts[key] += weight(*args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


def work(monkeypatch, points: int, expectations: int) -> tuple[Counter, cm.Document]:
    raw = document(points, expectations)
    counts: Counter = Counter()
    with monkeypatch.context() as m:
        # Every node deep-copied: each call weighs what it copies (copy.deepcopy's own recursion
        # is bound inside the copy module, so only the calls made from outside it are seen).
        counting(m, counts, copy, "deepcopy", "nodes deep-copied", weight=lambda value, *_: nodes(value))
        # Every threshold validated (Comparison's field validator calls it): expectations validated.
        counting(m, counts, expect, "_no_bool", "thresholds validated")
        # Every node the sweep's walker visits (finding wrappers, refusing unlowered points).
        counting(m, counts, sweep, "_walk", "nodes walked")
        counting(m, counts, Expectation, "applies", "expectation x point tests")
        counting(m, counts, sweep, "label", "values spelled")
        doc = cm.read(raw, path=SOURCE)
    return counts, doc


def test_reading_grows_with_points_plus_expectations_not_their_product(monkeypatch):
    (p, p2), (e, e2) = SIZES, EXPECTATIONS
    f = {(pp, ee): work(monkeypatch, pp, ee)[0] for pp in (p, p2) for ee in (e, e2)}
    keys = sorted(set().union(*f.values()))
    assert {"nodes deep-copied", "thresholds validated", "nodes walked"} <= set(keys)  # the wrappers ran
    mixed = {k: f[p2, e2][k] - f[p2, e][k] - f[p, e2][k] + f[p, e][k] for k in keys}
    table = "\n".join(f"{k}: {[f[s][k] for s in f]} at (P, E) = {list(f)}" for k in keys)
    assert mixed == {k: 0 for k in keys}, f"a points x expectations term:\n{table}"
    # And the expectations are validated once each, not once per point (2 thresholds where one
    # comparison's field validator sees its number, the rest 1).
    assert f[p2, e]["thresholds validated"] == f[p, e]["thresholds validated"] <= 2 * e


def test_each_point_keeps_the_expectations_that_apply_there(monkeypatch):
    """The points the counted read gives are the points: each with the expectations whose
    selector names it, in the header's order, without their "points"."""
    _, doc = work(monkeypatch, 10, 12)
    raw = document(10, 12)["header"]["expect"]
    for point in doc.points:
        want = [{k: v for k, v in e.items() if k != "points"} for e in raw
                if Expectation.model_validate(e).applies(point.name, point.coords)]
        assert point.document["header"]["expect"] == want
        assert [e.model_dump(exclude_none=True) for e in point.spec.header.expect] == \
            [Expectation.model_validate(w).model_dump(exclude_none=True) for w in want]


@pytest.mark.parametrize("path", [p for p in CORPUS if '"sweep"' in p.read_text()], ids=lambda p: p.stem)
def test_shared_lowering_gives_the_copies_documents(path):
    """``lower(share=True)``, what reading uses, gives the documents, names and coordinates the
    copying ``lower`` gives, and leaves the input as it was."""
    raw = json.loads(path.read_text())
    before = copy.deepcopy(raw)
    shared, copied = sweep.lower(raw, share=True), sweep.lower(raw)
    assert [(p.name, p.coords, p.document) for p in shared] == [(p.name, p.coords, p.document) for p in copied]
    assert raw == before


def test_a_swept_expectation_is_validated_at_each_point():
    """A sweep inside the header changes it per point: each point's expectation is its own, and
    a value one point cannot take is refused at that point, as before."""
    raw = json.loads(SOURCE.read_text())
    raw["header"]["expect"] = [{"result": "iia", "mean": {"sweep": [0.5, 1.0, 0.25]}}]
    doc = cm.read(raw, path=SOURCE)
    assert len(doc.points) == 9  # 3 thresholds x pos_sweep's 3 positions
    assert all(p.spec.header.expect[0].mean.approx == dict(p.coords)["mean"] for p in doc.points)
    assert all(p.document["header"]["expect"][0]["mean"] == dict(p.coords)["mean"] for p in doc.points)
    raw["header"]["expect"][0]["mean"] = {"sweep": [0.5, {">": 1, "<": 2}, 0.25]}
    with pytest.raises(cm.errors.DocumentError) as err:
        cm.read(raw, path=SOURCE)
    assert err.value.path == "header.expect.0.mean" and "exactly one operator" in err.value.problem

"""The five compared-read and parametrised metric kinds (prob_diff, token_rank, top_k, kl_div,
normalized_effect) run end to end, held to a computation written here.

One document patches the residual stream leaving layer 0 at the last token of the counterfactual
prompt into the base prompt, reads the patched, the clean (base) and the counterfactual logits at
the last token — both as the model's output (``logits``: Gemma-2's soft cap applied) and as the
unembedding's (``lm_head``: not) — and scores every kind on them. It runs through ``cm.run`` on
both engines, on the three shipped checkpoints and on tiny random GPT-2, Llama and Gemma-2
checkpoints built at test time (``families.build``). The values are checked per row against the
raw Hugging Face model — one unpadded row at a time, a hand-written forward hook doing the patch,
answer ids straight from the tokenizer — with every metric computed here in float64 another way
than its compute, and the two engines are held equal to each other.

Then the rows a normalized effect leaves out (its denominator below ``min_denominator``), found
by hand, and the refusals a document with these kinds gets: each a DocumentError at the field,
with a fix, and from the CLI without a traceback.
"""
from __future__ import annotations

import copy
import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from paths import DATA, REPO
from reference import answer_id, hidden_of, with_hidden
from samples import cli_command

import causalab_mini as cm
from causalab_mini.errors import DocumentError

transformers = pytest.importorskip("transformers")

ATOL, RTOL = 1e-5, 1e-4
ENGINES = ("hooks", "nnterp")
SHIPPED = ("tiny-llama", "tiny-gpt2", "tiny-gemma2")
FAMILIES = ("gpt2", "llama", "gemma2")  # built at test time: families.build
MODEL_CASES = [*SHIPPED, *(f"family:{f}" for f in FAMILIES)]
# The module whose output is the residual stream leaving a layer, by model type.
LAYERS = {"gpt2": "transformer.h", "llama": "model.layers", "gemma2": "model.layers"}
# The two logits a metric may score: the model's output, and lm_head's (before any soft cap).
VIEWS = {"": "logits", "raw_": "lm_head"}
K = (1, 3)  # top_k's k


# --------------------------------------------------------------------------- the document

def _read(site: str, model: str, role: str) -> dict:
    return {"site": site, "pos": -1, "model": model, "input": role}


def _metrics(p: str) -> dict:
    """Every kind on the patched logits of view prefix ``p``, compared with the clean and the
    counterfactual runs' logits of the same view."""
    of, clean, cf = f"{p}logits", f"{p}clean", f"{p}cf"
    metrics = {
        f"{p}kl": {"kind": "kl_div", "of": of, "reference": clean},
        f"{p}kl_cf": {"kind": "kl_div", "of": of, "reference": cf},
        f"{p}pd": {"kind": "prob_diff", "of": of, "a": "cf_answer", "b": "base_answer"},
        f"{p}ne": {"kind": "normalized_effect", "of": of, "base": clean, "counterfactual": cf,
                   "a": "cf_answer", "b": "base_answer"},
        f"{p}ne_prob": {"kind": "normalized_effect", "of": of, "base": clean, "counterfactual": cf,
                        "a": "cf_answer", "b": "base_answer", "params": {"measure": "prob_diff"}},
        f"{p}rank_cf": {"kind": "token_rank", "of": of, "token": "cf_answer"},
        f"{p}rank_base": {"kind": "token_rank", "of": of, "token": "base_answer"},
    }
    for k in K:
        metrics[f"{p}top{k}_cf"] = {"kind": "top_k", "of": of, "expected": "cf_answer", "params": {"k": k}}
        metrics[f"{p}top{k}_base"] = {"kind": "top_k", "of": of, "expected": "base_answer", "params": {"k": k}}
    return metrics


def document(key: str, extra_metrics: dict | None = None) -> dict:
    reads = {"v_cf": _read("target", "original", "counterfactual")}
    metrics = {}
    for p, component in VIEWS.items():
        site = f"{p}out"
        reads[f"{p}logits"] = _read(site, "patched", "base")
        reads[f"{p}clean"] = _read(site, "original", "base")
        reads[f"{p}cf"] = _read(site, "original", "counterfactual")
        metrics.update(_metrics(p))
    metrics.update(extra_metrics or {})
    return {
        "header": {"description": "the five compared and parametrised metric kinds, on a residual patch"},
        "model": {"key": key, "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"component": "block_output", "layers": [0]},
                  **{f"{p}out": {"component": c} for p, c in VIEWS.items()}},
        "interventions": {"patching": {
            "reads": reads,
            "writes": {"patch": {"site": "target", "pos": -1, "mechanism": "swap", "operand": "v_cf"}},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": metrics,
        }},
        "steps": {"score": {"kind": "observe", "interventions": "patching",
                            "rows": {"base": "weekdays/train", "counterfactual": "weekdays/train"},
                            "saves": [{"value": "kl", "file_path": "kl.json"}]}},
    }


# --------------------------------------------------------------------------- the hand side

class Hand:
    """The raw Hugging Face model, one unpadded row at a time: the patched, clean and
    counterfactual logits at the last token, as the model returns them and as lm_head does."""

    def __init__(self, folder: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.rows = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines()
                     if line.strip()]
        self.layer0 = self.model.get_submodule(f"{LAYERS[self.model.config.model_type]}.0")
        self.head = self.model.get_output_embeddings()
        self.cf_answer = torch.tensor([answer_id(self.tok, r["cf_answer"]) for r in self.rows])
        self.base_answer = torch.tensor([answer_id(self.tok, r["base_answer"]) for r in self.rows])
        views = {p: {"logits": [], "clean": [], "cf": []} for p in VIEWS}
        for r in self.rows:
            base = self.tok(r["input"])["input_ids"]
            cf = self.tok(r["counterfactual_inputs"][0])["input_ids"]
            kept = {}
            out, raw = self._run(cf, keep=kept)
            views[""]["cf"].append(out)
            views["raw_"]["cf"].append(raw)
            out, raw = self._run(base)
            views[""]["clean"].append(out)
            views["raw_"]["clean"].append(raw)
            out, raw = self._run(base, patch=kept["resid"])
            views[""]["logits"].append(out)
            views["raw_"]["logits"].append(raw)
        self.logits = {p: {k: torch.stack(v) for k, v in got.items()} for p, got in views.items()}

    def _run(self, ids, keep=None, patch=None):
        """(the model's logits, lm_head's output) at the last token; ``keep`` stores layer 0's
        output there, ``patch`` replaces it."""
        store = {}

        def at_layer(module, args, output):
            h = hidden_of(output)
            if keep is not None:
                keep["resid"] = h[0, -1].clone()
            if patch is None:
                return None
            h = h.clone()
            h[0, -1] = patch
            return with_hidden(output, h)

        def at_head(module, args, output):
            store["raw"] = output[0, -1].clone()

        handles = [self.layer0.register_forward_hook(at_layer), self.head.register_forward_hook(at_head)]
        try:
            with torch.no_grad():
                out = self.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
        finally:
            for h in handles:
                h.remove()
        return out, store["raw"]

    def columns(self, name: str) -> torch.Tensor:
        return {"cf_answer": self.cf_answer, "base_answer": self.base_answer}[name]


# The metric definitions, in float64, written out row by row, not with the kinds' code.

def _probs(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def hand_kl(of: torch.Tensor, reference: torch.Tensor) -> list[float]:
    """Σ_v p_ref(v) · (log p_ref(v) − log p(v)), summed over the vocabulary in Python."""
    out = []
    for p_row, q_row in zip(_probs(reference).tolist(), _probs(of).tolist()):
        out.append(math.fsum(p * (math.log(p) - math.log(q)) for p, q in zip(p_row, q_row) if p > 0))
    return out


def hand_prob_diff(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> list[float]:
    p = _probs(x)
    return [p[i, a[i]].item() - p[i, b[i]].item() for i in range(len(a))]


def hand_logit_diff(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> list[float]:
    x = x.double()
    return [x[i, a[i]].item() - x[i, b[i]].item() for i in range(len(a))]


def hand_effect(of, base, cf, a, b, measure: str = "logit_diff") -> tuple[list[float], list[float]]:
    """(the normalised effect, its denominator) per row."""
    m = hand_logit_diff if measure == "logit_diff" else hand_prob_diff
    here, low, high = m(of, a, b), m(base, a, b), m(cf, a, b)
    return [(h - lo) / (hi - lo) for h, lo, hi in zip(here, low, high)], [hi - lo for lo, hi in zip(low, high)]


# A logit this close to the scored token's is a tie the two sides may round either way.
TIE = 1e-4


def hand_ranks(x: torch.Tensor, token: torch.Tensor) -> list[tuple[int, int]]:
    """Per row, the ranks the token may have: 1 + its place in the row sorted high to low, where
    tokens within TIE of its logit may fall either side of it (one rank when there is none)."""
    out = []
    for row, t in zip(x.double().tolist(), token.tolist()):
        ordered = sorted(row, reverse=True)
        v = row[t]
        above = next(i for i, u in enumerate(ordered) if u <= v + TIE)  # surely higher
        at_most = next((i for i, u in enumerate(ordered) if u < v - TIE), len(ordered))  # possibly higher
        out.append((1 + above, at_most))  # at_most counts the token itself: the worst rank it can have
    return out


def _close(got, want, what: str) -> None:
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64),
                               atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}: {m}")


def _values(result) -> list:
    return [row["value"] for row in result.rows]


# --------------------------------------------------------------------------- fixtures: each model once

@pytest.fixture(scope="module")
def hands(folders):
    cache: dict = {}

    def get(case: str) -> Hand:
        if case not in cache:
            key, root = folders(case)
            cache[case] = Hand(root / key)
        return cache[case]
    yield get
    cache.clear()


@pytest.fixture(scope="module")
def runs(folders, engines):
    """``runs(case, engine)``: the Run of the five-kinds document on that model, each run once."""
    cache: dict = {}

    def get(case: str, engine: str, extra: dict | None = None):
        tag = (case, engine, json.dumps(extra, sort_keys=True))
        if tag not in cache:
            key, root = folders(case)
            raw = document(key, extra)
            loaded = engines(raw, engine, models=(root,))
            cache[tag] = cm.run(raw, loaded=loaded, models=[root], data=[DATA])
        return cache[tag]
    yield get
    cache.clear()


# --------------------------------------------------------------------------- every kind, every model

@pytest.mark.parametrize("case", MODEL_CASES)
def test_every_kind_equals_the_hand_computation_on_both_engines(case, hands, runs):
    hand = hands(case)
    a, b = hand.cf_answer, hand.base_answer
    n = len(hand.rows)
    points = {engine: runs(case, engine).points[0] for engine in ENGINES}
    for engine, point in points.items():
        for p in VIEWS:
            lg = hand.logits[p]
            of, clean, cf = lg["logits"], lg["clean"], lg["cf"]
            want = {
                f"{p}kl": hand_kl(of, clean),
                f"{p}kl_cf": hand_kl(of, cf),
                f"{p}pd": hand_prob_diff(of, a, b),
                f"{p}ne": hand_effect(of, clean, cf, a, b)[0],
                f"{p}ne_prob": hand_effect(of, clean, cf, a, b, "prob_diff")[0],
            }
            # Every row is scored: the answers differ, the positions are fixed, the denominators
            # are well away from min_denominator (checked, so a row left out fails here).
            for measure in ("logit_diff", "prob_diff"):
                denominators = hand_effect(of, clean, cf, a, b, measure)[1]
                assert min(abs(d) for d in denominators) > 1e-3, (case, p, measure, denominators)
            for name, values in want.items():
                result = point.result(name)
                assert result.eligible == (True,) * n, (engine, name, result.rows)
                _close(_values(result), values, f"{case} {engine} {name}")
            for column, token in (("cf", a), ("base", b)):
                ranks = hand_ranks(of, token)
                got = _values(point.result(f"{p}rank_{column}"))
                assert all(lo <= r <= hi for r, (lo, hi) in zip(got, ranks)), (engine, column, got, ranks)
                assert all(r == int(r) >= 1 for r in got)
                for k in K:
                    hits = _values(point.result(f"{p}top{k}_{column}"))
                    for hit, (lo, hi) in zip(hits, ranks):
                        assert hit in (0.0, 1.0)
                        if hi <= k or lo > k:  # the rank decides it whichever way a tie rounds
                            assert hit == float(hi <= k), (engine, column, k, hits, ranks)
                    # top_k is the rank test: in the top k exactly where the rank is at most k
                    assert hits == [float(r <= k) for r in got]
    # Not vacuous: the patch moves the logits away from the clean run's (on some row: at a
    # random layer 0 a swap may change little), and on a capping family the two views differ.
    assert max(hand_kl(hand.logits[""]["logits"], hand.logits[""]["clean"])) > 1e-2
    if getattr(hand.model.config, "final_logit_softcapping", None):
        assert not torch.allclose(hand.logits[""]["logits"], hand.logits["raw_"]["logits"], atol=1e-3)
    # And the two engines agree with each other, row by row, bit for bit.
    hooks, nnterp = (points[e].results() for e in ENGINES)
    assert set(hooks) == set(nnterp) and len(hooks) == 2 * len(_metrics(""))
    for name in hooks:
        assert hooks[name].rows == nnterp[name].rows, name


@pytest.mark.parametrize("case", ["tiny-llama", "family:gemma2"])
def test_the_scored_answers_are_the_ones_the_hand_side_uses(case, hands, runs):
    hand = hands(case)
    rows = runs(case, "hooks").points[0].result("pd").rows
    pieces = [row["answers"] for row in rows]
    assert [p["a"]["column"] for p in pieces] == ["cf_answer"] * len(rows)
    assert [p["b"]["column"] for p in pieces] == ["base_answer"] * len(rows)
    assert [p["a"]["token"] for p in pieces] == hand.tok.convert_ids_to_tokens(hand.cf_answer.tolist())
    assert [p["b"]["token"] for p in pieces] == hand.tok.convert_ids_to_tokens(hand.base_answer.tolist())


# --------------------------------------------------------------------------- rows a normalized effect leaves out

@pytest.mark.parametrize("measure", ["logit_diff", "prob_diff"])
def test_rows_below_min_denominator_are_excluded_with_their_reason(measure, hands, runs):
    case = "tiny-llama"
    hand = hands(case)
    lg = hand.logits[""]
    a, b = hand.cf_answer, hand.base_answer
    values, denominators = hand_effect(lg["logits"], lg["clean"], lg["cf"], a, b, measure)
    # A threshold between two rows' |denominator|s, far from both: the rows below it are left out.
    size = sorted(abs(d) for d in denominators)
    gaps = [(size[i + 1] - size[i], i) for i in range(len(size) - 1)]
    gap, i = max(gaps)
    assert gap > 1e-4, size  # far more than the engines' and the hand side's rounding: no row crosses it
    threshold = (size[i] + size[i + 1]) / 2
    out = [abs(d) < threshold for d in denominators]
    assert 0 < sum(out) < len(out)
    extra = {"ne_cut": {"kind": "normalized_effect", "of": "logits", "base": "clean", "counterfactual": "cf",
                        "a": "cf_answer", "b": "base_answer",
                        "params": {"measure": measure, "min_denominator": threshold}}}
    results = {}
    for engine in ENGINES:
        run = runs(case, engine, extra)
        result = run.points[0].result("ne_cut")
        results[engine] = result
        assert result.eligible == tuple(not o for o in out), (engine, denominators, threshold)
        for row, left_out, want in zip(result.rows, out, values):
            if left_out:
                assert row["value"] is None and row["reason"] == "effect_denominator_near_zero", row
            else:
                assert row["reason"] == "" and row["value"] == pytest.approx(want, rel=RTOL, abs=ATOL), row
        # Counted: the aggregates are over the rows kept, and the step records which were left out.
        kept = [v for v, o in zip(values, out) if not o]
        assert len(result) == len(kept) and result.fraction_eligible() == len(kept) / len(out)
        assert result.mean() == pytest.approx(sum(kept) / len(kept), rel=RTOL, abs=ATOL)
        (step,) = [s for _, s in run.plan.walk() if "ne_cut" in getattr(s, "results", {})]
        assert step.results["excluded"]["ne_cut"] == tuple("effect_denominator_near_zero" if o else ""
                                                           for o in out)
        assert step.results["eligible"]["ne_cut"] == tuple(not o for o in out)
        assert "ne" not in step.results["excluded"]  # the default min_denominator keeps every row
    assert results["hooks"].rows == results["nnterp"].rows


# --------------------------------------------------------------------------- refusals

FIVE = document("tiny-llama")
IV = "interventions.patching"


def _edit(change) -> dict:
    doc = copy.deepcopy(FIVE)
    change(doc["interventions"]["patching"])
    return doc


def _set(*path_and_value):
    *path, value = path_and_value

    def change(iv):
        here = iv
        for p in path[:-1]:
            here = here[p]
        here[path[-1]] = value
    return change


def _drop(*path):
    def change(iv):
        here = iv
        for p in path[:-1]:
            here = here[p]
        del here[path[-1]]
    return change


# (the edit, the path refused, words of the problem)
REFUSALS = [
    pytest.param(_drop("metrics", "kl", "reference"), f"{IV}.metrics.kl.reference", "missing 'reference'",
                 id="kl_div-without-reference"),
    pytest.param(_set("metrics", "kl", "reference", "clen"), f"{IV}.metrics.kl.reference",
                 "read 'clen' is not declared", id="unknown-reference"),
    pytest.param(_set("metrics", "kl", "reference", "logits"), f"{IV}.metrics.kl.reference",
                 "it would compare the read with itself", id="reference-is-of"),
    pytest.param(_set("reads", "clean", "pos", {"span": [0, 2]}), f"{IV}.metrics.kl.reference",
                 "2 positions wide", id="reference-two-positions-wide"),
    pytest.param(_set("reads", "clean", "site", "target"), f"{IV}.metrics.kl.reference",
                 "not at logits", id="reference-not-logits"),
    pytest.param(_drop("metrics", "top1_cf", "params"), f"{IV}.metrics.top1_cf.params", "params.k: Field required",
                 id="top_k-without-k"),
    pytest.param(_set("metrics", "top1_cf", "params", {"k": 0}), f"{IV}.metrics.top1_cf.params",
                 "params.k: Input should be greater than or equal to 1", id="top_k-k-0"),
    pytest.param(_set("metrics", "top1_cf", "params", {"k": 1, "kk": 2}), f"{IV}.metrics.top1_cf.params",
                 "params.kk: Extra inputs are not permitted", id="top_k-unknown-param"),
    pytest.param(_set("metrics", "ne", "params", {"measure": "ratio"}), f"{IV}.metrics.ne.params",
                 "params.measure", id="normalized_effect-unknown-measure"),
]


@pytest.mark.parametrize("change,path,problem", REFUSALS)
def test_a_document_misusing_the_kinds_is_refused_at_the_field(change, path, problem):
    doc = _edit(change)
    with pytest.raises(DocumentError) as caught:
        cm.read(doc)
    err = caught.value
    assert err.path == path, str(err)
    assert problem in err.problem, str(err)
    assert err.fix.strip(), f"no fix: {err}"


def test_a_missing_reference_is_refused_at_its_field_saying_what_to_write():
    with pytest.raises(DocumentError) as caught:
        cm.read(_edit(_drop("metrics", "kl", "reference")))
    assert caught.value.path == f"{IV}.metrics.kl.reference"
    assert "missing 'reference'" in caught.value.problem and '{"reference": <read>}' in caught.value.fix


def test_the_unedited_document_is_accepted():
    # The refusals above are the edits', not the document's.
    assert cm.read(FIVE).points


@pytest.mark.parametrize("change,path,problem", [REFUSALS[2], REFUSALS[6]])
def test_the_cli_prints_the_refusal_without_a_traceback(tmp_path, change, path, problem):
    doc_path = tmp_path / "bad.causalab.json"
    doc_path.write_text(json.dumps(_edit(change)))
    done = subprocess.run([*cli_command(), "validate", str(doc_path)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert done.stderr.startswith(f"error: DocumentError: {path}: "), done.stderr
    assert problem in done.stderr

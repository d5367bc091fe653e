"""Inside attention on the hooks engine (engine/attention.py), against the family's own eager code.

For every family of ``tests/families.py`` (every one has the attention seam, ``Layout.attention_seam``:
transformers' attention-function registry, or GPT-Neo's and BLOOM's routine,
``engine/attention_families.py``), a tiny random checkpoint is built once and loaded twice:

* by the hooks engine, which serves it with the seam; its reads of ``attention_query`` / ``_key`` /
  ``_value`` / ``_scores`` / ``_probs`` at layer 1 (a heads selector; the last token, every token,
  the last three) on a left-padded batch;
* by transformers alone with ``attn_implementation="eager"``: the pattern from
  ``output_attentions=True``; q, k, v as the arguments layer 1's attention module hands its
  family's own ``eager_attention_forward`` (wrapped here) — GPT-Neo: the arguments of its own
  ``_attn``; BLOOM: what its own ``_reshape`` returns — and the scores as the tensor the family's
  code hands ``torch.nn.functional.softmax`` (patched for the duration of that one call). Same
  ids, mask and position ids (``reference.padded``, checked equal to the engine's forward).

Writes (a pattern clamped or swapped from the counterfactual run, scores clamped, a query or value
head zeroed) are held to the same eager forward with the same change made by hand inside the
family's code: the softmax's input or output replaced, or its q/v. Both engines read the same
interiors where nnterp reaches them; serving the seam moves nothing else beyond float32 rounding
(GPT-Neo and BLOOM: nothing at all); a remote engine is refused what only this process's seam
serves, and a document's own ``model.modules`` every interior on hooks; run.json says which
attention implementation ran. All to 1e-5.
"""
from __future__ import annotations

import importlib
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import pytest
import torch

import families
from paths import DATA, MODELS, REPO
from reference import padded
from test_families import REFERENCE
import causalab_mini as cm
from causalab_mini.components import INTERIORS
from causalab_mini.engine import attention, attention_families
from causalab_mini.errors import CompileError
from causalab_mini.layouts import FAMILIES as LAYOUTS, ROUTINES
from causalab_mini.model.facts import ModelFacts
from causalab_mini.plan import compile as compiler

pytestmark = pytest.mark.families

ATOL = 1e-5
LAYER = 1  # read here
WRITE_LAYER = 0  # written here: layer 1 and the logits feel it
QKV = ("attention_query", "attention_key", "attention_value")
PATTERNS = ("attention_scores", "attention_probs")
# Heads read: q head 1; k/v head 1 (0 where there is one kv head); two heads of each pattern.
SCORE_HEADS, PROB_HEADS = [1, 3], [0, 2]
# Rows of different lengths (8, 9, 16, 8 tokens), each counterfactual as long as its base prompt,
# so the batch is left-padded and a pattern can be swapped key for key.
PAIRS = [("If today is Sunday, tomorrow is", "If today is Monday, tomorrow is"),
         ("If today is Thursday, tomorrow is", "If today is Wednesday, tomorrow is"),
         ("Q: What day is one days after Monday?\nA:", "Q: What day is three days after Monday?\nA:"),
         ("If today is Friday, tomorrow is", "If today is Tuesday, tomorrow is")]
BASE = [a for a, _ in PAIRS]
CF = [b for _, b in PAIRS]


def _model_type(family: str) -> str:
    return families._config(family).model_type


def _routine(family: str):
    """The seam's routine for the family (``"gpt_neo"``, ``"bloom"``), or None: the registry's function."""
    return LAYOUTS[_model_type(family)].attention_routine


SEAM = tuple(f for f in families.FAMILIES if LAYOUTS[_model_type(f)].attention_call)
assert SEAM == tuple(families.FAMILIES), set(families.FAMILIES) - set(SEAM)
ROUTINE = tuple(f for f in SEAM if _routine(f))
assert set(ROUTINE) == {"gpt_neo", "bloom", "bloom_slow_but_exact"}, ROUTINE
assert set(ROUTINES) == set(attention_families.ROUTINES)  # the layout's names are the routines there


# --- documents --------------------------------------------------------------------------------

def _doc(family: str, sites: dict, interventions: dict, steps: dict) -> dict:
    return {"header": {"description": "written by tests/test_attention_seam.py"},
            "model": {"key": family, "dtype": "fp32"},
            "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
            "sites": sites, "interventions": interventions, "steps": steps}


def _observe(iv: str, outputs: dict, both: bool = False) -> dict:
    rows = {"base": "pairs/train", **({"counterfactual": "pairs/train"} if both else {})}
    return {"kind": "observe", "interventions": iv, "rows": rows, "outputs": outputs}


def _kv_head(n_kv: int) -> int:
    return 1 if n_kv > 1 else 0


def interiors_doc(family: str, n_kv: int, components=QKV + PATTERNS) -> dict:
    """Every interior at layer 1: at the last token; q at every token; each pattern at the last three."""
    heads = {"attention_query": [1], "attention_key": [_kv_head(n_kv)], "attention_value": [_kv_head(n_kv)],
             "attention_scores": SCORE_HEADS, "attention_probs": PROB_HEADS}
    sites = {c: {"component": c, "layers": [LAYER], "heads": heads[c]} for c in components}
    reads = {c: {"site": c, "pos": -1, "input": "base"} for c in components}
    if "attention_query" in components:
        reads["q_all"] = {"site": "attention_query", "pos": {"all": True}, "input": "base"}
    for c in PATTERNS:
        if c in components:
            reads[f"{c}_last3"] = {"site": c, "pos": {"last": 3}, "input": "base"}
    return _doc(family, sites, {"r": {"reads": reads}}, {"s": _observe("r", {f"out_{n}": n for n in reads})})


def plain_doc(family: str) -> dict:
    """No tap inside attention: the logits and a residual read at every token."""
    sites = {"logits": {"component": "logits"}, "resid": {"component": "block_output", "layers": [LAYER]}}
    reads = {"logits": {"site": "logits", "pos": {"all": True}, "input": "base"},
             "resid": {"site": "resid", "pos": {"all": True}, "input": "base"}}
    return _doc(family, sites, {"r": {"reads": reads}}, {"s": _observe("r", {f"out_{n}": n for n in reads})})


def write_doc(family: str, component: str, heads: list, write: dict, operand_read: bool = False) -> dict:
    """``write`` at ``component`` (layer 0, ``heads``, the last token) into the base run; its logits."""
    sites = {"w": {"component": component, "layers": [WRITE_LAYER], "heads": heads}, "logits": {"component": "logits"}}
    reads = {"logits": {"site": "logits", "pos": -1, "model": "patched", "input": "base"}}
    if operand_read:
        reads["cf"] = {"site": "w", "pos": -1, "model": "original", "input": "counterfactual"}
    iv = {"reads": reads, "writes": {"w": {"site": "w", "pos": -1, **write}},
          "models": {"patched": {"input": "base", "writes": ["w"]}}}
    return _doc(family, sites, {"w": iv}, {"s": _observe("w", {"out_logits": "logits"}, both=operand_read)})


def results(run) -> dict:
    """{read: value} of the one step's outputs (each output is its read, named out_<read>)."""
    return {name.removeprefix("out_"): value for name, value in run.plan.steps["s"].results.items()}


# --- the independent side: the family's own eager attention, wrapped ---------------------------

class Edit:
    """A change made by hand inside one attention call: to its query or value argument, to the
    softmax's input (the scores) or to its output (the pattern). Each a function of a clone."""

    def __init__(self, query=None, value=None, scores=None, probs=None):
        self.query, self.value, self.scores, self.probs = query, value, scores, probs


def _edit_qkv(store, edit: Edit, query, key, value):
    """q and v as the edit changes them (clones); all three kept in ``store`` (None: not watched)."""
    if edit.query is not None:
        query = edit.query(query.clone())
    if edit.value is not None:
        value = edit.value(value.clone())
    if store is not None:
        store.update(query=query.detach().clone(), key=key.detach().clone(), value=value.detach().clone(),
                     softmaxes=0)
    return query, key, value


@contextmanager
def _softmax_edited(store, edit: Edit):
    """``torch.nn.functional.softmax`` patched for one attention call: its input kept as the scores,
    the edit made to its input and output. The families call it by attribute (``nn.functional.softmax``,
    ``F.softmax``), so the patch reaches them."""
    softmax = torch.nn.functional.softmax

    def patched(x, *a, **k):
        if store is not None:
            store["scores"] = x.detach().clone()
            store["softmaxes"] += 1
        if edit.scores is not None:
            x = edit.scores(x.clone())
        out = softmax(x, *a, **k)
        if edit.probs is not None:
            out = edit.probs(out.clone())
        return out

    torch.nn.functional.softmax = patched
    try:
        yield
    finally:
        torch.nn.functional.softmax = softmax


@contextmanager
def eager_wrapped(attn_module, watch: dict, edits: dict, routine=None):
    """The family's own eager attention, wrapped: for an attention module in ``watch``, its
    (query, key, value) and its softmax's input and output are kept there; for one in ``edits``,
    the change is made. ``routine`` None: the family's ``eager_attention_forward`` (every module of
    the family goes through it); ``"gpt_neo"``: each module's own ``_attn`` (q, k, v its arguments);
    ``"bloom"``: each module's own forward (q, k, v what its ``_reshape`` returns; no cache is used)."""
    if routine is None:
        module = importlib.import_module(type(attn_module).__module__)
        original = module.eager_attention_forward

        def eager(attn, query, key, value, attention_mask, *args, **kwargs):
            store, edit = watch.get(attn), edits.get(attn, Edit())
            query, key, value = _edit_qkv(store, edit, query, key, value)
            with _softmax_edited(store, edit):
                return original(attn, query, key, value, attention_mask, *args, **kwargs)

        module.eager_attention_forward = eager
        try:
            yield
        finally:
            module.eager_attention_forward = original
        return
    wrapped = {**dict.fromkeys(watch), **dict.fromkeys(edits)}
    for attn in wrapped:  # instance attributes over the family's own methods, removed after
        store, edit, cls = watch.get(attn), edits.get(attn, Edit()), type(attn)
        if routine == "gpt_neo":
            def _attn(query, key, value, attention_mask=None, attn=attn, store=store, edit=edit, cls=cls):
                query, key, value = _edit_qkv(store, edit, query, key, value)
                with _softmax_edited(store, edit):
                    return cls._attn(attn, query, key, value, attention_mask)
            attn._attn = _attn
        else:
            assert routine == "bloom", routine

            def _reshape(fused, attn=attn, store=store, edit=edit, cls=cls):
                return _edit_qkv(store, edit, *cls._reshape(attn, fused))

            def forward(*args, attn=attn, store=store, edit=edit, cls=cls, **kwargs):
                assert kwargs.get("layer_past") is None, "q, k, v are _reshape's only without a cache"
                with _softmax_edited(store, edit):
                    return cls.forward(attn, *args, **kwargs)
            attn._reshape, attn.forward = _reshape, forward
    try:
        yield
    finally:
        for attn in wrapped:
            for name in ("_attn", "_reshape", "forward"):
                attn.__dict__.pop(name, None)


class Case:
    """One family: its checkpoint, the hooks engine (loaded as a document without interiors loads
    it, then served with the seam), and the raw model with eager attention."""

    def __init__(self, root: Path, data: Path, family: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.family, self.root, self.data = family, root, data
        self.folder = families.build(family, root / family)
        self.tok = AutoTokenizer.from_pretrained(self.folder)
        ref = REFERENCE[family]
        self.attention_path = f"{ref.layers}.{{}}.{ref.attention_z.rsplit('.', 1)[0]}"
        # The engine loaded normally; the same document run before and after the seam is served.
        plain = self.read(plain_doc(family), "plain")
        self.engine = cm.load(plain, engine="hooks", models=[root])
        self.default = self.engine.model.config._attn_implementation
        assert not attention.served(self.engine.model)
        self.plain_before = results(self.run(plain))
        attention.serve(self.engine.model)
        assert attention.served(self.engine.model)
        self.plain_after = results(self.run(plain))
        self.n_kv = self.engine.heads("attention_key")
        self.hf = AutoModelForCausalLM.from_pretrained(self.folder, attn_implementation="eager",
                                                       dtype=torch.float32).eval()
        self.base, self.cf = padded(self.tok, BASE), padded(self.tok, CF)
        self._interiors: Optional[tuple] = None

    def read(self, raw: dict, name: str):
        return cm.read(raw, path=self.root / f"{self.family}.{name}.causalab.json")

    def run(self, doc, **kw):
        return cm.run(doc, loaded=self.engine, models=[self.root], data=[self.data], **kw)

    def attn(self, layer: int):
        return self.hf.get_submodule(self.attention_path.format(layer))

    def forward(self, batch, edits: Optional[dict] = None):
        """The eager model on ``batch``: (layer 1's captured call, attentions per layer, logits)."""
        ids, mask, positions = batch
        store: dict = {}
        edits = {self.attn(layer): e for layer, e in (edits or {}).items()}
        with eager_wrapped(self.attn(LAYER), {self.attn(LAYER): store}, edits, _routine(self.family)), \
                torch.no_grad():
            out = self.hf(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                          output_attentions=True)
        assert store.get("softmaxes") == 1, f"{self.family}: layer {LAYER}'s eager attention was not called once"
        assert len(out.attentions) == families.LAYERS, f"{self.family}: {len(out.attentions)} attentions"
        return store, out.attentions, out.logits

    def interiors(self):
        """(the engine's reads of every interior, its compiled forward)."""
        if self._interiors is None:
            run = self.run(self.read(interiors_doc(self.family, self.n_kv), "interiors"))
            self._interiors = (results(run), run.plan.steps["s"].forwards[0])
        return self._interiors


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("seam_data")
    (root / "pairs").mkdir()
    (root / "pairs" / "train.jsonl").write_text(
        "".join(json.dumps({"input": a, "counterfactual_inputs": [b]}) + "\n" for a, b in PAIRS))
    return root


@pytest.fixture(scope="module")
def cases(family_root, data_root):
    made: dict = {}

    def case(family: str) -> Case:
        if family not in made:
            made[family] = Case(family_root, data_root, family)
        return made[family]

    yield case
    made.clear()


def close(got, want, what: str, atol: float = ATOL, exact: bool = False):
    """Equal to ``atol``; ``exact``: bit for bit (a family routine is its family's own code, op for op)."""
    torch.testing.assert_close(got.detach().float(), want.detach().float(), rtol=0, atol=atol,
                               msg=lambda m: f"{what}: {m}")
    if exact:
        assert torch.equal(got, want), f"{what}: max |Δ| {(got - want).abs().nan_to_num(0).max().item():.2e}"


def content(tok, mask) -> torch.Tensor:
    """The positions ``{"all": true}`` reads: each row's real tokens after the tokenizer's BOS."""
    prefix = len(tok("a")["input_ids"]) - len(tok("a", add_special_tokens=False)["input_ids"])
    keep = mask.bool().clone()
    for row in range(len(mask)):
        first = int(mask[row].argmax())
        keep[row, first:first + prefix] = False
    return keep


# --- 1. reads equal the family's eager attention -------------------------------------------------

@pytest.mark.parametrize("family", SEAM)
def test_interior_reads_equal_the_familys_eager_attention(cases, family):
    """Measured: bit-equal on every family. What the family hands its attention function is the
    truth here: OPT's q arrives pre-multiplied by head_dim ** -0.5 (its scaling is 1); Falcon-ALiBi's
    bias arrives inside the mask, so it is in the scores at every key, as BLOOM's alibi is in its own;
    GPT-Neo's scores are unscaled, float32, and −inf at a key both its window buffer and the padding
    mask mask."""
    case = cases(family)
    got, forward = case.interiors()
    ids, mask, positions = case.base
    assert [list(r) for r in forward.ids] == ids.tolist() and [list(m) for m in forward.mask] == mask.tolist()
    assert len(set(mask.sum(-1).tolist())) > 1, "the batch must be padded"
    store, attentions, _ = case.forward(case.base)
    rows, keys = ids.shape
    kv = _kv_head(case.n_kv)
    assert store["key"].shape[1] == case.n_kv  # k and v as handed over: grouped-query heads not repeated
    want = {"attention_query": store["query"][:, 1, -1], "attention_key": store["key"][:, kv, -1],
            "attention_value": store["value"][:, kv, -1],
            "attention_scores": store["scores"][:, SCORE_HEADS, -1].reshape(rows, -1),
            "attention_probs": attentions[LAYER][:, PROB_HEADS, -1].reshape(rows, -1)}
    exact = _routine(family) is not None
    for name, value in want.items():
        assert got[name].shape == (rows, 1, value.shape[-1]), (name, got[name].shape)
        close(got[name][:, 0], value, f"{family} {name}", exact=exact)
    # the probs are the family's own softmax output, and q/k/v tell heads and each other apart
    close(store["scores"].softmax(-1)[:, PROB_HEADS, -1].reshape(rows, -1), want["attention_probs"], "softmax")
    assert (store["query"][:, 1, -1] - store["query"][:, 0, -1]).abs().max() > 10 * ATOL
    assert (want["attention_key"] - want["attention_value"]).abs().max() > 10 * ATOL
    # a padded key is masked in the scores (the dtype's lowest number, ALiBi's bias on it or not)
    # and holds no weight in the pattern
    scores = got["attention_scores"][:, 0].view(rows, len(SCORE_HEADS), keys)
    probs = got["attention_probs"][:, 0].view(rows, len(PROB_HEADS), keys)
    padding = (mask == 0)[:, None, :]
    assert (scores[padding.expand_as(scores)] < -1e30).all()
    assert (probs[padding.expand_as(probs)] == 0).all()
    # every token (ragged, rows in order) and the last three
    keep = content(case.tok, mask)
    close(got["q_all"], store["query"][:, 1][keep], f"{family} q, every token", exact=exact)
    for name, full in (("attention_scores", store["scores"][:, SCORE_HEADS]),
                       ("attention_probs", attentions[LAYER][:, PROB_HEADS])):
        last3 = full[:, :, -3:].transpose(1, 2).reshape(rows, 3, -1)  # (rows, queries, heads·keys)
        close(got[f"{name}_last3"], last3, f"{family} {name}, last three", exact=exact)


# --- 2. writes equal the same change made by hand ------------------------------------------------

def _clamp_probs(head):
    def edit(p):
        p[:, head, -1] = p[:, head, -1].clamp(max=0.0)
        return p
    return edit


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", *ROUTINE])
def test_pattern_writes_equal_eager_with_the_same_change(cases, family):
    case = cases(family)
    _, _, clean = case.forward(case.base)
    # a clamp: the head's last query attends nowhere
    got = results(case.run(case.read(write_doc(family, "attention_probs", [2],
                                               {"mechanism": "clamp", "params": {"max": 0.0}}), "clamp")))
    _, _, want = case.forward(case.base, {WRITE_LAYER: Edit(probs=_clamp_probs(2))})
    assert (want[:, -1] - clean[:, -1]).abs().max() > 1e-3, "the write must be felt"
    exact = _routine(family) is not None
    close(got["logits"][:, 0], want[:, -1], f"{family} clamped pattern", exact=exact)
    # a swap: heads 1 and 3 at the last query attend as they did on the counterfactual prompt
    assert torch.equal(case.base[1], case.cf[1]), "the pairs must line up key for key"
    _, cf_attentions, _ = case.forward(case.cf)

    def swap(p):
        p[:, [1, 3], -1] = cf_attentions[WRITE_LAYER][:, [1, 3], -1]
        return p
    got = results(case.run(case.read(write_doc(family, "attention_probs", [1, 3],
                                               {"mechanism": "swap", "operand": "cf"}, operand_read=True), "swap")))
    _, _, want = case.forward(case.base, {WRITE_LAYER: Edit(probs=swap)})
    assert (want[:, -1] - clean[:, -1]).abs().max() > 1e-3, "the write must be felt"
    close(got["logits"][:, 0], want[:, -1], f"{family} swapped pattern", exact=exact)


@pytest.mark.parametrize("family", ["llama", "gpt_neo", "bloom"])
def test_scores_query_and_value_writes_equal_eager_with_the_same_change(cases, family):
    case = cases(family)
    _, _, clean = case.forward(case.base)

    def clamp_scores(s):
        s[:, 1, -1] = s[:, 1, -1].clamp(max=0.0)
        return s

    def zero_query(q):
        q[:, 2, -1] = 0.0
        return q

    def zero_value(v):
        v[:, 1, -1] = 0.0
        return v

    cases_ = {"scores": ("attention_scores", [1], {"mechanism": "clamp", "params": {"max": 0.0}},
                         Edit(scores=clamp_scores)),
              "query": ("attention_query", [2], {"mechanism": "swap", "operand": 0.0}, Edit(query=zero_query)),
              "value": ("attention_value", [1], {"mechanism": "swap", "operand": 0.0}, Edit(value=zero_value))}
    for name, (component, heads, write, edit) in cases_.items():
        got = results(case.run(case.read(write_doc(family, component, heads, write), name)))
        _, _, want = case.forward(case.base, {WRITE_LAYER: edit})
        assert (want[:, -1] - clean[:, -1]).abs().max() > 1e-3, f"{name}: the write must be felt"
        close(got["logits"][:, 0], want[:, -1], f"{family} {name} write", exact=_routine(family) is not None)


# --- 3. both engines read the same ----------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2", *ROUTINE])
def test_both_engines_read_the_same_interiors(cases, family):
    """Every interior the nnterp engine reaches on the family, read by both engines: bit-equal.
    (Every one of them, on every family in this process: q, k, v through nnsight where the family
    calls the registry, through the seam's routine on GPT-Neo and BLOOM; the scores, and the pattern,
    through the seam.)"""
    pytest.importorskip("nnterp")
    case = cases(family)
    reached = tuple(c for c in QKV + PATTERNS if case.engine._facts.refusal(c, "nnterp") is None)
    assert reached == QKV + PATTERNS, reached
    doc = case.read(interiors_doc(family, case.n_kv, reached), "both")
    hooks = results(case.run(doc))
    nnterp = results(cm.run(doc, engine="nnterp", models=[case.root], data=[case.data]))
    assert set(hooks) == set(nnterp) and set(reached) <= set(hooks)
    for name in hooks:
        assert torch.equal(hooks[name], nnterp[name]), \
            f"{family} {name}: max |Δ| {(hooks[name] - nnterp[name]).abs().max().item():.2e}"


# --- 4. the seam changes nothing else ------------------------------------------------------------

@pytest.mark.parametrize("family", SEAM)
def test_serving_the_seam_moves_other_components_only_by_rounding(cases, family):
    """The logits and layer 1's residual at every token, before and after ``attention.serve``.
    Measured (transformers 5.2x, fp32): 4e-7 to 3.5e-6, sdpa's rounding against eager's; 0 on
    Gemma-2, whose default is eager, and on GPT-Neo and BLOOM, whose routine is their own eager code."""
    case = cases(family)
    before, after = case.plain_before, case.plain_after
    assert set(before) == {"logits", "resid"}
    for name in before:
        delta = (before[name] - after[name]).abs().max().item()
        assert delta <= ATOL, f"{family} {name}: max |Δ| {delta:.2e} after serving the seam"
        if _routine(family):  # the family's own code, op for op, with the listener idle
            assert delta == 0, f"{family} {name}: max |Δ| {delta:.2e} after installing its routine"


# --- 5. refusals, at compile time ----------------------------------------------------------------

def _one_read(family: str, component: str, modules=None) -> dict:
    raw = _doc(family, {"p": {"component": component, "layers": [0], "heads": [0]}},
               {"r": {"reads": {"x": {"site": "p", "pos": -1, "input": "base"}}}}, {"s": _observe("r", {})})
    if modules:
        raw["model"]["modules"] = modules
    return raw


def _refused(root: Path, data: Path, family: str, component: str, engine: str, modules=None) -> str:
    with pytest.raises(CompileError) as caught:
        compiler.compile_plan(_one_read(family, component, modules), document=root / "refused.causalab.json",
                              models=[root], data=[data], engine=engine)
    text = str(caught.value)
    assert text.startswith("sites.p.component:"), text
    return text


def test_interiors_of_a_documents_own_modules_are_refused(family_root, data_root):
    """A layout the document names (``model.modules``) has no seam: its attention's code is not known."""
    families.build("llama", family_root / "llama")
    modules = {"layers": "model.layers", "ln_final": "model.norm", "attention": "self_attn", "mlp": "mlp",
               "attention_projection": "self_attn.o_proj", "mlp_projection": "mlp.down_proj"}
    assert INTERIORS == set(QKV + PATTERNS)
    for component in sorted(INTERIORS):
        for engine in ("hooks", "nnterp"):
            text = _refused(family_root, data_root, "llama", component, engine, modules=modules)
            assert component in text and "model.modules" in text and "attention_z" in text, text


def test_a_loaded_engine_refuses_them_before_serving(family_root, data_root):
    """Compiled against a gpt_neo engine loaded for a document without interiors: refused, saying how
    to load it, and the model is left as it loaded (its routine not installed)."""
    from causalab_mini.errors import Unsupported

    families.build("gpt_neo", family_root / "gpt_neo")
    engine = cm.load(cm.read(plain_doc("gpt_neo"), path=family_root / "neo.causalab.json"), engine="hooks",
                     models=[family_root])
    with pytest.raises(Unsupported, match="loaded without it") as caught:
        compiler.compile_plan(_one_read("gpt_neo", "attention_probs"), document=family_root / "r.causalab.json",
                              models=[family_root], data=[data_root], facts=engine)
    assert caught.value.fix == attention.LOAD_FIX
    assert not attention.served(engine.model)
    assert not any(isinstance(m, attention_families.SeamedGPTNeoSelfAttention) for m in engine.model.modules())


def test_a_routine_runs_under_accelerates_hook_and_refuses_another_patch(family_root):
    """BLOOM's routine replaces the forward: accelerate's device-map hook (an instance forward calling
    the one it kept) is pointed at it; any other instance forward is refused before anything changes."""
    from accelerate.hooks import ModelHook, add_hook_to_module
    from transformers import AutoModelForCausalLM

    folder = families.build("bloom", family_root / "bloom")
    hooked, patched = (AutoModelForCausalLM.from_pretrained(folder).eval() for _ in range(2))
    for layer in hooked.transformer.h:
        add_hook_to_module(layer.self_attention, ModelHook())
    attention.serve(hooked)
    heard: list = []
    with attention.listening({hooked.transformer.h[1].self_attention: lambda p, x: heard.append(p) or x}), \
            torch.no_grad():
        hooked(input_ids=torch.tensor([[3, 4, 5]]))
    assert heard == list(QKV + PATTERNS)
    patched.transformer.h[0].self_attention.forward = lambda *a, **k: None
    with pytest.raises(cm.EngineError, match="would never run"):
        attention.serve(patched)
    assert not attention.served(patched) and type(patched.transformer.h[1].self_attention).__name__ == "BloomAttention"


@pytest.mark.parametrize("family", ["gpt_neo", "bloom"])
def test_what_only_this_processs_routine_serves_is_refused_on_ndif(family_root, data_root, family):
    """A remote server runs the family's own attention: q, k, v (no call nnsight could trace there)
    and the scores are refused by name; the pattern only where nnterp's own route fails (GPT-Neo)."""
    families.build(family, family_root / family)
    for component in QKV + ("attention_scores",):
        text = _refused(family_root, data_root, family, component, "ndif")
        assert component in text and "remote server" in text and "instead" in text, text
    facts = ModelFacts.from_config(families._config(family), None, key=family, revision=None)
    assert (facts.refusal("attention_probs", "ndif") is None) == (family == "bloom")


def test_attention_scores_on_ndif_are_refused(family_root, data_root):
    """A remote server runs its own attention function: no listener of this process is in it."""
    families.build("llama", family_root / "llama")
    text = _refused(family_root, data_root, "llama", "attention_scores", "ndif")
    assert "attention_scores" in text and "remote server" in text, text


# --- 6. run.json names the attention that ran ----------------------------------------------------

def test_run_json_records_the_attention_implementation(cases, tmp_path):
    case = cases("llama")
    root, data = case.root, case.data
    plain = case.read(plain_doc("llama"), "plain")
    tapped = case.read(interiors_doc("llama", case.n_kv, ("attention_scores",)), "tapped")

    def recorded(out: Path) -> str:
        return json.loads((out / "run.json").read_text())["attention"]

    cm.run(plain, engine="hooks", models=[root], data=[data], out=tmp_path / "plain")
    assert recorded(tmp_path / "plain") == case.default == "sdpa"
    cm.run(tapped, engine="hooks", models=[root], data=[data], out=tmp_path / "tapped")  # served at load
    assert recorded(tmp_path / "tapped") == "causalab"
    # A model loaded for a document without interiors is never switched under its other runs: a
    # plan that taps inside attention is refused at compile time, saying how to load it.
    loaded = cm.load(plain, engine="hooks", models=[root])
    cm.run(plain, loaded=loaded, models=[root], data=[data], out=tmp_path / "loaded_plain")
    assert recorded(tmp_path / "loaded_plain") == "sdpa"
    with pytest.raises(cm.Unsupported, match="loaded without it") as caught:
        cm.run(tapped, loaded=loaded, models=[root], data=[data], out=tmp_path / "loaded_tapped")
    assert "cm.load" in caught.value.fix or "causalab_mini.load(doc)" in caught.value.fix
    assert not (tmp_path / "loaded_tapped").exists() and not attention.served(loaded.model)


@pytest.mark.parametrize("family", ["gpt_neo", "bloom"])
@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
def test_run_json_records_a_routine_familys_seam(cases, tmp_path, family, engine):
    """A family the registry does not reach runs eager until a document taps inside its attention;
    then its routine, which its config names as the seam ("causalab"), as the registry's families do."""
    if engine == "nnterp":
        pytest.importorskip("nnterp")
    case = cases(family)
    plain = case.read(plain_doc(family), "plain")
    tapped = case.read(interiors_doc(family, case.n_kv, ("attention_query",)), "tapped")
    for doc, name, want in ((plain, "plain", "eager"), (tapped, "tapped", "causalab")):
        cm.run(doc, engine=engine, models=[case.root], data=[case.data], out=tmp_path / name)
        assert json.loads((tmp_path / name / "run.json").read_text())["attention"] == want, name


@pytest.mark.parametrize("component", ["attention_key", "attention_value"])
def test_a_key_or_value_write_in_a_decoding_pass_is_refused(tmp_path, component):
    # The model caches keys and values before its attention function sees them: a write there would
    # reach the prompt's own attention and not one generated token's. Refused at compile time.
    raw = json.loads((REPO / "documents" / "v2" / "patching.causalab.json").read_text())
    raw["sites"]["target"] = {"component": component, "layers": [0], "heads": [0]}
    patching = raw["interventions"]["patching"]
    patching["writes"]["patch"] = {"site": "target", "pos": -1, "mechanism": "swap", "operand": 0.0}
    patching["reads"].pop("v_cf")
    patching["decode"] = 2
    for engine in ("hooks", "nnterp"):
        with pytest.raises(CompileError, match="caches keys and values") as caught:
            cm.compile(raw, engine=engine, models=[MODELS], data=[DATA])
        assert caught.value.path == "interventions.patching.writes.patch.site" and caught.value.fix


def test_a_session_sent_elsewhere_is_refused_what_the_seam_serves(tmp_path):
    # The seam's listeners run in this process's model call; nnsight's local simulation of a remote
    # run (a session executed after the walk) would run the model without them: refused by name.
    from causalab_mini.errors import Unsupported

    raw = json.loads((REPO / "documents" / "v2" / "patching.causalab.json").read_text())
    raw["sites"]["scores"] = {"component": "attention_scores", "layers": [0], "heads": [1]}
    raw["interventions"]["patching"]["reads"]["s"] = {"site": "scores", "pos": -1, "input": "base"}
    engine = cm.load(raw, engine="nnterp", models=[MODELS])
    plan = cm.compile(raw, loaded=engine, data=[DATA])
    with pytest.raises(Unsupported, match="a session sent elsewhere does not run") as caught:
        engine.execute(plan, remote="local")
    assert caught.value.path == "attention_scores[0].heads[1]" and caught.value.fix

"""The family matrix's interiors: the pattern, the scores and q/k/v on the nnterp engine, every family.

For each family in ``tests/families.py`` one document reads, at layer 1 on the base
prompts (a left-padded batch), the attention pattern and the scores of heads 0 and 1 and the
query, key and value of head 0 at the last token, and runs it on the nnterp engine (the hooks
engine's reads are held to the family's code in ``test_attention_seam.py``). Each value is held
to 1e-5 against a computation written here, on the raw Hugging Face model, one unpadded row at
a time:

* attention_probs: the model loaded with ``attn_implementation="eager"`` and run with
  ``output_attentions=True``; its last query's weights for those heads are the engine's
  over that row's real keys (the last ones of the left-padded batch), and the engine's
  weights at the row's padded keys are 0;
* q / k / v and the scores: for a family whose attention calls transformers' registry, the model
  loaded with an attention function registered here through transformers' own
  ``AttentionInterface``, which keeps the (query, key, value) layer 1's attention hands it —
  (batch, heads, seq, head_dim), after projection, head reshape and rotary — and the input of
  the softmax of the family's own eager attention, which it then runs. GPT-Neo and BLOOM call no
  registered function (the engine reaches them through the seam's routine,
  ``engine/attention_families.py``): their own eager code is wrapped instead
  (``test_attention_seam.eager_wrapped``: GPT-Neo's ``_attn`` arguments, BLOOM's ``_reshape``
  results, the softmax's input).

Every family of the matrix reaches every interior on this engine (``Layout.attention_seam``);
a layout the seam does not reach refuses them at compile time (``test_attention_seam.py``).

Writes are not run here: a swap of attention_probs must line up key for key, and the
weekday pairs do not pad to the same real lengths row by row (``test_attention_probs.py``
covers writes on two families).
"""
from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest
import torch

import families
from test_families import FAMILY_NAMES, REFERENCE, _folder, _observe, document
import causalab_mini as cm
from causalab_mini.layouts import FAMILIES as LAYOUTS
from paths import DATA
from test_attention_seam import eager_wrapped

pytestmark = pytest.mark.families

ATOL = 1e-5
LAYER = 1
PROBS_HEADS = [0, 1]
QKV_HEAD = 0
QKV = ("attention_query", "attention_key", "attention_value")
CAPTURE = "causalab_capture"  # the attention implementation registered below


def _model_type(family: str) -> str:
    return families._config(family).model_type


def _layout(family: str):
    return LAYOUTS[_model_type(family)]


# The nnterp engine reaches the pattern through nnterp's own route, or else through the attention
# seam (engine/attention.py: GPT-2, GPT-J and GPT-Neo, whose nnterp route fails); q, k and v as the
# arguments of the registry's call, or through the seam's routine (GPT-Neo, BLOOM); the scores
# through the seam. Every family of the matrix has it.
PATTERN = tuple(f for f in FAMILY_NAMES if _layout(f).attention_pattern or _layout(f).attention_call)
CALL = tuple(f for f in FAMILY_NAMES if _layout(f).attention_call)
ROUTINE = tuple(f for f in CALL if _layout(f).attention_routine)
assert PATTERN == CALL == tuple(FAMILY_NAMES), set(FAMILY_NAMES) - set(CALL)


# --- the document: every read in one step -----------------------------------------------------

def interiors(family: str, components: tuple[str, ...]) -> dict:
    """The family's document (the matrix's header, roles and model) reading ``components`` at layer 1,
    the last token of the base prompts, in one step; each site and output is named by its component."""
    raw = document(family, ())
    heads = {c: PROBS_HEADS if c in ("attention_probs", "attention_scores") else [QKV_HEAD] for c in components}
    sites = {c: {"component": c, "layers": [LAYER], "heads": heads[c]} for c in components}
    reads = {c: {"site": c, "pos": -1, "input": "base"} for c in components}
    step = _observe("interiors")
    step["outputs"] = {f"interiors.{c}": c for c in components}
    raw.update(sites=sites, interventions={"interiors": {"reads": reads}}, steps={"interiors": step})
    return raw


def reachable(family: str) -> tuple[str, ...]:
    """The interiors the family's layout lets the nnterp engine reach."""
    layout = _layout(family)
    return ((("attention_probs",) if family in PATTERN else ())
            + ((*QKV, "attention_scores") if layout.attention_call else ()))


def run_engine(root: Path, family: str) -> dict[str, torch.Tensor]:
    """The family's reachable interiors on the nnterp engine: {component: (rows, width) at the last token}."""
    raw = interiors(family, reachable(family))
    path = root / f"{family}.interiors.causalab.json"
    plan = cm.run(cm.read(raw, path=path), engine="nnterp", models=[root], data=[DATA]).plan
    return {name.split(".", 1)[1]: value[:, 0] for step in plan.steps.values()
            for name, value in step.results.items()}


# --- the independent side: the raw model, one unpadded row at a time ---------------------------

_CAUGHT: dict = {}  # the attention module to watch, and what its call was handed


def _capture(module, query, key, value, attention_mask, **kwargs):
    """An attention function: keeps the arguments layer 1's call is handed, and the input of the
    softmax the family's own eager function takes there (its scores), and runs that eager function."""
    eager = importlib.import_module(type(module).__module__).eager_attention_forward
    if module is not _CAUGHT.get("module"):
        return eager(module, query, key, value, attention_mask, **kwargs)
    _CAUGHT["qkv"] = (query.detach().clone(), key.detach().clone(), value.detach().clone())
    softmax = torch.nn.functional.softmax

    def keeping(x, *args, **kw):
        if x.dim() == 4 and "scores" not in _CAUGHT:
            _CAUGHT["scores"] = x.detach().clone()
        return softmax(x, *args, **kw)
    torch.nn.functional.softmax = keeping
    try:
        return eager(module, query, key, value, attention_mask, **kwargs)
    finally:
        torch.nn.functional.softmax = softmax


def _register():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(CAPTURE, _capture)
    # a custom implementation with no mask function of its own gets no mask at all: the eager one's
    AttentionMaskInterface.register(CAPTURE, eager_mask)


class Raw:
    """The family's checkpoint loaded by transformers alone, and the base prompts unpadded."""

    def __init__(self, folder: Path, family: str):
        from transformers import AutoTokenizer

        self.folder, self.family = folder, family
        tok = AutoTokenizer.from_pretrained(folder)
        rows = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines()]
        self.base = [tok(r["input"])["input_ids"] for r in rows]

    def load(self, implementation: str):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.folder, attn_implementation=implementation).eval()

    def patterns(self) -> list[torch.Tensor]:
        """Each row's last-query weights at layer 1 for PROBS_HEADS: (heads, the row's own length)."""
        model = self.load("eager")
        out = []
        for ids in self.base:
            with torch.no_grad():
                got = model(input_ids=torch.tensor([ids]), use_cache=False, output_attentions=True)
            assert len(got.attentions) == families.LAYERS, f"{self.family}: {len(got.attentions)} attentions"
            out.append(got.attentions[LAYER][0, PROBS_HEADS, -1, :])
        return out

    def qkv(self) -> dict[str, torch.Tensor]:
        """Each row's last-token q, k and v of head QKV_HEAD as layer 1's attention function is handed them
        (GPT-Neo, BLOOM: as their own attention code has them), (rows, head_dim) each; and the same of
        head 1 (q, and k/v where there are two kv heads) under ``other.*``, so a check can show the heads
        differ; and each row's scores of PROBS_HEADS at its last query."""
        routine = _layout(self.family).attention_routine
        if routine is None:
            _register()
        model = self.load(CAPTURE if routine is None else "eager")
        assert model.config.get_text_config()._attn_implementation == (CAPTURE if routine is None else "eager")
        attention = REFERENCE[self.family].attention_z.rsplit(".", 1)[0]
        _CAUGHT.clear()
        _CAUGHT["module"] = module = model.get_submodule(f"{REFERENCE[self.family].layers}.{LAYER}.{attention}")
        got: dict[str, list] = {}
        try:
            for ids in self.base:
                _CAUGHT.pop("qkv", None)
                _CAUGHT.pop("scores", None)
                if routine is None:
                    with torch.no_grad():
                        model(input_ids=torch.tensor([ids]), use_cache=False)
                else:  # the family's own code, wrapped: no registered function is called
                    store: dict = {}
                    with eager_wrapped(module, {module: store}, {}, routine), torch.no_grad():
                        model(input_ids=torch.tensor([ids]), use_cache=False)
                    if "query" in store:
                        _CAUGHT["qkv"] = (store["query"], store["key"], store["value"])
                    if store.get("softmaxes") == 1:
                        _CAUGHT["scores"] = store["scores"]
                assert "qkv" in _CAUGHT, f"{self.family}: layer {LAYER}'s attention never called the interface"
                assert "scores" in _CAUGHT, f"{self.family}: the eager function took no 4-D softmax"
                got.setdefault("attention_scores", []).append(_CAUGHT["scores"][0, PROBS_HEADS, -1, :])
                for name, x in zip(QKV, _CAUGHT["qkv"]):
                    assert x.dim() == 4 and x.shape[0] == 1 and x.shape[2] == len(ids), (name, x.shape)
                    got.setdefault(name, []).append(x[0, QKV_HEAD, -1])
                    if x.shape[1] > 1:
                        got.setdefault(f"other.{name}", []).append(x[0, 1, -1])
        finally:
            _CAUGHT.clear()
        return {name: (v if name == "attention_scores" else torch.stack(v)) for name, v in got.items()}


# --- fixtures: a checkpoint per family, the engine run once ---------------------------------------

_RUNS: dict = {}


def _runs(root: Path, family: str) -> dict:
    if family not in _RUNS:
        folder = _folder(root, family)
        # only the engine's tensors are kept (the engine is dropped): each family is loaded once
        _RUNS[family] = {"nnterp": run_engine(root, family), "raw": Raw(folder, family)}
    return _RUNS[family]


# --- attention_probs ---------------------------------------------------------------------------

@pytest.mark.parametrize("family", PATTERN)
def test_attention_probs_equal_eager_output_attentions(family_root, family):
    runs = _runs(family_root, family)
    got, want = runs["nnterp"]["attention_probs"], runs["raw"].patterns()
    rows, heads = len(want), len(PROBS_HEADS)
    keys = max(len(ids) for ids in runs["raw"].base)  # the padded batch's width
    assert got.shape == (rows, heads * keys), got.shape
    lengths = [w.shape[-1] for w in want]
    assert lengths == [len(ids) for ids in runs["raw"].base]
    assert min(lengths) < keys, "the batch must be padded for the padded keys to mean anything"
    for row, (pattern, length) in enumerate(zip(want, lengths)):
        mine = got[row].view(heads, keys)  # heads-major: head h is columns h·keys …
        torch.testing.assert_close(mine[:, keys - length:], pattern, rtol=0, atol=ATOL,
                                   msg=lambda m: f"{family} row {row}: {m}")
        assert torch.equal(mine[:, :keys - length], torch.zeros(heads, keys - length)), \
            f"{family} row {row}: weight at a padded key"
        # the check can tell the heads apart, and the pattern is a distribution over the row's keys
        assert (pattern[0] - pattern[1]).abs().max() > 10 * ATOL, f"{family} row {row}: heads 0 and 1 agree"
        torch.testing.assert_close(mine.sum(-1), torch.ones(heads), rtol=0, atol=ATOL)


# --- the scores ----------------------------------------------------------------------------------

@pytest.mark.parametrize("family", CALL)
def test_attention_scores_equal_the_eager_softmax_input(family_root, family):
    """The nnterp engine's scores (through the attention seam, engine/attention.py) against the input
    of the softmax in the family's own eager code, row by row unpadded: equal on the row's real keys,
    the padded keys masked."""
    runs = _runs(family_root, family)
    got, want = runs["nnterp"]["attention_scores"], runs["raw"].qkv()["attention_scores"]
    heads = len(PROBS_HEADS)
    keys = max(len(ids) for ids in runs["raw"].base)
    assert got.shape == (len(want), heads * keys), got.shape
    for row, scores in enumerate(want):
        length = scores.shape[-1]
        mine = got[row].view(heads, keys)
        torch.testing.assert_close(mine[:, keys - length:], scores, rtol=1e-5, atol=ATOL,
                                   msg=lambda m: f"{family} row {row}: {m}")
        # a padded key holds the mask's value: the dtype's lowest number, never a finite score
        assert (mine[:, :keys - length] <= torch.finfo(mine.dtype).min / 2).all(), f"{family} row {row}"


# --- q / k / v -----------------------------------------------------------------------------------

@pytest.mark.parametrize("family", CALL)
def test_qkv_equal_the_attention_calls_arguments(family_root, family):
    runs = _runs(family_root, family)
    got, want = runs["nnterp"], runs["raw"].qkv()
    for name in QKV:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=ATOL,
                                   msg=lambda m: f"{family} {name}: {m}")
    # the check can tell q from k from v, and head 0 from head 1
    assert (want["attention_query"] - want["attention_key"]).abs().max() > 10 * ATOL
    assert (want["attention_key"] - want["attention_value"]).abs().max() > 10 * ATOL
    for name in QKV:
        if f"other.{name}" in want:
            assert (want[name] - want[f"other.{name}"]).abs().max() > 10 * ATOL, f"{family} {name}"


@pytest.mark.parametrize("family", ROUTINE)
def test_a_routine_familys_attention_makes_no_registry_call(family_root, family):
    """Why GPT-Neo and BLOOM need a routine of the seam's own: the module that computes their pattern
    (the seam's ATTENTION port) calls no attention function — were transformers to port them to the
    registry, this fails and the routine should go."""
    from transformers import AutoModelForCausalLM

    _folder(family_root, family)
    model = AutoModelForCausalLM.from_pretrained(family_root / family)
    attention = _layout(family).ports["attention"].module
    cls = type(model.get_submodule(f"{REFERENCE[family].layers}.{LAYER}.{attention}"))
    source = inspect.getsource(cls)
    assert "softmax" in source and "attention_interface" not in source and "ALL_ATTENTION_FUNCTIONS" not in source, \
        f"{family}: {cls.__name__} dispatches through transformers' registry"


def teardown_module(module):
    _RUNS.clear()

"""One record per component (causalab_mini/components.py), and one recipe for reading a model
(causalab_mini/model/recipe.py), held to what the engines do.

The record says where a component is read (a module role and a side) and how wide it is (a
width rule over the model's sizes). Every family layout reads each component on the side its
record names; on each shipped checkpoint, and on a grouped-query one whose widths all differ
from the residual stream's, each engine reports for every component the width its record's rule
gives on sizes read here from the config by hand — and a forward reading every component it
reaches hands back a tensor exactly that wide. The pytest plugin's strategies size a site by
the same record. The compiler and both engines read a model by one recipe: the same facts, and
the same refusal for a model that is not there or ships code of its own.
"""
from __future__ import annotations

import importlib
import json
import shutil
from types import SimpleNamespace

import pytest

import families
from paths import DATA, MODELS
from causalab_mini import components
from causalab_mini.components import COMPONENTS, INPUT, INSIDE, OUTPUT, PATTERNS
from causalab_mini.document import read as front
from causalab_mini import layouts
from causalab_mini.errors import CompileError, ModelError
from causalab_mini.plan import compile as compiler

SHIPPED = ("tiny-llama", "tiny-gpt2", "tiny-gemma2")
GROUPED = "llama"  # tests/families.py's llama: 2 key/value heads of 4, an MLP 48 wide of a 32-wide residual
ENGINES = ("hooks", "nnterp")
ROLES = {components.INPUT_EMBEDDINGS, components.OUTPUT_EMBEDDINGS, components.MODEL, components.LN_FINAL,
         components.LAYER, components.ATTENTION, components.ATTENTION_PROJECTION, components.MLP,
         components.MLP_PROJECTION}
RULES = {components.RESIDUAL, components.MLP_WIDTH, components.VOCAB, components.HEADS, components.UNFIXED}


# --- the record itself: no torch ---------------------------------------------------------------

def test_every_component_has_a_place_and_a_width_rule():
    for name, c in COMPONENTS.items():
        assert c.module in ROLES and c.io in (INPUT, OUTPUT, INSIDE) and c.size in RULES, name
        assert (c.size == components.HEADS) == (c.selector == "heads" and c.size is not components.UNFIXED), name
    assert components.INTERIORS == {"attention_query", "attention_key", "attention_value", "attention_scores",
                                    "attention_probs"}
    assert {n for n, c in COMPONENTS.items() if not c.hooks} == components.INTERIORS
    assert components.BEFORE_LAYERS == {"embeddings"}
    assert components.VOCAB_WIDE == {"lm_head", "logits"}
    assert {n for n, c in COMPONENTS.items() if c.head_count == "n_kv_heads"} == {"attention_key",
                                                                                 "attention_value"}


def test_every_layout_reads_a_component_on_the_side_its_record_names():
    custom = layouts.custom_layout({"layers": "l", "ln_final": "n", "attention": "a", "mlp": "m",
                                    "attention_projection": "a.o", "mlp_projection": "m.d"}, "x")
    for layout in (*layouts.FAMILIES.values(), custom):
        for component, port in layout.ports.items():
            if component != layouts.ATTENTION:
                assert port.io == COMPONENTS[component].io, (layout.family, component)


def test_the_width_rule_reads_the_sizes_it_names():
    sizes = SimpleNamespace(d_model=32, d_mlp=48, vocab_size=170, n_heads=4, n_kv_heads=2, head_dim=8)
    widths = {n: c.width_of(sizes) for n, c in COMPONENTS.items()}
    assert widths == {"embeddings": 32, "block_input": 32, "attention_query": 32, "attention_key": 16,
                      "attention_value": 16, "attention_scores": None, "attention_probs": None, "attention_z": 32,
                      "attention_output": 32, "mlp_input": 32, "mlp_hidden": 48, "mlp_output": 32,
                      "block_output": 32, "ln_final": 32, "lm_head": 170, "logits": 170}


# --- on loaded models ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def grouped_root(family_root):
    families.build(GROUPED, family_root / GROUPED)
    return family_root


def _roots(model, grouped_root):
    return (grouped_root,) if model == GROUPED else (MODELS,)


def _sizes_by_hand(model, grouped_root) -> SimpleNamespace:
    """The model's sizes, read from its config.json here (not through ModelFacts)."""
    config = json.loads((_roots(model, grouped_root)[0] / model / "config.json").read_text())
    d_model = config.get("hidden_size") or config["n_embd"]
    n_heads = config.get("num_attention_heads") or config["n_head"]
    return SimpleNamespace(
        d_model=d_model, n_heads=n_heads, n_kv_heads=config.get("num_key_value_heads") or n_heads,
        head_dim=config.get("head_dim") or d_model // n_heads,
        d_mlp=config.get("intermediate_size") or config.get("n_inner") or 4 * d_model,
        vocab_size=config["vocab_size"])


def _reads_every(model: str, names) -> dict:
    """A document reading each of ``names`` whole at the last token of the base prompts, in one step."""
    sites = {c: {"component": c, **({"layers": [1]} if COMPONENTS[c].layered else {})} for c in names}
    return {"header": {"description": "every component read whole, to measure its width"},
            "model": {"key": model, "dtype": "fp32"}, "roles": {"base": {"field": "input"}},
            "sites": sites,
            "interventions": {"read": {"reads": {f"r_{c}": {"site": c, "pos": -1, "input": "base"}
                                                 for c in names}}},
            "steps": {"read": {"kind": "observe", "interventions": "read", "rows": {"base": "weekdays/train"},
                               "outputs": {f"o_{c}": f"r_{c}" for c in names}}}}


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("model", (*SHIPPED, GROUPED))
def test_each_engine_reports_and_reads_the_width_the_record_gives(engines, grouped_root, model, engine_name):
    # Served with the attention seam, so every interior is reached (chosen at load, as cm.load does).
    engine = engines({"key": model, "dtype": "fp32"}, engine_name, models=_roots(model, grouped_root),
                     attention_seam=True)
    sizes = _sizes_by_hand(model, grouped_root)
    sized = [n for n in COMPONENTS if n not in PATTERNS]
    for name in sized:
        assert engine.width(name) == COMPONENTS[name].width_of(sizes), name
        if COMPONENTS[name].selector == "heads":
            assert engine.heads(name) == COMPONENTS[name].heads_of(sizes), name
    with pytest.raises(CompileError, match="the model alone does not fix it"):
        engine.width("attention_probs")

    reached = [n for n in sized if engine._facts.refusal(n, engine.name) is None]
    # Every family here calls transformers' attention function: both engines reach inside attention.
    assert set(sized) == set(reached)
    plan = compiler.compile_plan(_reads_every(model, reached), facts=engine, data=[DATA])
    results = engine.execute(plan).steps["read"].results
    for name in reached:
        value = results[f"o_{name}"]
        assert value.shape[-1] == COMPONENTS[name].width_of(sizes), (name, tuple(value.shape))


@pytest.mark.parametrize("model", SHIPPED)
def test_the_strategies_size_a_site_by_the_same_record(engines, model):
    # the module, not the strategy of its name that the package exports
    drawn = importlib.import_module("pytest_causalab.strategies.documents")
    bounds = drawn.model_bounds(model)
    engine = engines({"key": model, "dtype": "fp32"}, "hooks")
    for name in COMPONENTS:
        if name not in PATTERNS:
            assert drawn._width(bounds, name) == engine.width(name), name


# --- one recipe: the compiler and both engines read a model alike -------------------------------

FACT_FIELDS = ("key", "revision", "family", "num_layers", "d_model", "n_heads", "n_kv_heads", "head_dim",
               "d_mlp", "vocab_size", "transform", "context_length", "weights", "config_digest")


@pytest.mark.parametrize("model", SHIPPED)
def test_the_compiler_and_both_engines_know_the_same_facts(engines, model):
    spec = front.points(_reads_every(model, ["block_output"]))[0].spec
    compiled = compiler.model_facts(spec, None, [MODELS])
    for engine_name in ENGINES:
        loaded = engines({"key": model, "dtype": "fp32"}, engine_name)._facts
        assert {f: getattr(loaded, f) for f in FACT_FIELDS} == {f: getattr(compiled, f) for f in FACT_FIELDS}
        assert loaded.layout == compiled.layout and loaded.absent == compiled.absent


def _refusals(section: dict, roots) -> list[str]:
    """What ``compiler.model_facts`` and each engine's ``load`` refuse ``section`` with."""
    from causalab_mini.document.spec import ModelRef
    from causalab_mini.engine.hooks import HooksEngine
    from causalab_mini.engine.nnterp import NNterpEngine

    said = []
    for read in (lambda: compiler.model_facts(SimpleNamespace(model=ModelRef.model_validate(section)), None,
                                              roots),
                 lambda: HooksEngine.load(section, models=roots),
                 lambda: NNterpEngine.load(section, models=roots)):
        with pytest.raises(ModelError) as refused:
            read()
        said.append(str(refused.value))
    return said


def test_a_model_that_is_not_there_is_refused_alike():
    said = _refusals({"key": "./no-such-model"}, [MODELS])
    assert len(set(said)) == 1 and "is not a model directory" in said[0]


def test_a_model_shipping_its_own_code_is_refused_alike(tmp_path):
    folder = shutil.copytree(MODELS / "tiny-llama", tmp_path / "own-code")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoConfig": "mine.Config"}}))
    said = _refusals({"key": "own-code"}, [tmp_path])
    assert len(set(said)) == 1 and "ships Python code of its own" in said[0]

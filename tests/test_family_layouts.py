"""What the compiler knows of each family with no weights loaded, held to the checkpoint itself.

Widths come from each family's real config fields (OPT's ``ffn_dim``, Falcon's
``ffn_hidden_size``, GPT-2's ``n_inner``), checked against the projection modules of
the tiny checkpoints; a unit or head past the end is refused at compile time on every
family; every refusal names the component, the family and what to use instead, and the
two engines refuse the same components but for the interiors a forward hook cannot reach.
A family no table knows is refused by name until its document names its modules
(``model.modules``), and then both engines run it with the numbers hand hooks give.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import families
import causalab_mini as cm
from causalab_mini.document import read as front
from causalab_mini.model.facts import ModelFacts
from causalab_mini.errors import CompileError, DocumentError
from causalab_mini.plan import compile as compiler
from causalab_mini.vocab import COMPONENTS
from paths import DATA, REPO
from test_families import REFERENCE, Hand, absent, document

pytestmark = pytest.mark.families
FAMILY_NAMES = tuple(families.FAMILIES)
INTERIORS = {c for c, comp in COMPONENTS.items() if not comp.hooks}


def _facts(folder):
    from transformers import AutoConfig

    return ModelFacts.from_config(AutoConfig.from_pretrained(folder), None, key="k", revision=None)


def _in_width(module) -> int:
    return getattr(module, "in_features", None) or module.nx  # Linear, or GPT-2's Conv1D


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_compile_time_widths_are_the_checkpoints(family_root, family):
    """The compiler's widths, from the config alone, equal the projections' real input widths."""
    from transformers import AutoModelForCausalLM

    folder = families.build(family, family_root / family)
    facts = _facts(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    ref = REFERENCE[family]
    layer = model.get_submodule(f"{ref.layers}.0")
    assert facts.width("attention_z") == _in_width(layer.get_submodule(ref.attention_z))
    projection = layer.get_submodule(ref.attention_z)
    assert facts.width("block_output") == (getattr(projection, "out_features", None) or projection.nf)
    assert facts.width("logits") == model.get_output_embeddings().weight.shape[0]
    if ref.mlp_hidden is not None:
        assert facts.width("mlp_hidden") == _in_width(layer.get_submodule(ref.mlp_hidden))
        if not family.startswith("bloom"):  # BLOOM's MLP is 4·d_model by construction; every other config says 48
            assert facts.width("mlp_hidden") == families.MLP


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_unit_or_head_past_the_end_is_refused_at_compile_time(family_root, family):
    folder = families.build(family, family_root / family)
    facts = _facts(folder)
    raw = document(family, ("mlp_units",))
    raw["sites"]["units1"]["units"] = [facts.d_mlp]  # one past the last neuron
    with pytest.raises(CompileError) as caught:
        compiler.compile_plan(raw, document=family_root / "d.causalab.json", models=[family_root], data=[DATA])
    if "mlp_hidden" in absent(family):  # a sparse MoE block, or never called: refused as a component first
        assert "mlp_hidden does not exist" in str(caught.value)
    else:
        assert str(caught.value).startswith("sites.units1.units:") and f"{facts.d_mlp} wide" in str(caught.value)
    if "attention_z" in absent(family):
        return
    raw = document(family, ("heads",))
    raw["sites"]["head1"]["heads"] = [facts.n_heads]
    with pytest.raises(CompileError, match=rf"head\(s\) \[{facts.n_heads}\] past the end"):
        compiler.compile_plan(raw, document=family_root / "d.causalab.json", models=[family_root], data=[DATA])


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_both_engines_refuse_the_same_components_but_for_interiors(family_root, family):
    facts = _facts(families.build(family, family_root / family))
    for component in COMPONENTS:
        nnterp, hooks = facts.refusal(component, "nnterp"), facts.refusal(component, "hooks")
        if component in INTERIORS:
            # The hooks engine reaches inside attention through the attention function transformers
            # calls (engine/attention.py): on every family whose attention module calls it.
            assert (hooks is None) == facts.layout.attention_call, component
        else:
            assert nnterp == hooks, component
        for reason in (nnterp, hooks):
            if reason is not None:  # names the component, and says what to use instead
                assert component in reason and ("instead" in reason or "--engine" in reason)


@pytest.mark.parametrize("family", [f for f in FAMILY_NAMES if REFERENCE[f].mlp_hidden is None])
def test_a_refused_component_names_the_family_on_both_engines_at_compile_time(family_root, family):
    families.build(family, family_root / family)
    for engine in ("nnterp", "hooks"):
        with pytest.raises(CompileError) as caught:
            compiler.compile_plan(document(family, ("mlp_units",)), document=family_root / "d.causalab.json",
                                  models=[family_root], data=[DATA], engine=engine)
        assert family in str(caught.value) and "mlp_input, mlp_output" in str(caught.value)


# --- a family no table knows -------------------------------------------------------------------

UNKNOWN = "arcee"  # a llama-like family with an ungated MLP, absent from the layout table
ARCEE_MODULES = {"layers": "model.layers", "ln_final": "model.norm", "attention": "self_attn", "mlp": "mlp",
                 "attention_projection": "self_attn.o_proj", "mlp_projection": "mlp.down_proj"}


@pytest.fixture(scope="module")
def unknown(family_root):
    import transformers

    folder = family_root / UNKNOWN
    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        config = transformers.ArceeConfig(**families._LLAMA_LIKE, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        model = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, p.shape[-1] ** -0.5) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
        model.save_pretrained(folder)
        for name in families.TOKENIZER_FILES:
            (folder / name).write_bytes((families.TOKENIZER / name).read_bytes())
    return folder


def test_an_unknown_family_is_refused_by_name(family_root, unknown):
    from causalab_mini.layouts import FAMILIES

    assert UNKNOWN not in FAMILIES
    with pytest.raises(CompileError) as caught:
        compiler.compile_plan(document(UNKNOWN, ("residual",)), document=family_root / "d.causalab.json",
                              models=[family_root], data=[DATA])
    text = str(caught.value)
    assert text.startswith("sites.resid0.component:") and f"'{UNKNOWN}'" in text and '"modules"' in text


def test_named_modules_run_an_unknown_family_on_both_engines(family_root, unknown):
    """model.modules: the same numbers hand hooks give, on both engines, bit-equal."""
    REFERENCE[UNKNOWN] = REFERENCE["llama"]
    try:
        experiments = ("residual", "mlp_units", "heads", "reads")
        raw = document(UNKNOWN, experiments)
        raw["model"]["modules"] = ARCEE_MODULES
        doc = cm.read(raw, path=family_root / "unknown.causalab.json")
        got = {}
        for engine in ("nnterp", "hooks"):
            loaded = cm.load(doc, engine=engine, models=[family_root])
            plan = cm.run(doc, loaded=loaded, data=[DATA]).plan
            got[engine] = {k: v[:, 0] for step in plan.steps.values() for k, v in step.results.items()
                           if k.endswith(".logits") or k.startswith("reads.")}
        hand = Hand(unknown)
        for experiment in experiments:
            for name, want in hand.expected(UNKNOWN, experiment).items():
                torch.testing.assert_close(got["nnterp"][name], want, rtol=0, atol=1e-5)
                assert torch.equal(got["nnterp"][name], got["hooks"][name]), name
    finally:
        del REFERENCE[UNKNOWN]


def test_named_modules_cover_only_what_they_name(family_root, unknown):
    raw = document(UNKNOWN, ("mlp_units",))
    raw["model"]["modules"] = {k: v for k, v in ARCEE_MODULES.items() if k != "mlp_projection"}
    with pytest.raises(CompileError, match="names no mlp_projection"):
        compiler.compile_plan(raw, document=family_root / "d.causalab.json", models=[family_root], data=[DATA])
    raw["model"]["modules"] = {**ARCEE_MODULES, "mlp_projection": "mlp.no_such"}
    doc = cm.read(raw, path=family_root / "d.causalab.json")
    engine = cm.load(doc, engine="hooks", models=[family_root])
    with pytest.raises(CompileError, match="no module 'mlp.no_such' for mlp_hidden"):
        cm.run(doc, loaded=engine, data=[DATA])


@pytest.mark.parametrize("modules, where", [
    ({"layers": "model.layers"}, "model.modules.ln_final"),
    ({**ARCEE_MODULES, "layers": "model/layers"}, "model.modules.layers"),
    ({**ARCEE_MODULES, "extra": "x"}, "model.modules.extra"),
])
def test_malformed_modules_are_refused_at_their_path(modules, where):
    raw = document(UNKNOWN, ("residual",))
    raw["model"]["modules"] = modules
    with pytest.raises(DocumentError) as caught:
        front.points(raw)
    assert str(caught.value).startswith(where)


NOISY = ("mixtral", "opt", "gemma3", "phi")  # loads that printed tracebacks, warnings or crashed


def test_the_cli_prints_no_library_noise(family_root, tmp_path):
    """``causalab-mini run`` on the families whose loads used to print a torch traceback (MoE), a
    warning (OPT) or crash (Gemma-3 multimodal, Phi): every run succeeds and stderr stays empty.
    One process runs them all through the CLI's own ``main``, so nnterp is imported once."""
    runs = []
    for family in NOISY:
        families.build(family, family_root / family)
        doc = tmp_path / f"{family}.causalab.json"
        doc.write_text(json.dumps(document(family, ("residual",))))
        for engine in ("nnterp", "hooks"):
            runs.append(["run", str(doc), "--engine", engine, "--models", str(family_root), "--data", str(DATA),
                         "--out", str(tmp_path / f"{family}-{engine}")])
    script = ("import sys, json\nfrom causalab_mini.cli import main\n"
              "codes = [main(argv) for argv in json.loads(sys.argv[1])]\nsys.exit(max(codes))\n")
    done = subprocess.run([sys.executable, "-c", script, json.dumps(runs)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    # Only the CLI's own lines: where each run's time went, one per run.
    said = done.stderr.splitlines()
    assert [line for line in said if not line.startswith("time: load ")] == [], done.stderr
    assert len(said) == len(runs)
    assert all((tmp_path / f"{f}-{e}" / "run.json").is_file() for f in NOISY for e in ("nnterp", "hooks"))


def test_the_readme_family_table_is_the_generated_one():
    """README.md's family table is scripts/family_table.py's output, never typed by hand."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("family_table", REPO / "scripts" / "family_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    generated = table.render()
    assert table.readme_table((REPO / "README.md").read_text(encoding="utf-8")) == generated, \
        "README.md's family table is stale: run python scripts/family_table.py --write"
    assert generated.count("\n| ") == len(FAMILY_NAMES) + 1  # a header row and one row per family


def test_model_modules_enter_produced_by_only_when_named():
    """Naming modules changes the experiment's digest; a document that names none keeps the digest
    it had before the field existed (so committed baselines stay valid)."""
    raw = document(UNKNOWN, ("residual",))
    plain = front.points(raw)[0].spec
    assert "modules" not in plain.canonical()["model"]
    raw["model"]["modules"] = ARCEE_MODULES
    named = front.points(raw)[0].spec
    assert named.canonical()["model"]["modules"] == {**ARCEE_MODULES}
    assert named.produced_by != plain.produced_by

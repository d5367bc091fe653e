"""``causalab-mini`` run the way a user runs it: a subprocess, its stdout, stderr and exit status."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import causalab_mini as cm
from paths import DATA, MODELS, REPO, V2
from samples import cli_command

PATCHING = "documents/v2/patching.causalab.json"
COMPONENTS = ("embeddings", "block_input", "attention_query", "attention_key", "attention_value",
              "attention_scores", "attention_probs", "attention_z", "attention_output", "mlp_input", "mlp_hidden", "mlp_output",
              "block_output", "ln_final", "lm_head", "logits")
MECHANISMS = ("add_scaled", "clamp", "gaussian", "lerp", "renormalize", "swap")





def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def ok(*args: str, cwd: Path = REPO) -> str:
    done = cli(*args, cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def refused(*args: str, cwd: Path = REPO) -> str:
    done = cli(*args, cwd=cwd)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert done.stderr.startswith("error: ")
    return done.stderr


def test_vocab_lists_every_component_and_mechanism():
    text = ok("vocab")
    lines = text.splitlines()
    start = lines.index("components:")
    listed = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        listed.append(line.split()[0])
    assert listed == list(COMPONENTS)
    (mech,) = [line for line in lines if line.startswith("mechanisms:")]
    assert [m.strip() for m in mech.split(":", 1)[1].split(",")] == list(MECHANISMS)
    assert any(line.startswith("position forms:") for line in lines)
    # Both local engines reach inside attention (the hooks engine through transformers' attention
    # function, on the families whose attention calls it: the family table says which).
    (query,) = [line for line in lines if line.startswith("  attention_query ")]
    assert query.split("engines=")[1].split("  ")[0].split(", ") == ["nnterp", "hooks"]


def test_vocab_json_parses():
    data = json.loads(ok("vocab", "--json"))
    assert list(data["components"]) == list(COMPONENTS)
    assert sorted(data["mechanisms"]) == list(MECHANISMS)
    assert data["mechanisms"]["lerp"]["params"]["t"]["required"] is True
    assert data["components"]["attention_z"]["selector"] == "heads"
    assert set(data["metric_kinds"]) == {"match", "logit_diff", "cross_entropy", "token_logit", "token_prob",
                                         "prob_diff", "token_rank", "top_k", "kl_div", "normalized_effect"}
    assert data["metric_kinds"]["kl_div"]["reads"] == ["reference"]
    assert data["metric_kinds"]["top_k"]["params"] == ["k"]
    from causalab_mini.layouts import FAMILIES

    assert data["model_families"] == sorted(FAMILIES) and {"llama", "gpt2", "bloom", "opt"} <= set(FAMILIES)


def test_schema_is_a_json_schema_of_the_document():
    schema = json.loads(ok("schema"))
    assert schema["type"] == "object"
    assert {"model", "roles", "sites", "interventions", "steps"} <= set(schema["properties"])
    assert set(schema["required"]) >= {"model", "interventions", "steps"}
    assert "$defs" in schema and "Write" in schema["$defs"]
    protocol = json.loads(ok("schema", "--protocol"))
    assert "method" in protocol["properties"] and "data" in protocol["properties"]


def test_data_describes_a_dataset():
    text = ok("data", "weekdays/train")
    assert text.splitlines()[0] == "weekdays/train: 4 rows"
    assert "columns:" in text and "cf_answer" in text
    described = json.loads(ok("data", "weekdays/train", "--json"))
    assert isinstance(described, dict)


def test_data_refuses_a_missing_dataset():
    err = refused("data", "weekdays/nope")
    assert "DataError" in err and "'weekdays/nope' not found" in err


def test_validate_prints_an_ok_line():
    assert ok("validate", PATCHING).strip() == f"ok: {PATCHING} is a valid plan-shaped document"


def test_validate_counts_the_points_of_a_sweep(tmp_path):
    doc = json.loads((REPO / PATCHING).read_text())
    doc["interventions"]["patching"]["writes"]["patch"]["pos"] = {"sweep": [-1, -2, -3]}
    path = tmp_path / "swept.causalab.json"
    path.write_text(json.dumps(doc))
    assert ok("validate", str(path)).strip() == f"ok: {path} is a valid plan-shaped document (3 points)"
    report = json.loads(ok("validate", str(path), "--json"))
    assert report[0]["points"] == ["pos=-1", "pos=-2", "pos=-3"]


def test_explain_prints_the_forwards():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODELS / "tiny-llama")
    data = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines()]
    cf = max(len(tok(r["counterfactual_inputs"][0])["input_ids"]) for r in data)
    base = max(len(tok(r["input"])["input_ids"]) for r in data)
    text = ok("explain", PATCHING)
    head = len(tok("a", add_special_tokens=False)["input_ids"])

    def several(word: str) -> bool:  # the answer is more than one token after a word
        return len(tok("a " + word.strip(), add_special_tokens=False)["input_ids"]) - head > 1

    multi = sum(1 for r in data if several(r["cf_answer"]))
    both = sum(1 for r in data if several(r["cf_answer"]) or several(r["base_answer"]))
    assert text.splitlines() == [
        "<root>: Plan",
        "  score: Observe  metrics=['iia/match', 'logit_diff/logit_diff']  saves=['iia.json', 'logit_diff.json']",
        f"      forward 'original' on 'counterfactual'  (4 rows x {cf} tokens)",
        "        read  'v_cf' at block_output[0] pos={index:-1} via 'identity'",
        f"      forward 'patched' on 'base'  (4 rows x {base} tokens)",
        "        write 'patch' at block_output[0] pos={index:-1} swap(v_cf) via 'identity'",
        "        read  'logits' at lm_head pos={index:-1} via 'identity'",
        "      metric 'iia': held apart from 'base_answer' (the other answer of logit_diff 'logit_diff')",
    ] + [  # a note only for a metric that has such rows
        f"      metric '{name}': {count} of 4 rows scored on the first of their answer's several tokens"
        for name, count in (("iia", multi), ("logit_diff", both))
        if count
    ]


def test_explain_json_is_the_plan_tree():
    tree = json.loads(ok("explain", PATCHING, "--json"))
    assert tree["kind"] == "plan" and len(tree["produced_by"]) == 64
    forwards = tree["steps"]["score"]["forwards"]
    assert [(f["model"], f["input"]) for f in forwards] == [("original", "counterfactual"), ("patched", "base")]
    assert [op["op"] for op in forwards[1]["ops"]] == ["write", "read"]


def test_a_bad_document_exits_2_naming_the_path(tmp_path):
    doc = json.loads((REPO / PATCHING).read_text())
    doc["interventions"]["patching"]["writes"]["patch"]["pos"] = {"index": -1, "last": 2}
    path = tmp_path / "bad.causalab.json"
    path.write_text(json.dumps(doc))
    for verb in ("validate", "explain"):
        err = refused(verb, str(path))
        assert "DocumentError: interventions.patching.writes.patch.pos: " in err
        assert "exactly one cut" in err


def test_a_compile_refusal_exits_2(tmp_path):
    doc = json.loads((REPO / PATCHING).read_text())
    doc["sites"]["target"]["layers"] = [7]
    path = tmp_path / "deep.causalab.json"
    path.write_text(json.dumps(doc))
    assert ok("validate", str(path)).startswith("ok:")  # the document alone cannot know the depth
    err = refused("explain", str(path), "--models", str(MODELS),
                  "--data", str(DATA))
    assert "CompileError: sites.target.layers: layer 7 is past the end" in err


def test_an_interior_past_the_last_layer_exits_2_on_both_engines(tmp_path):
    # Both engines reach inside attention now (attention_scores through transformers' attention
    # seam); a layer past the model's end is refused by the compiler, by name, on either.
    doc = json.loads((REPO / PATCHING).read_text())
    doc["sites"]["s"] = {"component": "attention_scores", "layers": [7], "heads": [1]}
    doc["interventions"]["patching"]["reads"]["s"] = {"site": "s", "pos": -1, "input": "base"}
    path = tmp_path / "scores.causalab.json"
    path.write_text(json.dumps(doc))
    models, data = str(MODELS), str(DATA)
    for engine in ("nnterp", "hooks"):
        err = refused("explain", str(path), "--engine", engine, "--models", models, "--data", data)
        assert "sites.s.layers" in err and "past the end" in err
    doc["sites"]["s"]["layers"] = [0]
    path.write_text(json.dumps(doc))
    for engine in ("nnterp", "hooks"):
        assert "read  's' at attention_scores[0].heads[1]" in ok("explain", str(path), "--engine", engine,
                                                                 "--models", models, "--data", data)


def test_a_json_syntax_error_exits_2_with_line_and_column(tmp_path):
    path = tmp_path / "broken.causalab.json"
    path.write_text('{\n  "model": {"key": "tiny-llama"},\n  "roles": {,}\n}\n')
    for verb in ("validate", "explain"):
        err = refused(verb, str(path))
        assert f"{path}:3:13: not valid JSON" in err
        assert "fix the syntax at that line and column" in err


def test_a_missing_file_exits_2(tmp_path):
    err = refused("validate", str(tmp_path / "nowhere.causalab.json"))
    assert "cannot read the document" in err


def test_revision_prints_the_revision_a_document_pins():
    from causalab_mini.model.loading import revision_digest

    model = MODELS / "tiny-llama"
    line = ok("revision", str(model)).strip()
    assert line == f"{revision_digest(model)}  {model}"
    assert line.split()[0] == cm.read(V2 / "patching.causalab.json").model.revision


@pytest.mark.parametrize("argv", [[], ["nonsense"]])
def test_usage_errors_are_argparse_errors(argv):
    done = cli(*argv)
    assert done.returncode == 2 and "usage:" in done.stderr and "Traceback" not in done.stderr


def test_main_in_process_returns_2_on_a_refusal(tmp_path, capsys):
    from causalab_mini.cli import main

    path = tmp_path / "bad.causalab.json"
    path.write_text(json.dumps({"model": {"key": "/abs"}}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: DocumentError: ")
    assert "model.key" in err

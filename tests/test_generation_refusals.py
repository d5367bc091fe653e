"""What the generated frame refuses, and where: at validation, at compile time, and from the
command line as a user runs it. Nothing here loads weights (generation.md, "What is refused")."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from causalab_mini import cli
from causalab_mini.document import read as front
from causalab_mini.errors import CompileError, DocumentError
from causalab_mini.plan import compile as compiler
from paths import DATA, MODELS, V2

N = 3  # generate_probe's decode
CONTINUATION_WRITE = ("a write in the continuation frame is at a step the decode has reached — "
                      "{'index': k} with k >= 0, or {'all': true}. {generated index:-1} names a cut of the "
                      "finished continuation, which is something to read and not something to write into")


def doc(name: str) -> dict:
    return front.read(V2 / f"{name}.causalab.json")


def variant(tmp_path: Path, name: str, edit, *, pin: str = None) -> Path:
    raw = copy.deepcopy(doc("generate_probe"))
    edit(raw["interventions"]["generate"])
    if pin is not None:  # a checkpoint of the test's own: its revision
        raw["model"]["revision"] = pin
    path = tmp_path / f"{name}.causalab.json"
    path.write_text(json.dumps(raw))
    return path


def _write_at_last(iv):
    iv["writes"]["patch"]["pos"] = {"frame": "generated", "index": -1}


def _no_decode(iv):
    del iv["decode"]


def _past_the_decode(iv):
    iv["reads"]["logits"]["pos"] = {"frame": "generated", "index": {"sweep": [0, N]}}


def _user_turn(iv):
    iv["reads"]["logits"]["pos"] = {"frame": "generated", "index": -1, "scope": {"segment": "user"}}


def _eos_in_prompt(iv):
    iv["reads"]["logits"]["pos"] = {"index": -1, "scope": {"segment": "eos"}}


def _write_every_token(iv):
    iv["writes"]["patch"]["pos"] = {"frame": "generated", "last": 2}


REFUSED = [
    (_write_at_last, "interventions.generate: write 'patch': " + CONTINUATION_WRITE),
    (_no_decode, "interventions.generate.reads.logits.pos: the generated frame needs a decode; "
                 "add \"decode\": N to interventions.generate"),
    (_past_the_decode, f"decode step {N} is past the decode of {N} steps; use an index below {N}"),
    (_user_turn, "segment 'user' is a chat turn of the prompt; the generated frame has only 'eos'"),
    (_eos_in_prompt, "segment 'eos' is a run of the generated frame; a prompt has none"),
    (_write_every_token, "a write in the continuation frame is at a step the decode has reached"),
]


@pytest.mark.parametrize("edit,message", REFUSED, ids=[e.__name__.strip("_") for e, _ in REFUSED])
def test_validate_refuses(tmp_path, capsys, edit, message):
    path = variant(tmp_path, edit.__name__, edit)
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: DocumentError: ") and message in err, err
    with pytest.raises(DocumentError, match=None) as info:
        front.points(front.read(path))
    assert message in str(info.value)


def test_the_continuation_write_is_refused_by_the_command_itself(tmp_path):
    path = variant(tmp_path, "write_last", _write_at_last)
    done = subprocess.run([sys.executable, "-m", "causalab_mini.cli", "validate", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert CONTINUATION_WRITE in done.stderr


def _long_context_models(tmp_path: Path) -> Path:
    """tiny-llama with room for a million positions (a rotary model has no table to grow), so a
    decode long enough to reach the buffer bound is not first refused for the context."""
    root = tmp_path / "models"
    (root / "tiny-llama").mkdir(parents=True)
    for f in (MODELS / "tiny-llama").iterdir():
        (root / "tiny-llama" / f.name).symlink_to(f)
    config = json.loads((MODELS / "tiny-llama" / "config.json").read_text())
    (root / "tiny-llama" / "config.json").unlink()
    (root / "tiny-llama" / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2**20}))
    return root


def test_a_stacked_read_over_the_buffer_bound_is_refused(tmp_path, capsys):
    from causalab_mini.model.loading import revision_digest

    models = _long_context_models(tmp_path)
    pin = revision_digest(models / "tiny-llama")  # its config is edited, and the revision covers it
    rows, width, bound = 4, json.loads((MODELS / "tiny-llama" / "config.json").read_text())["vocab_size"], 256 * 2**20
    decode = bound // (rows * width * 4) + 1  # the least decode over the bound
    below = decode - 1

    def stacked(n):
        def edit(iv):
            iv["reads"]["logits"]["pos"] = {"frame": "generated", "index": -1}
            iv["decode"] = n
        return edit

    over = variant(tmp_path, "over", stacked(decode), pin=pin)
    assert cli.main(["validate", str(over)]) == 0  # a bound of the model's width: not a document error
    capsys.readouterr()
    assert cli.main(["explain", str(over), "--models", str(models), "--data", str(DATA)]) == 2
    err = capsys.readouterr().err
    mib = rows * decode * width * 4 / 2**20
    assert err.startswith("error: CompileError: interventions.generate.reads.logits.pos: ")
    assert f"{rows} rows x {decode} steps x {width} wide is {mib:.0f} MiB, over the 256 MiB bound" in err, err
    # One step fewer fits: the bound is the number, not a rough size.
    plan = compiler.compile_plan(front.read(variant(tmp_path, "under", stacked(below), pin=pin)),
                                 document=V2 / "x.causalab.json", models=[models], data=[DATA])
    assert {f.decode for f in plan.steps["score"].forwards} == {below}
    with pytest.raises(CompileError, match="MiB"):
        compiler.compile_plan(front.read(over), document=V2 / "x.causalab.json", models=[models],
                              data=[DATA])


def test_a_decode_past_the_context_is_refused_and_one_that_fits_compiles(tmp_path, capsys):
    """tiny-llama was built for 128 positions: the longest prompt plus the decode must fit."""
    from transformers import AutoTokenizer

    limit = json.loads((MODELS / "tiny-llama" / "config.json").read_text())["max_position_embeddings"]
    tok = AutoTokenizer.from_pretrained(MODELS / "tiny-llama")
    rows = [json.loads(line) for line in (DATA / "weekdays" / "train.jsonl").read_text().splitlines()]
    # the padded width: the longest prompt of either role, with the tokenizer's own special tokens
    width = max(len(tok(r[k] if k == "input" else r[k][0])["input_ids"])
                for r in rows for k in ("input", "counterfactual_inputs"))
    fits = variant(tmp_path, "fits", lambda iv: iv.__setitem__("decode", limit - width))
    over = variant(tmp_path, "over", lambda iv: iv.__setitem__("decode", limit - width + 1))
    plan = compiler.compile_plan(front.read(fits), document=V2 / "x.causalab.json", models=[MODELS],
                                 data=[DATA])
    assert {f.decode for p in plan.points for f in p.steps["score"].forwards} == {limit - width}
    assert cli.main(["explain", str(over), "--models", str(MODELS), "--data", str(DATA)]) == 2
    assert capsys.readouterr().err == (
        f"error: CompileError: interventions.generate.decode: {width} prompt tokens and {limit - width + 1} "
        f"decoded make {limit + 1}, over the {limit} positions tiny-llama was built for; decode at most "
        f"{limit - width} tokens, or shorten the prompts\n")


def test_an_attention_pattern_in_the_continuation_is_refused(tmp_path):
    raw = copy.deepcopy(doc("generate_probe"))
    raw["sites"]["pattern"] = {"component": "attention_probs", "layers": [0]}
    raw["interventions"]["generate"]["reads"]["pp"] = {
        "site": "pattern", "pos": {"frame": "generated", "index": 0}, "model": "patched", "input": "base"}
    with pytest.raises(CompileError, match="an attention pattern gains a key at every decode step"):
        compiler.compile_plan(raw, document=V2 / "x.causalab.json", models=[MODELS], data=[DATA])

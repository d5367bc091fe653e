"""Two failures that came out untyped, now refusals naming the field and the fix:

- a mean-ablation harvest whose read lands on no row (an anchored position every row misses):
  the mean of no vectors, refused at run time naming ``steps.<step>.outputs.<name>`` (a fixed
  cut that fits no row is already refused at compile time; an anchored one is resolved per row,
  in the run);
- a chat template that fails while rendering (``{% include %}`` and friends, or any error inside
  it), refused at compile time naming the checkpoint's template file.

Real documents on the shipped checkpoint, edited as a user would: no mocks.
"""
from __future__ import annotations

import json
import shutil

import pytest
from paths import DATA, MODELS, V2

import causalab_mini as cm
from causalab_mini import cli

pytestmark = pytest.mark.usefixtures("one_thread")

MEAN_ABLATION = V2 / "mean_ablation.causalab.json"
CHAT_TURN = V2 / "chat_turn.causalab.json"


# --- a harvested mean of no vectors ------------------------------------------------------------

# The harvest's read, moved to positions every weekdays/train row misses, and why each misses.
NOWHERE = {
    # " Friday" is the row's answer: the prompt never says it.
    "an anchor no prompt has": ({"index": -1, "scope": {"variable": "answer"}}, "alignment_missing on 4"),
    # A weekday is one to three tokens on tiny-llama: a sixth token is outside every one.
    "a cut outside every anchor": ({"index": 5, "scope": {"variable": "entity"}}, "cut_outside_scope on 4"),
}


def _harvest_at(pos, tmp_path):
    raw = json.loads(MEAN_ABLATION.read_text())
    raw["interventions"]["harvest"]["reads"]["acts"]["pos"] = pos
    path = tmp_path / "nowhere.causalab.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize("case", list(NOWHERE))
def test_a_mean_of_a_read_that_skips_every_row_is_refused_naming_the_output(engines, tmp_path, case):
    pos, why = NOWHERE[case]
    path = _harvest_at(pos, tmp_path)
    doc = cm.read(path)
    cm.compile(doc, loaded=engines(MEAN_ABLATION, "hooks"), data=DATA)  # anchored: resolved in the run
    with pytest.raises(cm.EngineError) as err:
        cm.run(doc, loaded=engines(MEAN_ABLATION, "hooks"), data=DATA, out=tmp_path / "out")
    assert err.value.path == "steps.harvest.outputs.mean"
    assert err.value.problem == (
        "no row had a position for read 'acts': its pos (interventions.harvest.reads.acts.pos) landed on "
        f"none of the 4 rows ({why}), so the mean it publishes is a mean of no vectors")
    assert err.value.fix.startswith("give the read a position every prompt has")
    assert not (tmp_path / "out").exists()  # nothing half written


def test_the_cli_prints_the_empty_mean_refusal_and_exits_2(tmp_path, capsys):
    path = _harvest_at(NOWHERE["an anchor no prompt has"][0], tmp_path)
    argv = ["run", str(path), "--engine", "hooks", "--out", str(tmp_path / "out"),
            "--models", str(MODELS), "--data", str(DATA)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("error: EngineError: steps.harvest.outputs.mean: no row had a position for read 'acts'")
    assert "Traceback" not in err


# --- a chat template that fails ----------------------------------------------------------------

INCLUDES = ("it loads another template ({% include %}, {% import %} or {% extends %}), and a chat template "
            "is rendered on its own, with nowhere to load one from; write what it includes into the chat "
            "template itself, or use plain-text prompts")
TEMPLATES = {
    "include": ("{% include 'x' %}", INCLUDES),
    "extends": ("{% extends 'base' %}", INCLUDES),
    "import": ("{% import 'macros' as m %}{{ m.turn(messages) }}", INCLUDES),
    "an error inside it": ("{% for m in messages %}{{ m.content + 1 }}{% endfor %}",
                           'TypeError: can only concatenate str (not "int") to str; fix the checkpoint\'s '
                           "chat_template, or use plain-text prompts"),
}


def _checkpoint_with(template: str, tmp_path, where: str):
    """A copy of tiny-llama whose chat template is ``template``, kept in ``where``: its own
    chat_template.jinja, or tokenizer_config.json's chat_template with the .jinja removed (a file
    transformers prefers when both are there). The file the refusal must name."""
    models = tmp_path / "models"
    shutil.copytree(MODELS / "tiny-llama", models / "tiny-llama")
    folder = models / "tiny-llama"
    if where == "chat_template.jinja":
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
        return models, str(folder / "chat_template.jinja")
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return models, f"chat_template in {folder / 'tokenizer_config.json'}"


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
@pytest.mark.parametrize("case", list(TEMPLATES))
def test_a_chat_template_that_fails_to_render_is_refused_naming_it(tmp_path, capsys, case, where):
    from causalab_mini.model.loading import revision_digest

    template, words = TEMPLATES[case]
    models, source = _checkpoint_with(template, tmp_path, where)
    document = json.loads(CHAT_TURN.read_text())
    document["model"]["revision"] = revision_digest(models / "tiny-llama")  # the revision covers the template
    path = tmp_path / CHAT_TURN.name
    path.write_text(json.dumps(document))
    with pytest.raises(cm.CompileError) as err:
        cm.compile(cm.read(path), engine="hooks", models=[models], data=[DATA])
    assert str(err.value) == f"roles.base.field: the checkpoint's chat template ({source}) fails on row 0: {words}"
    assert cli.main(["explain", str(path), "--models", str(models), "--data", str(DATA)]) == 2
    assert capsys.readouterr().err == f"error: CompileError: {err.value}\n"

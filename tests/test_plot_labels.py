"""A heatmap's ticks and orientation: a position axis names the token it lands on, layer 0 is on top.

Real runs on the shared hooks engine, each kept both as ``cm.run`` returned it and as ``cm.open``
reads it back. The tokens a tick should show are computed here on their own — the prompts read
from the dataset file, encoded by the checkpoint's tokenizer loaded with transformers, each token's
text cut as decoding the growing prefix spells it — or read from the run's own metric rows;
never typed in, and never through the resolver the run used.
"""
from __future__ import annotations

import json

import pytest

from paths import DATA, MODELS, V2

pytest.importorskip("matplotlib")
import numpy as np  # noqa: E402

import causalab_mini as cm  # noqa: E402
from causalab_mini.document.sweep import label  # noqa: E402
from causalab_mini.plots import encode, plot  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

LAYER_POS = V2 / "layer_pos_sweep.causalab.json"
ENTITY = {"index": -1, "scope": {"variable": "entity"}}  # the last token of each row's own weekday
PROMPT = {"index": -1, "scope": {"variable": "input"}}  # the last token of the row's prompt, found as text


def _run(engines, tmp_path_factory, raw: dict, name: str):
    """(the run as cm.run returned it, the same run opened from its folder)."""
    doc = cm.read(raw, path=V2 / f"{name}.causalab.json")
    out = tmp_path_factory.mktemp(name) / "run"
    ran = cm.run(doc, loaded=engines(doc.raw, "hooks", document=doc.path), out=out, data=[DATA])
    return ran, cm.open(out)


@pytest.fixture(scope="module")
def layer_pos(engines, tmp_path_factory):
    return _run(engines, tmp_path_factory, json.loads(LAYER_POS.read_text()), "layer_pos_sweep")


@pytest.fixture(scope="module")
def lens(engines, tmp_path_factory):
    """logit_lens.causalab.json with its read's position swept too: a bare index, the row's entity
    (a different weekday on every row) and the prompt found as text (the same ' is' on every row)."""
    raw = json.loads((V2 / "logit_lens.causalab.json").read_text())
    raw["header"] = {"description": "the logit lens at three positions"}
    raw["interventions"]["lens"]["reads"]["lens"]["pos"] = {"sweep": [-1, ENTITY, PROMPT], "as": "pos"}
    return _run(engines, tmp_path_factory, raw, "lens_positions")


def _ticks(labels):
    return [t.get_text() for t in labels]


def _heatmap_axes(fig):
    return next(ax for ax in fig.axes if any(i.get_gid() == "heatmap" for i in ax.get_images()))


def _prompts(raw: dict) -> list[str]:
    """Every prompt the patching step feeds the model: the base rows' and the counterfactual rows'."""
    rows = raw["steps"]["score"]["rows"]
    texts = []
    for role, ref in rows.items():
        name, split = ref.split("/")
        records = [json.loads(line) for line in (DATA / name / f"{split}.jsonl").read_text().splitlines() if line]
        field = raw["roles"][role]["field"]
        texts += [r["input"] if field == "input" else r["counterfactual_inputs"][0] for r in records]
    return texts


def _token_at(tok, text: str, position: int) -> str:
    """The text of the token at ``position`` (from the end) of ``text``, leading space kept: what decoding
    one more token adds to the decoded prefix (a lone sentencepiece token decodes without its space)."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    k = len(ids) + position
    return repr(tok.decode(ids[:k + 1])[len(tok.decode(ids[:k])):])


# --- the token a position lands on ----------------------------------------------------------

def test_position_ticks_are_the_tokens_every_row_lands_on(layer_pos):
    from transformers import AutoTokenizer

    ran, _ = layer_pos
    raw = json.loads(LAYER_POS.read_text())
    tok = AutoTokenizer.from_pretrained(MODELS / raw["model"]["key"])
    prompts = _prompts(raw)
    positions = raw["interventions"]["patching"]["writes"]["patch"]["pos"]["sweep"]
    expected = []
    for p in positions:
        landed = {_token_at(tok, text, p) for text in prompts}
        expected.append(f"{p} {landed.pop()}" if len(landed) == 1 else str(p))  # rows differ: the bare index
    ax = _heatmap_axes(plot(ran, "iia"))
    assert _ticks(ax.get_xticklabels()) == expected
    assert expected[-1] == "-1 ' is'" and expected[0] == "-4"  # both cases are here: one token, and several


def test_an_anchored_position_is_named_by_its_scope_where_rows_differ(lens):
    ran, opened = lens
    entity = opened.point(layers=[0], pos=ENTITY).result("top1").rows
    prompt = opened.point(layers=[0], pos=PROMPT).result("top1").rows
    assert len({r["tokens"] for r in entity}) > 1  # each row's own weekday: no one token to show
    (same,) = {r["tokens"] for r in prompt}  # the prompt's last token: one, on every row
    from_memory = _ticks(_heatmap_axes(plot(ran, "top1")).get_xticklabels())
    assert from_memory == ["-1 ' is'", "-1 entity", f"-1 input {same}"]
    # From disk (no model or data reachable from its folder) the anchored passes' rows still say
    # where they landed; the bare -1 recorded nothing (the document fixes it), and without the
    # prompts' ids its token is not known.
    from_disk = _ticks(_heatmap_axes(plot(opened, "top1")).get_xticklabels())
    assert from_disk == ["-1", "-1 entity", f"-1 input {same}"]


def test_a_run_opened_from_disk_labels_fixed_positions_by_their_coordinate(layer_pos):
    """Where its model and data cannot be found from its folder, a run read back from disk has no
    prompts to find a fixed position's token in: the coordinate alone, never a guess."""
    _, opened = layer_pos
    grid = opened.grid("iia", "layers", "pos")
    assert _ticks(_heatmap_axes(plot(opened, "iia")).get_xticklabels()) == [label(v) for v in grid.columns]


def test_a_run_opened_from_disk_finds_the_tokens_where_its_model_and_data_are_found(layer_pos, monkeypatch):
    """With the model and data reachable as a run finds them (here CAUSALAB_MODELS and CAUSALAB_DATA;
    in a checkout, the documents/ above the run folder), the folder's document is compiled again,
    weightless, and the ticks are what the run in memory shows."""
    ran, opened = layer_pos
    monkeypatch.setenv("CAUSALAB_MODELS", str(MODELS))
    monkeypatch.setenv("CAUSALAB_DATA", str(DATA))
    in_memory = _ticks(_heatmap_axes(plot(ran, "iia")).get_xticklabels())
    assert _ticks(_heatmap_axes(plot(opened, "iia")).get_xticklabels()) == in_memory
    assert in_memory[-1] == "-1 ' is'"


def test_a_position_axis_on_the_rows_is_labelled_too(lens):
    ran, _ = lens
    ax = _heatmap_axes(plot(ran, "top1", x="layers", y="pos"))
    assert _ticks(ax.get_yticklabels())[:2] == ["-1 ' is'", "-1 entity"]  # the first position at the top
    assert _ticks(ax.get_xticklabels()) == ["0", "1"]


# --- layer 0 at the top, the numbers in the cells -------------------------------------------

@pytest.mark.parametrize("which", [0, 1], ids=["in memory", "opened"])
def test_layer_zero_is_drawn_at_the_top(layer_pos, which):
    run = layer_pos[which]
    grid = run.grid("iia", "layers", "pos")
    ax = _heatmap_axes(plot(run, "iia"))
    assert _ticks(ax.get_yticklabels()) == ["0", "1"] and list(ax.get_yticks()) == [0, 1]
    bottom, top = ax.get_ylim()
    assert top < bottom  # y grows downward: row 0 is the highest row drawn
    to_screen = ax.transData.transform
    assert to_screen((0, 0))[1] > to_screen((0, 1))[1]  # on the canvas, layer 0's row is above layer 1's
    # Each cell's number sits on its own cell: the text at (column j, row i) is grid.values[i][j].
    cells = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in ax.texts}
    assert cells == {(j, i): f"{v:.2f}" for i, line in enumerate(grid.values) for j, v in enumerate(line)}
    np.testing.assert_array_equal(np.asarray(ax.get_images()[0].get_array()), np.array(grid.values))


def test_labelled_heatmaps_have_the_same_bytes_every_time(layer_pos, lens):
    for run, result in ((layer_pos[0], "iia"), (lens[0], "top1")):
        assert encode(plot(run, result)) == encode(plot(run, result))

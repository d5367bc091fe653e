"""causalab_mini.plots and ``causalab-mini plot``: what each figure draws is the run's own numbers.

Documents of the corpus run once per module on the shared hooks engine (an attention pattern on
the nnterp engine, which alone taps it) into tmp folders, and are opened back as a user would.
Every expected value is computed from the ``Run`` (``grid``, ``Result.mean``/``ci``, the saved
tensors, the fit's own curves) — never typed in.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paths import DATA, MODELS, V2
from samples import cli_command, with_pattern

pytest.importorskip("matplotlib")
import numpy as np  # noqa: E402
from matplotlib.image import imread  # noqa: E402

import causalab_mini as cm  # noqa: E402
from causalab_mini import cli  # noqa: E402
from causalab_mini.document.sweep import label  # noqa: E402
from causalab_mini.plots import choose, plot, save  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

LAYER_POS = V2 / "layer_pos_sweep.causalab.json"


def _run(engines, tmp_path_factory, document, name, *, engine="hooks"):
    """(the run as cm.run returned it, the same run opened from its folder)."""
    doc = cm.read(document, path=V2 / f"{name}.causalab.json") if isinstance(document, dict) else cm.read(document)
    out = tmp_path_factory.mktemp(name) / "run"
    ran = cm.run(doc, loaded=engines(doc.raw, engine, document=doc.path), out=out, data=[DATA])
    return ran, cm.open(out)


@pytest.fixture(scope="module")
def layer_pos(engines, tmp_path_factory):
    return _run(engines, tmp_path_factory, LAYER_POS, "layer_pos_sweep")[1]


@pytest.fixture(scope="module")
def pos_sweep(engines, tmp_path_factory):
    return _run(engines, tmp_path_factory, V2 / "pos_sweep.causalab.json", "pos_sweep")[1]


@pytest.fixture(scope="module")
def patching(engines, tmp_path_factory):
    return _run(engines, tmp_path_factory, V2 / "patching.causalab.json", "patching")[1]


@pytest.fixture(scope="module")
def dbm(engines, tmp_path_factory):
    """dbm.causalab.json, shortened: two sparsity weights, two epochs. (in memory, opened)."""
    raw = json.loads((V2 / "dbm.causalab.json").read_text())
    raw["steps"]["fit"]["epochs"] = 2
    raw["steps"]["fit"]["objective"][1][0]["sweep"] = [0.01, 3.0]
    return _run(engines, tmp_path_factory, raw, "dbm_short")


@pytest.fixture(scope="module")
def attention(engines, tmp_path_factory):
    """Layer 1's attention pattern over the last 6 queries of every row, saved as .safetensors."""
    raw = json.loads((V2 / "patching.causalab.json").read_text())
    raw["header"] = {"description": "the attention pattern, saved"}
    with_pattern(raw)
    return _run(engines, tmp_path_factory, raw, "attention", engine="nnterp")[1]


def _image(fig, gid):
    return next(a for ax in fig.axes for a in ax.get_images() if a.get_gid() == gid)


def _lines(fig, gid):
    return [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == gid]


def _texts(labels):
    return [t.get_text() for t in labels]


# --- heatmap ----------------------------------------------------------------------------------

@pytest.mark.parametrize("result", ["iia", "logit_diff"])
def test_heatmap_is_the_grid_in_sweep_order(layer_pos, result):
    grid = layer_pos.grid(result, "layers", "pos")
    fig = plot(layer_pos, result)
    image = _image(fig, "heatmap")
    np.testing.assert_array_equal(np.asarray(image.get_array()), np.array(grid.values))
    ax = image.axes
    assert _texts(ax.get_yticklabels()) == [label(v) for v in grid.rows]  # layers, as the sweep lists them
    # Opened from disk, a pass of bare indices recorded no tokens, so its ticks are the coordinates
    # (in memory they name the token too: test_plot_labels.py).
    assert _texts(ax.get_xticklabels()) == [label(v) for v in grid.columns]
    assert (ax.get_ylabel(), ax.get_xlabel()) == ("layers", "pos")
    unit = layer_pos.points[0].result(result).rows[0]["unit"]
    low, high = image.get_clim()
    if unit == "logit":
        bound = max(abs(v) for line in grid.values for v in line)
        assert (low, high) == (-bound, bound) and image.get_cmap().name == "RdBu_r"
    else:
        assert unit == "fraction" and (low, high) == (0.0, 1.0)
    shown = sorted(t.get_text() for t in ax.texts)
    assert shown == sorted(f"{v:.2f}" for line in grid.values for v in line)  # every cell annotated


def test_heatmap_axes_as_asked(layer_pos):
    fig = plot(layer_pos, "iia", x="layers", y="pos")
    grid = layer_pos.grid("iia", "pos", "layers")
    np.testing.assert_array_equal(np.asarray(_image(fig, "heatmap").get_array()), np.array(grid.values))
    assert choose(layer_pos, "iia", y="pos").x == "layers"  # one axis given: the other fills in


# --- line, bars -------------------------------------------------------------------------------

@pytest.mark.parametrize("result", ["iia", "logit_diff"])
def test_line_is_the_means_and_their_bootstrap_band(pos_sweep, result):
    fig = plot(pos_sweep, result, level=0.9)
    (mean,) = _lines(fig, "mean")
    results = [p.result(result) for p in pos_sweep.points]
    assert list(mean.get_ydata()) == [r.mean() for r in results]
    assert _texts(mean.axes.get_xticklabels()) == [label(p.coords["pos"]) for p in pos_sweep.points]
    (band,) = [c for c in mean.axes.collections if c.get_gid() == "ci"]
    corners = band.get_paths()[0].vertices
    for i, r in enumerate(results):
        assert {float(y) for x, y in corners if x == i} == set(r.ci(0.9))


def test_a_sweep_with_one_axis_fixed_is_a_line(layer_pos):
    one = layer_pos.select(layers=1)
    assert choose(one).kind == "line" and choose(one).x == "pos"
    (mean,) = _lines(plot(one, "logit_diff"), "mean")
    assert list(mean.get_ydata()) == [p.result("logit_diff").mean() for p in one.points]


def test_bars_of_every_saved_metric_with_its_ci(patching):
    fig = plot(patching)
    point = patching.point()
    assert [ax.get_xticklabels()[0].get_text() for ax in fig.axes] == list(point.saved())
    for ax, (name, result) in zip(fig.axes, point.saved().items()):
        assert ax.patches[0].get_height() == result.mean()
        (segments,) = [c.get_segments() for c in ax.collections]  # the error bar
        assert [float(y) for _, y in segments[0]] == list(result.ci())


# --- gate, fit --------------------------------------------------------------------------------

def test_gate_sweep_is_units_kept_against_the_metric(dbm):
    ran, opened = dbm
    assert choose(opened).kind == "gate"
    fig = plot(opened, "score/iia")
    data = fig.axes[0].containers[0].lines[0]
    kept = [int((p.saved_tensors()["mask.safetensors"]["theta"] > 0).sum()) for p in opened.points]
    assert list(data.get_xdata()) == kept
    assert list(data.get_ydata()) == [p.result("iia", "score").mean() for p in opened.points]
    # the saved mask is the fit's last state: its units kept are the last epoch's, as the fit counted them
    assert kept == [p.plan.steps["fit"].results["mask.kept"][-1].item() for p in ran.points]


def test_fit_curves_from_a_run_in_memory(dbm):
    ran, opened = dbm
    fig = plot(ran, kind="fit")
    for p in ran.points:
        curves = p.plan.steps["fit"].results
        for key in ("loss", "iia", "mask.kept"):
            (line,) = _lines(fig, f"{key}:{p.name}")
            assert list(line.get_ydata()) == curves[key].tolist()
    with pytest.raises(cm.PlanError, match="not on disk"):  # a fit's curves are never saved
        plot(opened, kind="fit")


# --- attention --------------------------------------------------------------------------------

def test_attention_pattern_of_one_row(attention):
    saved = attention.point().saved_tensors()["attention.safetensors"]["attn_out"].numpy()
    rows, queries, width = saved.shape
    heads = json.loads((MODELS / "tiny-llama" / "config.json").read_text())["num_attention_heads"]
    per_head = saved[2].reshape(queries, heads, width // heads).transpose(1, 0, 2)
    assert choose(attention, "attn_out").result == "attention.safetensors"
    np.testing.assert_allclose(np.asarray(_image(plot(attention, "attn_out", row=2), "attention").get_array()),
                               per_head.mean(axis=0), rtol=0, atol=1e-7)
    image = _image(plot(attention, "attention.safetensors", row=2, head=3), "attention")
    np.testing.assert_array_equal(np.asarray(image.get_array()), per_head[3])
    assert len(image.axes.get_xticks()) == width // heads and len(image.axes.get_yticks()) == queries
    with pytest.raises(cm.PlanError, match=r"row 9: not a row .* give 0 to 3"):
        plot(attention, "attn_out", row=9)
    with pytest.raises(cm.PlanError, match=r"heads: \[0, 1, 2, 3\]"):
        plot(attention, "attn_out", head=7)
    assert choose(attention).kind == "bars"  # the metrics first; the pattern when asked


# --- files, the command line, determinism -----------------------------------------------------

def test_cli_writes_a_png_of_the_fixed_size_with_the_same_bytes(layer_pos, tmp_path):
    out = tmp_path / "heatmap.png"
    done = subprocess.run([*cli_command(), "plot", str(layer_pos.out), "--result", "iia", "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    pixels = imread(out)
    assert pixels.shape[:2] == (480, 640)  # 6.4 x 4.8 inches at 100 dpi
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50  # not blank
    again = save(plot(layer_pos, "iia"), tmp_path / "again.png")  # another process, the same bytes
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_two_renders_are_byte_identical(pos_sweep, tmp_path, suffix):
    first, second = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
    plot(pos_sweep, "logit_diff", path=first)
    plot(pos_sweep, "logit_diff", path=second)
    assert first.read_bytes() == second.read_bytes()


def test_cli_default_file_name(pos_sweep, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plot", str(pos_sweep.out)]) == 0
    assert capsys.readouterr().out.strip() == "pos_sweep-iia.png"
    assert imread(tmp_path / "pos_sweep-iia.png").shape[:2] == (480, 640)


# --- refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("args, said", [
    (["--result", "nope"], "error: PlanError: result 'nope': not a result of this run (a run opened from disk "
                           "has what it saved); results: iia, logit_diff"),
    (["--x", "heads"], "error: PlanError: plot(x='heads'): not an axis of this run; axes: layers, pos"),
    (["--kind", "gate"], "error: PlanError: kind 'gate': no gate's mask is saved"),
    (["--kind", "attention"], "error: PlanError: kind 'attention': this run saves no attention_probs output"),
    (["-o", "figure.jpg"], "error: PlanError: figure.jpg: not a figure file this writes; end it in .png, .svg, .pdf"),
])
def test_refusals_name_the_choices(layer_pos, capsys, args, said):
    assert cli.main(["plot", str(layer_pos.out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and "Traceback" not in err


def test_an_ambiguous_metric_names_its_steps(dbm):
    with pytest.raises(cm.PlanError, match="name the step: fit/iia, score/iia"):
        plot(dbm[1], "iia")


def test_without_matplotlib_the_extra_is_named(layer_pos, monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    with pytest.raises(cm.PlanError, match=r'matplotlib is not installed; pip install "causalab-mini\[plots\]"'):
        plot(layer_pos)
    assert cli.main(["plot", str(layer_pos.out), "-o", str(tmp_path / "x.png")]) == 2
    assert "causalab-mini[plots]" in capsys.readouterr().err

"""The HTML report in a real browser: headless chromium opens the page ``causalab-mini report``
writes for layer_pos_sweep (2 × 3) and patching, run on the hooks engine.

Why a browser: tests/test_report.py reads the markup with Python's HTML parser, which says what
the page holds, not what a person sees. Here chromium decodes and lays it out: (a) every embedded
image loads and decodes at the size its tag declares; (b) the means in the DOM chromium builds
(``data-value`` and the shown text) are the run's own, and both sections and the heatmaps are
there; (c) a screenshot of the page is the window's size and not blank. Every expected value
comes from the run (``cm.open``), never typed in. Skipped only where chromium is not installed.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile

import pytest
from paths import V2
from report_page import ReportPage as Dom

import causalab_mini as cm
from causalab_mini import cli

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.usefixtures("one_thread")

LAYER_POS = V2 / "layer_pos_sweep.causalab.json"
PATCHING = V2 / "patching.causalab.json"
WIDTH, HEIGHT = 1200, 2000
BACKGROUND = "f6f7f9"  # the page's body background (report/html.py's STYLE)

# Sets, once the page has loaded, how many images it has and how many decoded (and at what size).
PROBE = """<script>window.addEventListener("load", () => {
  const images = Array.from(document.images);
  document.body.dataset.images = images.length;
  document.body.dataset.loaded = images.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.natural = JSON.stringify(images.map(i => [i.naturalWidth, i.naturalHeight]));
});</script>"""


@pytest.fixture(scope="module")
def chromium():
    found = shutil.which("chromium")
    if found is None:
        pytest.skip("Debian's chromium is not installed; .ci/run installs it (apt-get install chromium)")
    return found


@pytest.fixture(scope="module")
def page(engines, tmp_path_factory):
    """The two runs' folders (by document path) and the page the CLI wrote from them."""
    base = tmp_path_factory.mktemp("report_browser")
    out = {LAYER_POS: base / "layer_pos", PATCHING: base / "patching"}
    for path, folder in out.items():
        cm.run(path, loaded=engines(path, "hooks"), out=folder)
    written = base / "page" / "index.html"
    assert cli.main(["report", *map(str, out.values()), "-o", str(written)]) == 0
    return out, written


def browse(chromium, tmp_path, *args) -> subprocess.CompletedProcess:
    """Headless chromium with a fresh profile and nothing reached over a network (its dbus noise on
    stderr is ignored)."""
    profile = tempfile.mkdtemp(prefix="profile-", dir=tmp_path)
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--disable-quic", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
               f"--window-size={WIDTH},{HEIGHT}", *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def dump(chromium, tmp_path, html) -> Dom:
    """The DOM chromium builds from the file ``html``, once loaded and its images decoded."""
    return Dom(browse(chromium, tmp_path, "--virtual-time-budget=5000", "--dump-dom", html.as_uri()).stdout)


def test_every_image_loads_at_the_size_its_tag_declares(chromium, page, tmp_path):
    _, written = page
    text = written.read_text(encoding="utf-8")
    original = Dom(text)
    assert len(original.figures) >= 3  # two heatmaps of the sweep, patching's bars
    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    body = dump(chromium, tmp_path, probed).body
    assert int(body["data-images"]) == int(body["data-loaded"]) == len(original.figures)
    declared = [[int(img["width"]), int(img["height"])] for img in original.images]
    assert json.loads(body["data-natural"]) == declared


def test_the_means_in_the_dom_are_the_runs(chromium, page, tmp_path):
    out, written = page
    dom = dump(chromium, tmp_path, written)
    got = {(m["point"], m["result"]): m for m in dom.means}
    expected = {}
    for folder in out.values():
        for point in cm.open(folder).points:
            for name, result in point.saved().items():
                expected[point.name, name] = result.mean()
    assert expected and set(got) == set(expected)
    for key, mean in expected.items():
        assert float(got[key]["value"]) == mean, key  # repr round-trips: the exact float
        assert got[key]["text"].strip() == f"{mean:.4g}", key
    names = {path: cm.open(folder).record["document"] for path, folder in out.items()}
    assert {s["data-document"]: s["data-outcome"] for s in dom.sections} == dict.fromkeys(names.values(), "passed")
    # The sweep's two axes get a heatmap for each metric it saves: iia and logit_diff.
    saved = {name for point in cm.open(out[LAYER_POS]).points for name in point.saved()}
    heatmaps = {f["data-result"] for f in dom.figures if f["data-kind"] == "heatmap"
                and f["section"] == names[LAYER_POS]}
    assert heatmaps == saved and {"iia", "logit_diff"} <= saved


def test_a_screenshot_is_the_windows_size_and_not_blank(chromium, page, tmp_path):
    import numpy as np
    from matplotlib.image import imread

    _, written = page
    shot = tmp_path / "page.png"
    browse(chromium, tmp_path, f"--screenshot={shot}", written.as_uri())
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (WIDTH, HEIGHT)
    pixels = np.round(imread(shot)[..., :3] * 255).astype(int).reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 1
    background = np.array(list(bytes.fromhex(BACKGROUND)))
    differing = np.any(pixels != background, axis=1).mean()
    assert (pixels == background).all(axis=1).any()  # the page's own style applied: its background shows
    assert differing > 0.25, f"only {differing:.1%} of the screenshot differs from the page's background"

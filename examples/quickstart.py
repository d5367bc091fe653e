"""Quick start: one experiment through causalab-mini's Python API, top to bottom.

    python examples/quickstart.py [OUT_DIR]            # from any directory
    QUICKSTART_ENGINE=nnterp python examples/quickstart.py

The experiment is documents/v2/layer_pos_sweep.causalab.json: activation patching of the
residual stream on the shipped tiny-llama, swept over 2 layers x 3 token positions (6
points, 30 weekday prompts each). iia is the fraction of rows where the patched model says
the counterfactual prompt's answer. The run is written to OUT_DIR (default: a fresh
temporary folder), then read back from disk without the model.
"""
import os
import sys
import tempfile
from pathlib import Path

import causalab_mini as cm

REPO = Path(__file__).resolve().parent.parent  # the checkout: examples/..
DOCUMENT = REPO / "documents" / "v2" / "layer_pos_sweep.causalab.json"
ENGINE = os.environ.get("QUICKSTART_ENGINE", "hooks")  # hooks: plain torch hooks, the fastest here
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="causalab-quickstart-"))


def show(grid: cm.Grid) -> None:
    """A grid as an aligned table: one line per row-axis value, one column per column-axis value."""
    print(f"{grid.row_axis:<8}" + "".join(f"{f'{grid.column_axis}={c}':>9}" for c in grid.columns))
    for value, cells in zip(grid.rows, grid.values):
        print(f"{value:<8}" + "".join(f"{cell:>9.3f}" for cell in cells))


# 1. Read: parse the JSON, lower the sweep into its points, validate. No model is loaded yet.
doc = cm.read(DOCUMENT)
print(f"{doc.name}: {len(doc.points)} points on {doc.model.key}, engine {ENGINE}")

# 2. Run: load the model (found under documents/models, the rows under documents/data, both
#    searched upwards from the document), compute every point, and commit the run to OUT whole.
run = cm.run(doc, engine=ENGINE, out=OUT / doc.name)

# 3. The mean iia of every point, laid out as layers x positions.
grid = run.grid("iia", "layers", "pos")
print("iia, mean over rows:")
show(grid)

# 4. One point, with a seeded percentile-bootstrap 95% interval of its mean.
iia = run.point(layers=0, pos=-1).result("iia")
low, high = iia.ci(0.95)
print(f"layers=0,pos=-1: iia mean {iia.mean():.3f} over {len(iia)} rows, 95% CI [{low:.3f}, {high:.3f}]")

# 5. Open the folder the run wrote: the same results, read back from disk, with no model and no rerun.
print(f"wrote {run.out}")
again = cm.open(run.out)
same = again.grid("iia", "layers", "pos").values == grid.values
print(f"reopened {again.engine} run from disk: same grid: {same}")
assert same, "the run read back from disk differs from the run in memory"

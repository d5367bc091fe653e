"""A researcher's own tests on an experiment's results, through the ``causalab`` fixture.

Run from this folder: ``cd examples && pytest`` (pytest.ini here pins the engine, the model and
data folders; conftest.py sets the batch size of every point). The document is the corpus's
documents/v2/pos_sweep.causalab.json: activation patching at layer 0 of tiny-llama on the 4
weekday prompts, with the patched position swept over pos = -1, -2, -3.

``causalab.run(path)`` runs each point once per session (a second test asking for the same
document reuses it) and returns a ``causalab_mini.Run``.
"""
import json

from pytest_causalab.asserts import assert_result

# Relative to the rootdir, which is this folder (pytest.ini is here). The corpus's own document,
# not a copy: a .causalab.json under this folder would also be collected as test items of its
# own, with a baseline folder of its own to keep.
POS_SWEEP = "../documents/v2/pos_sweep.causalab.json"


def test_patching_the_last_token_moves_the_answer(causalab):
    point = causalab.run(POS_SWEEP).point("pos=-1")
    iia = point.result("iia")
    assert len(iia) == 4  # every row scored: no two compared answers share a token
    assert iia.mean() > 0.5  # measured: 0.75 (3 of the 4 rows take the counterfactual's answer)
    assert_result(point, "iia", eligible=1.0, mean=("between", 0.5, 1.0))
    # logit_diff = logit(cf_answer) - logit(base_answer): positive on some row, not on all.
    assert_result(point, "logit_diff", max=(">", 1.0), min=("<", 0))


def test_patching_an_earlier_token_never_moves_the_answer(causalab):
    run = causalab.run(POS_SWEEP)
    for pos in (-2, -3):
        point = run.point(pos=pos)
        assert point.result("iia").max() == 0  # not one row changes its answer
        assert_result(point, "logit_diff", all=("<", -1.0))  # the base answer stays ahead on every row


def test_the_answer_lives_only_at_the_last_token(causalab):
    grid = causalab.run(POS_SWEEP).grid("iia", "pos")  # one axis: one column, the mean per position
    means = {pos: cells[0] for pos, cells in zip(grid.rows, grid.values)}
    assert means[-1] > means[-2] == means[-3] == 0


def test_every_point_ran_as_conftest_and_ini_say(causalab):
    run = causalab.run(POS_SWEEP)
    assert run.engine == "hooks"  # pytest.ini: causalab_engine = hooks
    for point in run.points:
        record = json.loads((point.out / "run.json").read_text())  # what the run wrote beside its results
        assert record["batch_size"] == 2  # conftest.py: pytest_causalab_modify_point
        assert record["engine"] == "HooksEngine"

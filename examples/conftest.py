"""Project-wide settings for this folder's tests, as a researcher would keep them.

pytest_causalab calls ``pytest_causalab_modify_point`` once per sweep point per engine, just
before the point runs, with the point's own document (a copy) and its batch size to change.
"""

# hub_model.causalab.json needs the Hugging Face hub (or gpt2 already in the local cache), so
# a plain `pytest` here does not collect it; ask for it by name where the hub is reachable:
# `pytest hub_model.causalab.json`. (A file given on the command line is collected even
# though it is listed here.)
collect_ignore = ["hub_model.causalab.json"]


def pytest_causalab_modify_point(point, config):
    # Two rows per forward pass, for every point. On a real model the whole dataset in one
    # batch is what runs out of memory first; a small batch bounds it. Rows are padded and
    # masked, so the batch size moves a number only by float rounding (about 1e-6 on
    # logit_diff here, inside the baselines' tolerance) and never a match. It is not part of
    # the experiment: the point's produced_by, and so its baseline, stay the same. Each point's
    # run.json records the batch size it ran with (test_my_model.py checks it).
    point.batch_size = 2

"""The sweep benchmark's hand-written variants (``benchmarks/sweep.py``): what a researcher writes
without the project — a minimal hook loop (2P forwards), the P + 1 floor, the same floor written
with nnsight's traces, and pyvene's own loop — each returning ``{point: [logit_diff per row]}`` for
the tables to hold every variant to."""
from __future__ import annotations

from pathlib import Path


def hidden_of(output):
    """A decoder layer's hidden states (older families return a tuple)."""
    return output[0] if isinstance(output, tuple) else output


def replaced(output, hidden):
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


def blocks(model):
    """The decoder layers: Llama's ``model.layers``, GPT-2's ``transformer.h`` (``lens.py``)."""
    return model.model.layers if hasattr(model, "model") else model.transformer.h


def prepared(directory: Path, doc: Path, device: str) -> list[dict]:
    """Per point, what a hand-written loop needs: the two forwards' model inputs, the layer and
    position, and the logit_diff's token ids. The plan (share=False) is only the tokenizer here."""
    from causalab_mini import api
    from causalab_mini.engine import taps
    from causalab_mini.plan.plan import Plan

    plan = api.compile(doc, engine="hooks", models=[directory / "models"], data=[directory / "data"],
                       share=False)
    points = []
    for name, point in plan.steps.items():
        if not isinstance(point, Plan):
            continue
        obs = point.steps["score"]
        cf, base = obs.forwards
        (read,) = cf.reads
        (metric,) = [m for m in obs.metrics if m.kind == "logit_diff"]
        points.append({"name": name, "layer": read.address.layer, "index": read.where.index,
                       "cf": taps.model_inputs(cf, device), "base": taps.model_inputs(base, device),
                       "cf_ids": cf.ids, "ids": metric.token_ids, "eligible": metric.column_eligible})
    return points


def logit_diffs(logits, point) -> list:
    """Per row, logit[a] - logit[b] at the last position (None where the metric excludes the row)."""
    return last_logit_diffs(logits[:, -1], point)


def last_logit_diffs(last, point) -> list:
    """``logit_diffs`` of the last position's logits, already taken ``(rows, vocab)``."""
    (a, b) = point["ids"]
    return [float(last[r, a[r]] - last[r, b[r]]) if ok else None for r, ok in enumerate(point["eligible"])]


def patched_forward(model, point, value):
    """The base forward with ``value`` swapped in at the point's layer and position."""
    index = point["index"]

    def patch(_module, _args, output):
        hidden = hidden_of(output).clone()
        hidden[:, index] = value
        return replaced(output, hidden)

    handle = blocks(model)[point["layer"]].register_forward_hook(patch)
    try:
        return model(**point["base"]).logits
    finally:
        handle.remove()


def minimal_sweep(model, points) -> dict:
    """Per point: the counterfactual forward read by a hook, then the patched forward."""
    import torch

    out = {}
    with torch.no_grad():
        for point in points:
            saved = {}
            index = point["index"]
            handle = blocks(model)[point["layer"]].register_forward_hook(
                lambda m, a, o: saved.__setitem__("v", hidden_of(o)[:, index].clone()))
            try:
                model(**point["cf"])
            finally:
                handle.remove()
            out[point["name"]] = logit_diffs(patched_forward(model, point, saved["v"]), point)
    return out


def floor_sweep(model, points) -> dict:
    """One counterfactual forward reading every (layer, position) the sweep needs, then one
    patched forward per point."""
    import torch

    if len({p["cf_ids"] for p in points}) != 1:  # the floor holds only when every point reads one prompt set
        raise AssertionError("the points' counterfactual forwards differ: there is no single forward to share")
    wanted: dict[int, set] = {}
    for p in points:
        wanted.setdefault(p["layer"], set()).add(p["index"])
    saved: dict = {}

    def reader(layer):
        def read(_module, _args, output):
            for index in wanted[layer]:
                saved[layer, index] = hidden_of(output)[:, index].clone()
        return read

    out = {}
    with torch.no_grad():
        handles = [blocks(model)[layer].register_forward_hook(reader(layer)) for layer in wanted]
        try:
            model(**points[0]["cf"])
        finally:
            for h in handles:
                h.remove()
        for point in points:
            value = saved[point["layer"], point["index"]]
            out[point["name"]] = logit_diffs(patched_forward(model, point, value), point)
    return out


def nnsight_floor_sweep(lm, points) -> dict:
    """The floor written with nnsight (``lm``: ``nnsight.LanguageModel(model, dispatch=False)``): one
    trace of the counterfactual prompts saving every (layer, position) the sweep reads, then one
    trace per point writing the saved value into its layer's output and saving the logits' last
    position. What nnsight itself costs over raw torch hooks, for the nnterp engine to be read
    against. The trace blocks are nnsight's: their source is compiled from this file."""
    import torch

    if len({p["cf_ids"] for p in points}) != 1:
        raise AssertionError("the points' counterfactual forwards differ: there is no single forward to share")
    wanted: dict[int, set] = {}
    for p in points:
        wanted.setdefault(p["layer"], set()).add(p["index"])
    layers = lm.model.layers
    saved: dict = {}  # filled inside the trace: a name first bound there does not come back out
    out = {}
    with torch.no_grad():
        with lm.trace(points[0]["cf"]):
            for layer in sorted(wanted):
                hidden = hidden_of(layers[layer].output)
                for index in sorted(wanted[layer]):
                    saved[layer, index] = hidden[:, index].clone().save()
        for point in points:
            value, index, got = saved[point["layer"], point["index"]], point["index"], {}
            with lm.trace(point["base"]):
                output = layers[point["layer"]].output
                hidden = hidden_of(output).clone()
                hidden[:, index] = value
                layers[point["layer"]].output = replaced(output, hidden)
                got["last"] = lm.lm_head.output[:, -1].save()
            out[point["name"]] = last_logit_diffs(got["last"], point)
    return out


def pyvene_sweep(model, points) -> dict:
    """pyvene's own loop: an IntervenableModel per point (it is built for one site), the source
    forward run inside every call. Its positions are absolute, so -k is counted from each batch's
    (left-padded) length."""
    import pyvene as pv
    import torch

    out = {}
    with torch.no_grad():
        for point in points:
            config = pv.IntervenableConfig(
                representations=[{"layer": point["layer"], "component": "block_output", "unit": "pos",
                                  "max_number_of_units": 1}],
                intervention_types=pv.VanillaIntervention)
            wrapped = pv.IntervenableModel(config, model)
            rows, cf_len = point["base"]["input_ids"].shape[0], point["cf"]["input_ids"].shape[1]
            base_len = point["base"]["input_ids"].shape[1]
            where = ([[[cf_len + point["index"]]] * rows], [[[base_len + point["index"]]] * rows])
            _, patched = wrapped(point["base"], [point["cf"]], unit_locations={"sources->base": where})
            out[point["name"]] = logit_diffs(patched.logits, point)
    return out

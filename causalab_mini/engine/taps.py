"""What both engines do at one address, given the tensor found there.

An engine's only job at a tap is to find the activation (``(rows, seq, width)``)
and put the result back; everything between — gathering each op's window,
the write seam, reads through a featurizer or a logits view — is this one
function, so the two engines cannot disagree about what a tap means.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from .. import kernel
from ..ops import intervene
from ..ops.featurizers import IDENTITY
from ..plan.plan import Forward, Tap
from ..vocab import MECHANISMS


def operand_value(op, values: dict):
    """A write's operand: a read of this pass or a published value (both in ``values``), or a number."""
    if op is None:
        return None
    if op.kind == "number":
        return float(op.value)
    return values[op.value]


# Shared with the kernel (kernel.py), which runs a remote tap the way ``run_tap`` runs one here:
# ``conform(operand, x)`` lays out an operand read in the other layout than the write's (a
# rectangular read feeding a ragged write holds the same positions in the same row order once the
# walk has checked each row's count, ``passes._check_operands``); ``fires(op_step, step)`` says
# whether an op fires at decode step ``step`` (a prompt-frame op at the prefill, step 0; ``k`` at
# step k; an ``all`` write and a read of a cut of the continuation, ``stack``, at every step).
conform = kernel.conform
fires = kernel.fires


def _window(op, forward: Forward, act: Tensor, step: Optional[int]):
    """The op's window into ``act``: resolved by the walk, or — at a decode step — the step's own position.

    Past the prefill a step's forward sees one position; at the prefill the step is the
    prompt's last token. Either way it is the last index of whatever the sequence axis has.
    """
    if step is None or op.step is None:
        return forward.window(op.name)
    return kernel.last_window(act), False


def run_tap(act: Tensor, tap: Tap, forward: Forward, values: dict, featurizers: dict,
            project: Optional[Callable[[Tensor], Tensor]] = None, step: Optional[int] = None) -> Tensor:
    """Apply ``tap``'s writes in order, then its reads, to ``act``; return the (new) activation.

    ``project`` pushes residual vectors through ln_final → lm_head → softcap, for
    a read with ``view: "logits"``. ``step`` is the decode step this forward call is
    (None when the forward does not decode): only the ops that fire there act, and a
    read of a cut of the continuation appends this step's value to its stack.
    """
    columns = tap.address.columns
    before = act  # f0: the address's value before this pass's first write, captured once
    for w in tap.writes:
        if not fires(w.step, step):
            continue
        mine = _rows(act, w.rows)
        window, ragged = _window(w, forward, mine, step)
        x = intervene.gather(mine, window, ragged=ragged, features=columns, path=w.name)
        f0 = None
        if MECHANISMS[w.mechanism].needs_f0:
            f0 = intervene.gather(_rows(before, w.rows), window, ragged=ragged, features=columns, path=w.name)
        new = intervene.apply_write(
            x, featurizer=featurizers.get(w.featurizer, IDENTITY) if w.featurizer else IDENTITY,
            mechanism=w.mechanism, params=dict(w.params), operand=conform(operand_value(w.operand, values), x),
            f0=f0, features=w.features, path=w.name)
        written = intervene.scatter(mine, window, new, ragged=ragged, features=columns, path=w.name)
        act = written if w.rows is None else _put_rows(act, w.rows, written)
    for r in tap.reads:
        if not fires(r.step, step):
            continue
        mine = _rows(act, r.rows)
        window, ragged = _window(r, forward, mine, step)
        x = intervene.gather(mine, window, ragged=ragged, features=columns, path=r.name)
        if r.view == "logits":
            x = project(x)
        elif r.featurizer:
            with intervene.exact():
                x, _ = featurizers[r.featurizer].featurize(x.float())
        if r.step == "stack":
            values.setdefault(r.name, []).append(x)
        else:
            values[r.name] = x
    return act


# The batch rows an op acts on (all of them, or its own point's when points run at once), and
# ``act`` with rows [a, b) replaced by ``part`` (a new tensor: the others are untouched).
_rows = kernel.rows_of
_put_rows = kernel.put_rows


def run_flat_tap(act: Tensor, rows: int, *args) -> Tensor:
    """``run_tap`` at a module the family hands its tokens flattened, ``(rows·seq, width)``:
    seen as ``(rows, seq, width)``, and what the tap returns put back flat."""
    x = act.reshape(rows, -1, act.shape[-1])
    new = run_tap(x, *args)
    return act if new is x else new.reshape(act.shape)


def finish_decode(forward: Forward, values: dict, sequences: Tensor) -> None:
    """After a decode: each stacked read as ``(rows, steps, width)``, and ``<model>.generated`` published.

    ``sequences`` is what generation returned, prompt included; the published ids are
    the ``decode`` tokens after it.
    """
    for r in forward.reads:
        if r.step == "stack":
            values[r.name] = torch.cat(values.pop(r.name), dim=1)
    values[f"{forward.model}.generated"] = sequences[:, forward.tokens:].detach().cpu()


def generation_options(forward: Forward, tokenizer) -> dict:
    """``generate`` arguments shared by both engines: exactly ``decode`` greedy tokens.

    min_new_tokens = max_new_tokens holds EOS off, so the decode is a bound and the batch
    stays rectangular: step k is step k on every row. Sampling options are cleared so a
    checkpoint's own generation_config cannot turn them on; compile_config is cleared
    because a decode here is a handful of steps, not worth compiling (and transformers
    warns when a device map rules it out).
    """
    from ..ops.locate import pad_id

    return {"max_new_tokens": forward.decode, "min_new_tokens": forward.decode, "do_sample": False,
            "pad_token_id": pad_id(tokenizer), "num_beams": 1, "temperature": None, "top_p": None,
            "top_k": None, "compile_config": None,
            # Every position's logits at the prefill: a prompt-frame read at the head is at its
            # own index, not only the last one generate would otherwise keep.
            "logits_to_keep": 0}


def logit_projection(norm: Callable[[Tensor], Tensor], head: Callable[[Tensor], Tensor],
                     transform) -> Callable[[Tensor], Tensor]:
    """``project`` for a read with ``view: "logits"``: final norm → head → the family's output transform.

    ``transform`` is the family's ``families.OutputTransform``, applied in the order the
    model's own forward applies it: Cohere's scale, Granite's divisor, Gemma-2/3's final
    softcap (``tanh(x / c) * c``). So a lens at the last layer is the model's own logits.
    Both engines build their ``project`` here, so a lens read means the same on each.
    """
    def project(x: Tensor) -> Tensor:
        # The transform is the kernel's, which a stock server applies to a remote lens read.
        return kernel.output_transform(head(norm(x)), transform.multiply, transform.divide, transform.softcap)

    return project


def forced_rows(forward: Forward) -> tuple[list, list]:
    """A teacher-forced forward's (ids, mask): each row's answer tokens after its whole padded
    prompt, then padding (id 0, masked) to the longest answer. The prompt keeps its columns, so the
    windows resolved against it hold; a causal model's prompt positions do not see what follows,
    and the position ids (counted over the mask) run on from the prompt's last real token."""
    longest = max((len(a) for a in forward.forced), default=0)
    ids, mask = [], []
    for row, m, answer in zip(forward.ids, forward.mask, forward.forced):
        pad = longest - len(answer)
        ids.append(list(row) + list(answer) + [0] * pad)
        mask.append(list(m) + [1] * len(answer) + [0] * pad)
    return ids, mask


def forced_window(forward: Forward) -> tuple[tuple[int, ...], ...]:
    """Per row, the positions whose logits predict the forced answer's tokens: the prompt's last
    real token, then each forced token but the last (none for a row without an answer)."""
    width = len(forward.ids[0]) if forward.ids else 0
    out = []
    for m, answer in zip(forward.mask, forward.forced):
        last = max(i for i, v in enumerate(m) if v) if any(m) else width - 1
        out.append((last, *range(width, width + len(answer) - 1)) if answer else ())
    return tuple(out)


def model_inputs(forward: Forward, device) -> dict:
    """The keyword arguments of one forward's model call — the same on both engines.

    Position ids count each row's real tokens from 0. transformers derives none from the
    mask, and an absolute-position family (GPT-2) would otherwise put a left-padded row's
    first token at the padding's position: the same prompt moves by ~4 logits with the
    width of its batch. Rotary families are unmoved by the shift, up to rounding. No cache:
    one forward has nothing to reuse, and on Gemma-2 building one takes another mask path
    whose logits are ~2e-6 away — both engines (and a reference) must make the same call.
    """
    rows, masks = forward.ids, forward.mask
    if forward.forced is not None:
        rows, masks = forced_rows(forward)
    ids = torch.tensor(rows, dtype=torch.long, device=device)
    mask = torch.tensor(masks, dtype=torch.long, device=device)
    return {"input_ids": ids, "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "use_cache": False}

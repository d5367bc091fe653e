"""HooksEngine: a plain ``AutoModelForCausalLM`` and ``register_forward_hook``.

No session, no tracing, no remote. One ``model(...)`` call per Forward, with a
hook on each module a tap names, reading and writing on the way through. It
shares ``steps.py``, ``taps.py`` and ``ops/`` with the nnterp engine unchanged;
what it adds is finding the module (``standardize.py``), saying where the tensor
sits in that module's value (a ``Selection`` per component), and removing every
hook it registered however the forward ends.

What it refuses, by name: every interior no module boundary exposes
(attention_query/key/value, attention_probs: at compile time, through
``locate``); ``remote`` in any form; a model with no weights (a meta shell).
A decoding forward is ``model.generate`` with the same hooks firing at every
step, a pre-hook on the model counting the steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import EngineError
from . import loading, provenance, steps, taps
from .base import Engine
from .facts import ModelFacts
from .standardize import Standardized, standardize


# --- where the tensor sits inside a module's value ------------------------------------------

class _FirstIfTuple:
    """A module output that is the tensor, or a tuple whose first element is (attention returns (out, weights))."""

    def get(self, value):
        return value[0] if isinstance(value, tuple) else value

    def put(self, value, new):
        return (new, *value[1:]) if isinstance(value, tuple) else new


@dataclass(frozen=True)
class _Field:
    """A field of the model's own output: ``logits`` is ``output.logits``, after any softcap."""

    name: str

    def get(self, value):
        return getattr(value, self.name) if hasattr(value, self.name) else value[self.name]

    def put(self, value, new):
        value[self.name] = new  # a ModelOutput keeps its attribute and its key in step
        return value


@dataclass(frozen=True)
class _Argument:
    """A module input: positional ``index``, or the keyword ``name`` (Llama's attention takes kwargs)."""

    index: int
    name: str

    def get(self, args, kwargs):
        if len(args) > self.index:
            return args[self.index]
        if self.name in kwargs:
            return kwargs[self.name]
        raise EngineError("", f"the module was called without its {self.name!r} input "
                          f"(args: {len(args)}, kwargs: {sorted(kwargs)})")

    def put(self, args, kwargs, new):
        if len(args) > self.index:
            return (*args[:self.index], new, *args[self.index + 1:]), kwargs
        return args, {**kwargs, self.name: new}


_OUTPUT, _INPUT = "output", "input"
_HIDDEN = _Argument(0, "hidden_states")
_PROJECTION_INPUT = _Argument(0, "input")

# component -> (which standardized module, output or input, where the tensor sits in it)
_ROUTES: dict[str, tuple[str, str, Any]] = {
    "embeddings": ("embed_tokens", _OUTPUT, _FirstIfTuple()),
    "block_input": ("layers", _INPUT, _HIDDEN),
    "attention_z": ("o_projs", _INPUT, _PROJECTION_INPUT),  # (rows, seq, n_heads*head_dim)
    "attention_output": ("attentions", _OUTPUT, _FirstIfTuple()),
    "mlp_input": ("mlps", _INPUT, _HIDDEN),
    "mlp_hidden": ("down_projs", _INPUT, _PROJECTION_INPUT),  # Linear and GPT-2's Conv1D alike
    "mlp_output": ("mlps", _OUTPUT, _FirstIfTuple()),
    "block_output": ("layers", _OUTPUT, _FirstIfTuple()),
    "ln_final": ("ln_final", _OUTPUT, _FirstIfTuple()),
    "lm_head": ("lm_head", _OUTPUT, _FirstIfTuple()),
    "logits": ("model", _OUTPUT, _Field("logits")),
}


def _module(std: Standardized, address):
    route = _ROUTES.get(address.component)
    if route is None:  # locate refused it at compile time; a plan compiled elsewhere can still get here
        raise EngineError(address.spelling(), f"the hooks engine has no module boundary for "
                          f"{address.component}", "run this document with --engine nnterp")
    attr, kind, selection = route
    found = getattr(std, attr)
    if isinstance(found, tuple):
        found = found[address.layer]
    return found, kind, selection


def _hook(std: Standardized, tap, forward, values, featurizers, project, step):
    """Register one hook doing ``tap`` at its module; returns the handle. ``step[0]`` is the
    decode step of the call the hook fires in (None when the forward does not decode)."""
    module, kind, selection = _module(std, tap.address)

    def apply(act):
        new = taps.run_tap(act, tap, forward, values, featurizers, project, step[0])
        return None if new is act else new

    if kind == _INPUT:
        def pre_hook(_module, args, kwargs):
            new = apply(selection.get(args, kwargs))
            return None if new is None else selection.put(args, kwargs, new)

        return module.register_forward_pre_hook(pre_hook, with_kwargs=True)

    def hook(_module, _args, output):
        new = apply(selection.get(output))
        return None if new is None else selection.put(output, new)

    return module.register_forward_hook(hook)


class HooksEngine(Engine):
    name: ClassVar[str] = "hooks"

    def __init__(self, model, facts: ModelFacts, std: Standardized) -> None:
        self.model = model
        self._facts = facts  # holds the tokenizer: one object answers compile time and run time
        self._std = std
        # `.forward`, not the module call: a lens projects through the final norm and the head
        # outside their place in the model, and must not fire the taps registered on them.
        self._project = taps.logit_projection(std.ln_final.forward, std.lm_head.forward, facts.softcap)

    # --- loading ------------------------------------------------------------------------------

    @classmethod
    def load(cls, model_ref, *, document=None, models=None, device_map="cpu",
             trust_remote_code=False, attention_probs: bool = False) -> "HooksEngine":
        """The document's model as a frozen ``AutoModelForCausalLM``, its modules standardized.

        ``attention_probs`` is accepted so both engines load with one call, and changes
        nothing: no module boundary exposes the pattern, so ``locate`` refuses it here.
        """
        loading.quiet_loading()
        from transformers import AutoModelForCausalLM

        ref = loading.model_ref(model_ref)
        resolved = loading.resolve(ref.key, ref.revision, document=document, roots=models)
        roots = loading.model_roots(models, document)
        tokenizer = loading.load_tokenizer(resolved, roots)  # first: it reports an unreachable hub id
        try:
            model = AutoModelForCausalLM.from_pretrained(
                resolved.source, revision=loading.hub_revision(resolved), dtype=loading.torch_dtype(ref),
                device_map=device_map, use_safetensors=True, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as err:
            raise loading._hub_failure(resolved, err, roots) from None
        loading.freeze(model)
        facts = ModelFacts.from_config(model.config, tokenizer, key=ref.key, revision=resolved.revision)
        return cls(model, facts, standardize(model, facts))

    # --- compile time -------------------------------------------------------------------------

    def locate(self, site, *, path: str, engine=None):
        """A site as an Address with the hooks refusals applied, whatever ``engine`` asks for:
        this engine is the one that will run it."""
        return self._facts.locate(site, path=path, engine=self.name)

    @property
    def num_layers(self) -> int:
        return self._facts.num_layers

    def width(self, component: str) -> int:
        return self._facts.width(component)

    def heads(self, component: str) -> int:
        return self._facts.heads(component)

    @property
    def tokenizer(self):
        return self._facts.tokenizer

    # --- run time -----------------------------------------------------------------------------

    def execute(self, plan, *, remote=False, batch_size=None):
        """Walk ``plan`` here, in this process; ``remote`` in any form is refused."""
        if remote:
            raise EngineError(
                "remote", f"the hooks engine cannot run remote={remote!r}: a hook is a Python callable "
                "registered on a module in this process; there is nothing to ship",
                "run without remote, or with --engine nnterp / --engine ndif")
        if any(p.is_meta for p in self.model.parameters()):
            raise EngineError("model", "the hooks engine holds a model with no weights (a meta shell), "
                              "which has nowhere to run", "load it with its weights")
        plan.provenance.update(provenance.record(self, False, batch_size))
        steps.run(self, plan, batch_size=batch_size)
        return plan

    def forward(self, forward, values: dict, featurizers: dict) -> None:
        """One ``model(...)`` call with a hook per tap — or, when the forward decodes, one
        ``model.generate(...)`` with the same hooks firing at every step; every hook is
        removed however it ends."""
        inputs = taps.model_inputs(forward, self._std.embed_tokens.weight.device)
        handles = []
        step = [None if not forward.decode else -1]  # the decode step the model is on
        try:
            if forward.decode:
                def count(_module, _args):
                    step[0] += 1
                handles.append(self.model.register_forward_pre_hook(count))
            for tap in forward.taps:
                handles.append(_hook(self._std, tap, forward, values, featurizers, self._project, step))
            if forward.decode:
                # generate derives position ids from the mask itself, and needs its cache.
                sequences = self.model.generate(
                    input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                    **taps.generation_options(forward, self.tokenizer))
                taps.finish_decode(forward, values, sequences)
            else:
                self.model(**inputs)
        finally:
            for handle in handles:
                handle.remove()

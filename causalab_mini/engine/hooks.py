"""HooksEngine: a plain ``AutoModelForCausalLM`` and ``register_forward_hook``.

No session, no tracing, no remote. One ``model(...)`` call per Forward, with a
hook on each module a tap names, reading and writing on the way through. It
shares ``steps.py``, ``taps.py`` and ``ops/`` with the nnterp engine unchanged;
what it adds is finding the module (``standardize.py``), saying where the tensor
sits in that module's value (a ``Selection`` per component), and removing every
hook it registered however the forward ends.

Inside attention (q, k, v, the scores, the pattern) it listens on the attention seam the model
is served with (``attention.py``: a function registered with transformers, or — GPT-Neo, BLOOM —
the family's routine, ``attention_families.py``). What it refuses, by name: an interior of a model
whose attention no seam reaches (a document's own ``model.modules``; at compile time, through
``locate``); ``remote`` in any form; a model with no weights (a meta shell).
A decoding forward is ``model.generate`` with the same hooks firing at every
step, a pre-hook on the model counting the steps.
"""
from __future__ import annotations

from typing import ClassVar

from ..components import INPUT, INSIDE, INTERIORS
from ..errors import EngineError, Unsupported
from ..model import loading
from . import attention, provenance, standardize, steps, taps
from .base import Engine
from .complete import load_causal_lm
from ..model.facts import AnswersFromFacts, ModelFacts
from ..model.recipe import describe_model


# --- where the tensor sits inside a module's value ------------------------------------------

class _FirstIfTuple:
    """A module output that is the tensor, or a tuple whose first element is (attention returns (out, weights))."""

    def get(self, value):
        return value[0] if isinstance(value, tuple) else value

    def put(self, value, new):
        return (new, *value[1:]) if isinstance(value, tuple) else new


class _Logits:
    """The model's own output: ``logits`` is ``output.logits``, after any scale or softcap."""

    def get(self, value):
        return value.logits if hasattr(value, "logits") else value["logits"]

    def put(self, value, new):
        value["logits"] = new  # a ModelOutput keeps its attribute and its key in step
        return value


class _Input:
    """A module's activation input, positional or by the keyword its family uses."""

    get = staticmethod(standardize.first_input)
    put = staticmethod(standardize.put_first_input)


def _hook(module, where, tap, forward, values, featurizers, project, step):
    """Register one hook doing ``tap`` at ``where`` (a module and its side); returns the handle.
    ``step[0]`` is the decode step of the call the hook fires in (None when the forward does not decode)."""
    io, root = where.io, where.path == standardize.ROOT
    rows = len(forward.ids)

    def apply(act):
        if where.flat:
            new = taps.run_flat_tap(act, rows, tap, forward, values, featurizers, project, step[0])
        else:
            new = taps.run_tap(act, tap, forward, values, featurizers, project, step[0])
        return None if new is act else new

    if io == INPUT:
        def pre_hook(_module, args, kwargs):
            new = apply(_Input.get(args, kwargs))
            return None if new is None else _Input.put(args, kwargs, new)

        return module.register_forward_pre_hook(pre_hook, with_kwargs=True)

    selection = _Logits() if root else _FirstIfTuple()

    def hook(_module, _args, output):
        new = apply(selection.get(output))
        return None if new is None else selection.put(output, new)

    return module.register_forward_hook(hook)


class HooksEngine(AnswersFromFacts, Engine):
    name: ClassVar[str] = "hooks"

    def __init__(self, model, facts: ModelFacts) -> None:
        self.model = model
        self._facts = facts  # holds the tokenizer: one object answers compile time and run time
        self._where: dict = {}  # (component, layer) -> standardize.Where, found when first tapped

    def _found(self, component: str, layer, path: str) -> "standardize.Where":
        """Where a component is (``standardize.where``), looked up once per (component, layer)."""
        key = (component, layer)
        if key not in self._where:
            self._where[key] = standardize.where(self.model, self._facts, component, layer, path)
        return self._where[key]

    def _module(self, address):
        """The module a tap hooks, and where on it (the model itself for ``logits``)."""
        found = self._found(address.component, address.layer, address.spelling())
        return self.model.get_submodule(found.path), found

    def _project(self, x):
        """A lens: final norm → head → the family's output transform. ``.forward``, not the module
        call: it runs outside the modules' place in the model and must not fire their taps."""
        norm = self.model.get_submodule(self._found("ln_final", None, "view").path)
        head = self.model.get_submodule(self._found("lm_head", None, "view").path)
        return taps.logit_projection(norm.forward, head.forward, self._facts.transform)(x)

    # --- loading ------------------------------------------------------------------------------

    @classmethod
    def load(cls, model_ref, *, document=None, models=None, device_map="cpu",
             trust_remote_code=False, attention_probs: bool = False,
             attention_seam: bool = False) -> "HooksEngine":
        """The document's model as a frozen ``AutoModelForCausalLM``, its modules standardized.

        ``attention_seam``: some point taps inside attention (q, k, v, the scores, the pattern):
        the model is served with the attention seam that reaches them (engine/attention.py: the
        family's eager arithmetic, exactly — the registered function, or the family's routine),
        and run.json says so.
        ``attention_probs`` is accepted so both engines load with one call.
        """
        loading.quiet_loading()
        # Found, config and tokenizer read, facts built, as the compiler does (first: an unreachable
        # hub id and a directory's own code are refused before any weight is read).
        described = describe_model(model_ref, document=document, models=models,
                                   trust_remote_code=trust_remote_code)
        resolved = described.resolved
        try:
            model = load_causal_lm(resolved, dict(
                revision=loading.hub_revision(resolved), dtype=loading.torch_dtype(described.ref),
                device_map=device_map, use_safetensors=True, trust_remote_code=bool(trust_remote_code)))
        except (OSError, ValueError) as err:
            raise loading._hub_failure(resolved, err, described.roots) from None
        loading.freeze(model)
        layout = described.facts.layout
        if (attention_seam or attention_probs) and layout is not None and layout.attention_call:
            attention.serve(model)  # no seam (a document's own modules): interiors refused at compile time
        return cls(model, described.facts)

    # --- compile time -------------------------------------------------------------------------

    def locate(self, site, *, path: str, engine=None):
        """A site as an Address with the hooks refusals applied, whatever ``engine`` asks for:
        this engine is the one that will run it."""
        address = self._facts.locate(site, path=path, engine=self.name)
        self._module(address)  # found now, so a module the layout misplaces is refused at compile time
        if address.component in INTERIORS and not attention.served(self.model):
            # Chosen at load, never switched under a loaded model: another run on it would change.
            raise Unsupported(f"{path}.component", f"{address.component} is inside attention, reached through "
                              "the attention function the model is served with when it loads, and this "
                              "model was loaded without it", attention.LOAD_FIX)
        return address

    # --- run time -----------------------------------------------------------------------------

    def execute(self, plan, *, remote=False, batch_size=None, at_once=1, state=None):
        """Walk ``plan`` here, in this process; ``remote`` in any form is refused."""
        if remote:
            raise EngineError(
                "remote", f"the hooks engine cannot run remote={remote!r}: a hook is a Python callable "
                "registered on a module in this process; there is nothing to ship",
                "run without remote, or with --engine nnterp / --engine ndif")
        if any(p.is_meta for p in self.model.parameters()):
            raise EngineError("model", "the hooks engine holds a model with no weights (a meta shell), "
                              "which has nowhere to run", "load it with its weights")
        plan.provenance.update(provenance.record(self, False, batch_size, at_once))
        steps.run(self, plan, batch_size=batch_size, at_once=at_once, state=state)
        return plan

    def forward(self, forward, values: dict, featurizers: dict) -> None:
        """One ``model(...)`` call with a hook per tap — or, when the forward decodes, one
        ``model.generate(...)`` with the same hooks firing at every step; every hook is
        removed however it ends."""
        inputs = taps.model_inputs(forward, self.model.get_input_embeddings().weight.device)
        handles = []
        step = [None if not forward.decode else -1]  # the decode step the model is on
        try:
            if forward.decode:
                def count(_module, _args):
                    step[0] += 1
                handles.append(self.model.register_forward_pre_hook(count))
            inside = []  # taps inside attention: reached through the attention seam's listeners
            for tap in forward.taps:
                module, where = self._module(tap.address)
                if where.io == INSIDE:
                    inside.append(tap)
                    continue
                handles.append(_hook(module, where, tap, forward, values, featurizers, self._project, step))
            if inside and not attention.served(self.model):  # locate refused it; a plan made elsewhere may not
                raise EngineError(inside[0].address.spelling(), "this forward taps inside attention, and "
                                  "the model was loaded without the attention seam", attention.LOAD_FIX)
            listeners = attention.listeners(inside, lambda a: self._module(a)[0], forward, values,
                                            featurizers, step)
            with attention.listening(listeners):
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

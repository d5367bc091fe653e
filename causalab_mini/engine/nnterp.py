"""NNterpEngine: the plan walked through nnsight, at nnterp's standardized names.

The whole request is one ``model.session(...)`` around the shared walk
(``steps.run``); each Forward inside it is one ``model.trace(...)``. At each tap
the engine only finds the activation — ``(rows, seq, width)`` — at an address
and puts back what ``taps.run_tap`` returns; what a tap means is shared with the
hooks engine.

Where an address is: the envoy at the module path the family's layout gives
(``families.py`` through ``standardize.where``, the same rule the hooks engine hooks
by), its input or output — element 0 of a tuple. nnsight keeps every module's own
name beside nnterp's aliases, so one path serves both engines. nnterp is handed a
``RenameConfig`` from the same layout (its defaults miss Phi's ``final_layernorm`` and a
multimodal model's text layers), and an image-text model (Gemma-3 4b+) is loaded here
and handed over as a module, since nnsight's ``LanguageModel`` will not load it by name.
Beyond the module components:

    attention_query   ┐ the q / k / v arguments of the attention's ``attention_interface(``
    attention_key     ├ call: after the projection, the head reshape and the rotary embedding,
    attention_value   ┘ shown as (rows, seq, heads·head_dim); on GPT-Neo and BLOOM, which make no
                        such call, through the attention seam's family routine (attention.py)
    logits            the model's output ``.logits`` (after its output transform; last)
    attention_probs   nnterp's ``attention_probabilities[l]`` (the pattern after softmax and dropout,
                      what multiplies v), shown as (rows, queries, heads·keys), heads-major. It
                      needs eager attention, chosen at load: ``load(..., attention_probs=True)``
                      (``causalab_mini.load`` asks for it when a document names the component); an engine
                      loaded without it refuses the component at compile time, and so does a
                      family whose pattern nnterp 1.3.0 cannot reach (GPT-2, GPT-J, GPT-Neo).

nnsight 0.7.0 facts this module is built on (see tests/test_nnterp_engine.py):

* A trace's body is compiled from this file's source, so the trace blocks live here.
* Values are fetched in forward order (a later module first raises MissedProviderError).
  Taps that share one hooked value — several selections of one block output, or q, k
  and v, three arguments of one call — are grouped: fetched once, each tap's writes
  applied in order, stored once.
* An operation nested in another's ``.source`` (the pattern, inside the attention function)
  is reachable only inside a trace, and only before the outer call starts: the ``.source``
  access swaps the call's function, chosen before its inputs are handed over. So when q/k/v
  (that call's inputs) are tapped too, the pattern's envoy is reached before they are fetched.
* The trace body runs on nnsight's worker thread, where the caller's grad mode is not
  in force (torch's grad mode is per thread): the body sets it again.
* ``nnsight.save`` marks by ``id`` in a process-wide set that every *root* trace clears
  when it exits — and each ``model.trace`` inside the walk is a root trace (its frame is
  a plain function's, not a compiled trace body). So the session saves what comes home
  after the walk, never before it.
* nnsight re-raises an error from inside a trace or a session as a subclass of its type
  whose text is a traceback; this project's own refusals are re-raised as themselves.
"""
from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ..components import INPUT, PATTERNS
from ..errors import CausalabError, CompileError, EngineError, ModelError, Unsupported
from ..plan import plan as plan_module
from ..model import loading
from .. import kernel
from . import attention, provenance, steps, taps
from . import standardize, unwrap
from .complete import load_causal_lm
from ..model.facts import AnswersFromFacts, ModelFacts
from ..model.recipe import describe_model

# The call whose arguments are q, k and v after reshape and rotary, matched on the source
# line: nnsight names an operation {callable}_{occurrence}, and a line is what a reader sees.
INTERIOR_CALL = "attention_interface("
QKV_ARGUMENT = {"attention_query": 1, "attention_key": 2, "attention_value": 3}  # (self, q, k, v, mask, …)


# --- where a value is, and how the activation sits in it ---------------------
# How the (rows, seq, width) activation sits in what nnsight hands over, by kind — the kernel's
# ``get_value``/``put_value`` (kernel.py), which a stock server runs for a remote tap:
FIRST = ("first",)  # a module output, element 0 of a tuple
ITSELF = ("itself",)  # a module input
LOGITS = ("logits",)  # the model's output ``.logits``
PATTERN = ("pattern",)  # (rows, heads, queries, keys) seen as (rows, queries, heads·keys), heads-major


def _heads(index: int) -> tuple:
    """One (rows, heads, seq, head_dim) argument of a call, seen as (rows, seq, heads·head_dim)."""
    return ("heads", index)


@dataclass(frozen=True)
class _Point:
    """One value nnsight hands over: an envoy's (or a call's) output, input or inputs."""

    key: tuple  # taps with one key share one fetch
    envoy: Any  # an Envoy, or an OperationEnvoy of a module's .source
    attr: str  # "output", "input" or "inputs"
    kind: tuple  # how the activation sits in the value (FIRST, ITSELF, LOGITS, PATTERN, _heads(i))
    # envoy -> the envoy to fetch from, for an operation nested inside another's .source,
    # which nnsight resolves only inside a trace (attention_probs) ...
    inner: Optional[Callable] = None
    # ... and only before that operation's call starts: the key of a point at the call's
    # inputs (q/k/v), before whose fetch this one's target must be reached.
    within: Optional[tuple] = None
    flat: bool = False  # the module sees (rows·seq, width) (OPT's fc1/fc2): taps.run_flat_tap

    def get(self, value):
        """The activation (rows, seq, width) in the value handed over."""
        return kernel.get_value(self.kind, value)

    def put(self, value, new):
        """The value with its activation replaced by ``new``."""
        return kernel.put_value(self.kind, value, new)

    def target(self):
        """The envoy whose ``attr`` is read and written back; only inside a trace, in forward order."""
        return self.inner(self.envoy) if self.inner is not None else self.envoy


class NNterpEngine(AnswersFromFacts):
    name = "nnterp"

    def __init__(self, model, facts: ModelFacts):
        self.model = model  # nnterp.StandardizedTransformer, dispatched and frozen
        self._facts = facts
        self._calls: dict[int, str] = {}  # layer -> the attention_interface call's operation name
        self._where: dict = {}  # (component, layer) -> standardize.Where, found when first located

    # --- load -----------------------------------------------------------------
    @classmethod
    def load(cls, model_ref, *, document=None, models=None, device_map="cpu",
             trust_remote_code=False, attention_probs: bool = False,
             attention_seam: bool = False) -> "NNterpEngine":
        """The document's model through nnterp, weights dispatched at load, then frozen.

        ``attention_seam=True`` (a document tapping inside attention) serves the model with the
        attention function that reaches the scores and the pattern (attention.py); without it,
        ``attention_probs=True`` loads with eager attention so nnterp's own route reaches the pattern
        (``enable_attention_probs``, checked by nnterp at load). Off by default:
        eager is slower than the fused kernels and rounds differently from a default load.
        On a family whose pattern this engine refuses (GPT-2) it is ignored, so the
        document is refused at compile time by name rather than inside nnterp's check.
        """
        # With the attention seam (a document tapping inside attention) the pattern comes through it
        # too: nnterp's own route reads an eager source the served model no longer runs.
        return cls._standardized(model_ref, document=document, models=models, device_map=device_map,
                                 trust_remote_code=trust_remote_code, attention_probs=attention_probs,
                                 weights=True, attention_seam=attention_seam)

    @classmethod
    def _standardized(cls, model_ref, *, document, models, device_map, trust_remote_code, attention_probs,
                      weights: bool, attention_seam: bool = False) -> "NNterpEngine":
        """The model as nnterp's StandardizedTransformer: with its weights dispatched, or — ``weights=False``,
        the ndif engine's shell — its structure on the meta device, no weight file opened (nnsight's
        ``dispatch=False``; nnterp's ``remote=True`` checks its renaming by a scan, never a forward)."""
        loading.quiet_loading()

        # Config and tokenizer read the way explain reads them, so a missing model is refused
        # as a ModelError naming the key rather than inside nnsight — and nnsight is handed
        # that tokenizer, so the compiler and the run share one object.
        described = describe_model(model_ref, document=document, models=models,
                                   trust_remote_code=trust_remote_code, hash_weights=weights)
        ref, resolved, roots = described.ref, described.resolved, described.roots
        tokenizer, facts = described.tokenizer, described.facts
        # After the config and tokenizer: a model refused there (its own code, a missing key) is
        # refused before the ~5 s import that only this engine pays.
        from nnterp import StandardizedTransformer
        from nnterp.rename_utils import RenamingError

        # The attention seam, for a family it reaches (the registry's function, or GPT-Neo's and BLOOM's
        # routine); with it the pattern comes through it too. Else nnterp's own route to the pattern,
        # where it passes nnterp's check.
        seam = (attention_seam and weights and facts.layout is not None and facts.layout.attention_call)
        eager = (attention_probs and not seam and facts.refusal("attention_probs", cls.name) is None
                 and facts.layout is not None and facts.layout.attention_pattern)
        options = dict(revision=loading.hub_revision(resolved), device_map=device_map,
                       dtype=loading.torch_dtype(ref), trust_remote_code=bool(trust_remote_code),
                       use_safetensors=True)  # never pickle: a .bin is outside the revision pin
        source = resolved.source
        if not weights and facts.layout is not None and facts.layout.multimodal:
            raise Unsupported("model", f"{ref.key} is an image-text model, which this project loads as a "
                              "module (its weights read here) for nnsight to wrap", "run it with --engine "
                              "nnterp or --engine hooks where its weights fit")
        if weights:
            # Loaded here and handed over as a module: so transformers' load report is checked
            # (complete.py: no tensor initialised at random), and because nnsight's LanguageModel
            # will not load an image-text model by name (its text half runs on text documents).
            try:
                with loading.quiet_library_logs():  # the load report is checked, not printed
                    source = load_causal_lm(resolved, {**options, **({"attn_implementation": "eager"} if eager else {})})
            except (OSError, ValueError) as err:  # no safetensors weights, a broken file, ...
                raise loading._hub_failure(resolved, err, roots) from None
            if seam and facts.layout.attention_routine:
                # A routine swaps the attention modules' class, which nnsight must find when it wraps
                # their forwards (attention_families.py): served before the model is handed over.
                attention.serve(source)
            options = {}
        with loading.quiet_library_logs():
            try:
                # dispatch=True: nnsight otherwise loads weights on the first trace by *replacing*
                # the module, and a freeze applied before that would not be what runs.
                # nnterp checks its renaming by running ln_final; a checkpoint without one (OPT-350m)
                # cannot pass, and this engine finds every module through the layout anyway.
                checked = "ln_final" not in facts.absent
                shell = {} if weights else dict(remote=True, check_attn_probs_with_trace=False)
                model = StandardizedTransformer(
                    source, dispatch=weights, tokenizer=tokenizer, enable_attention_probs=eager,
                    rename_config=_rename_config(facts.layout), check_renaming=checked, **shell, **options)
                if eager and not checked:  # nnterp disables the pattern it did not check: check it alone
                    model.attention_probabilities.enabled = True
                    model.attention_probabilities.check_source(allow_dispatch=weights, use_trace=weights)
            except RenamingError as err:
                raise ModelError("model", f"nnterp 1.3.0 cannot standardize this {facts.family} model: "
                                 f"{str(err).splitlines()[0]}",
                                 "name its modules in the document's model.modules, or run it with "
                                 "--engine hooks") from None
            except (OSError, ValueError) as err:  # no safetensors weights, a broken file, ...
                raise loading._hub_failure(resolved, err, roots) from None
        loading.freeze(model._model)
        if seam:
            attention.serve(model._model)  # the registry's: a config switch (a routine's: served above)
        if weights:  # its forwards run here: each keeps nnsight's wrapping only where its taps are (unwrap.py)
            unwrap.manage(model._model, model.interleaver)
        return cls(model, facts)

    # --- compile-time members ---------------------------------------------------
    def locate(self, site, *, path: str, engine=None):
        address = self._facts.locate(site, path=path, engine=engine or self.name)
        component = address.component
        if not attention.served(self.model._model) and (
                (component in PATTERNS and (component == "attention_scores" or not self.model.attn_probs_available))
                or (component in QKV_ARGUMENT and self._routine)):
            # The scores, a pattern nnterp's own route does not serve, and a routine family's q/k/v:
            # through the attention seam (attention.py), chosen when the model loads.
            raise Unsupported(f"{path}.component", f"{address.component} is reached through the attention "
                              "function the model is served with when it loads, and this model was loaded "
                              "without it", attention.LOAD_FIX)
        if not self._seamed(address.component):
            self._point(address, path)  # every interior and projection is found now, not in a trace
        return address

    @property
    def _routine(self) -> bool:
        """The family's attention is reached by a routine of the seam's (GPT-Neo, BLOOM): its forward
        makes no ``attention_interface(`` call whose arguments nnsight could hand over."""
        return bool(self._facts.layout is not None and self._facts.layout.attention_routine)

    def _seamed(self, component: str) -> bool:
        """Whether ``component`` is reached through the attention seam, once the model is served with
        it: a pattern (nnterp's own route to the pattern reads an eager source it no longer runs), and
        a routine family's q, k and v."""
        return ((component in PATTERNS or (component in QKV_ARGUMENT and self._routine))
                and attention.served(self.model._model))

    # --- run ----------------------------------------------------------------------
    def execute(self, plan, *, remote=False, batch_size=None, at_once=1, state=None):
        """The walk here, each trace run as it closes; sent elsewhere (``remote``: NDIF, a backend,
        or ``"local"``, nnsight's simulated round trip), one session around the whole walk."""
        import nnsight

        options = _session_options(self.model, remote)
        plan.provenance.update(provenance.record(self, remote, batch_size, at_once))
        engine, model = self, self.model
        if not remote:
            # A session only gathers the walk into one request to ship; here it would add its own
            # capture and thread to every run for nothing.
            with _plain_errors():
                steps.run(engine, plan, batch_size=batch_size, at_once=at_once, state=state)
            return plan  # served_dtype: provenance.record read it off the model that ran
        # The block names only locals. nnsight ships the block's code with its module
        # globals, and its local simulation re-imports those with user modules blocked —
        # a second ``causalab_mini`` whose Plan is not the class of this plan — while the
        # locals are the caller's own objects. Remotely both resolve by import on the server.
        walk, results_of, save = steps.run, plan_module.results_of, nnsight.save
        # The server imports the walk's code from its own causalab-mini: checked against ours first.
        check, client = provenance.check_server, provenance.identity()
        seamed = sorted({t.address.spelling() for _, step in plan.walk() for f in getattr(step, "forwards", ())
                         for t in f.taps if self._seamed(t.address.component)})
        if seamed:
            # The seam's listeners run in this process's model call; a session's traces run where
            # it is sent, after this walk has returned, and would run without them.
            raise Unsupported(seamed[0], "reached through the attention function the model is served "
                              "with in this process, which a session sent elsewhere does not run",
                              "run this document without remote")
        with _plain_errors(), model.session(**options):
            server = check(client)
            walk(engine, plan, batch_size=batch_size, at_once=at_once, state=state)
            # What comes home is plain — strings and tensors by step path. Saved after the
            # walk: each trace inside it clears nnsight 0.7.0's saved set on exit.
            home = results_of(plan)
            # A server serves the dtype it chose; say what ran.
            home["served_dtype"] = str(model.lm_head.weight.dtype)
            home["server"] = server
            save(home)
        plan.provenance["served_dtype"] = home.pop("served_dtype")
        plan.provenance["server"] = home.pop("server")
        wire = getattr(options.get("backend"), "wire", None)  # a stand-in measures what crossed (remote.py)
        if wire is not None:
            plan.provenance["wire"] = dict(wire)
        plan_module.fill(plan, home)
        return plan

    def forward(self, forward, values: dict, featurizers: dict) -> None:
        """One ``model.trace`` — or, when the forward decodes, one ``model.generate`` whose step
        iterator applies each step's taps (prompt-frame taps at the prefill, step 0)."""
        seamed = [t for t in forward.taps if self._seamed(t.address.component)]
        groups = self._groups([t for t in forward.taps if not self._seamed(t.address.component)])
        model = self.model
        step = [None if not forward.decode else -1]  # the decode step the seam's call is in
        listeners = attention.listeners(  # the scores and the pattern (a routine's q/k/v), through the seam
            seamed, lambda a: model._model.get_submodule(self._found(a.component, a.layer, a.spelling()).path),
            forward, values, featurizers, step)
        project = self._project
        inputs = taps.model_inputs(forward, model._model.get_input_embeddings().weight.device)
        grad = torch.is_grad_enabled()  # the trace body runs in nnsight's worker thread
        # A nested operation's .source is reachable only before its call takes its inputs:
        # such a point's target is reached just before the group at those inputs is fetched.
        keys = {group[0][0].key for group in groups}
        ahead: dict[tuple, list[_Point]] = {}
        for group in groups:
            point = group[0][0]
            if point.within in keys:
                ahead.setdefault(point.within, []).append(point)
        apply = _apply_taps  # a local: the block names no module globals (see execute)
        unwrap.narrow(model._model, self._reached(forward.taps))
        if not forward.decode:
            with attention.listening(listeners), _plain_errors(), model.trace(inputs):
                with torch.set_grad_enabled(grad):
                    apply(groups, ahead, forward, values, featurizers, project, None)
            return
        # generate derives position ids from the mask itself, and needs its cache.
        prompt = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
        produced: dict = {}  # filled in the block: a name first bound there does not come back out
        counter = model._model.register_forward_pre_hook(lambda *_: step.__setitem__(0, step[0] + 1)) \
            if listeners else None
        try:
            with attention.listening(listeners), _plain_errors(), \
                    model.generate(prompt, **taps.generation_options(forward, self.tokenizer)) as tracer:
                with torch.set_grad_enabled(grad):
                    for i in tracer.iter[0:forward.decode]:
                        apply(groups, ahead, forward, values, featurizers, project, i)
                    produced["ids"] = tracer.result
        finally:
            if counter is not None:
                counter.remove()
        taps.finish_decode(forward, values, produced["ids"])

    # --- addresses --------------------------------------------------------------------
    def _groups(self, tap_list) -> list[list[tuple[_Point, Any]]]:
        """(point, tap) pairs in the taps' (forward) order, grouped by the value they share."""
        groups, seen = [], set()
        points = [(self._point(t.address, t.address.spelling()), t) for t in tap_list]
        for key, run in itertools.groupby(points, key=lambda pt: pt[0].key):
            run = list(run)
            if key in seen:
                raise EngineError(run[0][1].address.spelling(), "taps sharing one value are not "
                                  "adjacent in the forward's order", "compile the plan again")
            seen.add(key)
            groups.append(run)
        return groups

    def _point(self, address, path: str) -> _Point:
        """Where an address's value is handed over: the envoy at the module path the family's
        layout gives (``standardize.where``, shared with the hooks engine), and which side."""
        model, component, layer = self.model, address.component, address.layer
        key = (component, layer)
        found = self._found(component, layer, path)
        if component in QKV_ARGUMENT:
            call = getattr(self._envoy(found.path).source, self._call(found.path, layer, path))
            return _Point(("attention_call", layer), call, "inputs", _heads(QKV_ARGUMENT[component]))
        if component == "attention_probs":
            # nnterp's own route to the pattern (checked by nnterp at load): an operation inside
            # the attention function's source, which nnsight resolves only inside a trace.
            return _Point(key, self._envoy(found.path), "output", PATTERN,
                          inner=model.attention_probabilities.source_attr, within=("attention_call", layer))
        if found.path == standardize.ROOT:
            return _Point(key, model, "output", LOGITS)
        if found.io == INPUT:
            return _Point(key, self._envoy(found.path), "input", ITSELF, flat=found.flat)
        return _Point(key, self._envoy(found.path), "output", FIRST, flat=found.flat)

    def _reached(self, tap_list) -> set[str]:
        """The module paths a forward's taps hand values over at ("" is the model), and the final
        norm and head a lens calls."""
        paths = {self._found(t.address.component, t.address.layer, t.address.spelling()).path for t in tap_list}
        if any(op.view == "logits" for t in tap_list for op in t.reads):
            paths |= {self._found(c, None, "view").path for c in ("ln_final", "lm_head")}
        return {"" if p == standardize.ROOT else p for p in paths}

    def _project(self, x):
        """A lens, inside a trace: the final norm's and the head's envoys called on ``x``, then the
        family's output transform. Found when a lens first runs (the compiler refused it where the
        model has no final norm)."""
        norm, head = self._found("ln_final", None, "view").path, self._found("lm_head", None, "view").path
        return taps.logit_projection(self._envoy(norm), self._envoy(head), self._facts.transform)(x)

    def _found(self, component: str, layer, path: str) -> "standardize.Where":
        """Where a component is (``standardize.where``), looked up once per (component, layer)."""
        key = (component, layer)
        if key not in self._where:
            self._where[key] = standardize.where(self.model._model, self._facts, component, layer, path)
        return self._where[key]

    def _envoy(self, dotted: str):
        """The envoy of the module at ``dotted`` (its own name: nnsight keeps those beside nnterp's)."""
        envoy = self.model
        for part in dotted.split(".") if dotted else ():
            envoy = getattr(envoy, part)
        return envoy

    def _call(self, attention: str, layer: int, path: str) -> str:
        """The operation name of layer ``layer``'s ``attention_interface(`` call, found on its source line."""
        name = self._calls.get(layer)
        if name is None:
            accessor = self._envoy(attention).source.accessor
            lines = accessor.source.split("\n")[1:]  # line_numbers count from the line after ``def``
            callable_name = INTERIOR_CALL[:-1]
            hits = [op for op, line in accessor.line_numbers.items()
                    if INTERIOR_CALL in lines[line] and op.rsplit("_", 1)[0] == callable_name]
            if len(hits) != 1:
                raise CompileError(f"{path}.component", f"layer {layer}'s attention forward has "
                                   f"{len(hits)} calls on a line containing {INTERIOR_CALL!r} "
                                   f"({', '.join(hits) or 'none'}), so q/k/v cannot be addressed",
                                   "read attention_z (the per-head result) instead")
            name = self._calls[layer] = hits[0]
        return name


def _apply_taps(groups, ahead, forward, values, featurizers, project, step) -> None:
    """Inside a trace (or one decode step of it): each group's value fetched once, in forward
    order, its taps run on it, and the value put back if any of them wrote.

    At a decode step only the groups with an op that fires there are touched: fetching a
    module's value in a step is what makes nnsight wait for that step's call.
    """
    reached = {}
    for group in groups:
        first = group[0][0]
        if step is not None and not any(taps.fires(op.step, step) for _, tap in group
                                        for op in (*tap.writes, *tap.reads)):
            continue
        for point in ahead.get(first.key, ()):
            reached[point.key] = point.target()
        target = reached.pop(first.key) if first.key in reached else first.target()
        value = getattr(target, first.attr)
        written = False
        for point, tap in group:
            if point.flat:
                act = taps.run_flat_tap(point.get(value), len(forward.ids), tap, forward, values,
                                        featurizers, project, step)
            else:
                act = taps.run_tap(point.get(value), tap, forward, values, featurizers, project, step)
            if any(taps.fires(w.step, step) for w in tap.writes):
                value, written = point.put(value, act), True
        if written:
            setattr(target, first.attr, value)


def _rename_config(layout):
    """nnterp's ``RenameConfig`` for a layout: the names its own defaults would not find.

    nnterp renames by a module's own name; its defaults miss Phi's ``final_layernorm`` and a
    multimodal model's text layers. Names nnterp already finds are left to it.
    """
    from nnterp.rename_utils import RenameConfig

    if layout is None:
        return None
    return RenameConfig(layers_name=layout.layers, ln_final_name=layout.ln_final)


def _session_options(model, remote) -> dict:
    """``model.session`` arguments: NDIF for ``remote=True``, nnsight's local simulation for "local",
    or an nnsight backend to send the session to (``causalab_mini.stand_in``)."""
    from nnsight.intervention.backends.base import Backend

    if isinstance(remote, Backend):
        return {"backend": remote}
    if remote == "local" and not model.dispatched:
        raise EngineError("remote", "remote=\"local\" simulates the round trip on the weights this process "
                          "holds, and this model was loaded without them (--engine ndif)",
                          "send it to NDIF (remote=True), or to a stand-in server "
                          "(causalab_mini.stand_in)")
    if remote == "local":
        from nnsight.intervention.backends.local_simulation import LocalSimulationBackend

        # session(remote=...) takes only a bool in nnsight 0.7.0; the simulated round trip
        # (serialize, deserialize with user modules blocked, execute) is a backend.
        return {"backend": LocalSimulationBackend(model)}
    if remote not in (True, False):
        raise EngineError("remote", f"remote={remote!r} is not a way to run",
                          "pass True, False, \"local\" or an nnsight backend")
    if not remote and not model.dispatched:
        raise EngineError("remote", "this model was loaded without its weights (--engine ndif): it runs "
                          "only where they are", "send it to NDIF (remote=True), or load it with "
                          "--engine nnterp to run here")
    if remote and Path(str(model.repo_id)).is_dir():
        raise EngineError("remote", f"the model was loaded from a local directory ({Path(model.repo_id).name}), "
                          "which NDIF does not have", "name a hub id the server serves, or run locally")
    return {"remote": remote}


@contextmanager
def _plain_errors():
    """This project's refusals out of a trace or session as themselves, not as nnsight's wrapper."""
    from nnsight.intervention.tracing.util import ExceptionWrapper

    try:
        yield
    except ExceptionWrapper as err:
        if isinstance(err.original, CausalabError):
            raise err.original from None
        raise

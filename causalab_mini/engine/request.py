"""A request a stock NDIF server runs: the walk stays on the client, the kernel goes to the weights.

NDIF's servers have torch, transformers and nnsight — not causalab-mini, not nnterp — so a request
that names this package's code by reference cannot run there, and shipping the package by value
does not survive nnsight 0.7.0's serializer (dataclasses under postponed annotations, context
managers, ``lru_cache``, ``dataclasses.MISSING``: measured, each breaks or silently changes). What
does survive is a module of plain functions over plain data: ``kernel.py``, shipped by value under a
name no server has, with the walk's model work compiled into a program of plain data.

How a run goes (``send``):

1. **record** — the package's own walk (``steps.run``) runs on a copy of the plan with an engine
   whose ``forward`` compiles each forward into a kernel instruction (every window resolved here,
   against the client's tokenizer, as in any run) and hands the walk placeholders of the reads'
   shapes. A placeholder knows where its value is on the server: rows sliced, reads concatenated,
   a basic index and a published mean stay server-side expressions, so a later write's operand is
   named by what the server holds; a metric of a built-in kind on placeholders becomes a score
   instruction (``ops/metrics.scored`` asks ``Placeholder.scored_elsewhere``), so its values come
   home and not the logit rows; any other use of a placeholder is the client's, and the read it
   came from is brought home.
2. **send** — one session whose body is ``home = run(model, program)``, opened on nnsight's plain
   ``LanguageModel`` over the shell's meta module (no nnterp object on the wire).
3. **replay** — the walk again on the real plan, each forward's reads filled from what came home
   (a read that stayed there, by its placeholder again, whose score is looked up by the same key):
   positions, metrics, outputs and continuations are the package's own code, run here. A metric on
   a cut of a continuation is scored here on every kind: its rows are placed on generated tokens.

Refused at compile time (``plan/stock.py``) is what the kernel cannot do: a fit (it trains through the
model step after step in the walk), an extension's mechanism or featurizer kind (their code is not
the kernel's). A run whose later forward depends on a value only the server saw (a continuation's
tokens placing a later position) is refused at the replay, before anything is written.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import inspect
import linecache
import sys
from typing import Optional

import torch

from .. import kernel, vocab
from ..metric_kinds import METRICS
from ..errors import EngineError
from ..ops import featurizers as featurizer_kinds
from ..plan.plan import Observe, Plan
from . import standardize, steps, taps

# The name the shipped copy of kernel.py has: a module no server can import, so nnsight's pickler
# sends its functions by value (their source) and the server rebuilds them from that.
SHIPPED = "causalab_kernel"


def shipped_kernel():
    """kernel.py as a module only this process has, registered so that nnsight pickles it by value."""
    import cloudpickle

    found = sys.modules.get(SHIPPED)
    if found is not None:
        return found
    source = inspect.getsource(kernel)
    # A file name no server has: the serializer reads the functions' source through linecache.
    filename = f"/{SHIPPED}/{hashlib.sha256(source.encode()).hexdigest()[:16]}/kernel.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(SHIPPED, loader=None, origin=filename))
    module.__file__ = filename
    exec(compile(source, filename, "exec"), module.__dict__)
    sys.modules[SHIPPED] = module
    cloudpickle.register_pickle_by_value(module)
    return module


def kernel_digest() -> str:
    """sha256 of the kernel's source: what ran on the server, for the run's record."""
    return hashlib.sha256(inspect.getsource(kernel).encode()).hexdigest()


# --- placeholders: the walk's view of values held on the server ------------------------------------------

_WALKING: list = []  # the recorder (or the replayer) while its walk runs: placeholders report to it
_METADATA = {"shape", "size", "dim", "numel", "dtype", "device", "__len__", "ndim", "element_size", "stride",
             "requires_grad", "is_floating_point", "layout", "is_sparse", "__repr__", "__format__"}
_DERIVED = set(kernel.DERIVING)  # tensor methods whose result the server derives (kernel.evaluate)


class Placeholder(torch.Tensor):
    """A value the walk sees while recording: random numbers of the value's shape, carrying where the
    value is on the server (``expr``, ``kernel.evaluate``'s form). Row slices, concatenations along
    rows, reshapes, casts and means stay server-side expressions; any other use is the client's
    (the expression's reads then come home) and gives a value computed here (``expr`` None)."""

    expr: Optional[tuple]

    @staticmethod
    def of(base: torch.Tensor, expr: Optional[tuple]) -> "Placeholder":
        made = torch.Tensor._make_subclass(Placeholder, base)
        made.expr = expr
        return made

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        recorder = _WALKING[-1] if _WALKING else None
        name = getattr(func, "__name__", "")
        if name == "__get__":  # a property (``.shape``, ``.T``): its getter's name
            name = getattr(getattr(func, "__self__", None), "__name__", "")
        if recorder is None or name in _METADATA:
            return out
        derived = _derived(func, name, args, kwargs)
        if derived is not None:
            return cls.of(out, derived)
        pieces = _split(func, args, kwargs, out)
        if pieces is not None:
            return pieces
        for held in _placeholders(args, kwargs):
            recorder.used(held.expr)
        return _computed_here(out)

    @staticmethod
    def scored_elsewhere(logits, kind: str, ids: list, reads: dict, params: dict):
        """``ops/metrics.scored``'s question of logits held on the server: (values, defined) from the
        server's score of them, or None — then the client scores (their reads come home)."""
        walking = _WALKING[-1] if _WALKING else None
        exprs = [x.expr if isinstance(x, Placeholder) else None for x in (logits, *reads.values())]
        if walking is None or any(e is None for e in exprs):
            return None
        instruction = {"op": "score", "kind": kind, "of": exprs[0], "ids": [t.detach().cpu() for t in ids],
                       "reads": tuple(zip(reads, exprs[1:])), "params": params}
        instruction["key"] = _score_key(instruction)
        return walking.scored(instruction, len(logits))

    @staticmethod
    def sequence_scored_elsewhere(kind: str, columns: list, per_token: str):
        """``ops/metrics.score_sequence``'s question of whole answers' logits held on the server: their
        scores from the server's, or None — then the client scores (the reads come home)."""
        walking = _WALKING[-1] if _WALKING else None
        exprs = [[x.expr if isinstance(x, Placeholder) else None for x in segments] for segments, _ in columns]
        if walking is None or any(e is None for column in exprs for e in column):
            return None
        instruction = {"op": "score_sequence", "kind": kind, "per_token": per_token,
                       "columns": [(tuple(e), [t.detach().cpu() for t in answers])
                                   for e, (_, answers) in zip(exprs, columns)]}
        instruction["key"] = _score_key(instruction)
        return walking.scored(instruction, len(columns[0][0]))[0]


def _derived(func, name: str, args: tuple, kwargs: dict) -> Optional[tuple]:
    """The server-side expression of ``func(*args, **kwargs)``, or None when the server cannot derive it."""
    first = args[0] if args else None
    if func is torch.cat:
        parts, dim = args[0], kwargs.get("dim", args[1] if len(args) > 1 else 0)
        if dim == 0 and all(isinstance(p, Placeholder) and p.expr is not None for p in parts):
            return ("cat", tuple(p.expr for p in parts))
        return None
    if not isinstance(first, Placeholder) or first.expr is None:
        return None
    if func is torch.Tensor.__getitem__ and isinstance(args[1], slice) and args[1].step in (None, 1):
        a, b, _ = args[1].indices(first.shape[0])
        return ("slice", first.expr, a, b)
    if func is torch.Tensor.__getitem__:  # a basic index (a metric's unit window squeezed off)
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if all(isinstance(i, int) or isinstance(i, slice) for i in index):
            return ("index", first.expr, tuple((i.start, i.stop, i.step) if isinstance(i, slice) else i
                                               for i in index))
        return None
    if name == "index_select" and len(args) == 3 and not kwargs and not isinstance(args[2], Placeholder):
        return ("index_select", first.expr, int(args[1]), tuple(int(i) for i in args[2].tolist()))
    rest = args[1:]
    if name in _DERIVED and not any(isinstance(x, torch.Tensor) for x in (*rest, *kwargs.values())):
        return ("call", name, first.expr, tuple(rest), tuple(sorted(kwargs.items())))
    return None


def _split(func, args: tuple, kwargs: dict, out) -> Optional[tuple]:
    """``torch.split`` of a held value along rows into sizes: each piece its own expression (a whole
    answer's logits, cut per row)."""
    if func not in (torch.split, torch.Tensor.split) or kwargs.get("dim", 0) != 0 or len(args) != 2:
        return None
    held, sizes = args
    if not isinstance(held, Placeholder) or held.expr is None or not isinstance(sizes, (list, tuple)):
        return None
    sizes = tuple(int(n) for n in sizes)
    return tuple(Placeholder.of(piece, ("split", held.expr, sizes, i)) for i, piece in enumerate(out))


def _placeholders(args, kwargs):
    stack = [*args, *kwargs.values()]
    while stack:
        x = stack.pop()
        if isinstance(x, Placeholder):
            if x.expr is not None:
                yield x
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())


def _computed_here(out):
    """A result the client computed from placeholders: marked, so it can never enter the program."""
    if isinstance(out, torch.Tensor) and not isinstance(out, Placeholder):
        return Placeholder.of(out, None)
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return tuple(_computed_here(x) for x in out)
    return out


# --- record -------------------------------------------------------------------------------------------


class Recorder:
    """An engine for ``steps.run`` that compiles each forward into a kernel instruction."""

    def __init__(self, engine, wanted: frozenset = frozenset()):
        self.engine = engine
        self.wanted = wanted  # read names the client needs whatever the walk does with them: they come home
        self.steps: list = []  # the program's instructions, in order
        self.calls: list = []  # per forward: read name -> server key (what the replay fills)
        self.prints: list = []  # per forward: what it is, for the replay to check it walks the same way
        self.placeholders: dict = {}  # server key -> the placeholder the walk saw
        self.home: set = set()  # server keys the client uses
        self.featurizers: dict = {}
        self._passes: dict = {}  # id of a pass's values -> its key prefix
        self._alive: list = []  # those values, kept so an id is never reused while recording
        self._derived: dict = {}  # expression -> the key the program stores it under
        self._scores: dict = {}  # a score instruction's key -> the instruction
        self._random = torch.Generator().manual_seed(0)

    def __getattr__(self, name):  # tokenizer, answers, …: the real engine's
        return getattr(self.engine, name)

    def used(self, expr) -> None:
        """The client's walk used this value: the reads it is made of come home."""
        self.home |= _keys(expr)

    def scored(self, instruction: dict, rows: int):
        """A metric the server scores: the instruction added once; placeholders of its values (and of
        which rows are defined, for a kind that may leave some out) handed to the walk."""
        key = instruction["key"]
        if key not in self._scores:
            self._scores[key] = instruction
            self.steps.append(instruction)
        values = Placeholder.of(torch.zeros(rows), ("key", key))
        if not METRICS[instruction["kind"]].excludes:
            return values, None
        return values, Placeholder.of(torch.ones(rows, dtype=torch.bool), ("key", key + "/defined"))

    def stored(self, expr) -> str:
        """The server key holding ``expr``: a read's own, or a derivation added to the program."""
        if expr[0] == "key":
            return expr[1]
        if expr not in self._derived:
            key = self._derived[expr] = f"derived/{len(self._derived)}"
            self.steps.append({"op": "derive", "key": key, "expr": expr})
        return self._derived[expr]

    def forward(self, forward, values: dict, featurizers: dict) -> None:
        if id(values) not in self._passes:  # a pass's first forward: its reads get their own prefix
            self._passes[id(values)] = f"pass{len(self._passes)}"
            self._alive.append(values)
        prefix = self._passes[id(values)]
        engine, rows = self.engine, len(forward.ids)
        instruction = {"op": "forward", "inputs": taps.model_inputs(forward, "cpu"), "decode": forward.decode,
                       "rows": rows, "groups": [], "stacked": []}
        call, made = {}, set()
        groups = engine._groups(list(forward.taps))
        keys = {group[0][0].key for group in groups}
        for group in groups:
            point, address = group[0][0], group[0][1].address
            if point.within in keys:
                raise EngineError(address.spelling(), "the pattern read with q, k or v of the same layer in one "
                                  "forward is reached in an order a stock server's request cannot give",
                                  "read them in two interventions, or send the request to a server with "
                                  "causalab-mini installed (--ndif-request package)")
            path = engine._found(address.component, address.layer, address.spelling()).path
            entry = {"path": "" if path == standardize.ROOT else path, "chain": _chain(engine, point, path, address),
                     "attr": point.attr, "kind": point.kind, "flat": point.flat, "taps": []}
            for _, tap in group:
                entry["taps"].append(self._tap(tap, forward, values, featurizers, prefix, made, call, instruction))
            instruction["groups"].append(entry)
        if forward.decode:
            key = f"{prefix}/{forward.model}.generated"
            instruction.update(generation=taps.generation_options(forward, engine.tokenizer),
                               tokens=forward.tokens, generated=key)
            ids = torch.randint(0, len(engine.tokenizer), (rows, forward.decode), generator=self._random)
            self.placeholders[key] = ids
            values[f"{forward.model}.generated"] = ids
            call[f"{forward.model}.generated"] = key
            self.home.add(key)
        self.steps.append(instruction)
        self.calls.append(call)
        self.prints.append(fingerprint(forward))

    def _tap(self, tap, forward, values, featurizers, prefix: str, made: set, call: dict, instruction: dict) -> dict:
        entry = {"columns": tap.address.columns, "writes": [], "reads": []}
        for w in tap.writes:
            window, ragged = forward.window(w.name) if w.step is None else ((), False)
            if w.featurizer:
                self._featurizer(w.featurizer, featurizers[w.featurizer])
            entry["writes"].append({
                "step": w.step, "rows": w.rows, "window": window, "ragged": ragged, "mechanism": w.mechanism,
                "params": vocab.check_params(w.mechanism, dict(w.params)),
                "needs_f0": vocab.MECHANISMS[w.mechanism].needs_f0, "featurizer": w.featurizer,
                "features": w.features, "operand": self._operand(w, values, prefix, made)})
        for r in tap.reads:
            key = f"{prefix}/{r.name}"
            window, ragged = forward.window(r.name) if r.step is None else ((), False)
            if r.featurizer:
                self._featurizer(r.featurizer, featurizers[r.featurizer])
            entry["reads"].append({"key": key, "step": r.step, "rows": r.rows, "window": window, "ragged": ragged,
                                   "view": r.view, "featurizer": r.featurizer,
                                   "project": self._projection() if r.view == "logits" else None})
            if r.step == "stack":  # a read of a cut of a continuation, stacked step by step there
                instruction["stacked"].append(key)
            if r.name in self.wanted:
                self.home.add(key)
            value = torch.randn(_read_shape(r, forward, window, ragged), generator=self._random)
            self.placeholders[key] = value
            values[r.name] = Placeholder.of(value, ("key", key))
            made.add(r.name)
            call[r.name] = key
        return entry

    def _operand(self, w, values: dict, prefix: str, made: set) -> Optional[dict]:
        if w.operand is None:
            return None
        if w.operand.kind == "number":
            return {"number": float(w.operand.value)}
        name = w.operand.value
        if name in made:  # a read of this same forward, held under this pass's prefix
            return {"key": f"{prefix}/{name}"}
        value = values.get(name)
        if isinstance(value, Placeholder) and value.expr is not None:
            return {"key": self.stored(value.expr)}
        raise EngineError(w.name, f"its operand {name!r} is computed in this process from values of the same "
                          "request, which a stock server does not have", "publish it from a read as a mean, "
                          "or save it and give it to a second document, or send the request to a server with "
                          "causalab-mini installed (--ndif-request package)")

    def _featurizer(self, name: str, made) -> None:
        if name not in self.featurizers:
            self.featurizers[name] = featurizer_data(name, made)

    def _projection(self) -> dict:
        engine = self.engine
        transform = engine._facts.transform
        return {"norm": engine._found("ln_final", None, "view").path, "head": engine._found("lm_head", None, "view").path,
                "multiply": transform.multiply, "divide": transform.divide, "softcap": transform.softcap}

    def program(self) -> dict:
        """The request's program. A metric whose reads come home anyway is scored here, not there."""
        local = {k for k, ins in self._scores.items() if _inputs(ins) <= self.home}
        steps_ = [ins for ins in self.steps if ins.get("key") not in local]
        home = {k for k in self.home if k not in local and k.rsplit("/", 1)[0] not in local}
        return {"steps": steps_, "featurizers": self.featurizers, "home": sorted(home)}


class _Names:
    """Records the attribute names a function reads off it: nnterp's route to the pattern
    (``source_attr``) applied to no envoy, as the chain the kernel follows on the server's."""

    def __init__(self, names: tuple = ()):
        self.names = names

    def __getattr__(self, name: str) -> "_Names":
        return _Names(self.names + (name,))


def _chain(engine, point, path: str, address) -> list:
    """The attribute names from the module's envoy to the value's: an operation inside its forward."""
    if point.inner is not None:  # the pattern, inside the attention function's source
        return list(point.inner(_Names()).names)
    if point.kind[0] == "heads":  # q, k, v: the arguments of the attention function's call
        return ["source", engine._call(path, address.layer, address.spelling())]
    return []


def _read_shape(read, forward, window, ragged: bool) -> tuple:
    """The shape a read's value has (what ``taps.run_tap`` stores): its placeholder's."""
    rows = (read.rows[1] - read.rows[0]) if read.rows else len(forward.ids)
    if read.step == "stack":
        return (rows, forward.decode, read.width)
    if read.step is not None:
        return (rows, 1, read.width)
    if ragged:
        return (sum(len(w) for w in window), read.width)
    return (rows, len(window[0]) if window else 0, read.width)


def fingerprint(forward) -> int:
    """What a forward is — its inputs, windows and taps — for the replay to check it walks the recording's way."""
    return hash((forward.ids, forward.mask, forward.windows, forward.decode,
                 tuple((t.address.spelling(), tuple(w.name for w in t.writes), tuple(r.name for r in t.reads))
                       for t in forward.taps)))


def featurizer_data(name: str, made) -> dict:
    """A featurizer as the kernel holds it: its kind and tensors (``kernel.featurize``)."""
    if isinstance(made, featurizer_kinds.Identity):
        data = {"kind": "identity"}
    elif isinstance(made, featurizer_kinds.Subspace):
        data = {"kind": "subspace", "weight": made.weight.detach().clone()}
    elif isinstance(made, featurizer_kinds.PCA):
        data = {"kind": "pca", "q": made.q}
    elif isinstance(made, featurizer_kinds.Dictionary):
        data = {"kind": made.kind, "w_enc": made.w_enc, "w_dec": made.w_dec, "b_enc": made.b_enc, "b_dec": made.b_dec}
    elif isinstance(made, featurizer_kinds.Gate) and not made.training:
        data = {"kind": "gate", "theta": made.theta.detach().clone()}
    else:
        raise EngineError(f"featurizers.{name}", f"a {type(made).__name__} featurizer has no form the kernel "
                          "holds", "send the request to a server with causalab-mini installed "
                          "(--ndif-request package)")
    for key, value in data.items():
        if isinstance(value, Placeholder):
            raise EngineError(f"featurizers.{name}", f"its {key} is computed in this process from values of the "
                              "same request, which a stock server does not have", "save it from one document "
                              "and load it from the file in a second")
    return data


class Replayer:
    """An engine for ``steps.run`` whose forward fills each read from what came home."""

    def __init__(self, engine, recorder: Recorder, home: dict):
        self.engine, self.recorder, self.home, self.done = engine, recorder, home, 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def forward(self, forward, values: dict, featurizers: dict) -> None:
        recorded = self.recorder
        if self.done >= len(recorded.calls) or fingerprint(forward) != recorded.prints[self.done]:
            raise EngineError("ndif", "the walk asked for a forward the request did not run: a later forward's "
                              "positions depend on a value only the server saw (a continuation's tokens)",
                              "run the document locally, or send it to a server with causalab-mini installed "
                              "(--ndif-request package)")
        for name, key in recorded.calls[self.done].items():
            # A read not brought home is held as the recording held it: what the walk did with it
            # there (a metric scored on the server) it does again here, and nothing else.
            values[name] = self.home[key] if key in self.home else Placeholder.of(recorded.placeholders[key], ("key", key))
        self.done += 1

    def used(self, expr) -> None:
        """The replay used a value the recording did not: the two walks went different ways."""
        missing = _keys(expr) - set(self.home)
        if missing:
            raise EngineError("ndif", f"the walk used {sorted(missing)[0]!r}, which the request did not bring home: "
                              "it went another way than when it was recorded", "run the document locally, and "
                              "report it with the document")

    def scored(self, instruction: dict, rows: int):
        """The server's score of a metric the recording sent it."""
        key = instruction["key"]
        if key not in self.home:
            self.used(("key", key))
        return self.home[key], self.home.get(key + "/defined")


def _on_continuations(obs: Observe) -> tuple:
    """The pass's metrics that score a cut of a continuation: their rows are placed on tokens only the
    server generates, so they are scored here, on what comes home."""
    stacked = {r.name for f in obs.forwards for t in f.taps for r in t.reads if r.step == "stack"}
    return tuple(m for m in obs.metrics if {m.of, *(op for _, op in m.reads)} & stacked)


def _wanted(plan: Plan) -> set:
    """The reads the client needs whatever its walk does: those the run keeps, and those a metric on a
    continuation scores (a borrowed read by its shared forward's name too)."""
    names: set = set()
    for _, step in plan.walk():
        if isinstance(step, Observe):
            mine = {name for m in _on_continuations(step) for name in (m.of, *(op for _, op in m.reads))}
            mine |= set(step.kept)
            names |= mine | {theirs for own, theirs in step.borrowed if own in mine}
    return names


def _recordable(plan: Plan) -> Plan:
    """``plan`` (a copy) without its metrics on continuations: recorded on placeholder tokens, their
    rows would be placed nowhere and the walk would refuse."""
    for name, step in plan.steps.items():
        if isinstance(step, Plan):
            _recordable(step)
        elif isinstance(step, Observe):
            skipped = _on_continuations(step)
            if skipped:
                plan.steps[name] = dataclasses.replace(step, metrics=tuple(m for m in step.metrics
                                                                           if m not in skipped))
    return plan


def _keys(expr) -> set:
    """The server keys an expression is made of."""
    if expr[0] == "key":
        return {expr[1]}
    if expr[0] == "cat":
        return set().union(*(_keys(e) for e in expr[1]))
    if expr[0] == "split":
        return _keys(expr[1])
    return _keys(expr[2] if expr[0] == "call" else expr[1])


def _inputs(instruction: dict) -> set:
    """The server keys a score instruction reads."""
    if instruction["op"] == "score_sequence":
        return {key for segments, _ in instruction["columns"] for e in segments for key in _keys(e)}
    return _keys(instruction["of"]) | {key for _, e in instruction["reads"] for key in _keys(e)}


def _score_key(instruction: dict) -> str:
    """A score instruction's key, from what it is: the same in the recording and the replay."""
    def plain(x):  # tensors (id columns) by their numbers
        if isinstance(x, torch.Tensor):
            return ("tensor", tuple(x.tolist()))
        if isinstance(x, (list, tuple)):
            return tuple(plain(v) for v in x)
        if isinstance(x, dict):
            return tuple(sorted((k, plain(v)) for k, v in x.items()))
        return x
    what = repr(plain({k: v for k, v in instruction.items() if k != "key"}))
    return "score/" + hashlib.sha256(what.encode()).hexdigest()[:16]


def send(engine, plan: Plan, *, batch_size=None, at_once: int = 1, options: dict) -> Plan:
    """Record the walk, send its program with the kernel as one session, replay the walk on what came home."""
    import nnsight

    recorder = Recorder(engine, wanted=frozenset(_wanted(plan)))
    _WALKING.append(recorder)
    try:
        steps.run(recorder, _recordable(copy.deepcopy(plan)), batch_size=batch_size, at_once=at_once)
    finally:
        _WALKING.remove(recorder)
    program = engine.last_request = recorder.program()  # kept on the shell, for a look at what was asked
    shipped = shipped_kernel()
    # The block names only locals (nnsight ships the block's code with its module's globals).
    run, dtype_of, save, model = shipped.run, shipped.served_dtype, nnsight.save, engine.plain_model()
    head = engine._found("lm_head", None, "served_dtype").path
    with model.session(**options):
        home = run(model, program)
        home["served_dtype"] = dtype_of(model, head)
        save(home)
    plan.provenance["served_dtype"] = home.pop("served_dtype")
    replayer = Replayer(engine, recorder, home)
    _WALKING.append(replayer)
    try:
        steps.run(replayer, plan, batch_size=batch_size, at_once=at_once)
    finally:
        _WALKING.remove(replayer)
    plan.provenance["request"] = {"kind": "kernel", "kernel": kernel_digest(),
                                  "instructions": len(program["steps"]), "home": len(program["home"])}
    return plan

"""The Plan: pure data an engine walks.

Strings, integers and tuples; every field frozen except ``results``, so every
number sits on the node that produced it, and a node's path in the tree is its
path on disk. There is no ``execute`` on a step: what running one means is the
engine's business (``engine/steps.py``).
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Union

from ..components import Address  # noqa: F401 — part of the plan's vocabulary: every op carries one
from ..errors import PlanError
from ..shapes import Where


@dataclass(frozen=True)
class Operand:
    kind: str  # "read" (of this pass), "ref" (published by an earlier step), "number"
    value: Union[str, float]

    def spelling(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class ReadOp:
    name: str
    address: Address
    where: Where
    anchors: Optional[tuple[Optional[str], ...]]  # per-row text the scope's variable binds to
    featurizer: Optional[str]
    view: Optional[str]
    width: int  # of the value it yields (feature space, or vocab for a logits view)
    step: Union[None, int, str] = None  # decode step it fires at; "stack" for a cut of the continuation
    rows: Optional[tuple[int, int]] = None  # set by the walk only: the batch rows [a, b) it acts on (at_once)


@dataclass(frozen=True)
class WriteOp:
    name: str
    address: Address
    where: Where
    anchors: Optional[tuple[Optional[str], ...]]
    mechanism: str
    operand: Optional[Operand]
    params: tuple[tuple[str, Any], ...]
    featurizer: Optional[str]
    features: Optional[tuple[int, ...]]
    step: Union[None, int, str] = None  # None prompt frame (prefill), k, or "all"
    rows: Optional[tuple[int, int]] = None  # set by the walk only: the batch rows [a, b) it acts on (at_once)


@dataclass(frozen=True)
class Tap:
    """Everything one forward does at one address: its writes (in list order), then its reads."""

    address: Address
    writes: tuple[WriteOp, ...]
    reads: tuple[ReadOp, ...]


def group_taps(ops: list) -> tuple[Tap, ...]:
    """Ops grouped by address, in forward order; at one site the writes go before the reads."""
    grouped: dict[Address, list] = {}
    for op in ops:
        grouped.setdefault(op.address, []).append(op)
    taps = [Tap(a, tuple(o for o in g if isinstance(o, WriteOp)), tuple(o for o in g if isinstance(o, ReadOp)))
            for a, g in grouped.items()]
    # Stable: ties keep document order. Writes-first among taps of one site, so a read at a
    # narrower selection of the same tensor still sees the pass's writes.
    return tuple(sorted(taps, key=lambda t: (t.address.key, 0 if t.writes else 1)))


@dataclass(frozen=True)
class Forward:
    model: str
    input: str
    dataset: str
    ids: tuple[tuple[int, ...], ...]  # left padded
    mask: tuple[tuple[int, ...], ...]
    sample: str  # row 0 decoded by the client's tokenizer: the run compares before looking for text
    texts: tuple[str, ...]  # each row's prompt text (a chat rendered through its template)
    segments: Optional[tuple[dict, ...]]  # per row: chat turn name -> (start, end) character span
    decode: Optional[int]
    taps: tuple[Tap, ...]
    # A teacher-forced forward (a metric scoring whole answers): per row, the answer's tokens put
    # after the prompt (none: a row without an answer). Positions still resolve against the prompt
    # (ids, mask), so a write at -1 acts on the prompt's last token; ``forced_read`` is read at the
    # prompt's last token and each forced token but the last — the positions that predict them.
    forced: Optional[tuple[tuple[int, ...], ...]] = None
    forced_read: Optional[str] = None
    # Filled by the walk, never by the compiler: op name -> (window per row, ragged).
    # Positions are resolved where the model is, against the engine's tokenizer.
    windows: tuple = ()

    @property
    def rows(self) -> int:
        return len(self.ids)

    @property
    def tokens(self) -> int:
        return len(self.ids[0]) if self.ids else 0

    @property
    def reads(self) -> tuple[ReadOp, ...]:
        return tuple(r for t in self.taps for r in t.reads)

    @property
    def writes(self) -> tuple[WriteOp, ...]:
        return tuple(w for t in self.taps for w in t.writes)

    def window(self, name: str):
        """(window per row, ragged) of op ``name``, as the walk resolved it."""
        for op, window, ragged in self.windows:
            if op == name:
                return window, ragged
        raise KeyError(f"op {name!r} has no resolved window on forward {self.model!r}")


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    of: str  # the read it scores
    model: str
    input: str
    token_ids: tuple[tuple[Optional[int], ...], ...]  # per column (vocab.COLUMNS order), per row
    column_eligible: tuple[bool, ...]  # the client's half: every answer there, no two sharing a token
    unit: str
    estimand_version: str
    # What each row's answers are, for people: (label, data column) per answer recorded — the
    # kind's columns, then the contrast ("distinct_from") when there is one — and per label,
    # per row, the answer's text and its full tokenization (the first id is the one scored).
    compared: tuple[tuple[str, str], ...] = ()
    answers: tuple[tuple[Optional[str], ...], ...] = ()
    pieces: tuple[tuple[Optional[tuple[int, ...]], ...], ...] = ()
    scored: tuple[tuple[Optional[str], ...], ...] = ()  # per label, per row: the scored token as a string
    column_reasons: tuple[str, ...] = ()  # per row: "", "no_answer" or "answers_share_token"
    contrast_from: Optional[str] = None  # why a contrast is held apart: "distinct_from", or the logit_diff
    # The other reads the kind compares ``of`` with: (slot, read name), scored at the same rows.
    reads: tuple[tuple[str, str], ...] = ()
    params: tuple[tuple[str, Any], ...] = ()  # the kind's parameters, defaults filled (sorted by name)
    excludes: str = ""  # the reason a row the kind leaves undefined is given
    # "sum" / "mean": whole answers scored (score: sequence), from the forced reads — per own
    # column, the read of the teacher-forced forward its answers were put after.
    sequence: Optional[str] = None
    forced_reads: tuple[str, ...] = ()

    @property
    def partial(self) -> int:
        """Eligible rows scored on the first of an answer's several tokens (the metric's own
        answers; a contrast is only compared by its first)."""
        if self.sequence is not None:
            return 0  # every token of every answer is scored
        own = self.pieces[:len(self.token_ids)]
        return sum(1 for r, ok in enumerate(self.column_eligible)
                   if ok and any(p[r] is not None and len(p[r]) > 1 for p in own))


@dataclass(frozen=True)
class OutputSpec:
    name: str
    read: str
    reduce: Optional[str]
    k: Optional[int]

    def spelling(self) -> str:
        if self.reduce is None:
            return f"{self.name}={self.read}"
        return f"{self.name}={self.reduce}({self.read}" + (f", k={self.k})" if self.k else ")")


@dataclass(frozen=True)
class SaveSpec:
    value: str
    file_path: str
    # A tensor file's safetensors header (``__metadata__``): where the tensor came from, so a
    # document loading it as a featurizer bundle can be checked against it. Empty for JSON.
    header: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Estimate:
    """An observe step scored by attribution (document/estimate.py): which points also run exactly."""

    by: str  # "attribution"
    top: int = 0
    random: int = 0
    all: bool = False
    seed: int = 0
    metric: Optional[str] = None  # what the verified points are ranked by (None: no verification)

    @property
    def verifies(self) -> bool:
        return self.all or bool(self.top or self.random)


@dataclass(frozen=True)
class Observe:
    name: str
    intervention: str
    forwards: tuple[Forward, ...]
    metrics: tuple[Metric, ...]
    outputs: tuple[OutputSpec, ...]
    saves: tuple[SaveSpec, ...]
    example_ids: tuple[str, ...]
    produced_by: str
    results: dict = field(default_factory=dict, compare=False)
    # Reads this pass takes from the root plan's Shared step instead of running their forward:
    # (this pass's name for the read, the shared read's name). See share.py.
    borrowed: tuple[tuple[str, str], ...] = ()
    # Reads this pass leaves in its results after scoring (``cm.run(reads=...)``, keep.py): not
    # part of the experiment, so not compared.
    kept: tuple[str, ...] = field(default=(), compare=False)
    # Scored by attribution from the root plan's Attribution step, not by running its written
    # forward (which stays compiled: verification runs it exactly). See plan/attribution.py.
    estimate: Optional[Estimate] = None

    kind = "observe"

    @property
    def rows(self) -> int:
        return len(self.example_ids)


@dataclass(frozen=True)
class Shared:
    """Forwards several sweep points run identically, run once before the points (share.py).

    ``users``: per shared read, the points that borrow it, in run order: the walk frees a read's
    value after its last user. ``record``: some user resolves positions against its prompt's
    text, so this step records every read's positions for them."""

    name: str
    forwards: tuple[Forward, ...]
    users: tuple[tuple[str, tuple[str, ...]], ...]
    record: bool
    results: dict = field(default_factory=dict, compare=False)

    kind = "shared"

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.forwards)


@dataclass(frozen=True)
class Attribution:
    """The passes that estimate every point of a sweep at once (plan/attribution.py): the base
    forward, un-written, with a zero perturbation and a read at every address some point writes
    (``taps``' ``grads``: (address's full-width write, its read)), the metrics it differentiates,
    and the points it estimates (``users``: point name, their observe step's name)."""

    name: str
    forward: Forward
    metrics: tuple[Metric, ...]
    grads: tuple[tuple[str, str], ...]  # (perturbation write's name, activation read's name) per address
    users: tuple[tuple[str, str], ...]
    estimate: Estimate
    results: dict = field(default_factory=dict, compare=False)

    kind = "attribution"

    @property
    def rows(self) -> int:
        return self.forward.rows


@dataclass(frozen=True)
class FeaturizerSpec:
    name: str
    kind: str
    address: Address
    d: int
    k: Optional[int]
    seed: int
    file_path: Optional[str]  # resolved against the document's directory
    trained: bool  # a fit in this document trains it
    start: Optional[float] = None


@dataclass(frozen=True)
class Featurizers:
    name: str
    specs: tuple[FeaturizerSpec, ...]
    results: dict = field(default_factory=dict, compare=False)

    kind = "featurizers"


class Epochs(Sequence):
    """A fit's epochs as a count and a schedule, not N compiled copies.

    The schedule is the seed's order: each epoch shuffles the row indices with one
    ``random.Random(seed)`` carried across epochs and cuts them into batches, so a
    fit replays exactly. ``epochs[e]`` is that epoch's updates, compiled when asked
    for (``compile_update(e, u, rows)``): epoch 0 is compiled with the plan, so
    every row's positions are checked before a weight loads, and later epochs only
    when the walk reaches them. Epoch 0 and the epoch last asked for are kept, so
    the results an engine writes on an update are there when it reads them back.
    """

    def __init__(self, count: int, rows: int, batch_size: int, seed: int,
                 compile_update: Callable[[int, int, tuple], "Observe"]):
        self.count, self.rows, self.batch_size, self.seed = count, rows, batch_size, seed
        self._compile = compile_update
        self._kept: dict[int, tuple] = {}
        self._rng_at = (0, random.Random(seed).getstate())  # (epoch, rng state before it)
        if count:
            self._kept[0] = self[0]

    def __len__(self) -> int:
        return self.count

    def batches(self, epoch: int) -> list[tuple[int, ...]]:
        """Epoch ``epoch``'s batches of row indices, each sorted, in the seed's order."""
        if not 0 <= epoch < self.count:
            raise IndexError(epoch)
        at, state = self._rng_at
        if at > epoch:  # asked backwards: replay from the seed (a shuffle is microseconds)
            at, state = 0, random.Random(self.seed).getstate()
        rng = random.Random()
        rng.setstate(state)
        while True:
            order = list(range(self.rows))
            rng.shuffle(order)
            if at == epoch:
                break
            at += 1
        self._rng_at = (epoch + 1, rng.getstate())
        return [tuple(sorted(order[i:i + self.batch_size])) for i in range(0, self.rows, self.batch_size)]

    def __getitem__(self, epoch):
        if isinstance(epoch, slice):
            return tuple(self[e] for e in range(*epoch.indices(self.count)))
        if epoch < 0:
            epoch += self.count
        if epoch in self._kept:
            return self._kept[epoch]
        updates = tuple(self._compile(epoch, u, rows) for u, rows in enumerate(self.batches(epoch)))
        self._kept = {e: v for e, v in self._kept.items() if e == 0}
        self._kept[epoch] = updates
        return updates

    @property
    def updates(self) -> int:
        """Updates per epoch (every epoch covers every row once)."""
        return -(-self.rows // self.batch_size) if self.count else 0

    def __eq__(self, other) -> bool:
        return isinstance(other, Epochs) and (self.count, self.rows, self.batch_size, self.seed) == \
            (other.count, other.rows, other.batch_size, other.seed) and self[0:1] == other[0:1]

    __hash__ = None

    def __repr__(self) -> str:
        return f"Epochs({self.count} x {self.updates} updates, seed={self.seed})"


@dataclass(frozen=True)
class Fit:
    name: str
    epochs: Epochs  # a count and the seed's schedule; each epoch's updates compiled when reached
    evaluation: Optional[Observe]
    lr: float
    objective: tuple[tuple[float, str], ...]
    params: tuple[str, ...]
    early_stop: Optional[tuple[str, str, int]]  # (metric, mode, patience)
    anneal: tuple[tuple[str, float, float], ...]
    seed: int
    saves: tuple[SaveSpec, ...]
    results: dict = field(default_factory=dict, compare=False)

    kind = "fit"


@dataclass(frozen=True)
class Weights:
    name: str
    names: tuple[str, ...]
    saves: tuple[SaveSpec, ...]
    header: tuple[tuple[str, str], ...]  # recorded in every bundle (model key, revision, digest)
    results: dict = field(default_factory=dict, compare=False)

    kind = "weights"


Step = Union["Plan", Observe, Fit, Featurizers, Weights, Shared, Attribution]


@dataclass(frozen=True)
class Plan:
    """A dict of named steps; itself a step, so a sweep point is a nested Plan."""

    name: str
    steps: dict  # name -> Step, in run order
    document: dict  # the point's document as written (root: the whole document, sweep and all)
    produced_by: Optional[str]  # None on a swept root: each point has its own digest
    coords: tuple = ()  # ((axis, value), ...) for a sweep point
    results: dict = field(default_factory=dict, compare=False)
    provenance: dict = field(default_factory=dict, compare=False)

    kind = "plan"

    def walk(self, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """Every step below this plan with its path ("pos=-1/score"), depth first, in run order."""
        for name, step in self.steps.items():
            path = f"{prefix}{name}"
            yield path, step
            if isinstance(step, Plan):
                yield from step.walk(path + "/")
            elif isinstance(step, Fit):
                # Not the updates: they are compiled per epoch as the fit reaches them, and
                # what they produce is on the fit itself (``update_loss``, the curves).
                if step.evaluation is not None:
                    yield f"{path}/evaluation", step.evaluation

    @property
    def points(self) -> list["Plan"]:
        """The sweep points (nested plans), or [self] for an unswept plan."""
        nested = [s for s in self.steps.values() if isinstance(s, Plan)]
        return nested or [self]

    def step(self, name: str, kind: type = object):
        found = self.steps.get(name)
        if found is None or not isinstance(found, kind):
            raise PlanError(name, f"no {getattr(kind, '__name__', 'step')} named {name!r} here",
                            f"steps: {list(self.steps)}")
        return found

    def result(self, name: str):
        """The one result called ``name`` in this plan; ambiguous across sweep points is an error."""
        hits = [(p, s.results[name]) for p, s in self.walk()
                if not isinstance(s, Plan) and name in s.results]
        if len(hits) == 1:
            return hits[0][1]
        names = sorted({k for p, s in self.walk() if not isinstance(s, Plan) for k in s.results
                        if k not in ("positions", "eligible", "excluded")})
        if not hits:
            raise PlanError(f"result {name!r}", "not in this plan", f"results here: {names}")
        raise PlanError(f"result {name!r}", f"{len(hits)} in this plan",
                        f"results here: {names}; name the point: plan.steps[{hits[0][0].split('/')[0]!r}]")


def results_of(plan: Plan) -> dict:
    """Every step's results as ``{step path: {name: value}}``: plain strings and tensors, none of our classes.

    This (and ``fill``, its inverse) is what crosses back from a server: the
    client already has the plan, so only what fills it in needs the trip.
    """
    home = {"": dict(plan.results)} if plan.results else {}
    for path, step in plan.walk():
        if step.results:
            home[path] = dict(step.results)
    return home


def fill(plan: Plan, home: dict) -> Plan:
    """Put ``results_of``'s dict back onto the plan's steps; returns the same plan object."""
    steps = dict(plan.walk())
    for path, results in home.items():
        target = plan if path == "" else steps.get(path)
        if target is None:
            raise PlanError(path, "a result came home for a step this plan does not have",
                            "run the plan the results were produced from")
        target.results.clear()
        target.results.update(results)
    return plan

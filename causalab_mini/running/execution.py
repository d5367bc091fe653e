"""One run path: the selected points of one or more documents on one loaded model, computed
when asked for, each once.

Every way of running — ``cm.run`` (a document, one folder), ``cm.run_points`` and
``cm.run_together`` (points handed back as their own runs), the result cache, the CLI and the
pytest plugin — builds an ``Execution`` and asks it for points; ``assemble.py`` turns what it
gives into ``Run`` objects and files. What an Execution does, in order:

1. compiles each document once, unshared, against the loaded model (every refusal that needs
   the model or the data, before any forward);
2. with a cache, keys every point on that compile and takes the points the cache holds from it;
3. shares the forwards the remaining points run identically (``plan/share.py``), across
   documents too, and cuts the points into the groups the walk stacks (``at_once``);
4. computes nothing until asked. ``compute(keys)`` runs the groups holding those points — the
   shared forwards once, with the first group that borrows them, freed after the last — and
   ``compute()`` everything left in one walk. A P-point sweep calls the model P + 1 times
   however the points are asked for, and a pytest item that asks for its own point pays for
   its own point.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ..errors import PlanError
from ..plan.plan import Plan
from ..plan.share import SHARED
from ..timing import Clock
from .options import RunOptions


@dataclass
class Slot:
    """One selected point: its document, its place in the walk and what it became."""

    index: int  # its document's place in the selection
    doc: object  # api.Document
    valid: object  # document.read.ValidPoint
    key: str  # its step in the walk's root plan (its name with one document; "i:name" with several)
    compiled: Optional[Plan] = None  # the point compiled alone-equivalent and unshared, unrun
    entry: object = None  # cache.store.Entry, when the cache served it
    error: Optional[BaseException] = None  # why it cannot run (its document's compile, its group's walk)
    ran: bool = False  # its group has walked
    # Not asked for, but computed: a point of an estimated sweep whose selection named only some of
    # its points (the estimate's verification is the whole sweep's, so every point is estimated).
    hidden: bool = False

    @property
    def name(self) -> Optional[str]:
        return self.valid.name


class Execution:
    """See the module's docstring. ``tolerant``: a document that fails to compile fails only its
    own points (raised when each is asked for) instead of the whole call — the pytest plugin's
    choice, where every point is an item that reports its own outcome."""

    def __init__(self, loaded, selections, options: RunOptions = RunOptions(), *, clock: Optional[Clock] = None,
                 tolerant: bool = False):
        options.check()
        self.loaded, self.options, self.engine = loaded, options, loaded.name
        self.clock = clock or Clock()
        self.docs = list(selections)  # (api.Document, names or None): read by the caller
        self.slots: dict[str, Slot] = {}
        one = len(self.docs) == 1
        for i, (doc, names) in enumerate(self.docs):
            wanted = chosen(doc, names)
            if names is not None and any(_estimates(v) for v in wanted):
                wanted, asked = chosen(doc, None), {v.name for v in wanted}
            else:
                asked = {v.name for v in wanted}
            for valid in wanted:
                key = (valid.name or "") if one else f"{i}:{valid.name or ''}"
                self.slots[key] = Slot(i, doc, valid, key, hidden=valid.name not in asked)
        # One unswept document runs as its own root, as it always has; otherwise every point is a
        # step of one root, whichever documents they come from.
        self.flat = one and len(self.slots) == 1 and next(iter(self.slots.values())).name is None
        self.state = None  # the walk's steps.State, once a group has run
        self.provenance: Optional[dict] = None  # what the first walk recorded
        self._lent = False  # the shared forwards have run (their reads live in self.state)
        self._walked: Optional[Plan] = None  # the root as one walk ran it whole, for Run.plan
        self.attribution: dict = {}  # an estimated sweep's verification (run.json's "attribution")
        self._compile(tolerant)
        self.store = self._serve()
        self.root = self._root()
        self.groups = self._groups()
        # Each point's group, so asking for one point costs the same at 10 points or 10,000.
        self._group_of = {k: i for i, g in enumerate(self.groups) for k in g}
        self._in_root = sum(isinstance(p, Plan) for p in self.root.steps.values()) if self.root is not None else 0

    def shown(self) -> list[Slot]:
        """The points the caller selected, in order (not the ones computed only beside them)."""
        return [s for s in self.slots.values() if not s.hidden]

    def key_of(self, path, name: Optional[str]) -> Optional[str]:
        """The key of the point ``name`` of the document at ``path``, or None: not selected here."""
        for key, s in self.slots.items():
            if s.doc.path == path and s.name == name:
                return key
        return None

    # --- 1. compile ------------------------------------------------------------------------

    def _compile(self, tolerant: bool) -> None:
        from ..plan.compile import compile_plan

        for i, (doc, _) in enumerate(self.docs):
            mine = [s for s in self.slots.values() if s.index == i]
            try:
                with self.clock.measure("compile"):
                    plan = compile_plan(doc.raw, document=doc.path, data=self.options.data,
                                        facts=self.loaded, valid=[s.valid for s in mine], share=False)
            except Exception as err:  # noqa: BLE001 — raised at once, or to each of its points' askers
                if not tolerant:
                    raise
                for s in mine:
                    s.error = err
                continue
            for s in mine:
                s.compiled = plan if s.name is None else plan.steps[s.name]

    # --- 2. serve --------------------------------------------------------------------------

    def _serve(self):
        """The cache store, with every point it holds taken from it (``Slot.entry``)."""
        if self.options.cache is None:
            return None
        from ..cache import key as keying
        from ..cache.serve import lookup, open_store
        from ..plan.attribution import estimated_steps

        store = open_store(self.options.cache, engine=self.engine)
        model, record = keying.model_parts(self.loaded), self.record()
        for s in self.live():
            # An estimated point's verification figures are the whole sweep's: computed with it, never served.
            if not estimated_steps(s.compiled):
                s.entry = lookup(store, s.compiled, model, record)
        return store

    # --- 3. share and group ----------------------------------------------------------------

    def live(self) -> list[Slot]:
        """The points that compiled, in the selection's order."""
        return [s for s in self.slots.values() if s.error is None]

    def _root(self) -> Optional[Plan]:
        from ..plan.attribution import attribute
        from ..plan.keep import keep_reads
        from ..plan.share import share

        todo = [s for s in self.live() if s.entry is None]
        if not todo:
            return None
        if self.flat:
            root = todo[0].compiled
        else:
            root = Plan(name="<root>", steps={s.key: s.compiled for s in todo}, document=self._document(),
                        produced_by=None)
            if self.options.share:
                root = share(root)
            root = attribute(root)
        return keep_reads(root, self.options.reads)

    def _document(self):
        # One swept document's root is that document (its document.json); several documents have none.
        return self.docs[0][0].raw if len(self.docs) == 1 else None

    def _groups(self) -> list[list[str]]:
        """The walk's groups of points, in order: what one model call stacks (``at_once``), or
        every point in one group where the engine's walk cannot be carried between calls."""
        from ..engine import at_once as at_once_mod
        from ..plan.attribution import attribution_steps

        if self.root is None:
            return []
        if self.flat:
            return [[next(iter(self.slots))]]
        points = [(k, p) for k, p in self.root.steps.items() if isinstance(p, Plan)]
        if not getattr(self.loaded, "incremental", True):
            return [[k for k, _ in points]]
        # An estimated sweep is one group: its points are estimated from one attribution pass, and
        # the points it verifies are chosen only once every point is estimated. It walks where its
        # first point would have.
        estimated = {a.name: [p for p, _ in a.users] for a in attribution_steps(self.root)}
        first = {users[0]: users for users in estimated.values()}
        others = [(k, p) for k, p in points if not any(k in users for users in estimated.values())]
        if self.options.at_once > 1:
            groups = [[k for k, _, _ in g] for g in at_once_mod.groups(others, self.options.at_once,
                                                                         self.options.batch_size)]
        else:
            groups = [[k] for k, _ in others]
        starts = {g[0]: g for g in groups}
        ordered = []
        for k, _ in points:
            if k in first:
                ordered.append(first[k])
            elif k in starts:
                ordered.append(starts[k])
        return ordered

    # --- 4. compute ------------------------------------------------------------------------

    def executed(self, key: str) -> Plan:
        """The point's plan as the walk ran it (results filled), computing its group if needed;
        refuses as its compile or its walk did."""
        self.compute([key])
        slot = self.slots[key]
        if slot.error is not None:
            raise slot.error
        return self.root if self.flat else self.root.steps[key]

    def compute(self, keys=None) -> None:
        """Run the groups holding ``keys`` (None: every point left, in one walk)."""
        if keys is None:
            pending = [g for g in self.groups if not all(self._done(k) for k in g)]
            if pending:
                self._walk([k for g in pending for k in g])
            return
        wanted = set()
        for key in keys:
            slot = self.slots[key]
            if slot.error is not None and slot.compiled is None:
                raise slot.error
            if key in self._group_of:
                wanted.add(self._group_of[key])
        for i in sorted(wanted):  # in the walk's order, as the whole walk would run them
            if not all(self._done(k) for k in self.groups[i]):
                self._walk(self.groups[i])

    def _done(self, key: str) -> bool:
        slot = self.slots[key]
        return slot.error is not None or slot.ran

    def _walk(self, members: list[str]) -> None:
        from ..engine.passes import walking
        from ..engine.steps import State
        from ..plan.attribution import attribution_steps

        if self.flat or len(members) == self._in_root:
            plan, whole = self.root, True
        else:
            steps = {SHARED: self.root.steps[SHARED]} if SHARED in self.root.steps and not self._lent else {}
            # The attribution pass of a group of estimated points walks with them (before them).
            steps.update((a.name, a) for a in attribution_steps(self.root) if a.users[0][0] in members)
            steps.update((k, self.root.steps[k]) for k in members)
            plan, whole = replace(self.root, steps=steps, provenance={}), False
        # A walk of the whole root starts afresh, as a run always has (its progress counts every row);
        # a group's walk carries the state the earlier groups left (the shared reads still lent).
        state = None if whole else (self.state if self.state is not None else State())
        try:
            with self.clock.walk({k: k for k in members if not self.flat}), walking():
                walked = self.loaded.execute(plan, batch_size=self.options.batch_size,
                                             at_once=self.options.at_once, state=state)
        except Exception as err:  # noqa: BLE001 — each point of the group reports it
            for k in members:
                self.slots[k].error = err
            raise
        self.state = state
        self._lent = self._lent or SHARED in plan.steps
        if self.provenance is None:
            self.provenance = dict(walked.provenance)
        self.attribution.update(walked.results.get("attribution", {}))
        if whole:
            self._walked = walked
        for k in members:
            self.slots[k].ran = True
            self._remember(self.slots[k])

    @property
    def walked(self) -> Optional[Plan]:
        """The root as one walk ran it, when one walk ran it all (a document run's ``Run.plan``)."""
        return self._walked

    def record(self) -> dict:
        """What the walk records (engine, versions, dtype served, the model): the record of the
        first group that ran, or, with every point served, what a walk would record."""
        if self.provenance is None:
            from ..engine import provenance

            return provenance.record(self.loaded, False, self.options.batch_size, self.options.at_once)
        return dict(self.provenance)

    # --- the cache's side ------------------------------------------------------------------

    def _remember(self, slot: Slot) -> None:
        """Store a computed point, keyed on what the walk recorded (not on what was foreseen)."""
        from ..plan.attribution import estimated_steps

        if self.store is not None and not estimated_steps(slot.compiled):
            from ..cache.serve import put

            put(self.store, slot.compiled, self.root if self.flat else self.root.steps[slot.key], self.loaded,
                self.record())


def _estimates(valid) -> bool:
    """Whether a point has a step estimated by attribution."""
    return any(getattr(step, "estimate", None) is not None for step in valid.spec.steps.values())


def chosen(doc, names) -> tuple:
    """The document's points named in ``names`` (None: all), in the document's order."""
    known = [p.name for p in doc.points]
    wanted = set(known if names is None else names)
    for name in wanted - set(known):
        shown = known if known != [None] else "none: it is not swept (name its point None)"
        raise PlanError(f"point {name!r}", f"not in {doc.name}", f"points: {shown}")
    return tuple(p for p in doc.points if p.name in wanted)

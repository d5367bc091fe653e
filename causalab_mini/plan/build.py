"""Spec + model facts + data → Plan, with no weights loaded.

Everything decidable without activations is decided here: an address and a
width per site, the token ids of every prompt (left padded), the order the
forwards run in, the taps of each forward in forward order, the metric token
ids, and every refusal that needs the model's config or the data. What it
returns is strings, integers and tuples.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from .. import data as data_mod
from .. import reading
from ..document.rules import ORIGINAL
from ..document.spec import FitStep, ObserveStep, Ref, Spec, WeightsStep
from ..errors import CompileError, MissingArtifact
from ..formats import TENSORS, format_of
from ..ops import locate
from ..components import PATTERNS
from ..metric_kinds import SEQUENCE_UNITS
from ..vocab import FEATURIZERS, METRICS
from . import forced, show_tokens
from .chat import render_row
from .plan import (Address, Epochs, FeaturizerSpec, Featurizers, Fit, Forward, Metric, Observe, Operand,
                   OutputSpec, Plan, ReadOp, SaveSpec, Weights, WriteOp, group_taps)
from .featurizer_files import bundle_header, space_width
from . import attribution
from ..memo import kept
from .schedule import schedule
from .share import share
from .tokens import Tokenized, answer_tokens, answers_tokens, tokenize_rows

BUFFER_BOUND = 256 * 2**20  # bytes a stacked continuation read may hold (rows × decode × width × 4)


@dataclass
class Context:
    """What every point of one document compiles against."""

    facts: Any  # model.facts.ModelFacts (or an engine exposing the same members)
    data_roots: list
    document_dir: Path
    engine: str = "nnterp"
    share: bool = True  # run the forwards sweep points share once (share.py); False: each point its own
    # Tokenizations made for one point, kept for the others: a sweep's points read the same rows
    # through the same tokenizer (``facts`` holds it for as long as this context lives), so a
    # 1,000-point sweep encodes each prompt and answer once, not once per point.
    tokenized: dict = field(default_factory=dict, repr=False)  # (rendered rows, path) -> Tokenized
    answers: dict = field(default_factory=dict, repr=False)  # answer text -> its token ids
    # The same holds one level up: every point of a sweep reads the same datasets, renders the same
    # rows of a role and scores the same metric on them; each is made once (successes only: a
    # refusal names the field that asked, so it is made afresh).
    datasets: dict = field(default_factory=dict, repr=False)  # dataset ref -> data.Dataset
    prompts: dict = field(default_factory=dict, repr=False)  # (dataset, field, rows) -> Tokenized
    metrics: dict = field(default_factory=dict, repr=False)  # (path, definition, read, rows, ...) -> Metric
    metric_of: dict = field(default_factory=dict, repr=False)  # the same by the definition's identity (memo.kept)
    pieces: dict = field(default_factory=dict, repr=False)  # token id -> its piece
    # Fixed cuts found to fit every row of a prompt set (a sweep's points cut the same prompts at
    # the same few places), by the Tokenized's identity and the cut (memo.kept).
    fitted: dict = field(default_factory=dict, repr=False)
    sites: dict = field(default_factory=dict, repr=False)  # a validated site's address, by its identity

    def locate(self, site, path: str):
        """A site's address. The points of a sweep share the site's object where the sweep leaves
        it alone (document/read.py): its address is found once (successes only, as ``answers``)."""
        return kept(self.sites, site, lambda: self.facts.locate(site, path=path, engine=self.engine))

    def tokenize(self, rendered: list, path: str) -> Tokenized:
        key = (tuple(rendered), path)
        if key not in self.tokenized:
            known = next(iter(self.tokenized.values())).prefix if self.tokenized else None  # asked once
            self.tokenized[key] = tokenize_rows(self.facts.tokenizer, rendered, path=path, prefix=known)
        return self.tokenized[key]


def build(raw: dict, points, ctx: Context) -> Plan:
    """The whole document: a root plan, with one nested plan per sweep point if it is swept.

    ``points`` are the document's points as ``document.read.points`` lowered and validated them
    (name, spec, document, coords): a document is lowered and validated once, not again here."""
    if len(points) == 1 and points[0].name is None:
        return attribution.attribute(compile_point(points[0].spec, ctx, name="<root>", document=raw))
    children = {point.name: compile_point(point.spec, ctx, name=point.name, document=point.document,
                                          coords=point.coords)
                 for point in points}
    root = Plan(name="<root>", steps=children, document=raw, produced_by=None)
    return attribution.attribute(share(root) if ctx.share else root)


def compile_point(spec: Spec, ctx: Context, *, name: str, document: dict, coords=()) -> Plan:
    addresses = {n: ctx.locate(site, f"sites.{n}") for n, site in spec.sites.items()}
    compiler = _PointCompiler(spec, ctx, addresses)
    steps: dict = {}
    if spec.featurizers:
        steps["featurizers"] = compiler.featurizers()
    for sname, step in spec.steps.items():
        if isinstance(step, ObserveStep):
            steps[sname] = compiler.observe(sname, step)
        elif isinstance(step, FitStep):
            steps[sname] = compiler.fit(sname, step)
        elif isinstance(step, WeightsStep):
            steps[sname] = compiler.weights(sname, step)
    return Plan(name=name, steps=steps, document=document, produced_by=compiler.produced_by,
                coords=tuple(coords))


class _PointCompiler:
    def __init__(self, spec: Spec, ctx: Context, addresses: dict[str, Address]):
        self.spec, self.ctx, self.addresses = spec, ctx, addresses
        self.tok = ctx.facts.tokenizer
        self.published: dict[str, Optional[int]] = {}  # output name -> width (None: not an operand)
        self.spaces = {n: self._space(n) for n in spec.featurizers}

    @cached_property
    def produced_by(self) -> str:
        # The spec's digest, made once per point: ``Spec.produced_by`` dumps and hashes the whole
        # point each time it is asked, and every pass, save and the plan of a point carry it.
        return self.spec.produced_by

    # --- featurizers -------------------------------------------------------
    def _space(self, name: str) -> int:
        """Width of a featurizer's space: k for a basis or a dictionary, d for a mask over units (a gate)."""
        feat = self.spec.featurizers[name]
        path = f"featurizers.{name}"
        if self.addresses[feat.site].component in PATTERNS:
            raise CompileError(f"{path}.site", f"site {feat.site!r} is an attention pattern, whose width "
                               "is the keys of each forward's padded batch, and a featurizer has one d",
                               "read or write the pattern with the identity featurizer")
        d = self.addresses[feat.site].width
        if feat.file_path is not None:
            expected = dict(bundle_header(self.spec.model, self.addresses[feat.site], feat.kind, d, feat.k))
            return space_width(feat, self._file(feat.file_path, f"{path}.file_path"), d, path, expected)
        if FEATURIZERS[feat.kind].space == "units":
            return d
        if feat.k > d:
            raise CompileError(f"{path}.k", f"k={feat.k} is more directions than the site's {d}",
                               f"use k <= {d}")
        return feat.k

    def _file(self, file_path: str, path: str) -> Path:
        named = self.ctx.document_dir / file_path
        resolved = named.resolve()
        try:
            reading.check_regular(named)  # a FIFO blocks and /dev/zero never ends: refused by kind
        except reading.NotRegular as err:
            raise CompileError(path, f"{file_path!r} ({named}) {err}",
                               "point at a bundle a weights step saved") from None
        except OSError:
            raise MissingArtifact(path, f"{file_path!r} does not exist (looked at {resolved})",
                                  "write the path relative to the document, or run the document "
                                  "whose weights step saves it") from None
        return resolved

    def _k(self, name: str) -> Optional[int]:
        """A featurizer's k: its space's width, or None where its features are the site's own units."""
        return None if FEATURIZERS[self.spec.featurizers[name].kind].space == "units" else self.spaces[name]

    def featurizers(self) -> Featurizers:
        trained = {p for s in self.spec.steps.values() if isinstance(s, FitStep) for p in s.params}
        specs = []
        for name, feat in self.spec.featurizers.items():
            address = self.addresses[feat.site]
            specs.append(FeaturizerSpec(
                name=name, kind=feat.kind, address=address, d=address.width,
                k=self._k(name), seed=feat.seed,
                file_path=str(self._file(feat.file_path, f"featurizers.{name}.file_path"))
                if feat.file_path else None,
                trained=name in trained, start=feat.start))
        return Featurizers(name="featurizers", specs=tuple(specs))

    # --- steps -------------------------------------------------------------
    def _datasets(self, path: str, rows: dict[str, str]):
        loaded = {role: self._dataset(ref, f"{path}.{role}") for role, ref in rows.items()}
        counts = {role: len(ds.rows) for role, ds in loaded.items()}
        if len(set(counts.values())) > 1:
            raise CompileError(path, f"the roles' datasets have different numbers of rows: {counts}",
                               "pair them row for row: give every role a dataset of the same length")
        return loaded

    def _dataset(self, ref: str, path: str):
        if ref not in self.ctx.datasets:
            self.ctx.datasets[ref] = data_mod.load(ref, self.ctx.data_roots, path=path)
        return self.ctx.datasets[ref]

    def observe(self, sname: str, step: ObserveStep) -> Observe:
        loaded = self._datasets(f"steps.{sname}.rows", step.rows)
        n = len(next(iter(loaded.values())).rows)
        obs = self._pass(sname, sname, step.interventions, loaded, range(n), step)
        if step.estimate is not None:
            obs = attribution.estimated(f"steps.{sname}", step, obs, self.spec, self.ctx.engine)
        for oname, out in step.outputs.items():
            forward, read = next((f, r) for f in obs.forwards for r in f.reads if r.name == out.read)
            if out.reduce == "pca":
                self._check_pca(f"steps.{sname}.outputs.{oname}", out.k, read, forward)
            self.published[oname] = None if out.reduce == "pca" else read.width
        return obs

    def _check_pca(self, path: str, k: int, read: ReadOp, forward: Forward) -> None:
        """A rank-k PCA needs k+1 vectors at least and k <= d; both are known here for a fixed cut."""
        if k > read.width:
            raise CompileError(f"{path}.k", f"k={k} is more directions than the read's {read.width}",
                               f"use k <= {read.width}")
        if not read.where.fixed:
            return
        spans = locate.content_spans(forward.mask, len(locate.special_prefix(self.tok)))
        vectors = sum(len(w or ()) for w in locate.cut_rows(spans, read.where))
        if vectors < k + 1:
            raise CompileError(f"{path}.k", f"read {read.name!r} gives {vectors} vectors, too few for "
                               f"a rank-{k} PCA (it needs at least {k + 1})",
                               "harvest more vectors (every token: {\"all\": true}) or lower k")

    def fit(self, sname: str, step: FitStep) -> Fit:
        path = f"steps.{sname}"
        loaded = self._datasets(f"{path}.rows", step.rows)
        n = len(next(iter(loaded.values())).rows)
        def update(e: int, u: int, rows: tuple) -> Observe:
            return self._pass(f"{sname}/epochs[{e}][{u}]", sname, step.interventions, loaded, rows, None)

        epochs = Epochs(step.epochs, n, step.batch_size, step.seed, update)
        evaluation = None
        if step.held_out:
            held = self._datasets(f"{path}.held_out", step.held_out)
            m = len(next(iter(held.values())).rows)
            evaluation = self._pass("evaluation", sname, step.interventions, held, range(m), step)
        es = step.early_stop
        return Fit(
            name=sname, epochs=epochs, evaluation=evaluation, lr=step.lr,
            objective=tuple((float(w), t) for w, t in step.objective), params=tuple(step.params),
            early_stop=(es.metric, es.mode, es.patience) if es else None,
            anneal=tuple((g, a.start, a.end) for g, a in step.anneal.items()), seed=step.seed,
            saves=tuple(SaveSpec(s.value, s.file_path) for s in step.saves))

    def weights(self, sname: str, step: WeightsStep) -> Weights:
        model = self.spec.model
        header = (("model", model.key), ("revision", model.revision or ""),
                  ("produced_by", self.produced_by))
        saves = []
        for s in step.saves:
            feat = self.spec.featurizers[s.value]
            address = self.addresses[feat.site]
            saves.append(SaveSpec(s.value, s.file_path, bundle_header(
                model, address, feat.kind, address.width, self._k(s.value),
                seed=feat.seed, produced_by=self.produced_by)))
        return Weights(name=sname, names=tuple(step.names), saves=tuple(saves), header=header)

    def _saves(self, step, iv, outputs) -> tuple[SaveSpec, ...]:
        """An observe step's saves; a tensor output's carries where it was read, for whoever loads it."""
        saves = []
        for s in getattr(step, "saves", ()):
            out = next((o for o in outputs if o.name == s.value), None)
            header = ()
            if out is not None and format_of(s.file_path).holds == TENSORS:
                read = iv.reads[out.read]
                address = self.addresses[read.site]
                d = self.spaces[read.featurizer] if read.featurizer else address.width
                header = bundle_header(self.spec.model, address, out.reduce or "activations", d, out.k,
                                       produced_by=self.produced_by)
            saves.append(SaveSpec(s.value, s.file_path, header))
        return tuple(saves)

    # --- one pass ----------------------------------------------------------
    def _pass(self, name: str, sname: str, iv_name: str, loaded: dict, rows, step) -> Observe:
        iv = self.spec.interventions[iv_name]
        ipath = f"interventions.{iv_name}"
        rows = list(rows)
        first = next(iter(loaded.values()))
        ids = first.example_ids()
        example_ids = tuple(ids[i] for i in rows)
        texts = {role: self._prompts(role, ds, rows) for role, ds in loaded.items()}
        forwards = tuple(self._forward(ipath, iv, model, role, loaded, rows, texts[role])
                         for model, role in schedule(ipath, iv, self.addresses))
        self._check_operands(ipath, iv, forwards)
        metrics = tuple(self._metric(f"{ipath}.metrics.{m}", m, metric, iv, loaded, rows)
                        for m, metric in iv.metrics.items())
        forwards = forced.with_forced(ipath, forwards, metrics)
        outputs = tuple(OutputSpec(o, out.read, out.reduce, out.k)
                        for o, out in getattr(step, "outputs", {}).items())
        saves = self._saves(step, iv, outputs)
        return Observe(name=name, intervention=iv_name, forwards=forwards, metrics=metrics,
                       outputs=outputs, saves=saves, example_ids=example_ids,
                       produced_by=self.produced_by)

    def _prompts(self, role: str, ds, rows: list) -> Tokenized:
        """A role's rows rendered (a chat through the tokenizer's template) and tokenized."""
        field, path = self.spec.roles[role].field, f"roles.{role}.field"
        key = (id(ds), field, tuple(rows), path)  # ds: held by ctx.datasets for the context's life
        tokens = self.ctx.prompts.get(key)
        if tokens is None:
            rendered = [render_row(self.tok, data_mod.get_field(ds.rows[i], field, path=path, row_index=i),
                                   path, i) for i in rows]
            tokens = self.ctx.prompts[key] = self.ctx.tokenize(rendered, path)
        return tokens

    def _anchors(self, path: str, where, role: str, loaded: dict, rows, tokens: Tokenized) -> Optional[tuple]:
        """The per-row text a variable scope binds to; a segment scope needs a chat to find it in."""
        segment = where.scope.segment if where.scope is not None else None
        if segment is not None and where.frame == "prompt" and tokens.segments is None:
            raise CompileError(f"{path}.pos.scope.segment", f"segment {segment!r} is a chat turn, and "
                               f"role {role!r} ({self.spec.roles[role].field}) holds plain-text prompts",
                               "scope a variable, or give the role a field of {\"role\", \"content\"} messages")
        if where.scope is None or where.scope.variable is None:
            return None
        ds = loaded[role]
        field = self.spec.roles[role].field
        data_mod.check_variable(ds, field, where.scope.variable, path=f"{path}.pos.scope.variable")
        return tuple(data_mod.variable_text(ds.rows[i], field, where.scope.variable, row_index=i)
                     for i in rows)

    def _check_lens(self, path: str) -> None:
        """A lens goes through the final norm: where the model has none to reach, it is refused."""
        from ..document.spec import Site

        try:
            self.ctx.facts.locate(Site(component="ln_final"), path=path, engine=self.ctx.engine)
        except CompileError as err:
            raise CompileError(f"{path}.view", "a logit lens projects through the model's final norm, "
                               f"which it cannot reach here: {err.problem}", err.fix) from None

    def _read_width(self, read, address: Address) -> int:
        if read.view == "logits":
            return self.ctx.facts.width("lm_head")
        if read.featurizer:
            return self.spaces[read.featurizer]
        return address.width  # a pattern (scores, probs): already this forward's heads × keys (keyed)

    def _address(self, site: str, path: str, where, tokens: Tokenized) -> Address:
        """A site's address as one forward's ops see it: a pattern (scores, probs) gets this forward's keys."""
        address = self.addresses[site]
        if address.component not in PATTERNS:
            return address
        if _step_of(where) is not None:
            raise CompileError(f"{path}.pos", "an attention pattern gains a key at every decode step, "
                               "so a tap on the continuation has no fixed width",
                               f"read or write {address.component} in the prompt frame")
        return keyed(address, len(tokens.ids[0]), self.ctx.facts.heads(address.component))

    def _forward(self, ipath, iv, model: str, role: str, loaded, rows, tokens: Tokenized) -> Forward:
        ops: list = []
        write_names = iv.models[model].writes if model != ORIGINAL else []
        for wname in write_names:
            w = iv.writes[wname]
            wpath = f"{ipath}.writes.{wname}"
            address = self._address(w.site, wpath, w.pos, tokens)
            self._check_cut(wpath, wname, w.pos, tokens)
            if iv.decode and address.component in ("attention_key", "attention_value"):
                # The model caches its keys and values before the attention function sees them: the
                # prompt's own attention would take the write, every generated token the original.
                raise CompileError(f"{wpath}.site", f"{address.component} written in a pass that decodes: "
                                   "the model caches keys and values before its attention sees them, so "
                                   "the generated tokens would read the unwritten ones",
                                   "write it in a pass without decode, or write attention_output or the "
                                   "residual stream instead")
            if w.features is not None:
                space = self.spaces[w.featurizer] if w.featurizer else address.width
                bad = [f for f in w.features if f >= space]
                if bad:
                    raise CompileError(f"{wpath}.features", f"feature(s) {bad} are outside the "
                                       f"{space}-wide space of {w.featurizer or 'identity'!r}",
                                       f"use indices 0..{space - 1}")
            operand = None
            if w.operand is not None:
                kind, value = ("ref", w.operand.ref) if isinstance(w.operand, Ref) else \
                    ("number", w.operand) if isinstance(w.operand, float) else ("read", w.operand)
                operand = Operand(kind, value)
            ops.append(WriteOp(
                name=wname, address=address, where=w.pos,
                anchors=self._anchors(wpath, w.pos, role, loaded, rows, tokens), mechanism=w.mechanism,
                operand=operand, params=tuple(sorted(w.params.items())), featurizer=w.featurizer,
                features=tuple(w.features) if w.features is not None else None,
                step=_step_of(w.pos)))
        for rname, r in iv.reads.items():
            if (r.model, r.input) != (model, role):
                continue
            rpath = f"{ipath}.reads.{rname}"
            address = self._address(r.site, rpath, r.pos, tokens)
            self._check_cut(rpath, rname, r.pos, tokens)
            if r.view == "logits":
                self._check_lens(rpath)
            width = self._read_width(r, address)
            step = _step_of(r.pos)
            if step == "all":
                step = "stack"  # a read at every step keeps each one: the stack, cut to all of it
            if step == "stack":
                held = len(rows) * iv.decode * width * 4
                if held > BUFFER_BOUND:
                    raise CompileError(f"{rpath}.pos", f"a cut of the continuation keeps every decode "
                                       f"step: {len(rows)} rows x {iv.decode} steps x {width} wide is "
                                       f"{held / 2**20:.0f} MiB, over the {BUFFER_BOUND >> 20} MiB bound",
                                       "read at a decode step ({\"index\": k}), fewer rows, or a narrower site")
            ops.append(ReadOp(name=rname, address=address, where=r.pos,
                              anchors=self._anchors(rpath, r.pos, role, loaded, rows, tokens),
                              featurizer=r.featurizer, view=r.view, width=width, step=step))
        self._check_context(ipath, iv, role, loaded[role], rows, tokens)
        return Forward(model=model, input=role, dataset=loaded[role].ref, ids=tokens.ids,
                       mask=tokens.mask, sample=tokens.sample, texts=tokens.texts,
                       segments=tokens.segments, decode=iv.decode, taps=group_taps(ops))

    def _check_context(self, ipath: str, iv, role: str, ds, rows, tokens: Tokenized) -> None:
        """Prompt and continuation must fit the positions the model was built for: past them a
        learned position table has no row (an index error deep in a forward) and a rotary model
        is outside what it was trained on."""
        limit = self.ctx.facts.context_length
        width = len(tokens.ids[0]) if tokens.ids else 0
        if limit is None or width + (iv.decode or 0) <= limit:
            return
        if width > limit:
            lengths = [sum(m) for m in tokens.mask]
            longest = max(range(len(lengths)), key=lengths.__getitem__)
            raise CompileError(f"roles.{role}.field", f"{ds.ref} row {list(rows)[longest]} is "
                               f"{lengths[longest]} tokens, over the {limit} positions "
                               f"{self.spec.model.key} was built for", "shorten the prompts, or use a model "
                               "with a longer context")
        raise CompileError(f"{ipath}.decode", f"{width} prompt tokens and {iv.decode} decoded make "
                           f"{width + iv.decode}, over the {limit} positions {self.spec.model.key} was "
                           "built for", f"decode at most {limit - width} tokens, or shorten the prompts")

    def _check_cut(self, path: str, name: str, where, tokens: Tokenized) -> None:
        """A fixed cut names the same tokens on every row: a row it does not fit is a wrong document."""
        if not where.fixed:
            return
        def fits() -> bool:  # asked once per prompt set and cut; a misfit refuses, and is not kept
            spans = locate.content_spans(tokens.mask, tokens.prefix)
            misses = [i for i, w in enumerate(locate.cut_rows(spans, where)) if w is None]
            if misses:
                raise CompileError(f"{path}.pos", *locate.misfit(name, where, spans, misses))
            return True

        kept(self.ctx.fitted, tokens, fits, where)

    def _check_operands(self, ipath: str, iv, forwards) -> None:
        reads = {r.name: (r, f) for f in forwards for r in f.reads}
        for f in forwards:
            for w in f.writes:
                if w.operand is None or w.operand.kind == "number":
                    continue
                wpath = f"{ipath}.writes.{w.name}.operand"
                space = self.spaces[w.featurizer] if w.featurizer else w.address.width
                want = {space, len(w.features)} if w.features else {space}
                if w.operand.kind == "ref":
                    have = self.published.get(w.operand.value)
                    if have is None:
                        raise CompileError(wpath, f"{w.operand.value!r} is a pca basis, not an "
                                           "activation", "load it as a pca featurizer's file_path")
                else:
                    read, src = reads[w.operand.value]
                    have = read.width
                    if w.address.component in PATTERNS:
                        _check_pattern_alignment(wpath, src, f)
                if have not in want:
                    raise CompileError(wpath, f"the operand is {have} wide and the write acts on "
                                       f"{sorted(want)[0]}", "read the operand at a site as wide as the "
                                       "write's (same heads/units, same featurizer)")

    def _metric(self, path: str, name: str, metric, iv, loaded, rows) -> Metric:
        read = iv.reads[metric.of]
        ds = loaded[read.input]
        contrast, contrast_from = _contrast(name, metric, iv)
        # A frozen Metric depends on nothing else: every point of a sweep scoring this metric on
        # these rows shares one (ds: held by ctx.datasets for the context's life).
        rest = (read.model, read.input, contrast, contrast_from, id(ds), tuple(rows))

        def by_value() -> Metric:
            key = (path, name, metric, *rest)
            if key not in self.ctx.metrics:
                self.ctx.metrics[key] = self._made_metric(path, name, metric, read, ds, rows, contrast,
                                                          contrast_from)
            return self.ctx.metrics[key]
        # The points of a sweep share the definition's object where the sweep leaves it alone
        # (document/read.py): found by it first, since hashing a definition dumps it to JSON.
        return kept(self.ctx.metric_of, metric, by_value, path, name, *rest)

    def _made_metric(self, path: str, name: str, metric, read, ds, rows, contrast, contrast_from) -> Metric:
        kind = METRICS[metric.kind]
        compared = list(zip(kind.columns, metric.columns))
        if contrast is not None:
            compared.append(("distinct_from", contrast))
        answers, pieces = [], []
        for label, column in compared:
            values = data_mod.column_values(ds, column, path=f"{path}.{label}")
            answers.append(tuple(values[i] for i in rows))
            self._learn([values[i] for i in rows if values[i] is not None])
            pieces.append(tuple(None if values[i] is None else self._answer(values[i], f"{path}.{label}")
                                for i in rows))
        reasons = []
        own = len(kind.columns)
        whole = metric.score == "sequence"
        for r in range(len(rows)):
            # A missing answer of the metric's own excludes the row; a missing contrast leaves
            # nothing to collide with. Whole answers collide only when they are the same tokens.
            firsts = [(p[r] if whole else p[r][0]) for p in pieces if p[r] is not None]
            reasons.append("no_answer" if any(p[r] is None for p in pieces[:own]) else
                           ("answers_identical" if whole else "answers_share_token")
                           if len(set(firsts)) < len(firsts) else "")
        eligible = tuple(not reason for reason in reasons)
        first = tuple(tuple(None if p is None else p[0] for p in col) for col in pieces[:own])
        scored = tuple(tuple(None if p is None else self._piece(p[0]) for p in col) for col in pieces)
        unit, estimand, sequence, forced_reads = kind.unit, kind.estimand_version, None, ()
        if whole:
            # Another quantity than the first token's: its own unit and estimand.
            unit, sequence = SEQUENCE_UNITS[metric.kind], metric.per_token
            estimand = f"{kind.estimand_version}+sequence_{metric.per_token}"
            forced_reads = tuple(forced.name(metric.of, column) for column in metric.columns)
        made = Metric(name=name, kind=metric.kind, of=metric.of, model=read.model, input=read.input,
                      token_ids=first, column_eligible=eligible, unit=unit, sequence=sequence,
                      forced_reads=forced_reads, estimand_version=estimand, compared=tuple(compared),
                      answers=tuple(answers), pieces=tuple(pieces), scored=scored,
                      column_reasons=tuple(reasons), contrast_from=contrast_from,
                      reads=metric.compared_reads, params=tuple(sorted(metric.params.items())),
                      excludes=kind.excludes)
        if not any(eligible):
            reason, shared = show_tokens.collision(made)
            if shared:
                ids = ds.example_ids()
                said = show_tokens.exclusions(made, [ids[i] for i in rows])
                if whole:
                    raise CompileError(path, f"every row's whole answers are identical ({shared} of "
                                       f"{len(rows)}: {said}): each row would compare an answer with itself",
                                       "compare columns whose answers differ")
                raise CompileError(path, f"every row's answers share their scored token ({shared} of "
                                   f"{len(rows)}: {said})"
                                   ": each row would compare a token with itself",
                                   "use answers whose first tokens differ on this tokenizer "
                                   "(`causalab-mini explain --tokens` shows them), or score whole "
                                   "answers (\"score\": \"sequence\")")
            raise CompileError(path, f"no row has a value in every column {list(metric.columns)}: "
                               "a metric of nothing has no mean", "score rows that have an answer")
        return made

    def _piece(self, token_id: int) -> str:
        if token_id not in self.ctx.pieces:
            self.ctx.pieces[token_id] = self.tok.convert_ids_to_tokens(token_id)
        return self.ctx.pieces[token_id]

    def _learn(self, values: list) -> None:
        """The answers not known yet, asked of the tokenizer together; one it would refuse is left
        to ``_answer``, which refuses it naming the field that asked."""
        new = [key for key in dict.fromkeys(map(str, values)) if key not in self.ctx.answers]
        for key, ids in zip(new, answers_tokens(self.tok, new)):
            if ids is not None:
                self.ctx.answers[key] = ids

    def _answer(self, value, path: str) -> tuple[int, ...]:
        # Only successes are kept, and they do not depend on ``path``: a refusal is made afresh
        # and names the field that asked.
        key = str(value)
        if key not in self.ctx.answers:
            self.ctx.answers[key] = answer_tokens(self.tok, value, path=path)
        return self.ctx.answers[key]


def _contrast(name: str, metric, iv) -> tuple[Optional[str], Optional[str]]:
    """The column a metric's answer must differ from, and why: the document's ``distinct_from``,
    or, for a match, the other answer of a logit_diff on the same read (the document compares them)."""
    if metric.distinct_from is not None:
        return metric.distinct_from, "distinct_from"
    if metric.kind != "match":
        return None, None
    for other, m in iv.metrics.items():
        if m.kind == "logit_diff" and m.of == metric.of and metric.expected in (m.a, m.b):
            return (m.b if m.a == metric.expected else m.a), f"logit_diff {other!r}"
    return None, None


def _step_of(where):
    """The decode step a tap fires at: None (prompt frame, the prefill), k, "all" or "stack"."""
    if where.frame != "generated":
        return None
    if where.is_step:
        return "all" if where.all else where.index
    return "stack"


def keyed(address: Address, tokens: int, n_heads: int) -> Address:
    """A pattern's address (attention_scores, attention_probs) at a forward of ``tokens`` padded tokens.

    The engine shows the pattern ``(rows, heads, queries, keys)`` as ``(rows, queries,
    heads·keys)``, heads-major, so head ``h`` is columns ``h·tokens … h·tokens + tokens - 1``.
    """
    full = n_heads * tokens
    if address.heads is None:
        return replace(address, full_width=full, width=full, columns=None)
    columns = tuple(h * tokens + k for h in address.heads for k in range(tokens))
    return replace(address, full_width=full, width=len(columns), columns=columns)


def _check_pattern_alignment(path: str, source: Forward, target: Forward) -> None:
    """An attention pattern swapped across prompts must line up key for key."""
    if source.tokens != target.tokens or [sum(m) for m in source.mask] != [sum(m) for m in target.mask]:
        raise CompileError(path, "an attention pattern from another prompt must line up key for key: "
                           f"{source.input!r} pads to {source.tokens} and {target.input!r} to "
                           f"{target.tokens}, or their rows have different numbers of real tokens",
                           "pair prompts of the same token length")

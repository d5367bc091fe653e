"""The rules that relate one field of a Spec to another.

Everything here is decidable from the document alone — no model, no data — so
``validate`` and pytest collection catch it. Checks that need the model (layer
bounds, widths) or the data (columns, rows) are the compiler's (``plan/build.py``).

Each rule raises ``DocumentError(path, problem, fix)`` at the field it is about.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .. import formats, names
from ..errors import DocumentError
from ..suggest import suggest_fix
from ..vocab import COMPONENTS, FEATURIZERS, METRICS, TRAINABLE_KINDS, VOCAB_WIDE

# spec.py runs these rules from its validator, so only type annotations name its classes here:
# the dependency goes spec -> rules, never back.
if TYPE_CHECKING:
    from .spec import Intervention, Spec

ORIGINAL = "original"  # the un-written model; every intervention has it implicitly
# The kinds whose featurizer is a mask: `<name>.mask` is an objective term, and a fit anneals it.
MASK_KINDS = " or ".join(n for n, f in FEATURIZERS.items() if f.declared and f.mask)


def _known(path: str, what: str, name: str, names, hint: str = "") -> None:
    if name not in names:
        listed = ", ".join(sorted(names)) or "none"
        raise DocumentError(path, f"{what} {name!r} is not declared",
                            suggest_fix(name, names, hint or f"declared: {listed}"))


def check_spec(spec: "Spec") -> None:
    for name, feat in spec.featurizers.items():
        _known(f"featurizers.{name}.site", "site", feat.site, spec.sites)
        if feat.file_path and feat.file_path.startswith(("/", "~")):
            raise DocumentError(f"featurizers.{name}.file_path", "an absolute path",
                                "write a path relative to the document")
        if feat.file_path and ".." in feat.file_path.split("/"):
            raise DocumentError(f"featurizers.{name}.file_path", f"{feat.file_path!r} reaches outside the "
                                "document's folder (..)", "keep the bundle in a folder beside the document "
                                "and name it from there, e.g. \"artifacts/rot.safetensors\"")
    for name, iv in spec.interventions.items():
        _check_intervention(spec, f"interventions.{name}", iv)
    _check_steps(spec)
    _check_save_paths(spec)
    _check_extensions_named(spec)


def _check_extensions_named(spec: "Spec") -> None:
    """A kind an extension registered is used only by a document that names the extension: the
    document then says what it needs, and a run records the version that scored it."""
    from ..extensions import origin_of

    named = set(spec.extensions)
    for iname, iv in spec.interventions.items():
        uses = [(f"interventions.{iname}.metrics.{n}.kind", m.kind, origin_of(m.kind, "metric"))
                for n, m in iv.metrics.items()]
        uses += [(f"interventions.{iname}.writes.{n}.mechanism", w.mechanism, origin_of(w.mechanism, "mechanism"))
                 for n, w in iv.writes.items()]
        if iname == next(iter(spec.interventions)):
            uses += [(f"featurizers.{n}.kind", f.kind, origin_of(f.kind, "featurizer"))
                     for n, f in spec.featurizers.items()]
        for where, kind, origin in uses:
            if origin is not None and origin not in named:
                raise DocumentError(where, f"{kind!r} comes from the extension {origin!r}, which the "
                                    "document does not name",
                                    f"add \"extensions\": {json.dumps(sorted(named | {origin}))} to the document")


def _check_save_paths(spec: "Spec") -> None:
    """Every file a run writes has one place: no two steps save one file, and no save's file is a
    folder another save needs (``a.json`` beside ``a.json/b.json``)."""
    owner: dict[str, str] = {}
    for sname, step in spec.steps.items():
        for i, save in enumerate(getattr(step, "saves", ())):
            where = f"steps.{sname}.saves.{i}.file_path"
            if save.file_path in owner:
                raise DocumentError(where, f"{save.file_path!r} is also saved at {owner[save.file_path]}",
                                    "give each save its own file_path")
            owner[save.file_path] = where
    for path, where in owner.items():
        parts = path.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder in owner:
                raise DocumentError(where, f"{path!r} needs a folder {folder!r}, which {owner[folder]} "
                                    "saves as a file", "give one of them another file_path")


def _check_featurizer_use(spec: "Spec", path: str, featurizer, site: str) -> None:
    if featurizer is None:
        return
    _known(f"{path}.featurizer", "featurizer", featurizer, spec.featurizers)
    home = spec.featurizers[featurizer].site
    if home != site:
        raise DocumentError(
            f"{path}.featurizer",
            f"featurizer {featurizer!r} belongs to site {home!r} and is used here at site {site!r}; "
            "one featurizer name is one parameter set, used at exactly one site",
            "declare a second featurizer for the second site")


def _check_intervention(spec: "Spec", path: str, iv: "Intervention") -> None:
    if ORIGINAL in iv.models:
        raise DocumentError(f"{path}.models.{ORIGINAL}", "'original' is the un-written model and "
                            "cannot be redefined", "name the written model something else")
    for name, model in iv.models.items():
        _known(f"{path}.models.{name}.input", "role", model.input, spec.roles)
        for i, w in enumerate(model.writes):
            _known(f"{path}.models.{name}.writes.{i}", "write", w, iv.writes)
        if len(set(model.writes)) != len(model.writes):
            raise DocumentError(f"{path}.models.{name}.writes", "lists a write twice",
                                "list each write once; writes apply in list order")

    for name, read in iv.reads.items():
        rp = f"{path}.reads.{name}"
        _known(f"{rp}.site", "site", read.site, spec.sites)
        _known(f"{rp}.input", "role", read.input, spec.roles)
        if read.model != ORIGINAL:
            _known(f"{rp}.model", "model", read.model, iv.models,
                   f"declared: {', '.join([ORIGINAL, *iv.models])}")
            if iv.models[read.model].input != read.input:
                raise DocumentError(
                    f"{rp}.input",
                    f"model {read.model!r} runs on {iv.models[read.model].input!r}, not {read.input!r}",
                    f"read it on \"input\": \"{iv.models[read.model].input}\"")
        _check_featurizer_use(spec, rp, read.featurizer, read.site)
        component = COMPONENTS[spec.sites[read.site].component]
        if read.view == "logits":
            if not component.residual:
                raise DocumentError(f"{rp}.view", f"view \"logits\" projects a residual-stream value "
                                    f"through ln_final and lm_head; {component.name} is not one",
                                    "read block_output, block_input, attention_output, mlp_output, "
                                    "mlp_input or embeddings")
            if read.featurizer is not None:
                raise DocumentError(f"{rp}.view", "a logits view is of the activation itself, "
                                    "not of a featurizer's space", "drop the featurizer or the view")
        _check_frame(path, rp, iv, read.pos, write=False, name=name)

    for name, write in iv.writes.items():
        wp = f"{path}.writes.{name}"
        _known(f"{wp}.site", "site", write.site, spec.sites)
        _check_featurizer_use(spec, wp, write.featurizer, write.site)
        if COMPONENTS[spec.sites[write.site].component].name == "logits":
            raise DocumentError(f"{wp}.site", "logits is the model's returned value; nothing runs "
                                "after it, so a write there changes nothing", "write at lm_head")
        _check_frame(path, wp, iv, write.pos, write=True, name=name)
        op = write.operand
        if isinstance(op, str):
            if op not in iv.reads and op in _output_names(spec):
                raise DocumentError(
                    f"{wp}.operand", f"{op!r} is an output a step publishes, not a read of this "
                    "intervention; a bare name is a read", f"write {{\"ref\": \"{op}\"}}")
            if op not in iv.reads:
                raise DocumentError(
                    f"{wp}.operand", f"{op!r} is not a read of this intervention",
                    suggest_fix(op, iv.reads, "a value from an earlier step is {\"ref\": name}; a read "
                                "names one of: " + (", ".join(iv.reads) or "none")))
            source = iv.reads[op]
            if source.view == "logits":
                raise DocumentError(f"{wp}.operand", f"read {op!r} is a logits view; an operand "
                                    "is an activation", "read the site without a view")
            if source.featurizer != write.featurizer:
                raise DocumentError(
                    f"{wp}.operand",
                    f"read {op!r} is in the space of {source.featurizer or 'identity'!r} and this "
                    f"write acts in {write.featurizer or 'identity'!r}",
                    "give the read and the write the same featurizer")
            if source.pos.width is not None and write.pos.width is not None \
                    and source.pos.width != write.pos.width:
                raise DocumentError(
                    f"{wp}.operand", f"read {op!r} is {source.pos.width} position(s) wide and this "
                    f"write is {write.pos.width}", "make the read's window as wide as the write's")

    for name, metric in iv.metrics.items():
        mp = f"{path}.metrics.{name}"
        # The read it scores, and the reads its kind compares that one with: each logits at one
        # position per row.
        for field, op in (("of", metric.of), *metric.compared_reads):
            _known(f"{mp}.{field}", "read", op, iv.reads)
            read = iv.reads[op]
            if read.pos.width != 1:
                raise DocumentError(
                    f"{mp}.{field}", f"a metric scores one position per row, and read {op!r} at "
                    f"{read.pos.spelling()} is {'a varying number of' if read.pos.width is None else read.pos.width} "
                    "positions wide", "read one position: {\"index\": -1}, optionally with a scope")
            component = spec.sites[read.site].component
            if component not in VOCAB_WIDE and read.view != "logits":
                raise DocumentError(f"{mp}.{field}", f"read {op!r} is at {component}, not at logits",
                                    "read lm_head or logits, or add \"view\": \"logits\" to the read")
            if read.featurizer is not None:
                raise DocumentError(f"{mp}.{field}", f"read {op!r} goes through featurizer "
                                    f"{read.featurizer!r}; a metric scores logits", "drop the featurizer")
        if metric.score == "sequence":
            read = iv.reads[metric.of]
            if (read.pos.index != -1 or read.pos.scope is not None or read.pos.frame != "prompt"
                    or iv.decode is not None):
                raise DocumentError(f"{mp}.score", f"a whole answer is scored after the prompt, and read "
                                    f"{metric.of!r} is at {read.pos.spelling()}"
                                    + (" of a pass that decodes" if iv.decode is not None else ""),
                                    "read the prompt's last token (\"pos\": -1) of a pass without decode")
        for field, op in metric.compared_reads:
            if op == metric.of:
                raise DocumentError(f"{mp}.{field}", f"{field} is the read this metric scores ({op!r}): "
                                    "it would compare the read with itself",
                                    "name the read of the other pass (e.g. the original model's)")
    if set(iv.writes) & set(iv.reads):
        clash = sorted(set(iv.writes) & set(iv.reads))[0]
        raise DocumentError(f"{path}.writes.{clash}", f"{clash!r} names both a read and a write",
                            "rename one; an op's name is how its positions and provenance are reported")
    if set(iv.metrics) & set(iv.reads):
        clash = sorted(set(iv.metrics) & set(iv.reads))[0]
        raise DocumentError(f"{path}.metrics.{clash}", f"{clash!r} names both a read and a metric",
                            "rename one; a save names one or the other")


def _output_names(spec: "Spec") -> set:
    return {o for step in spec.steps.values() for o in getattr(step, "outputs", {})}


def _check_frame(ipath: str, path: str, iv, where, *, write: bool, name: str) -> None:
    if where.frame != "generated":
        return
    if iv.decode is None:
        raise DocumentError(f"{path}.pos", "the generated frame needs a decode",
                            f"add \"decode\": N to {ipath}")
    if write and not where.is_step:
        raise DocumentError(
            ipath,
            f"write {name!r}: a write in the continuation frame is at a step the decode has reached "
            f"— {{'index': k}} with k >= 0, or {{'all': true}}. {where.spelling()} names a cut of "
            "the finished continuation, which is something to read and not something to write into",
            "write at a step: \"pos\": {\"frame\": \"generated\", \"index\": 0}, or read this cut instead")
    if where.index is not None and where.scope is None and where.index >= iv.decode:
        raise DocumentError(f"{path}.pos", f"decode step {where.index} is past the decode of "
                            f"{iv.decode} steps", f"use an index below {iv.decode}")


def _check_rows(spec: "Spec", path: str, rows: dict, iv, iv_name: str) -> None:
    for role, ref in rows.items():
        _known(f"{path}.{role}", "role", role, spec.roles)
        wrong = names.problem(ref)
        if wrong:
            raise DocumentError(f"{path}.{role}", f"dataset reference {ref[:80]!r} {wrong}",
                                'write "name/split", e.g. "weekdays/train"')
        if ref.count("/") != 1 or not all(ref.split("/")):
            raise DocumentError(f"{path}.{role}", f"{ref!r} is not a dataset reference",
                                "write \"name/split\", e.g. \"weekdays/train\"")
    needed = {r.input for r in iv.reads.values()} | {m.input for m in iv.models.values()}
    for role in sorted(needed - set(rows)):
        raise DocumentError(path, f"intervention {iv_name!r} runs on role {role!r} and no rows "
                            "are given for it", f"add \"{role}\": \"<dataset>/<split>\"")


def _check_steps(spec: "Spec") -> None:
    published: dict[str, str] = {}  # output name -> step that published it
    read_names = {r for iv in spec.interventions.values() for r in iv.reads}
    for sname, step in spec.steps.items():
        sp = f"steps.{sname}"
        if step.kind == "weights":
            for i, n in enumerate(step.names):
                _known(f"{sp}.names.{i}", "featurizer", n, spec.featurizers)
            for i, save in enumerate(step.saves):
                _known(f"{sp}.saves.{i}.value", "weights name", save.value, step.names)
                formats.check_fits(f"{sp}.saves.{i}.file_path", save.file_path, formats.BUNDLE, save.value)
            continue
        _known(f"{sp}.interventions", "intervention", step.interventions, spec.interventions)
        iv = spec.interventions[step.interventions]
        _check_rows(spec, f"{sp}.rows", step.rows, iv, step.interventions)
        for wname, write in iv.writes.items():
            if write.operand_ref is not None and write.operand_ref not in published:
                raise DocumentError(
                    f"interventions.{step.interventions}.writes.{wname}.operand",
                    f"{{\"ref\": {json.dumps(write.operand_ref)}}} is not published by a step "
                    f"before {sname!r}",
                    suggest_fix(write.operand_ref, published, "publish it from an earlier observe step's outputs"
                                + (f" (published so far: {', '.join(published)})" if published else "")))
        if step.kind == "fit":
            _check_fit(spec, sp, step, iv)
        else:
            for oname, out in step.outputs.items():
                op = f"{sp}.outputs.{oname}"
                _known(f"{op}.read", "read", out.read, iv.reads)
                if oname in published:
                    raise DocumentError(op, f"{oname!r} is already published by step "
                                        f"{published[oname]!r}", "give each output its own name")
                if oname in read_names:
                    raise DocumentError(op, f"{oname!r} is also a read's name; an operand names "
                                        "one or the other", "rename the output")
                published[oname] = sname
        _check_saves(sp, step, iv)


def _check_saves(sp: str, step, iv) -> None:
    outputs = getattr(step, "outputs", {})
    generated = {f"{m}.generated" for m in [ORIGINAL, *iv.models]} if iv.decode else set()
    for i, save in enumerate(step.saves):
        path = f"{sp}.saves.{i}"
        if save.value in iv.metrics:
            formats.check_fits(f"{path}.file_path", save.file_path, formats.METRIC, save.value)
            read = iv.reads[iv.metrics[save.value].of]
            for key in ("model", "input"):
                given = getattr(save, key)
                if given is not None and given != getattr(read, key):
                    raise DocumentError(f"{path}.{key}", f"metric {save.value!r} is scored on "
                                        f"{key} {getattr(read, key)!r}, not {given!r}",
                                        f"write {getattr(read, key)!r} or omit it")
                # Omitted means the read's own: stored filled, so writing it out (as the
                # protocol always does) and omitting it are the same experiment.
                object.__setattr__(save, key, getattr(read, key))
        elif save.value in outputs or save.value in generated:
            formats.check_fits(f"{path}.file_path", save.file_path, formats.TENSOR, save.value)
        else:
            choices = sorted([*iv.metrics, *outputs, *generated])
            raise DocumentError(f"{path}.value", f"{save.value!r} is not a metric or output of "
                                "this step", suggest_fix(save.value, choices,
                                                         f"save one of: {', '.join(choices) or 'nothing'}"))
        if [s.file_path for s in step.saves].count(save.file_path) > 1:
            raise DocumentError(f"{path}.file_path", f"{save.file_path!r} is written twice",
                                "give each save its own file")


def _check_fit(spec: "Spec", sp: str, step, iv) -> None:
    if step.held_out is not None:
        _check_rows(spec, f"{sp}.held_out", step.held_out, iv, step.interventions)
    if not step.params:
        raise DocumentError(f"{sp}.params", "a fit trains the featurizers its params list, and this one "
                            "lists none", f"name the featurizers to train (kinds {', '.join(TRAINABLE_KINDS)})")
    for i, name in enumerate(step.params):
        _known(f"{sp}.params.{i}", "featurizer", name, spec.featurizers)
        kind = FEATURIZERS[spec.featurizers[name].kind]
        if not kind.trainable:
            # Refused here, not at run time: AdamW would be handed no parameters (or, beside a
            # trainable one, this featurizer would silently stay as it was loaded).
            why = ": its weights are loaded from its file_path, never trained" if kind.loads == "always" else ""
            raise DocumentError(f"{sp}.params.{i}", f"featurizer {name!r} is a {kind.name}, which has no "
                                f"parameters a fit can train{why}",
                                f"a fit trains only the kinds {', '.join(TRAINABLE_KINDS)}: drop {name!r} "
                                "from params, or declare one of those to train")
    if not step.objective:
        raise DocumentError(f"{sp}.objective", "a fit needs an objective",
                            "write [[1.0, \"<metric>\"]]")
    for i, (_, term) in enumerate(step.objective):
        tp = f"{sp}.objective.{i}.1"
        if term.endswith(".mask"):
            gate = term[: -len(".mask")]
            if gate not in step.params or not FEATURIZERS[spec.featurizers[gate].kind].mask:
                raise DocumentError(tp, f"{term!r} is the mask of a {MASK_KINDS} this fit trains, and "
                                    f"{gate!r} is not one",
                                    suggest_fix(term, [f"{g}.mask" for g in _masks(spec, step)],
                                                f"add the {MASK_KINDS} to params, or drop the term"))
            continue
        _known(tp, "metric", term, iv.metrics)
        kind = iv.metrics[term].kind
        if not METRICS[kind].differentiable:
            raise DocumentError(tp, f"metric {term!r} is a {kind}, which has no gradient",
                                "use cross_entropy or logit_diff in the objective; keep "
                                f"{kind} for early_stop")
    if step.early_stop is not None:
        _known(f"{sp}.early_stop.metric", "metric", step.early_stop.metric, iv.metrics)
        if step.held_out is None:
            raise DocumentError(f"{sp}.early_stop", "early stopping watches the held-out pass",
                                "add held_out rows")
    for gate in step.anneal:
        if gate not in step.params or not FEATURIZERS[spec.featurizers[gate].kind].mask:
            raise DocumentError(f"{sp}.anneal.{gate}", f"{gate!r} is not a {MASK_KINDS} this fit trains",
                                suggest_fix(gate, _masks(spec, step),
                                            f"anneal only a {MASK_KINDS} listed in params"))


def _masks(spec: "Spec", step) -> list:
    """The featurizers a fit trains that are masks (a gate): what `.mask` terms and anneal name."""
    return [g for g in step.params if g in spec.featurizers and FEATURIZERS[spec.featurizers[g].kind].mask]

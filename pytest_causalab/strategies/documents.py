"""Strategies for data and whole documents: dataset rows shaped like ``weekdays``
(``rows``), valid plan-shaped documents for a shipped model (``documents``), and the
two facts they are drawn within, read without torch or transformers — a model's
bounds from its ``config.json`` (``model_bounds``) and a dataset's prompt lengths on
its tokenizer (``prompt_lengths``) — with the model and data search paths.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional, Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from causalab_mini import vocab
from causalab_mini import LOCAL_ENGINES, revision_digest  # stdlib only: no torch at import

from .positions import _spelled, position_json, positions
from .tensors import _number, mechanisms
from .words import _REPO, WEEKDAY_PROMPT, WEEKDAYS


# --------------------------------------------------------------------------- rows


def _row(base: str, cf: str, days: tuple, template: str, chat: bool, split: str) -> dict:
    def after(day: str) -> str:
        return " " + days[(days.index(day) + 1) % len(days)]

    def prompt(day: str):
        text = template.format(entity=day)
        if not chat:
            return text
        return [{"role": "user", "content": "Name a weekday."},
                {"role": "assistant", "content": f"{day}."},
                {"role": "user", "content": text}]

    row = {
        "input": prompt(base),
        "counterfactual_inputs": [prompt(cf)],
        "counterfactual_inputs_variables": [{"entity": cf}],
        "entity": base,
        "base_answer": after(base),
        "cf_answer": after(cf),
        "split": split,
    }
    if not chat:
        row["answer"] = row["base_answer"]
        row["label"] = row["cf_answer"]
    return row


@st.composite
def _rows(draw, min_rows: int, max_rows: int, days: tuple, template: str, chat: bool, split: str):
    pair = st.tuples(st.sampled_from(days), st.sampled_from(days)).filter(lambda p: p[0] != p[1])
    pairs = draw(st.lists(pair, min_size=min_rows, max_size=max_rows))
    return [_row(b, c, days, template, chat, split) for b, c in pairs]


def rows(min_rows: int = 1, max_rows: int = 8, *, days: Sequence[str] = WEEKDAYS,
         template: str = WEEKDAY_PROMPT, chat: bool = False, split: str = "all"
         ) -> st.SearchStrategy[list[dict]]:
    """Lists of dataset rows with the columns of ``weekdays/train`` (or ``weekdays/chat``).

    Each row is a drawn (base, counterfactual) pair of distinct days:
    ``input`` = ``template`` with the base day as ``{entity}``,
    ``counterfactual_inputs`` = ``[the same on the counterfactual day]``,
    ``counterfactual_inputs_variables`` = ``[{"entity": cf}]``, ``entity`` (the
    base day), ``base_answer``/``answer`` and ``cf_answer``/``label`` (" " + the
    next day in ``days``' cyclic order), ``split``. With ``chat=True`` both
    prompts are message lists (user asks for a weekday, the assistant names it,
    the user asks the question) and there is no ``answer``/``label``, as in
    ``weekdays/chat``. Write them one JSON object a line to
    ``<root>/<name>/<split>.jsonl`` and a document can name ``"name/split"``.
    """
    days = tuple(days)
    if len(set(days)) < 2:
        raise InvalidArgument("days needs at least two distinct days to make a counterfactual pair")
    if "{entity}" not in template:
        raise InvalidArgument("template must contain {entity}")
    if not 0 <= min_rows <= max_rows:
        raise InvalidArgument(f"need 0 <= min_rows <= max_rows, got {min_rows}, {max_rows}")
    return _rows(min_rows, max_rows, days, template, chat, split)


# --------------------------------------------------------------------------- documents


def _search(explicit, env: str, default: Path) -> list[Path]:
    found: list[Path] = []
    if explicit is not None:
        found += [Path(p) for p in ([explicit] if isinstance(explicit, (str, os.PathLike)) else explicit)]
    found += [Path(p) for p in os.environ.get(env, "").split(os.pathsep) if p]
    return found + [default, Path.cwd() / "documents" / default.name]


def _model_dir(model: str, models) -> Path:
    for root in _search(models, "CAUSALAB_MODELS", _REPO / "documents" / "models"):
        if (root / model / "config.json").is_file():
            return (root / model).resolve()
    raise InvalidArgument(f"no model directory {model!r} with a config.json under the model search path")


def _data_file(ref: str, data) -> Path:
    name, split = ref.split("/")
    for root in _search(data, "CAUSALAB_DATA", _REPO / "documents" / "data"):
        if (root / name / f"{split}.jsonl").is_file():
            return (root / name / f"{split}.jsonl").resolve()
    raise InvalidArgument(f"no dataset {ref!r} under the data search path")


@functools.lru_cache(maxsize=None)
def _bounds(model_dir: Path) -> dict:
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config") or config

    def first(*keys, default=None):
        return next((text[k] for k in keys if text.get(k) is not None), default)

    d_model = first("hidden_size", "n_embd")
    n_heads = first("num_attention_heads", "n_head")
    return {
        "family": text.get("model_type"),
        "num_layers": first("num_hidden_layers", "n_layer"),
        "d_model": d_model,
        "n_heads": n_heads,
        "n_kv_heads": first("num_key_value_heads", default=n_heads),
        "head_dim": first("head_dim", default=d_model // n_heads),
        # The MLP width by the family's own config field (OPT's ffn_dim, Falcon's ffn_hidden_size):
        # the layout table the compiler reads, so a strategy never draws a unit the compiler refuses.
        "d_mlp": _layout(config).d_mlp(SimpleNamespace(**text), d_model),
        "vocab_size": text.get("vocab_size"),
        "revision": revision_digest(model_dir),
    }


def _layout(config: dict):
    from causalab_mini import family_layout

    return family_layout(config.get("model_type"))


def model_bounds(model: str = "tiny-llama", *, models=None) -> dict:
    """What ``documents`` draws a site within, read from ``<model>/config.json`` without transformers.

    ``num_layers``, ``d_model``, ``n_heads``, ``n_kv_heads``, ``head_dim``,
    ``d_mlp``, ``vocab_size``, ``family``, and ``revision`` (the local weights'
    ``sha256:`` digest, as a document pins it).
    """
    return dict(_bounds(_model_dir(model, models)))


# The bounds carry the sizes under ModelFacts' own names, so each component's record (its width
# rule and head count, read through vocab) sizes a drawn site exactly as the compiler does.

def _head_count(b: dict, component: str) -> int:
    return vocab.COMPONENTS[component].heads_of(SimpleNamespace(**b))


def _width(b: dict, component: str) -> int:
    return vocab.COMPONENTS[component].width_of(SimpleNamespace(**b))


def _prompt_text(row: dict, field: str):
    value = row
    for part in field.replace("]", "").replace("[", ".").split("."):
        value = value[int(part)] if part.isdigit() else value[part]
    return value


@functools.lru_cache(maxsize=None)
def _lengths(model_dir: Path, data_file: Path, fields: tuple) -> tuple[int, ...]:
    from tokenizers import Tokenizer  # the Rust library only: no torch, no transformers

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prefix = len(tok.encode("").ids)
    lengths = []
    for line in data_file.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        for field in fields:
            text = _prompt_text(row, field)
            if not isinstance(text, str):
                raise InvalidArgument(f"{data_file}: {field} is a chat; documents() draws over plain prompts")
            lengths.append(len(tok.encode(text).ids) - prefix)
    if not lengths:
        raise InvalidArgument(f"{data_file} has no rows")
    return tuple(sorted(set(lengths)))


def prompt_lengths(model: str = "tiny-llama", data: str = "weekdays/train", *,
                   fields: Sequence[str] = ("input", "counterfactual_inputs[0]"),
                   models=None, data_roots=None) -> tuple[int, ...]:
    """The distinct content lengths, in tokens, of the prompts among ``fields`` of ``data``.

    Content is what the resolver cuts: the ids after the prefix the tokenizer puts
    before every prompt (BOS). ``positions(prompt_lengths(...))`` draws fixed
    positions that fit every row. Tokenized with the ``tokenizers`` library from
    ``<model>/tokenizer.json`` (no torch, no transformers).
    """
    return _lengths(_model_dir(model, models), _data_file(data, data_roots), tuple(fields))


_ANSWER_COLUMNS = ("cf_answer", "base_answer", "answer", "label")
# Columns holding the same answer on every row (answer is base_answer, label is cf_answer).
_SAME_ANSWER = {"cf_answer": "cf", "label": "cf", "base_answer": "base", "answer": "base"}


@functools.lru_cache(maxsize=None)
def _columns(data_file: Path) -> tuple:
    first = json.loads(next(line for line in data_file.read_text().splitlines() if line.strip()))
    return tuple(c for c in _ANSWER_COLUMNS if isinstance(first.get(c), str))


def _subset(n: int, max_size: int) -> st.SearchStrategy[list]:
    return st.lists(st.integers(0, n - 1), min_size=1, max_size=min(n, max_size), unique=True)


# A metric kind's params, drawn within its schema: required ones always, the others sometimes
# (their defaults are filled in when left out).
_METRIC_PARAMS = {
    "top_k": st.fixed_dictionaries({"k": st.integers(1, 5)}),
    "normalized_effect": st.fixed_dictionaries({}, optional={
        "measure": st.sampled_from(("logit_diff", "prob_diff")),
        "min_denominator": st.sampled_from((1e-6, 1e-4, 1e-3))}),
}


def _metric_params(record) -> Optional[st.SearchStrategy[dict]]:
    """The params of kind ``record`` drawn within its schema; for a kind not in the table, none when
    its schema requires none (defaults are filled in), and None when it requires some."""
    if record.name in _METRIC_PARAMS:
        return _METRIC_PARAMS[record.name]
    if any(f.is_required() for f in record.params.model_fields.values()):
        return None
    return st.just({})


@st.composite
def _document(draw, model: str, data: str, models, data_roots, sweeps: bool, scopes: bool,
              engine: Optional[str], header: bool) -> dict:
    model_dir = _model_dir(model, models)
    data_file = _data_file(data, data_roots)
    b = _bounds(model_dir)
    lengths = _lengths(model_dir, data_file, ("input", "counterfactual_inputs[0]"))
    answers = _columns(data_file)
    if not answers:
        raise InvalidArgument(f"{data} has none of the answer columns {_ANSWER_COLUMNS}")

    # --- the site a patch writes at, within the model's bounds
    components = sorted(
        name for name, c in vocab.COMPONENTS.items()
        if name not in vocab.VOCAB_WIDE and name not in ("attention_probs", "attention_scores")
        and (engine is None or engine in vocab.engines_reaching(c)))
    component = draw(st.sampled_from(components))
    comp = vocab.COMPONENTS[component]
    site: dict = {"component": component}
    layer_sweep = None
    if comp.layered:
        site["layers"] = [draw(st.integers(0, b["num_layers"] - 1))]
        if sweeps and draw(st.booleans()):
            layers = draw(st.lists(st.integers(0, b["num_layers"] - 1), min_size=1, max_size=3, unique=True))
            layer_sweep = {"sweep": [[l] for l in layers]}
    space = _width(b, component)
    if comp.selector == "heads" and draw(st.booleans()):
        site["heads"] = draw(_subset(_head_count(b, component), 4))
        space = len(site["heads"]) * b["head_dim"]
    elif comp.selector == "units" and draw(st.booleans()):
        site["units"] = draw(_subset(_width(b, component), 8))
        space = len(site["units"])
    if layer_sweep is not None:
        site["layers"] = layer_sweep

    # --- what the write does
    mechanism, params = draw(mechanisms())
    takes_operand = vocab.MECHANISMS[mechanism].operand
    operand: Any = None
    if takes_operand:
        operand = draw(st.sampled_from(("read", "number")))
    if operand == "read":
        # A read operand is as wide as the write's window on every row: a known width.
        fixed = positions(lengths, cuts=("index", "last", "span")).filter(lambda w: w.width is not None)
        pos_where = draw(fixed | positions(1, scopes="always", variables=("entity",), segments=False,
                                           cuts=("index",)) if scopes else fixed)
    else:
        pos_where = draw(positions(lengths) | positions(1, scopes="always", variables=("entity",),
                                                         segments=False) if scopes else positions(lengths))
    pos = draw(_spelled(pos_where))
    pos_sweep = None
    if sweeps and layer_sweep is None and pos_where.fixed and draw(st.booleans()):
        others = positions(lengths).filter(lambda w: operand != "read" or w.width is not None)
        extra = draw(st.lists(others, min_size=1, max_size=2, unique_by=lambda w: json.dumps(w.to_json())))
        values = list(dict.fromkeys(json.dumps(w.to_json()) for w in [pos_where, *extra]))
        pos_sweep = {"sweep": [json.loads(v) for v in values], "as": "pos"}

    write: dict = {"site": "target", "pos": pos_sweep or pos, "mechanism": mechanism}
    if params or draw(st.booleans()):
        write["params"] = params
    if operand == "read":
        write["operand"] = "v_cf"
    elif operand == "number":
        write["operand"] = draw(_number(-4, 4))
    if draw(st.integers(0, 3)) == 0:
        write["features"] = draw(_subset(space, 4))

    reads: dict = {}
    if operand == "read":
        reads["v_cf"] = {"site": "target", "pos": pos_sweep or pos, "input": "counterfactual"}
        if draw(st.booleans()):
            reads["v_cf"]["model"] = "original"
    head_component = draw(st.sampled_from(("lm_head", "logits")))
    reads["logits"] = {"site": "head", "pos": draw(position_json(lengths, cuts=("index",))),
                       "model": "patched", "input": "base"}

    # --- metrics on the patched logits, and which of them are saved
    kinds = draw(st.lists(st.sampled_from(sorted(vocab.METRICS)), min_size=1, max_size=3, unique=True))
    metrics: dict = {}
    compared: list = []  # the other logits reads the drawn kinds compare the patched one with
    for kind in kinds:
        record = vocab.METRICS[kind]
        metric: dict = {"kind": kind, "of": "logits"}
        for column in record.columns:
            metric[column] = draw(st.sampled_from(answers))
        if "a" in record.columns and "b" in record.columns:
            # b is the other day's answer: a with itself shares its scored token, and every row is refused
            others = [c for c in answers if _SAME_ANSWER[c] != _SAME_ANSWER[metric["a"]]]
            if not others:
                continue
            metric["b"] = draw(st.sampled_from(others))
        if record.params is not None:
            drawn_params = _metric_params(record)
            if drawn_params is None:  # an extension's kind whose required params this cannot fill
                continue
            metric_params = draw(drawn_params)
            if metric_params or draw(st.booleans()):  # no params, or {}, written out: the same
                metric["params"] = metric_params
        # Each read slot names another logits read of one position: the original model's on the
        # base prompt ("clean"), or, for a second slot (normalized_effect's counterfactual), on
        # the counterfactual prompt ("cf_logits") — distinct reads, so the effect has a denominator.
        for i, slot in enumerate(record.reads):
            metric[slot] = ("clean", "cf_logits")[min(i, 1)]
            compared.append(metric[slot])
        metrics[kind] = metric  # each drawn metric is named by its kind: at most one of each
    if not metrics:  # data with one answer column and only a/b kinds drawn
        metrics["token_prob"] = {"kind": "token_prob", "of": "logits", "token": answers[0]}
    if "clean" in compared:
        reads["clean"] = {"site": "head", "pos": draw(position_json(lengths, cuts=("index",))),
                          "model": "original", "input": "base"}
    if "cf_logits" in compared:
        reads["cf_logits"] = {"site": "head", "pos": draw(position_json(lengths, cuts=("index",))),
                              "model": "original", "input": "counterfactual"}
    saved = draw(st.lists(st.sampled_from(sorted(metrics)), unique=True, max_size=len(metrics)))
    saves = []
    for name in saved:
        save = {"value": name, "file_path": f"{name}.json"}
        if draw(st.booleans()):  # written out or omitted: the same experiment
            save.update(model="patched", input="base")
        saves.append(save)

    roles = {"base": {"field": "input"}}
    rows_of = {"base": data}
    if operand == "read" or "cf_logits" in reads:
        roles["counterfactual"] = {"field": "counterfactual_inputs[0]"}
        rows_of["counterfactual"] = data

    doc: dict = {}
    if header:
        doc["header"] = {"description": draw(st.text(max_size=40))}
    model_ref = {"key": model, "revision": b["revision"]}
    if draw(st.booleans()):
        model_ref["dtype"] = "fp32"
    doc.update({
        "model": model_ref,
        "roles": roles,
        "sites": {"target": site, "head": {"component": head_component}},
        "interventions": {"patching": {
            "reads": reads,
            "writes": {"patch": write},
            "models": {"patched": {"input": "base", "writes": ["patch"]}},
            "metrics": metrics,
        }},
        "steps": {"score": {"kind": "observe", "interventions": "patching", "rows": rows_of,
                            "saves": saves}},
    })
    return doc


def documents(model: str = "tiny-llama", *, data: str = "weekdays/train", sweeps: bool = True,
              scopes: bool = False, engine: Optional[str] = None, header: bool = True,
              models=None, data_roots=None) -> st.SearchStrategy[dict]:
    """Whole valid plan-shaped documents (JSON dicts) for a shipped model, patching-like.

    One intervention ``patching``: a write ``patch`` at a drawn site ``target`` —
    any component but the vocabulary-wide ones and the patterns (scores, probs), at a layer
    inside the model, optionally narrowed to drawn heads or units inside its
    bounds — with a drawn mechanism and parameters (``mechanisms()``), its
    operand (when it takes one) a read ``v_cf`` of the counterfactual prompt at
    the same position, or a number; sometimes ``features`` inside the write's
    space. A read ``logits`` of the patched model at a drawn index, one to three
    metrics on it over the data's answer columns, a drawn subset of them saved; a
    kind that compares ``logits`` with other reads (``METRICS[kind].reads``) names
    the original model's logits on the base prompt (``clean``) and, for a second
    slot, on the counterfactual prompt (``cf_logits``), each at a drawn index, and
    a kind's params are drawn within its schema (top_k's ``k``, required).

    Bounds come from ``documents/models/<model>/config.json`` (the model search
    path: ``models``, ``CAUSALAB_MODELS``, the repository's ``documents/models``),
    read as JSON; the revision is the checkpoint's ``sha256:`` digest. Fixed positions
    fit every prompt of ``data`` on the model's tokenizer (``prompt_lengths``); with ``scopes`` a position may instead be
    ``{"index": 0 | -1, "scope": {"variable": "entity"}}`` (any cut of it when the
    operand is a number). ``sweeps`` sometimes sweeps the layer, or the position
    of the read and the write together (``"as": "pos"``). ``engine`` (a local
    engine) keeps to the components it reaches (``vocab.engines_reaching``). Every
    drawn document passes ``causalab_mini.document.read.points``, and the files it reads
    are read once per process.
    """
    if engine is not None and engine not in LOCAL_ENGINES:
        raise InvalidArgument(f"engine={engine!r} is None or a local engine: {', '.join(LOCAL_ENGINES)}")
    if not isinstance(data, str) or data.count("/") != 1:
        raise InvalidArgument(f"data={data!r} is a dataset reference \"name/split\"")
    return _document(model, data, models, data_roots, sweeps, scopes, engine, header)

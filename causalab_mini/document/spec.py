"""The plan-shaped document: one point of an experiment, as pydantic models.

Field shapes live here; the rules that relate one field to another (a read's
site is declared, a metric's read is one position wide, an output is published
before it is referenced, …) live in ``rules.py`` and run from ``Spec``'s
validator, so every way of building a Spec goes through them.

Every refusal is a ``DocumentError`` naming the document path of the field.
``validate_spec`` is the entry point: it turns pydantic's errors into that form
(``errors.document_error``).
"""
from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer,
                      StrictInt, ValidationError, ValidationInfo, WithJsonSchema, field_validator,
                      model_validator)

from .. import formats, names
from ..errors import CausalabError, DocumentError
from ..jsontext import array_as_tuple
from ..shapes import Where
from ..vocab import (COMPONENTS, DTYPES, FEATURIZERS, MECHANISMS, METRICS, REDUCTIONS,
                     check_params)
from ..metric_kinds import READ_SLOTS, SEQUENCE_KINDS, check_params as check_metric_params
from ..suggest import HintedValueError, did_you_mean
from .errors import document_error
from .estimate import Estimate
from .expect import Expectation
from .rules import check_spec


def _parse_where(value: Any) -> Where:
    if isinstance(value, Where):
        return value
    return Where.from_json(value)  # ValueError → pydantic error at this field's path


_POSITION_SCHEMA = {
    "description": 'A position: a bare integer (`-1` is the last prompt token) or an object with '
                   'exactly one cut (index, span, last, all), an optional scope and an optional frame.',
    "anyOf": [
        {"type": "integer"},
        {"type": "object", "additionalProperties": False,
         "properties": {
             "frame": {"enum": ["prompt", "generated"]},
             "index": {"type": "integer"},
             "span": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
             "last": {"type": "integer", "minimum": 1},
             "all": {"const": True},
             "scope": {"type": "object", "additionalProperties": False,
                       "properties": {"variable": {"type": "string"}, "segment": {"type": "string"}}},
         }},
    ],
}
Position = Annotated[
    Where,
    BeforeValidator(_parse_where),
    PlainSerializer(lambda w: w.to_json(), return_type=Any),
    WithJsonSchema(_POSITION_SCHEMA),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True, strict=True)


class Header(_Strict):
    """Everything outside the experiment: text for people and the expectations a test run checks.

    The header is excluded from ``produced_by``, so rewording a description or
    tightening an expectation does not change the experiment's digest.
    """
    description: str = ""
    protocol_version: Optional[str] = None
    expect: list[Expectation] = Field(
        default_factory=list,
        description="What a test run holds the results to (pytest_causalab): per metric result, "
                    "aggregates (mean, min, max, all, eligible) compared with thresholds.")


_MODULE_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$"


class Modules(_Strict):
    """Where a family no table knows keeps its modules (dotted paths as ``named_modules`` spells them)."""

    layers: str = Field(pattern=_MODULE_PATH, description="The decoder layers' ModuleList, from the "
                        "top-level model: `model.layers`, `transformer.h`.")
    ln_final: str = Field(pattern=_MODULE_PATH, description="The final norm, from the top-level model.")
    attention: str = Field(pattern=_MODULE_PATH, description="The attention module, inside a layer: "
                           "its output is attention_output.")
    mlp: str = Field(pattern=_MODULE_PATH, description="The MLP module, inside a layer: its input and "
                     "output are mlp_input and mlp_output.")
    attention_projection: Optional[str] = Field(None, pattern=_MODULE_PATH, description="The attention's "
                                                "output projection, inside a layer: its input is attention_z.")
    mlp_projection: Optional[str] = Field(None, pattern=_MODULE_PATH, description="The MLP's down "
                                          "projection, inside a layer: its input is mlp_hidden.")


class ModelRef(_Strict):
    key: str = Field(description="A directory relative to the document, a name under the model "
                                 "search path, or a hub id.")
    revision: Optional[str] = Field(None, description="Hub commit, or `sha256:<hex>` of a local "
                                                      "model's weights (checked at load).")
    dtype: Literal["fp32", "fp16", "bf16"] = "fp32"
    modules: Optional[Modules] = Field(None, description="Module names for a model family causalab-mini "
                                       "has no layout for (the way nnterp's RenameConfig names them); "
                                       "a known family needs none.")

    @field_validator("key")
    @classmethod
    def _portable(cls, key: str) -> str:
        if not key:
            raise ValueError("model key is empty")
        if key.startswith(("/", "\\", "~")) or (len(key) > 1 and key[1] == ":"):
            raise ValueError(
                f"{key!r} is an absolute path; a document names its model portably — a path "
                "relative to the document, a name under the model search path (--models, "
                "CAUSALAB_MODELS), or a hub id")
        wrong = names.problem(key, relative=False)
        if wrong:
            raise ValueError(f"model key {key[:80]!r} {wrong}")
        if ".." in key.split("/"):
            # A key is looked up under the document's folder and the model search path; ".."
            # would climb out of them to any directory on the machine. A hub id (org/name) has none.
            raise ValueError(f"model key {key[:80]!r} climbs out of its folder with '..'; put the model "
                             "under the model search path (--models, CAUSALAB_MODELS, a models/ folder "
                             "above the document) and name it there, or beside the document")
        return key

    @property
    def torch_dtype(self) -> str:
        return DTYPES[self.dtype]


class Role(_Strict):
    field: str = Field(description="Path into a data row: `input`, `counterfactual_inputs[0]`.")


class Site(_Strict):
    component: Literal[tuple(COMPONENTS)]  # type: ignore[valid-type]
    # validate_default: a missing "layers" is refused at sites.<name>.layers, not at the site.
    # Strict: true, "1" and 1.0 are not layer indices (pydantic's lax mode would take them).
    layers: Optional[list[StrictInt]] = Field(None, validate_default=True)
    heads: Optional[list[StrictInt]] = None
    units: Optional[list[StrictInt]] = None

    # Field validators (not one model validator) so each refusal names its own field:
    # sites.<name>.layers / .heads / .units. ``component`` is declared first, so it is in
    # info.data when it is valid; when it is not, that is the error to report.
    @field_validator("layers")
    @classmethod
    def _layers(cls, value: Optional[list[int]], info: ValidationInfo) -> Optional[list[int]]:
        component = info.data.get("component")
        if component is None:
            return value
        comp = COMPONENTS[component]
        if comp.layered and not value:
            raise ValueError(f"{component} is inside a layer: write \"layers\": [l]")
        if not comp.layered and value is not None:
            raise ValueError(f"{component} has no layer: remove \"layers\"")
        if value is not None and len(value) != 1:
            raise ValueError(f"a site is at one layer, and this names {len(value)}; sweep the "
                             "layer instead: \"layers\": {\"sweep\": [[0], [1]]}")
        if any(i < 0 for i in (value or ())):
            raise ValueError("layers are counted from 0; negative indices are not allowed")
        return value

    @field_validator("heads", "units")
    @classmethod
    def _selection(cls, value: Optional[list[int]], info: ValidationInfo) -> Optional[list[int]]:
        component = info.data.get("component")
        if value is None or component is None:
            return value
        comp, sel = COMPONENTS[component], info.field_name
        if comp.selector != sel:
            allowed = f'"{comp.selector}"' if comp.selector else "no selector"
            raise ValueError(f"{component} takes {allowed}, not \"{sel}\"")
        if not value:
            raise ValueError(f"{sel} is empty; omit it to take the whole site")
        if len(set(value)) != len(value):
            raise ValueError(f"{sel} {value} repeats an index")
        if any(i < 0 for i in value):
            raise ValueError(f"{sel} are counted from 0; negative indices are not allowed")
        return value

    @property
    def layer(self) -> Optional[int]:
        return self.layers[0] if self.layers else None


def _live_enum(table: dict, declared_only: bool = False):
    """A field's JSON-schema enum read from a live registry when the schema is made, so
    ``causalab-mini schema`` lists an installed extension's kinds too."""
    def extra(schema: dict) -> None:
        schema["enum"] = sorted(n for n, r in table.items() if not declared_only or r.declared)
    return extra


def _featurizer_kind(value: Any) -> Any:
    """A declared featurizer kind from the live vocabulary (an extension's included)."""
    kinds = sorted(n for n, f in FEATURIZERS.items() if f.declared)
    if isinstance(value, str) and value not in kinds:
        raise HintedValueError(f"unknown featurizer kind {value!r}; one of {', '.join(kinds)}",
                               did_you_mean(value, kinds) or "list them with `causalab-mini vocab`; "
                               "one an extension provides needs that extension installed")
    return value


class Featurizer(_Strict):
    kind: Annotated[str, AfterValidator(_featurizer_kind)] = Field(
        description="A featurizer kind: `causalab-mini vocab` lists the built-in ones and installed extensions'.",
        json_schema_extra=_live_enum(FEATURIZERS, declared_only=True))
    site: str
    k: Optional[int] = Field(None, ge=1)
    seed: int = Field(0, ge=0, lt=2**63)  # torch's generator takes a 64-bit seed
    file_path: Optional[str] = None
    start: Optional[float] = Field(None, description="gate: the initial θ of every unit (default 0).")

    @field_validator("file_path")
    @classmethod
    def _loadable(cls, path: Optional[str]) -> Optional[str]:
        # Relative to the document and inside its folder (rules.check_spec refuses / and .. with
        # the document's own words); what it names is a .safetensors name, read as a regular file
        # only (build._file), only its header at compile time.
        wrong = names.problem(path, relative=False) if path is not None else None
        if wrong:
            raise ValueError(f"{path[:80]!r} {wrong}")
        if path is not None and not path.endswith(".safetensors"):
            raise ValueError(f"{path!r} is not a .safetensors file; featurizer weights load from "
                             "safetensors only (never pickle)")
        return path

    # Runs only on the fields a document writes (no validate_default), so each kind is held to
    # the fields vocab.FEATURIZERS says it takes, and the refusal names the field written.
    @field_validator("k", "seed", "file_path", "start")
    @classmethod
    def _taken_by_kind(cls, value: Any, info: ValidationInfo) -> Any:
        kind = FEATURIZERS.get(info.data.get("kind"))
        field = info.field_name
        if kind is None or value is None or field in kind.params:
            return value
        if field == "k" and kind.space == "units":
            raise ValueError(f"a {kind.name}'s features are the site's units; it takes no k")
        takers = " or ".join(f"a {n}" for n, f in FEATURIZERS.items() if field in f.params)
        raise ValueError(f"a {kind.name} takes no {field} (its fields: {', '.join(kind.params)}); "
                         f"only {takers} takes it")

    @model_validator(mode="after")
    def _kind_needs(self) -> "Featurizer":
        kind = FEATURIZERS[self.kind]
        if self.file_path is not None:
            return self
        if kind.loads == "always":
            raise ValueError(f"a {self.kind} featurizer is always loaded: write \"file_path\"")
        missing = [f for f in kind.needs_without_file if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.kind} needs {' and '.join(missing)}, or a file_path to load a "
                             "fitted one")
        return self


class Ref(_Strict):
    ref: str = Field(description="The name an earlier step published in its outputs.")


Operand = Union[Ref, float, str]


class Read(_Strict):
    site: str
    pos: Position
    model: str = "original"
    input: str
    view: Optional[Literal["logits"]] = None
    featurizer: Optional[str] = None


def _mechanism(value: Any) -> Any:
    """A mechanism from the live vocabulary (an extension registered after import is known)."""
    if isinstance(value, str) and value not in MECHANISMS:
        raise HintedValueError(f"unknown mechanism {value!r}; one of {', '.join(sorted(MECHANISMS))}",
                               did_you_mean(value, MECHANISMS) or "list them with `causalab-mini vocab`; "
                               "one an extension provides needs that extension installed")
    return value


class Write(_Strict):
    site: str
    pos: Position
    mechanism: Annotated[str, AfterValidator(_mechanism)] = Field(
        description="A mechanism: `causalab-mini vocab` lists the built-in ones and installed extensions'.",
        json_schema_extra=_live_enum(MECHANISMS))
    # validate_default: a missing operand or parameter is refused at its own field's path.
    operand: Optional[Operand] = Field(None, validate_default=True)
    # Numbers for the built-ins (checked by vocab.check_params); an extension's schema may take more.
    params: dict[str, Any] = Field(default_factory=dict, validate_default=True)
    featurizer: Optional[str] = None
    features: Optional[list[int]] = None

    @property
    def operand_ref(self) -> Optional[str]:
        """The output an earlier step publishes that the operand names (``{"ref": name}``), if any."""
        return self.operand.ref if isinstance(self.operand, Ref) else None

    @field_validator("operand", mode="before")
    @classmethod
    def _operand(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("an operand is a read name, {\"ref\": name} or a number, not a boolean")
        if isinstance(value, int):
            return float(value)
        return value

    @field_validator("operand")
    @classmethod
    def _operand_wanted(cls, value: Any, info: ValidationInfo) -> Any:
        mechanism = info.data.get("mechanism")
        if mechanism is None:
            return value
        mech = MECHANISMS[mechanism]
        if mech.operand and value is None:
            raise ValueError(f"{mechanism} needs an operand: a read of this intervention, "
                             "{\"ref\": output} or a number")
        if not mech.operand and value is not None:
            raise ValueError(f"{mechanism} takes no operand; remove \"operand\"")
        return value

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict, info: ValidationInfo) -> dict:
        # Parameters are checked by name and stored with their defaults filled, so a
        # default written out and a default omitted are the same experiment.
        mechanism = info.data.get("mechanism")
        return value if mechanism is None else check_params(mechanism, dict(value))

    @field_validator("features")
    @classmethod
    def _features(cls, value: Optional[list[int]]) -> Optional[list[int]]:
        if value is not None:
            if not value or any(f < 0 for f in value):
                raise ValueError("features are non-negative indices into the featurizer's space")
            if len(set(value)) != len(value):
                raise ValueError(f"features {value} repeat an index; they must be distinct")
        return value


class ModelDef(_Strict):
    input: str
    writes: list[str] = Field(default_factory=list)


def _metric_kind(value: Any) -> Any:
    """A metric kind from the live registry (an extension registered after import is known), with
    the name a misspelling likely meant."""
    if isinstance(value, str) and value not in METRICS:
        raise HintedValueError(f"unknown metric kind {value!r}; one of {', '.join(sorted(METRICS))}",
                               did_you_mean(value, METRICS) or "list the kinds with `causalab-mini vocab`; "
                               "a kind an extension provides needs that extension installed")
    return value


class MetricDef(_Strict):
    kind: Annotated[str, AfterValidator(_metric_kind)] = Field(
        description="A metric kind: `causalab-mini vocab` lists the built-in kinds and installed extensions'.",
        json_schema_extra=_live_enum(METRICS))
    of: str
    # validate_default: a column the kind needs and the document omits is refused at its own path.
    expected: Optional[str] = Field(None, validate_default=True)
    a: Optional[str] = Field(None, validate_default=True)
    b: Optional[str] = Field(None, validate_default=True)
    target: Optional[str] = Field(None, validate_default=True)
    token: Optional[str] = Field(None, validate_default=True)
    # Other reads of the intervention the kind compares this one with, at the same rows.
    reference: Optional[str] = Field(None, validate_default=True, description="kl_div: the read whose "
                                     "distribution this read's is measured from.")
    base: Optional[str] = Field(None, validate_default=True, description="normalized_effect: the read "
                                "of the run the effect is measured from (0).")
    counterfactual: Optional[str] = Field(None, validate_default=True, description="normalized_effect: "
                                          "the read of the run the effect is measured to (1).")
    params: dict[str, Any] = Field(default_factory=dict, validate_default=True,
                                   description="The kind's parameters (top_k's k, normalized_effect's "
                                   "measure); defaults are written out.")
    token_form: Literal["space_prefixed"] = "space_prefixed"
    # How an answer of several tokens is scored: by its first token, or whole — teacher-forced
    # after the prompt under the same writes, its tokens' log-probabilities summed (or averaged).
    score: Literal["first_token", "sequence"] = Field(
        "first_token", description="first_token: an answer's first token; sequence: the whole answer, "
        "teacher-forced (cross_entropy, token_prob, logit_diff and match).")
    per_token: Literal["sum", "mean"] = Field(
        "sum", description="score: sequence: the answer's log-probability summed over its tokens, or "
        "their mean per token.")
    # A column whose answer this metric's must not share a scored token with: a row where they
    # do compares a token with itself and is excluded (answers_share_token). logit_diff's a and
    # b are always held apart; a match on a read a logit_diff also scores takes that contrast.
    distinct_from: Optional[str] = Field(None, description="A data column whose answer must not "
                                         "share the scored token (rows that do are excluded).")

    @field_validator("expected", "a", "b", "target", "token", "reference", "base", "counterfactual")
    @classmethod
    def _slot(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        kind = info.data.get("kind")
        if kind is None or kind not in METRICS:
            return value
        record = METRICS[kind]
        slots = record.reads if info.field_name in READ_SLOTS else record.columns
        what = "read" if info.field_name in READ_SLOTS else "column"
        spelled = ", ".join(f'"{c}": <{what}>' for c in slots)
        if info.field_name in slots and value is None:
            raise HintedValueError(f"{kind} names the {what}(s) {list(slots)}; missing {info.field_name!r}",
                                   f"write {{{spelled}}}")
        if info.field_name not in slots and value is not None:
            owners = [k for k, m in METRICS.items() if info.field_name in (*m.columns, *m.reads)]
            takes = f"the {what}(s) {list(slots)}" if slots else f"no {what}"
            raise HintedValueError(f"{kind} names {takes}; {info.field_name!r} belongs to {', '.join(owners)}",
                                   f"write {{{spelled}}}" if slots else f"remove {info.field_name!r}")
        return value

    # Field validators (each sees the fields declared before it), so a refusal names its field.
    @field_validator("score")
    @classmethod
    def _score(cls, value: str, info: ValidationInfo) -> str:
        kind = info.data.get("kind")
        if value == "sequence" and kind is not None and kind not in SEQUENCE_KINDS:
            raise HintedValueError(f"{kind} does not score a whole answer; the kinds that do are "
                                   f"{', '.join(SEQUENCE_KINDS)}", 'use one of those, or remove "score"')
        return value

    @field_validator("per_token")
    @classmethod
    def _per_token(cls, value: str, info: ValidationInfo) -> str:
        if value != "sum" and info.data.get("score", "first_token") == "first_token":
            raise HintedValueError("per_token is how a whole answer's tokens combine, and this metric "
                                   "scores the first token", 'add "score": "sequence", or remove per_token')
        return value

    @field_validator("distinct_from")
    @classmethod
    def _distinct(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        if value is not None and info.data.get("score") == "sequence":
            raise HintedValueError("distinct_from holds first tokens apart; a whole answer is compared "
                                   "whole (rows whose answers are the same tokens are excluded)",
                                   "remove distinct_from")
        return value

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict, info: ValidationInfo) -> dict:
        # Checked by the kind's schema and stored with defaults filled, so a default written out
        # and a default omitted are the same experiment.
        kind = info.data.get("kind")
        if kind is None or kind not in METRICS:
            return value
        return check_metric_params(METRICS[kind], value)

    @property
    def columns(self) -> tuple[str, ...]:
        """The data columns, in the order the scorer takes them (vocab.COLUMNS)."""
        return tuple(getattr(self, c) for c in METRICS[self.kind].columns)

    def __hash__(self) -> int:
        # Frozen, but params is a dict: hashed by its JSON (a compile keys its metrics on the def).
        fields = self.model_dump()
        return hash(json.dumps(fields, sort_keys=True, default=str))

    @property
    def compared_reads(self) -> tuple[tuple[str, str], ...]:
        """(slot, read name) of the other reads the kind compares this one with, in its order."""
        return tuple((slot, getattr(self, slot)) for slot in METRICS[self.kind].reads)


class Intervention(_Strict):
    reads: dict[str, Read] = Field(default_factory=dict)
    writes: dict[str, Write] = Field(default_factory=dict)
    models: dict[str, ModelDef] = Field(default_factory=dict)
    metrics: dict[str, MetricDef] = Field(default_factory=dict)
    decode: Optional[int] = Field(None, ge=1, description="Greedy decode steps after the prefill.")


class Output(_Strict):
    read: str
    reduce: Optional[Literal[tuple(REDUCTIONS)]] = None  # type: ignore[valid-type]
    k: Optional[int] = Field(None, ge=1)

    @model_validator(mode="after")
    def _k(self) -> "Output":
        if (self.reduce == "pca") != (self.k is not None):
            raise ValueError("k is for reduce: \"pca\", and pca needs it; write both or neither")
        return self


def _output(value: Any) -> Any:
    # A bare read name is shorthand for publishing the read whole.
    return {"read": value} if isinstance(value, str) else value


# A fit compiles as a count and a schedule (plan.Epochs), so this bounds a typo, not the compiler.
MAX_EPOCHS = 100_000
RESERVED = ("run.json", "document.json")  # what every run writes at its root


class Save(_Strict):
    value: str
    file_path: str
    model: Optional[str] = None
    input: Optional[str] = None

    @field_validator("file_path")
    @classmethod
    def _relative(cls, path: str) -> str:
        wrong = names.problem(path)
        if wrong:
            raise ValueError(f"{path[:80]!r} {wrong}; a save is a relative path inside the run's directory")
        if path in RESERVED:
            raise ValueError(f"{path!r} is the run's own record, written beside every run; save under another name")
        try:
            formats.format_of(path)
        except formats.UnknownFormat as refused:
            raise ValueError(f"{path!r}: {refused.problem}") from None
        return path


class ObserveStep(_Strict):
    kind: Literal["observe"]
    interventions: str
    rows: dict[str, str]
    outputs: dict[str, Annotated[Output, BeforeValidator(_output)]] = Field(default_factory=dict)
    saves: list[Save] = Field(default_factory=list)
    estimate: Optional[Estimate] = Field(None, description="Estimate the step's metrics by attribution "
                                         "instead of running each point's writes (document/estimate.py).")


class EarlyStop(_Strict):
    metric: str
    mode: Literal["max", "min"] = "max"
    patience: int = Field(3, ge=1)


class Anneal(_Strict):
    start: float = Field(gt=0)
    end: float = Field(gt=0)


class FitStep(_Strict):
    kind: Literal["fit"]
    interventions: str
    rows: dict[str, str]
    held_out: Optional[dict[str, str]] = None
    params: list[str]
    objective: list[Annotated[tuple[float, str], BeforeValidator(array_as_tuple)]]
    epochs: int = Field(1, ge=1, le=MAX_EPOCHS)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-3, gt=0)
    seed: int = Field(0, ge=0, lt=2**63)  # torch's generator takes a 64-bit seed
    early_stop: Optional[EarlyStop] = None
    anneal: dict[str, Anneal] = Field(default_factory=dict)
    saves: list[Save] = Field(default_factory=list)


class WeightsStep(_Strict):
    kind: Literal["weights"]
    names: list[str]
    saves: list[Save] = Field(default_factory=list)


Step = Annotated[Union[ObserveStep, FitStep, WeightsStep], Field(discriminator="kind")]


class Spec(_Strict):
    """One point of an experiment in the plan shape. Build it with ``validate_spec``."""

    header: Header = Field(default_factory=Header)
    model: ModelRef
    roles: dict[str, Role]
    sites: dict[str, Site]
    featurizers: dict[str, Featurizer] = Field(default_factory=dict)
    interventions: dict[str, Intervention]
    steps: dict[str, Step]
    # The distributions (or modules) whose metric kinds and mechanisms the document uses: a reader
    # without them is told which to install, and a run records their versions.
    extensions: list[str] = Field(default_factory=list, description="The extensions (installed "
                                  "distributions, or modules) whose kinds this document uses.")

    @model_validator(mode="before")
    @classmethod
    def _lowered(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            from .sweep import refuse_unlowered
            refuse_unlowered(raw, "Spec")
        return raw

    @model_validator(mode="after")
    def _rules(self) -> "Spec":
        check_spec(self)
        return self

    def canonical(self) -> dict:
        """The experiment without its header, every default written out: what ``produced_by`` digests.

        Fields added to the schema later (``model.modules``, a metric's ``distinct_from``, its
        other reads and params, a step's ``estimate``) are
        left out when the document does not use them: they do not change what an experiment
        that never used them is.
        """
        out = self.model_dump(mode="json", exclude={"header"})
        if not out.get("extensions"):
            out.pop("extensions", None)
        if out["model"].get("modules") is None:
            out["model"].pop("modules", None)
        for step in out.get("steps", {}).values():
            if step.get("kind") == "observe" and step.get("estimate") is None:
                step.pop("estimate", None)
        for iv in out.get("interventions", {}).values():
            for metric in iv.get("metrics", {}).values():
                for later in ("distinct_from", "reference", "base", "counterfactual"):
                    if metric.get(later) is None:
                        metric.pop(later, None)
                if metric.get("score") == "first_token" and metric.get("per_token") == "sum":
                    metric.pop("score", None)
                    metric.pop("per_token", None)
                if not metric.get("params"):
                    metric.pop("params", None)
        return out

    @property
    def produced_by(self) -> str:
        # Keys are sorted so spelling order does not matter — except the steps', which is the
        # order they run in (a fit before a score is not a score before a fit), so it is kept.
        payload = {"experiment": self.canonical(), "step_order": list(self.steps)}
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def validate_spec(raw: Any, *, prefix: str = "") -> Spec:
    """Validate a lowered plan-shaped point; every refusal is a ``CausalabError``."""
    if not isinstance(raw, dict):
        raise DocumentError(prefix, "a document is a JSON object", "start the file with {")
    try:
        return Spec.model_validate(raw)
    except ValidationError as err:
        raise document_error(err, prefix, raw) from None
    except CausalabError:
        raise

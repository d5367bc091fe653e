"""Where a component is in a loaded model: a module path and which side of it, for both engines.

The family's ``Layout`` (``families.py``) says where each layered component sits; this
module turns (component, layer) into a dotted module path in the top-level causal LM
and the module's input or output, and finds that module. The hooks engine hooks the
``nn.Module`` at the path; the nnterp engine touches the envoy at the same path (nnsight
keeps every module's own name beside nnterp's aliases), so the two engines address one
module by one rule.

Resolution is lazy — a component is found when a document taps it — so a family whose
MLP has no single down projection still runs every document that never asks for
``mlp_hidden``. Which module role and which side a component is read at is its record
(``components.py``); the layout spells where that role is in the family. Three modules
need no family knowledge, because transformers publishes them: the embeddings
(``get_input_embeddings``), the head (``get_output_embeddings``) and the model's own
``logits``. Every projection found is checked against the width the compiler addressed
(the record's width rule), and a miss is refused naming the component, the family and the path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from torch import nn

from ..components import (COMPONENTS, INPUT_EMBEDDINGS, INTERIORS, LAYER, LN_FINAL, MODEL, OUTPUT_EMBEDDINGS,
                          PROJECTIONS)
from ..errors import CompileError, ModelError
from ..layouts import ATTENTION

ROOT = ""  # the path of the top-level model: its output's ``logits`` is the ``logits`` component


@dataclass(frozen=True)
class Where:
    """A component's place: the module's dotted path (ROOT for the model itself) and its side."""

    path: str
    io: str  # INPUT or OUTPUT; INSIDE for an interior, reached inside the module's forward
    flat: bool = False  # the module sees (rows·seq, width): families.Port.flat


def _module_path(model: nn.Module, module: Optional[nn.Module], what: str) -> str:
    if module is None:
        raise ModelError("model", f"the model publishes no {what}",
                         "it is not a causal language model transformers knows how to head")
    for name, candidate in model.named_modules():
        if candidate is module:
            return name
    raise ModelError("model", f"the model's {what} is not one of its own modules", "")


def where(model: nn.Module, facts: Any, component: str, layer: Optional[int], path: str) -> Where:
    """Where ``component`` at ``layer`` is in ``model`` (a plain torch causal LM), checked.

    ``facts`` is the compiler's ``ModelFacts``: its layout, and the widths a projection's
    input must have. ``path`` is the document path refusals name.
    """
    role, io = COMPONENTS[component].module, COMPONENTS[component].io
    if role == INPUT_EMBEDDINGS:
        return Where(_module_path(model, model.get_input_embeddings(), "input embeddings"), io)
    if role == OUTPUT_EMBEDDINGS:
        return Where(_module_path(model, model.get_output_embeddings(), "output embeddings"), io)
    if role == MODEL:
        return Where(ROOT, io)
    layout = facts.layout
    if layout is None:  # ModelFacts.locate refused it at compile time; a plan compiled elsewhere may not have
        raise CompileError(f"{path}.component", f"{facts.key} cannot address {component}",
                           facts.refusal(component, "hooks") or "")
    if role == LN_FINAL:
        _find(model, layout.ln_final, component, layout.family, path)
        return Where(layout.ln_final, io)
    layers = layer_list(model, facts, path)
    base = f"{layout.layers}.{layer}"
    if role == LAYER:
        return Where(base, io)
    if component in INTERIORS:  # inside the attention forward: the nnterp engine reaches it there
        attention = layout.ports[ATTENTION].module
        _find(layers[layer], attention, component, layout.family, path)
        return Where(f"{base}.{attention}", io)
    port = layout.port(component)
    if port is None:
        raise CompileError(f"{path}.component", f"{layout.family}'s layout does not place {component}",
                           "use another component")
    module = _find(layers[layer], port.module, component, layout.family, path)
    _check_width(module, component, facts, path)
    return Where(f"{base}.{port.module}", port.io, port.flat)


def layer_list(model: nn.Module, facts: Any, path: str = "model") -> nn.ModuleList:
    layout = facts.layout
    layers = _find(model, layout.layers, "the layer list", layout.family, path)
    if not isinstance(layers, nn.ModuleList) or len(layers) != facts.num_layers:
        raise ModelError(path, f"{layout.family}: {layout.layers} is a {type(layers).__name__} "
                         f"of {len(layers) if hasattr(layers, '__len__') else '?'}, and the config says "
                         f"{facts.num_layers} layers", "correct model.modules.layers")
    return layers


def _find(root: nn.Module, dotted: str, what: str, family: str, path: str) -> nn.Module:
    try:
        return root.get_submodule(dotted)
    except AttributeError:
        raise CompileError(f"{path}.component", f"{family} has no module {dotted!r} for {what}",
                           "this checkpoint's layout differs from its family's; name its modules in "
                           "the document's model.modules") from None


def _in_width(module: nn.Module) -> Optional[int]:
    """The last-axis width a projection takes: Linear's in_features, GPT-2 Conv1D's nx."""
    for attr in ("in_features", "nx"):
        value = getattr(module, attr, None)
        if isinstance(value, int):
            return value
    return None


def _check_width(module: nn.Module, component: str, facts: Any, path: str) -> None:
    """A projection whose input the compiler addressed must take exactly that width."""
    comp = COMPONENTS[component]
    expected = comp.width_of(facts) if comp.module in PROJECTIONS else None
    got = _in_width(module) if expected is not None else None
    if got is not None and got != expected:
        raise ModelError(f"{path}.component", f"{facts.layout.family}: the module at {component} takes "
                         f"inputs {got} wide, and the compiler addressed {expected} from the config",
                         "the config and the checkpoint disagree; name the right module in model.modules")


def first_input(args: tuple, kwargs: dict):
    """A module's activation input: its first positional argument, or the keyword a family names it by."""
    if args:
        return args[0]
    for name in INPUT_NAMES:
        if name in kwargs:
            return kwargs[name]
    raise ModelError("", f"the module was called without a positional input or one of {INPUT_NAMES} "
                     f"(kwargs: {sorted(kwargs)})", "")


def put_first_input(args: tuple, kwargs: dict, new):
    if args:
        return (new, *args[1:]), kwargs
    for name in INPUT_NAMES:
        if name in kwargs:
            return args, {**kwargs, name: new}
    raise ModelError("", "the module's input has nowhere to go back", "")


# Llama's decoder layer and attention take hidden_states=..., its MLP x, a Linear input.
INPUT_NAMES = ("hidden_states", "x", "input")

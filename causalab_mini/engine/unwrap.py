"""nnsight's per-module wrapping kept only on the modules a forward's taps reach.

nnsight 0.7.0 wraps every module of a model when it builds the envoys: the module's ``forward``
is replaced by ``nnsight_forward`` (a skip check, a weak reference, a source-accessor lookup)
and a pass-through forward hook is added, which keeps PyTorch on its slower hook path so a hook
registered mid-forward still fires. Both cost every call of every module, inside a trace and
out: on the small Llama of ``benchmarks/sweep.py``, a quarter of the engine's time over a plain
model's forward.

A trace of this engine reaches only the modules its taps name (``standardize.where``) and
their ancestors, through whose calls nnsight hands values over. ``narrow`` gives every other
module its own forward back and removes the pass-through hook — the same arithmetic, run as
plain torch — and wraps, through nnsight's own ``wrap_module``, any module a forward needs
that an earlier narrowing unwrapped. Only nnsight's wrapping of a class's own forward is ever
undone: a module whose wrapped forward is an instance-level one of another library's is left
as nnsight made it.

The record of which modules are wrapped is kept here, by model, not on the engine: an engine
object that travels (nnsight's simulated round trip serializes the session) carries none, and
a model this module never saw is left alone.
"""
from __future__ import annotations

import weakref
from typing import Iterable

from torch import nn

_WRAPPINGS: "weakref.WeakKeyDictionary[nn.Module, _Wrapping]" = weakref.WeakKeyDictionary()


def _is_sentinel(hook) -> bool:
    """nnsight's pass-through hook: a lambda defined in its interleaver."""
    code = getattr(hook, "__code__", None)
    return (code is not None and getattr(hook, "__name__", "") == "<lambda>"
            and code.co_filename.replace("\\", "/").endswith("nnsight/intervention/interleaver.py"))


def _unwrap_one(module: nn.Module) -> bool:
    """``module``'s class forward again, nnsight's pass-through hook gone; False where the wrapped
    forward is not the class's own (left wrapped)."""
    original = module.__dict__.get("__nnsight_forward__")
    if original is None or getattr(type(module), "forward", None) is not original:
        return False
    del module.__dict__["forward"]
    del module.__dict__["__nnsight_forward__"]  # so nnsight's wrap_module wraps it afresh
    for key, hook in list(module._forward_hooks.items()):
        if _is_sentinel(hook):
            del module._forward_hooks[key]
    return True


def with_ancestors(paths: Iterable[str]) -> set[str]:
    """Every dotted module path given and each of its ancestors ("" is the model itself)."""
    found = {""}
    for path in paths:
        parts = path.split(".") if path else []
        found.update(".".join(parts[:k]) for k in range(len(parts) + 1))
    return found


class _Wrapping:
    def __init__(self, model: nn.Module, interleaver) -> None:
        self.model = weakref.ref(model)
        self.interleaver = interleaver
        self.wrapped = {p for p, m in model.named_modules() if "__nnsight_forward__" in m.__dict__}

    def narrow(self, paths: Iterable[str]) -> None:
        model = self.model()
        want = with_ancestors(paths)
        for path in sorted(self.wrapped - want):
            if _unwrap_one(model.get_submodule(path)):
                self.wrapped.discard(path)
        for path in want - self.wrapped:
            self.interleaver.wrap_module(model.get_submodule(path))
            self.wrapped.add(path)


def manage(model: nn.Module, interleaver) -> None:
    """From now on ``narrow`` decides which of ``model``'s modules carry nnsight's wrapping;
    ``interleaver`` is the one nnsight wrapped them with (the envoys')."""
    _WRAPPINGS[model] = _Wrapping(model, interleaver)


def narrow(model: nn.Module, paths: Iterable[str]) -> None:
    """Before a trace: nnsight's wrapping on exactly the modules at ``paths`` and their ancestors;
    nothing where ``manage`` was never told of ``model``."""
    wrapping = _WRAPPINGS.get(model)
    if wrapping is not None:
        wrapping.narrow(paths)

"""The engine contract: nine members and ``model``, no bodies.

An engine inherits no behaviour from here. The walk over steps, the metrics,
the fit loop and the write algebra are shared (``steps.py``, ``taps.py``,
``ops/``), so a second engine is these members and no more; a test asserts the
set of public names each engine defines, so a member added quietly fails.
"""
from __future__ import annotations

from typing import Any, ClassVar, Optional


class Engine:
    name: ClassVar[str]  # its name in engines.py: whose compile-time refusals apply
    model: Any  # the loaded model (a StandardizedTransformer, or an AutoModelForCausalLM)

    @classmethod
    def load(cls, model_ref, *, document=None, models=None, device_map="cpu",
             trust_remote_code=False, attention_probs=False, attention_seam=False) -> "Engine":
        """Resolve, load (frozen: eval(), requires_grad_(False)) and standardize a document's model.

        ``attention_probs=True``: load so the attention pattern can be tapped (eager attention),
        where the engine can; off by default, since it is slower and rounds differently."""
        ...

    def execute(self, plan, *, remote=False, batch_size=None, at_once=1, state=None):
        """Walk ``plan`` (steps.run) and return it with every step's ``results`` filled;
        ``at_once`` points' forwards stacked into one call where they can be (engine/at_once.py).
        ``state``: a walk's ``steps.State`` carried from an earlier call, so a plan's points can
        run a few at a time and still borrow the shared forwards the first call ran (an engine
        whose walk cannot carry it says ``incremental = False``)."""
        ...

    def forward(self, forward, values: dict, featurizers: dict) -> None:
        """Run one Forward: apply its taps, leave each read's value in ``values`` under its name."""
        ...

    def locate(self, site, *, path: str, engine=None):
        """A site as an Address, bounds checked and this engine's refusals applied (compile time)."""
        ...

    @property
    def num_layers(self) -> int:
        ...

    @property
    def context_length(self) -> Optional[int]:
        """Positions the model was built for (prompt plus decoded tokens); None: no fixed bound."""
        ...

    def width(self, component: str) -> int:
        ...

    def heads(self, component: str) -> int:
        ...

    @property
    def tokenizer(self):
        ...


MEMBERS = frozenset({"load", "execute", "forward", "locate", "num_layers", "context_length", "width", "heads",
                     "tokenizer"})

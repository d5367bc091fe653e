"""The clock inside ``startup.py``'s child processes: a tiny wrapper that starts a clock before any
import of its own, then either

- ``import``: imports torch and transformers, then transformers' Llama class, and says when each
  was done (the floor any run on these libraries pays); or
- ``cli ARGS...``: wraps the Llama class's ``forward`` and calls ``causalab_mini.cli.main(ARGS)``,
  saying when the first forward came, whether nnsight and nnterp were imported by then, how many
  forwards ran, and when ``main`` returned. The class is imported before the CLI runs, which
  moves that import earlier but not out of the measurement: the CLI's load imports it anyway.

Each says one line on stderr, ``startup-clock: {json}`` (stdout stays the CLI's).
"""
import time

STARTED = time.perf_counter()  # before every import below: a child's times count from here

import functools  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

MARK = "startup-clock: "


def say(**fields) -> None:
    print(MARK + json.dumps(fields), file=sys.stderr, flush=True)


def since_start() -> float:
    return time.perf_counter() - STARTED


def imports() -> None:
    importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    libraries = since_start()
    transformers.LlamaForCausalLM  # noqa: B018 - transformers imports its classes lazily, on first use
    say(torch_transformers=libraries, model_class=since_start())


def cli(argv: list) -> None:
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    seen = {"forwards": 0}
    inner = LlamaForCausalLM.forward

    @functools.wraps(inner)  # transformers reads forward's signature: keep it
    def clocked(self, *args, **kwargs):
        if not seen["forwards"]:
            seen.update(first_forward=since_start(), nnsight="nnsight" in sys.modules,
                        nnterp="nnterp" in sys.modules)
        seen["forwards"] += 1
        return inner(self, *args, **kwargs)

    LlamaForCausalLM.forward = clocked
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's package
    from causalab_mini.cli import main

    rc = main(argv)
    say(rc=rc, main_s=since_start(), **seen)
    sys.exit(rc)


if __name__ == "__main__":
    if sys.argv[1] == "import":
        imports()
    else:
        cli(sys.argv[2:])

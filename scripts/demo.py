"""The main job: validate and compile every document of the corpus on the shipped models.

Each document is validated (no model) and explained (compiled against its
model's config and tokenizer, no weights). A document that loads an artifact
another document produces (a fitted rotation, say) is reported as waiting for
it, by the typed reason, and does not fail the job; any other refusal does.
"""
from __future__ import annotations

import sys
from pathlib import Path

from causalab_mini import documents
from causalab_mini.errors import CausalabError, MissingArtifact
from causalab_mini.plan.explain import explain

ROOT = Path(__file__).resolve().parent.parent / "documents"


def main() -> int:
    paths = sorted(ROOT.rglob(f"*{documents.SUFFIX}"))
    failed, waiting = [], []
    for path in paths:
        rel = path.relative_to(ROOT.parent)
        try:
            raw = documents.read(path)
            plan = documents.compile_plan(raw, document=path)
        except MissingArtifact as err:
            waiting.append((rel, err))
            print(f"# {rel}\nwaiting: {err}\n")
            continue
        except CausalabError as err:
            failed.append((rel, err))
            print(f"# {rel}\nFAILED: {type(err).__name__}: {err}\n")
            continue
        print(f"# {rel}\n{explain(plan)}\n")
    print(f"{len(paths) - len(failed) - len(waiting)} compiled, {len(waiting)} waiting for an artifact, "
          f"{len(failed)} failed")
    return 1 if failed or not paths else 0


if __name__ == "__main__":
    sys.exit(main())

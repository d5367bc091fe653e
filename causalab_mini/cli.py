"""``causalab-mini``: vocab, schema, data, validate, explain, run, revision.

Every refusal is a ``CausalabError``; it is printed as one message (path, what
is wrong, what to write instead) without a traceback, and the exit status is 2.
Verbs that need no model import nothing heavier than pydantic.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import CausalabError


def _paths_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", action="append", metavar="DIR",
                   help="a folder of model directories (repeatable; also CAUSALAB_MODELS)")
    p.add_argument("--data", action="append", metavar="DIR",
                   help="a folder of datasets <name>/<split>.jsonl (repeatable; also CAUSALAB_DATA)")
    p.add_argument("--json", action="store_true", help="print JSON for programs")


def _cmd_vocab(args) -> int:
    from . import vocab
    print(json.dumps(vocab.as_json(), indent=1) if args.json else vocab.render())
    return 0


def _cmd_schema(args) -> int:
    from .plan.document import ProtocolDocument
    from .plan.spec import Spec
    schema = (ProtocolDocument if args.protocol else Spec).model_json_schema()
    print(json.dumps(schema, indent=1))
    return 0


def _cmd_data(args) -> int:
    from . import data
    roots = data.data_roots(args.data, None)
    ds = data.load(args.ref, roots, path="data")
    print(json.dumps(data.describe_json(ds), indent=1, ensure_ascii=False) if args.json
          else data.describe(ds))
    return 0


def _cmd_validate(args) -> int:
    from . import documents
    report = []
    for doc in args.documents:
        raw = documents.read(doc)
        pts = documents.points(raw)
        report.append({"document": doc, "shape": documents.shape(raw),
                       "points": [p.name for p in pts if p.name is not None]})
        if not args.json:
            swept = f" ({len(pts)} points)" if pts[0].name is not None else ""
            print(f"ok: {doc} is a valid {documents.shape(raw)} document{swept}")
    if args.json:
        print(json.dumps(report, indent=1))
    return 0


def _cmd_explain(args) -> int:
    from . import documents
    from .plan.explain import explain, plan_json
    for i, doc in enumerate(args.documents):
        raw = documents.read(doc)
        facts = documents.model_facts(documents.points(raw)[0].spec, Path(doc), args.models,
                                      trust_remote_code=args.trust_remote_code)
        plan = documents.compile_plan(raw, document=Path(doc), models=args.models, data=args.data,
                                      engine=args.engine, facts=facts)
        if args.json:
            print(json.dumps(plan_json(plan), indent=1))
        else:
            if len(args.documents) > 1:
                print(("\n" if i else "") + f"# {doc}")
            print(explain(plan, tokenizer=facts.tokenizer if args.tokens else None, rows=args.rows))
    return 0


def _cmd_revision(args) -> int:
    from .engine.loading import weights_digest
    for d in args.directories:
        print(f"{weights_digest(Path(d))}  {d}")
    return 0


def _bar(name: str, done: int, total: int) -> None:
    width = 24
    filled = width * done // total
    end = "\n" if done == total else ""
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name}\033[K", end=end,
          file=sys.stderr, flush=True)


def _cmd_run(args) -> int:
    from contextlib import nullcontext

    from . import api
    from .engine.steps import reporting
    from .plan.show_tokens import notes

    # A progress bar only for a person watching: not with --quiet, not into a pipe or a log.
    progress = nullcontext() if args.quiet or not sys.stderr.isatty() else reporting(_bar)
    with progress:
        ran = api.run(args.document, engine=args.engine, out=args.out, batch_size=args.batch_size,
                      models=args.models, data=args.data, device_map=args.device_map,
                      trust_remote_code=args.trust_remote_code)
    for path in ran.files:
        print(path)
    sys.stdout.flush()
    for line in notes(ran.plan):
        print(line, file=sys.stderr)
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="causalab-mini", description=__doc__.splitlines()[0])
    verbs = top.add_subparsers(dest="verb", required=True)

    p = verbs.add_parser("vocab", help="the closed vocabularies: components, mechanisms, featurizers, "
                                       "metrics, position forms")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_vocab)

    p = verbs.add_parser("schema", help="the document's JSON Schema, for editors")
    p.add_argument("--protocol", action="store_true", help="the protocol shape instead of the plan shape")
    p.set_defaults(func=_cmd_schema)

    p = verbs.add_parser("data", help="describe a dataset: NAME/SPLIT")
    p.add_argument("ref")
    _paths_options(p)
    p.set_defaults(func=_cmd_data)

    p = verbs.add_parser("validate", help="check documents without a model")
    p.add_argument("documents", nargs="+")
    _paths_options(p)
    p.set_defaults(func=_cmd_validate)

    p = verbs.add_parser("explain", help="compile documents against the model's config (no weights) "
                                         "and print the plan")
    p.add_argument("documents", nargs="+")
    p.add_argument("--engine", choices=("nnterp", "hooks"), default="nnterp",
                   help="the engine whose refusals apply (default nnterp)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="read a model whose config or tokenizer names code of its own (runs that code)")
    p.add_argument("--tokens", action="store_true",
                   help="show rows as tokens, where each read and write lands, and each answer's scored token")
    p.add_argument("--rows", type=int, default=3, metavar="N", help="rows shown per forward with --tokens "
                                                                    "(default 3)")
    _paths_options(p)
    p.set_defaults(func=_cmd_explain)

    p = verbs.add_parser("revision", help="print the sha256 revision of local model directories")
    p.add_argument("directories", nargs="+")
    p.set_defaults(func=_cmd_revision)

    p = verbs.add_parser("run", help="run a document and write its results")
    p.add_argument("document")
    p.add_argument("--engine", choices=("nnterp", "hooks", "ndif"), default="nnterp")
    p.add_argument("--device-map", default="cpu")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--out", required=True, help="the directory to write results into")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="load a model whose directory or repository ships code of its own (runs that code)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _paths_options(p)
    p.set_defaults(func=_cmd_run)
    return top


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except CausalabError as err:
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `causalab-mini explain … | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())

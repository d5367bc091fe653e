"""``causalab-mini``: causal experiments on transformer language models, written as JSON documents.

Every refusal is a ``CausalabError``; it is printed as one message (path, what
is wrong, what to write instead) without a traceback, and the exit status is 2.
Verbs that need no model import nothing heavier than pydantic.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import engines  # the engine names: standard library only, like this module's imports
from .errors import CausalabError


def _paths_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", action="append", metavar="DIR",
                   help="a folder of model directories (repeatable; also CAUSALAB_MODELS)")
    p.add_argument("--data", action="append", metavar="DIR",
                   help="a folder of datasets <name>/<split>.jsonl (repeatable; also CAUSALAB_DATA)")
    p.add_argument("--json", action="store_true", help="print JSON for programs")


def _cmd_vocab(args) -> int:
    from . import extensions, vocab

    found = extensions.extensions()  # the installed ones loaded: their kinds are in the tables below
    if args.json:
        print(json.dumps({**vocab.as_json(), "extensions": {
            n: {**e.record(), "metric_kinds": e.metric_kinds, "mechanisms": e.mechanisms,
                "featurizer_kinds": e.featurizer_kinds, "error": e.error}
            for n, e in sorted(found.items())}}, indent=1))
        return 0
    print(vocab.render())
    print("extensions:       " + ("none (installed ones are found by the 'causalab_mini' entry-point group; "
                                  "--plugin MODULE names one)" if not found else ""))
    for name, e in sorted(found.items()):
        where = f"{name} {e.version}" if e.version else f"{name} (module, not installed)"
        gives = ", ".join([*(f"metric {k}" for k in e.metric_kinds), *(f"mechanism {m}" for m in e.mechanisms),
                           *(f"featurizer {f}" for f in e.featurizer_kinds)])
        print(f"  {where}  from {e.module}: " + (f"BROKEN — {e.error}" if e.error else gives or "nothing"))
    return 0


def _cmd_schema(args) -> int:
    from .document.protocol import ProtocolDocument
    from .document.spec import Spec
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
    from . import api
    report = []
    for path in args.documents:
        doc = api.read(path)
        report.append({"document": path, "shape": doc.shape,
                       "points": [p.name for p in doc.points if p.name is not None]})
        if not args.json:
            swept = f" ({len(doc.points)} points)" if doc.points[0].name is not None else ""
            print(f"ok: {path} is a valid {doc.shape} document{swept}")
    if args.json:
        print(json.dumps(report, indent=1))
    return 0


def _cmd_explain(args) -> int:
    from . import api
    from .plan.compile import model_facts
    from .plan.explain import explain, plan_json
    for i, path in enumerate(args.documents):
        doc = api.read(path)
        # The config and tokenizer, read once: the compile's facts, and the tokens explain shows.
        facts = model_facts(doc.points[0].spec, doc.path, args.models,
                            trust_remote_code=args.trust_remote_code)
        plan = api.compile(doc, engine=args.engine, loaded=facts, data=args.data, share=not args.no_share)
        if args.json:
            print(json.dumps(plan_json(plan), indent=1))
        else:
            if len(args.documents) > 1:
                print(("\n" if i else "") + f"# {path}")
            print(explain(plan, tokenizer=facts.tokenizer if args.tokens else None, rows=args.rows))
    return 0


def _cmd_revision(args) -> int:
    from .model.loading import revision_digest
    for d in args.directories:
        print(f"{revision_digest(Path(d))}  {d}")
    return 0


class _Watch:
    """A run's progress events (``engine.progress``): a tqdm bar on stderr when ``bar`` — rows
    through the passes of all the run's rows, advanced per batch, with an ETA; the sweep point
    underway as its label, a fit's last epoch after it — and, bar or not, where the walk was,
    for a refusal to say."""

    def __init__(self, bar: bool):
        self.show, self.bar = bar, None
        self.started, self.point, self.index, self.points = False, None, 0, 0

    def __call__(self, event) -> None:
        if event.kind == "run":
            self.started = True
            if self.show:
                try:  # transformers' own dependency, so there wherever a run is
                    from tqdm import tqdm
                except ImportError:
                    self.show = False
                    return
                self.close()
                self.bar = tqdm(total=event.total, unit="row", file=sys.stderr, dynamic_ncols=True)
        elif event.kind == "point":
            self.point, self.index, self.points = event.name, event.done, event.total
            if self.bar is not None:
                self.bar.set_description_str(event.name)
        elif self.bar is None:
            return
        elif event.kind == "batch":
            self.bar.update(event.rows)
        elif event.kind == "done" and event.name != self.point:  # a fit's epoch
            self.bar.set_postfix_str(event.name)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def refusal(self, err: CausalabError, out) -> CausalabError:
        """A refusal from inside the walk, saying at which point, and that nothing was written:
        the folder is committed whole after every point has run (``api.run``), so no point's
        folder exists to point at. A refusal before the walk, or from the write, is as it was."""
        from .errors import WriteError

        if not self.started or isinstance(err, WriteError):
            return err
        said = (f"nothing was written to {out}: a run's folder is committed whole, after every point "
                "has run")
        if self.point is not None:
            said = f"at point {self.point} ({self.index + 1} of {self.points}); {said}"
        return type(err)(err.path, err.problem, f"{err.fix}; {said}" if err.fix else said)


def _cmd_run(args) -> int:
    from . import api
    from .engine.progress import listening
    from .outputs import tables
    from .plan.show_tokens import notes

    # A progress bar only for a person watching: not with --quiet, not into a pipe or a log.
    watch = _Watch(bar=not args.quiet and sys.stderr.isatty())
    try:
        with listening(watch):
            ran = api.run(args.document, engine=args.engine, out=args.out, batch_size=args.batch_size,
                          models=args.models, data=args.data, device_map=args.device_map,
                          trust_remote_code=args.trust_remote_code, share=not args.no_share,
                          cache=args.cache, at_once=args.at_once, request=args.ndif_request)
    except CausalabError as err:
        raise watch.refusal(err, args.out) from None
    finally:
        watch.close()
    if args.json:  # for programs: this object and nothing else on stdout
        print(json.dumps(tables.means_json(ran), indent=1, ensure_ascii=False))
    else:
        for path in ran.files:
            print(path)
        # Stdout stays one path a line into a pipe or a file (what scripts read; --json is the
        # machine form); a person at a terminal also sees what the run measured.
        if sys.stdout.isatty() and tables.result_names(ran):
            print()
            print("\n".join(tables.aligned(*tables.means_table(ran))))
    sys.stdout.flush()
    if ran.plan is not None:  # None when every point was served from the cache
        for line in notes(ran.plan):
            print(line, file=sys.stderr)
    _say_cached(ran)
    _say_time(ran)
    return 0


def _say_time(ran) -> None:
    """``time: load 2.31 s, compile 0.05 s, compute 4.20 s (shared forwards 0.61 s, points 0.30–0.41 s)``
    on stderr: where the run's time went (run.json's ``timing`` has each point's)."""
    from .timing import KEY

    timing = (ran.record or {}).get(KEY) or {}
    parts = [f"{stage} {timing[f'{stage}_s']:.2f} s" for stage in ("load", "compile", "compute")
             if timing.get(f"{stage}_s") is not None]
    points = [s for s in (timing.get("points") or {}).values() if s is not None]
    if points:
        # An estimated sweep's gradient pass and its exact verification belong to no point either.
        shared = "shared forwards" + (", attribution and verification" if (ran.record or {}).get("attribution")
                                      else "")
        parts[-1] += (f" ({shared} {timing['shared_s']:.2f} s, {len(points)} points "
                      f"{min(points):.2f}–{max(points):.2f} s each)")
    if parts:
        print("time: " + ", ".join(parts), file=sys.stderr)


def _say_cached(ran) -> None:
    """``cached: 4 of 6 points (layers=0,pos=-4, …)`` on stderr, after the files, when the cache
    served any: stdout stays one path a line (or the --json object) for programs."""
    from .cache import served

    names = served(ran)
    if names:
        shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
        print(f"cached: {len(names)} of {len(ran.points)} points ({shown})", file=sys.stderr)


def _cmd_table(args) -> int:
    from . import api
    from .outputs import tables

    ran = api.open(args.directory)
    sys.stdout.write(tables.render(tables.records(ran, args.result), args.format))
    return 0


def _cmd_plot(args) -> int:
    from . import api
    from .plots import choose, file_name, plot

    ran = api.open(args.directory)
    out = args.output or file_name(ran, choose(ran, args.result, x=args.x, y=args.y, kind=args.kind))
    plot(ran, args.result, x=args.x, y=args.y, kind=args.kind, point=args.point, row=args.row, head=args.head,
         level=args.level, path=out)
    print(out)
    return 0


def _cmd_report(args) -> int:
    from . import report

    page = report.from_folders(args.directories)
    path = report.write(page, args.output)
    counts = [f"{n} {outcome}" for outcome, n in page.counts().items()]
    damaged = page.damaged
    if damaged:
        counts.append(f"{len(damaged)} damaged")
    print(f"{path.resolve()}\n{len(page.sections)} runs, {', '.join(counts) or 'no points'}")
    # The page is written either way (the damaged runs marked on it), but a damaged run is results
    # lost, not results: say which and why, and exit 1 so a script or CI job notices — not 2,
    # which is a refusal that wrote nothing.
    for section in damaged:
        print(f"damaged: {section.source}: {section.damaged}", file=sys.stderr)
    return 1 if damaged else 0


NO_SHARE = ("give every sweep point its own forwards (by default a forward several points run identically, "
            "like the counterfactual pass of a patching sweep, runs once for all of them: the same numbers)")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="causalab-mini", description=__doc__.splitlines()[0].replace("``", ""),
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog="Run `causalab-mini VERB --help` for a verb's options.")
    top.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    top.add_argument("--plugin", action="append", metavar="MODULE", default=[],
                     help="load an extension module by its dotted name (repeatable); installed "
                          "extensions are found without it")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB",
                               title="verbs (document → plan → run → results)")

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
    p.add_argument("--engine", choices=engines.LOCAL_ENGINES, default=engines.DEFAULT,
                   help=f"the engine whose refusals apply (default {engines.DEFAULT})")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="read a model whose config or tokenizer names code of its own (runs that code)")
    p.add_argument("--tokens", action="store_true",
                   help="show rows as tokens, where each read and write lands, and each answer's scored token")
    p.add_argument("--rows", type=int, default=3, metavar="N", help="rows shown per forward with --tokens "
                                                                    "(default 3)")
    p.add_argument("--no-share", action="store_true", help=NO_SHARE)
    _paths_options(p)
    p.set_defaults(func=_cmd_explain)

    p = verbs.add_parser("revision", help="print the sha256 revision of local model directories")
    p.add_argument("directories", nargs="+")
    p.set_defaults(func=_cmd_revision)

    p = verbs.add_parser("run", help="run a document and write its results")
    p.add_argument("document", help="a *.causalab.json document (every sweep point runs)")
    p.add_argument("--engine", choices=engines.ENGINES, default=engines.DEFAULT, help=engines.help_text())
    p.add_argument("--device-map", default="cpu", metavar="MAP",
                   help="where the weights load: cpu, cuda:0, auto (spread over every device), ... "
                        "(transformers' device_map; default cpu)")
    p.add_argument("--batch-size", type=int, default=None, metavar="N",
                   help="rows per forward (default: every row of a pass in one forward)")
    p.add_argument("--out", required=True, help="the directory to write results into")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="load a model whose directory or repository ships code of its own (runs that code)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--no-share", action="store_true", help=NO_SHARE)
    p.add_argument("--at-once", type=int, default=1, metavar="N",
                   help="stack up to N points' passes into one model call, rows x points within the batch "
                        "size (default 1: each point its own call)")
    p.add_argument("--cache", metavar="DIR", help="a result cache folder (made if missing): points whose "
                   "results it holds for this model, engine, dtype, batch size and package are not computed "
                   "again; the files written are the same")
    p.add_argument("--ndif-request", choices=engines.REQUESTS, default=None,
                   help="--engine ndif: what the request carries — kernel (default: the walk's forwards as data "
                        "and a torch-only kernel, which a stock NDIF server runs) or package (the walk itself, "
                        "for a server with this causalab-mini and nnterp installed; a fit needs it)")
    _paths_options(p)
    p.set_defaults(func=_cmd_run)

    p = verbs.add_parser("table", help="a finished run's metric rows as one table: a record per (point, row), "
                                       "the coordinates as columns")
    p.add_argument("directory", metavar="OUT_DIR", help="the folder a run wrote (the one holding run.json)")
    p.add_argument("--result", metavar="NAME", help="one saved metric (default: all, with a result column)")
    p.add_argument("--format", choices=("csv", "json", "md"), default="csv", help="default csv")
    p.set_defaults(func=_cmd_table)

    p = verbs.add_parser("plot", help="draw a finished run: a heatmap (two axes), a line with its CI (one), "
                                      "bars (none), a gate's sparsity curve, an attention pattern")
    p.add_argument("directory", metavar="OUT_DIR", help="the folder a run wrote (the one holding run.json)")
    p.add_argument("--result", metavar="NAME", help="a saved metric (default: the first), or a saved "
                                                    "attention pattern's file")
    p.add_argument("--x", metavar="AXIS", help="the sweep axis across (a heatmap's columns, a line's x)")
    p.add_argument("--y", metavar="AXIS", help="the sweep axis up (a heatmap's rows)")
    p.add_argument("--kind", choices=("heatmap", "line", "bars", "gate", "fit", "attention"),
                   help="default: chosen from the run's axes and saves")
    p.add_argument("--point", metavar="NAME", help="the point whose attention pattern is drawn")
    p.add_argument("--row", type=int, default=0, help="the data row whose attention pattern is drawn (default 0)")
    p.add_argument("--head", type=int, default=None, help="one attention head (default: their mean)")
    p.add_argument("--level", type=float, default=0.95, help="the bootstrap CI's level (default 0.95)")
    p.add_argument("-o", "--output", metavar="FILE", help=".png, .svg or .pdf (default "
                                                          "<document>-<result>.png here)")
    p.set_defaults(func=_cmd_plot)

    p = verbs.add_parser("report", help="one self-contained HTML page of finished runs: per document its "
                                        "description, points, means, figures, expectation verdicts and files")
    p.add_argument("directories", nargs="+", metavar="OUT_DIR",
                   help="a folder a run wrote, or a folder holding such folders (searched)")
    p.add_argument("-o", "--output", metavar="FILE", default="causalab-report.html",
                   help="the page to write (default causalab-report.html here)")
    p.set_defaults(func=_cmd_report)
    return top


def _version() -> str:
    """The installed distribution's version (the source tree's when run uninstalled)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("causalab-mini")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.plugin:
            from . import extensions

            extensions.use(args.plugin)
        return args.func(args)
    except CausalabError as err:
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `causalab-mini explain … | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())

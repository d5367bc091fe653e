"""A document is a ``pytest.File``; each of its sweep points is a ``pytest.Item``.

Collection reads and validates the document (JSON and pydantic, no model, no
torch) and checks its expectations name real metrics and points. Running an
item asks the session for its point on each engine, then holds the results to
the document's expectations, to each other (``--causalab-engine=both``) and to
the stored baseline; every miss is one row of the failure table.
"""
from __future__ import annotations

import shlex
import warnings
from pathlib import Path

import pytest

from causalab_mini import CausalabError, HubUnreachable, MissingArtifact, Unsupported
from causalab_mini.names import label, point_name

from . import baseline, page, report
from .checks import Check, compare_rows, default_tolerance, evaluate, number, render, tolerance
from .session import session_of

# What this run cannot do, through no fault of the document — a feature a later version builds,
# an artifact another document makes, a hub model with no hub — skips the item with the typed
# reason; it never passes it.
LATER = (Unsupported, MissingArtifact, HubUnreachable)


def refusal(err: CausalabError, where: str = "") -> str:
    """A typed refusal as the three things it names: the field, what is wrong, what to write."""
    lines = [f"{type(err).__name__}" + (f" in {where}" if where else "")]
    if err.path:
        lines.append(f"  at:   {err.path}")
    lines.append(f"  what: {err.problem}")
    if err.fix:
        lines.append(f"  fix:  {err.fix}")
    return "\n".join(lines)


def marker_value(value):
    """A coordinate as ``-m "point(axis=value)"`` can spell it: ints, strings, booleans as
    themselves, a one-element list as its element, anything else as its point-name label."""
    if isinstance(value, list) and len(value) == 1:
        return marker_value(value[0])
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return label(value)


class DocumentFile(pytest.File):
    """``*.causalab.json``: one item per sweep point, or one item named after an unswept document."""

    def collect(self):
        try:
            # Read once per process: the session keeps the Document its items then run.
            points = session_of(self.config).document(self.path).points  # expectations checked, as validate does
        except Exception as err:  # noqa: BLE001 - one bad document must not stop the session
            # The document is one failing item with its refusal, and every other document runs;
            # an error pytest would raise at collection interrupts the whole session.
            yield RefusedDocument.from_parent(self, name=point_name(self.path, None), error=err)
            return
        for valid in points:
            yield PointItem.from_parent(self, name=point_name(self.path, valid.name), valid=valid)


def _described(err: BaseException, nodeid: str, config) -> str:
    """A failure as the user should see it: a typed refusal's three parts, or an unexpected
    error's message without the internals' stack (``--tb=long`` shows it)."""
    if isinstance(err, CausalabError):
        return refusal(err, nodeid)
    return (f"{type(err).__name__}: {err}\n"
            f"(while running {nodeid}; --tb=long shows the traceback)")


class RefusedDocument(pytest.Item):
    """A document that cannot be read or validated: one item that fails with the refusal."""

    def __init__(self, *, error: BaseException, **kwargs):
        super().__init__(**kwargs)
        self.error = error
        self.add_marker(pytest.mark.causalab)

    def runtest(self) -> None:
        raise self.error

    def repr_failure(self, excinfo, style=None):
        if not isinstance(excinfo.value, CausalabError) and self.config.getoption("tbstyle", "auto") == "long":
            return super().repr_failure(excinfo)
        return _described(excinfo.value, self.nodeid, self.config)

    def reportinfo(self):
        return self.path, 0, f"{self.name} ({self.path.name})"


class PointFailure(Exception):
    """Checks that did not hold at one point: rendered as a table by ``PointItem.repr_failure``."""

    def __init__(self, title: str, checks: list, notes: list, lines: list = (), accept: str = ""):
        super().__init__(title)
        self.title, self.checks, self.notes, self.lines = title, checks, notes, list(lines)
        self.accept = accept  # the command that accepts a baseline failure as the new baseline

    def render(self) -> str:
        # The baseline's drift (one line per result) and a changed experiment's fields lead the table;
        # the command that accepts it ends it, ready to paste.
        text = "\n".join([self.title, *self.lines, render(self.checks)])
        text += "".join(f"\n{n}" for n in self.notes)
        return text + (f"\nto accept this as the new baseline: {self.accept}" if self.accept else "")


class PointItem(pytest.Item):
    def __init__(self, *, valid, **kwargs):
        super().__init__(**kwargs)
        self.valid = valid  # document.read.ValidPoint: name, spec, document, coords
        coords = {axis: marker_value(v) for axis, v in valid.coords}
        self.add_marker(pytest.mark.causalab)
        self.add_marker(pytest.mark.point(**coords))
        # Added here, when the item is built, so `--dist loadgroup` sees it.
        self.add_marker(pytest.mark.xdist_group(name=valid.spec.model.key))
        # -k cannot spell "=", but ":" is an identifier character: -k "pos:-1".
        self.extra_keyword_matches.update(f"{axis}:{label(v)}" for axis, v in valid.coords)

    @property
    def group(self) -> tuple:
        model = self.valid.spec.model
        return (model.key, model.revision or "", model.dtype)

    @property
    def expectations(self):
        return self.valid.spec.header.expect

    def tolerance(self, result: str):
        """The document's word on ``result``, else the command line's, else the default of the
        dtype the point's model runs in (a bf16 model rounds each op to 2^-7)."""
        settings = self.session_state.settings
        rtol, atol = default_tolerance(self.valid.spec.model.dtype)
        default = (rtol if settings.rtol is None else settings.rtol, atol if settings.atol is None else settings.atol)
        return tolerance(self.expectations, self.valid.name, self.valid.coords, result, default)

    @property
    def session_state(self):
        return session_of(self.config)

    def runtest(self) -> None:
        state = self.session_state
        engines = state.settings.engines
        ran = {}
        for engine in engines:
            try:
                ran[engine] = state.point(self.path, self.valid.name, engine)
            except LATER as err:
                prefix = f"{engine}: " if len(engines) > 1 else ""
                if state.settings.strict:
                    # A gate that skips what it cannot run lets a broken document through (a
                    # misspelt model key reads as an unreachable hub): under CI it fails.
                    raise type(err)(err.path, err.problem, f"{err.fix + '; ' if err.fix else ''}under "
                                        "--causalab-strict (or CI) a point that cannot run fails rather "
                                        "than skips") from None
                _skip(f"{prefix}{type(err).__name__}: {err}")
        checks = []
        for engine, point in ran.items():
            tag = f"{point.name} [{engine}]" if len(ran) > 1 else point.name
            checks += evaluate(self.expectations, self.valid.name, self.valid.coords,
                                      point.lookup(), label=tag)
        if len(ran) > 1:
            checks += self._across(ran)
        primary = ran[engines[0]]
        settings = state.settings
        verdict = baseline.check(primary, folder=settings.baselines, update=settings.update,
                                 strict=settings.strict, tolerance=self.tolerance,
                                 mode=settings.mode_for(self.path, self.config.rootpath),
                                 experiment=state.experiment(self.path, self.valid.name, engines[0]),
                                 points=state.document(self.path).point_names,
                                 extensions=state.extension_versions(self.path, self.valid.name, engines[0]))
        checks += verdict.checks
        self._say_unpinned(primary)
        for note in verdict.notes:
            # Line 0: attributed to the document without quoting its first line ("{").
            warnings.warn_explicit(BaselineWarning(note), None, str(self.path), 0)
        baseline.record(self, verdict)  # for the session's baseline report, xdist or not
        report.record(self, ran)
        served = [engine for engine in ran if state.served(self.path, self.valid.name, engine)]
        if served:
            self.user_properties.append((report.CACHED, ",".join(served)))
        if settings.report is not None:
            page.record(self, ran, checks, [*verdict.lines, *verdict.notes])
        failed = [c for c in checks if not c.ok]
        if failed:
            first = failed[0]
            more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
            title = (f"{len(failed)} of {len(checks)} checks failed on {', '.join(ran)}: {first.result} "
                     f"{first.aggregate} got {number(first.got)}, expected {first.expected}{more}")
            accept = self.accept_command() if any(not c.ok for c in verdict.checks) else ""
            raise PointFailure(title, failed, verdict.notes, verdict.lines, accept)

    def _say_unpinned(self, point) -> None:
        """A document that pins no revision ran on whatever weights were there: say which, once per
        document and process, with the line that pins them. A warning, not a failure: the weights'
        digest is in run.json and the baseline, and a baseline that drifts says the weights changed."""
        pin = point.revision if point.weights is not None else None
        if self.valid.spec.model.revision is not None or pin is None:
            return
        warned = self.config.stash.setdefault(_UNPINNED, set())
        if self.path in warned:
            return
        warned.add(self.path)
        warnings.warn_explicit(UnpinnedModelWarning(
            f"{self.path.name} pins no model.revision; it ran on {pin}: pin that checkpoint with "
            f"\"revision\": \"{pin}\" in its model section"), None, str(self.path), 0)

    def accept_command(self) -> str:
        """The exact command that rewrites this point's baseline from what it computes now, run
        from where this session was started: its node id, its engine, its baselines folder."""
        where = self.config.invocation_params.dir
        try:
            shown = Path(self.path).relative_to(where)
        except ValueError:
            shown = Path(self.path)
        settings = self.session_state.settings
        words = ["pytest", f"{shown}::{self.name}", f"--causalab-engine={settings.engines[0]}"]
        if settings.baselines != "baselines":
            words.append(f"--causalab-baselines={settings.baselines}")
        for option in ("models", "data"):  # folders given on the command line (an ini's are read again)
            words += [f"--causalab-{option}={d}" for d in self.config.getoption(f"causalab_{option}") or ()]
        words.append("--causalab-update-baselines=failing")
        return " ".join(shlex.quote(w) for w in words)

    def _across(self, ran: dict) -> list:
        """Every metric row and saved tensor of the first engine against each other engine's, within tolerance."""
        (first, reference), *others = ran.items()
        checks = []
        for engine, point in others:
            def other(c):  # the check as this engine's failure: its value labelled with the engine
                return Check(c.point, c.result, c.aggregate, c.expected,
                                    f"{engine} {number(c.got)}", c.difference, False, c.note)

            def missing(name):
                return Check(point.name, name, "engines", first, f"missing on {engine}", None, False)

            theirs = point.results()
            for name, result in reference.results().items():
                if name not in theirs:
                    checks.append(missing(name))
                    continue
                rtol, atol = self.tolerance(name.split("/")[-1])
                checks += [other(c) for c in compare_rows(point.name, name, first, result.pairs(),
                                                                 theirs[name].pairs(), rtol, atol)]
            mine = point.saved_tensors()
            for file, named in reference.saved_tensors().items():
                rtol, atol = self.tolerance(file)
                for tname, tensor in named.items():
                    label_ = f"{file}:{tname}"
                    if tname not in mine.get(file, {}):
                        checks.append(missing(label_))
                        continue
                    checks += [other(c) for c in baseline.compare_tensor(
                        point.name, label_, baseline.tensor_entry(tensor), mine[file][tname], rtol, atol,
                        reference=first)]
        return checks

    def repr_failure(self, excinfo, style=None):
        err = excinfo.value
        if isinstance(err, PointFailure):
            return err.render()
        if not isinstance(err, CausalabError) and self.config.getoption("tbstyle", "auto") == "long":
            return super().repr_failure(excinfo)
        # An engine's internals (torch, nnsight) are not the user's code: the message, not the
        # stack, unless they ask for it.
        return _described(err, self.nodeid, self.config)

    def reportinfo(self):
        # Not a suffix of the node id on purpose: pytest rewrites dots in a suffix domain to "::".
        return self.path, 0, f"{self.name} ({self.path.name})"


def _skip(reason: str):
    """Skip, reported at the document (not at this file, where the skip is raised)."""
    try:
        raise pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:  # pragma: no cover - a pytest without the (private) keyword
        pytest.skip(reason)


class BaselineWarning(UserWarning):
    """A baseline was written or rewritten; commit it."""


class UnpinnedModelWarning(UserWarning):
    """A document ran on a model whose revision it does not pin: which weights, and how to pin them."""


_UNPINNED = pytest.StashKey[set]()  # documents already warned about in this process

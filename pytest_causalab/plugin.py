"""pytest_causalab: causalab-mini documents as pytest test cases. Hooks only.

Registered through the ``pytest11`` entry point. ``*.causalab.json`` files are
collected as ``items.DocumentFile``; each sweep point is an item. Models, plans
and runs live in ``session.Session`` on ``config.stash``; results reach Python
through the ``causalab`` fixture.
"""
from __future__ import annotations

import pytest

# Before anything imports it: the helpers' plain asserts get pytest's introspection.
pytest.register_assert_rewrite("pytest_causalab.asserts")

from causalab_mini import SUFFIX  # noqa: E402

from . import baseline, baseline_report, hookspecs, page, report  # noqa: E402
from .items import DocumentFile, PointItem  # noqa: E402
from .session import ENGINES, SESSION, UPDATES, Session, read_settings, session_of  # noqa: E402


def pytest_addhooks(pluginmanager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser) -> None:
    group = parser.getgroup("causalab", "causalab-mini documents (pytest_causalab)")

    def option(name: str, help: str, ini_type=None, default=None, **kwargs) -> None:
        dest = name.replace("-", "_")
        group.addoption(f"--{name}", dest=dest, help=f"{help} (ini: {dest})", **kwargs)
        parser.addini(dest, help, type=ini_type, default=default)

    option("causalab-engine", f"engine to run points on: {', '.join(ENGINES)} (both: run on each "
           "and fail on any difference beyond tolerance); default nnterp", metavar="ENGINE")
    option("causalab-models", "a folder of model directories (repeatable)", "paths", [],
           action="append", metavar="DIR")
    option("causalab-data", "a folder of datasets NAME/SPLIT.jsonl (repeatable)", "paths", [],
           action="append", metavar="DIR")
    option("causalab-device-map", "device map models load with; default cpu. auto: under xdist each worker "
           "gwN takes the Nth visible accelerator (cpu if none), else transformers' auto (a model spread over "
           "every device); a list a,b,...: worker gwN takes entry N", metavar="MAP")
    option("causalab-batch-size", "rows per forward; default all", metavar="N")
    option("causalab-cache", "a result cache folder (made if missing): a point whose results it holds for "
           "this model, engine, dtype, batch size and package is not computed again", metavar="DIR")
    option("causalab-at-once", "a document's points stacked into one model call, rows x points within "
           "the batch size; default 1 (each point its own call)", metavar="N")
    option("causalab-plugins", "an extension module to load by its dotted name (repeatable; ini: one a "
           "line); installed extensions are found without it", "linelist", [], action="append",
           metavar="MODULE")
    option("causalab-out", "where each point's files are written; default a pytest tmp dir",
           metavar="DIR")
    option("causalab-report", "write an HTML report of the session to DIR/index.html (each point's files "
           "go to DIR/runs unless --causalab-out says where)", metavar="DIR")
    option("causalab-baselines", "folder beside each document holding its baseline; default baselines",
           metavar="NAME")
    option("causalab-rtol", "relative tolerance against baselines and across engines; default by the model's "
           "dtype: 1e-4 fp32, 3.1e-2 bf16, 3.9e-3 fp16",
           metavar="X")
    option("causalab-atol", "absolute tolerance against baselines and across engines; default by the model's "
           "dtype: 1e-5 fp32, 7.8e-3 bf16, 9.8e-4 fp16",
           metavar="X")
    option("causalab-strict", "a missing baseline fails (it always does when the CI environment "
           "variable is set to anything but empty, 0, false, no or off, case-insensitive)", "bool",
           False, action="store_true")
    option("causalab-summary", "print a table of every point's result means (on under -v)", "bool",
           False, action="store_true")
    group.addoption("--causalab-update-baselines", dest="causalab_update_baselines", metavar="WHICH",
                    nargs="?", const="failing",
                    help=f"rewrite stored baselines: {' or '.join(UPDATES)} (alone: failing, the entries "
                         "that fail); stale entries, of points no longer in their document, are removed")
    # Ini only: how a committed baseline file is stored is the repository's decision, not one run's.
    parser.addini("causalab_baseline_mode", "how baselines store each result: rows (every row's value, "
                  "the default) or aggregates (mean, std, n, n_rows: for sweeps too large for rows)",
                  default="rows")
    parser.addini("causalab_baseline_aggregates", "glob patterns (one or more a line) of documents whose "
                  "baselines store aggregates whatever causalab_baseline_mode says, matched against the "
                  "document's path relative to the rootdir or its file name", type="linelist", default=[])


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "causalab: a causalab-mini document's point")
    config.addinivalue_line("markers", "point(**coords): the point's sweep coordinates, e.g. "
                            '-m "point(pos=-1)"')
    if not config.pluginmanager.hasplugin("xdist"):
        config.addinivalue_line("markers", "xdist_group(name): the model a point loads (pytest-xdist)")
    _use_plugins(config)
    config.stash[SESSION] = Session(config, read_settings(config))  # UsageError on a bad value
    baseline.forget()


def _use_plugins(config) -> None:
    """The extension modules the command line or the ini names, loaded before any document is read."""
    from causalab_mini import ExtensionError, extensions

    names = config.getoption("causalab_plugins") or config.getini("causalab_plugins")
    if names:
        try:
            extensions.use(names)
        except ExtensionError as err:
            raise pytest.UsageError(f"--causalab-plugins: {err}") from None


def pytest_collect_file(file_path, parent):
    if file_path.name.endswith(SUFFIX):
        return DocumentFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(session, config, items) -> None:
    """One model's points run together (loaded once, then the next), documents kept in order."""
    slots = [i for i, item in enumerate(items) if isinstance(item, PointItem)]
    points = [items[i] for i in slots]
    first: dict = {}
    for item in points:
        first.setdefault(item.group, len(first))
    for i, item in zip(slots, sorted(points, key=lambda it: first[it.group])):
        items[i] = item


def pytest_collection_finish(session) -> None:
    # After every plugin's modifyitems (-k and -m deselect there): the points this process runs.
    state = session.config.stash.get(SESSION, None)
    if state is not None:
        state.select(session.items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadgroup":
        from .grouping import make_scheduler
        return make_scheduler(config, log)
    return None


@pytest.fixture(scope="session")
def causalab(pytestconfig) -> Session:
    """The session's runs: ``causalab.run("documents/v2/patching.causalab.json").point()``.

    The same cache as the document items, so a point that ran as an item is not run again.
    """
    return session_of(pytestconfig)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    state = config.stash.get(SESSION, None)
    # The reporter's own record of reports: under xdist these are the workers' reports,
    # user_properties and all.
    reports = [r for kind in terminalreporter.stats.values() for r in kind
               if getattr(r, "when", None) == "call"]
    if state is None:
        return
    detailed = state.settings.summary or config.getoption("verbose") > 0
    rows = [row for row in map(report.row, reports) if row is not None]
    if rows and detailed:
        terminalreporter.write_sep("=", "causalab summary: result means per point")
        for line in report.render(rows):
            terminalreporter.write_line(line)
    # The same path for the baselines' verdicts: each item's user_properties.
    lines = baseline_report.session_report(reports, update=state.settings.update, detailed=detailed)
    if lines:
        terminalreporter.write_sep("=", "causalab baselines")
        for line in lines:
            terminalreporter.write_line(line)
    if state.settings.cache is not None:
        terminalreporter.write_sep("=", "causalab cache")
        for line in report.cache_lines(reports, state.settings.cache):
            terminalreporter.write_line(line)
    if state.settings.report is not None and not hasattr(config, "workerinput"):
        errors = [r for r in terminalreporter.stats.get("error", ()) if getattr(r, "when", None) is None]
        written = page.write(reports, errors, state, config)
        terminalreporter.write_sep("=", "causalab report")
        terminalreporter.write_line(str(written))

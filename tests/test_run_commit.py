"""A run's folder is committed whole: killed at any write, it is the previous run or incomplete.

The plan is run once; then, for every filesystem step ``write`` takes (each rename, unlink,
rmdir and fsync, and the one durability barrier before run.json), a forked child writes it
and is SIGKILLed at that step. After
each kill the folder is either the previous run, byte for byte, or ``state`` calls it
incomplete — never a result with missing or mixed files — and a rerun into it leaves
exactly the files a clean run leaves, byte for byte. The same holds for a rerun of a
changed document over an earlier run's folder, and for a write that fails half way (a
full disk). Files are written with the permissions the umask asks for.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
from pathlib import Path

import pytest

import causalab_mini as cm
from causalab_mini.errors import EngineError, PlanError, WriteError
from causalab_mini.outputs import write as write_mod
from model_calls import untimed, untimed_bytes
from paths import DATA, MODELS, V2
from samples import cli_command, patching_document

KILLABLE = ("fsync", "replace", "unlink", "rmdir")  # the os calls a write's steps go through
BARRIER = "barrier"  # files.barrier, as the writer calls it: killable too


def _swept() -> dict:
    raw = patching_document()
    raw["interventions"]["patching"]["writes"]["patch"]["pos"] = {"sweep": [-1, -2]}
    return raw


def _plan(raw: dict, tmp_path: Path, engines):
    doc = tmp_path / "doc.causalab.json"
    engine = engines(raw, "hooks", document=doc)
    return cm.run(cm.read(raw, path=doc), loaded=engine, data=[DATA]).plan


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): untimed(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def _without_leftovers(files: dict[str, bytes]) -> dict[str, bytes]:
    """A folder's files less what an interrupted write leaves: its staging folder, temporary files."""
    return {rel: data for rel, data in files.items()
            if not rel.startswith(write_mod.STAGING + "/")
            and not (Path(rel).name.startswith(".") and rel.endswith(".tmp"))}


def _write_killed_at(plan, out: Path, n: int) -> bool:
    """Write ``plan`` into ``out`` in a forked child killed at its ``n``-th killable call;
    True when the child was killed (False: the write finished before call ``n``)."""
    return _write_killed_when(plan, out, lambda count, name, args: count == n)


def _write_killed_when(plan, out: Path, kill) -> bool:
    """Write ``plan`` into ``out`` in a forked child killed before the first killable call for which
    ``kill(count, name, args)`` is true (``count``: that call's number, from 1); True when the child
    was killed (False: the write finished first)."""
    pid = os.fork()
    if pid == 0:  # the child: count the calls, die at the one ``kill`` picks
        count = [0]
        for name in KILLABLE:
            original = getattr(os, name)

            def counted(*args, _original=original, _name=name, **kwargs):
                count[0] += 1
                if kill(count[0], _name, args):
                    os.kill(os.getpid(), signal.SIGKILL)
                return _original(*args, **kwargs)
            setattr(os, name, counted)
        original_barrier = write_mod.barrier

        def barrier(*args, **kwargs):
            count[0] += 1
            if kill(count[0], BARRIER, args):
                os.kill(os.getpid(), signal.SIGKILL)
            return original_barrier(*args, **kwargs)
        write_mod.barrier = barrier
        try:
            write_mod.write(plan, out, plan.provenance)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status)


@pytest.fixture(scope="module")
def plans(tmp_path_factory, engines):
    tmp = tmp_path_factory.mktemp("plans")
    first = _plan(_swept(), tmp, engines)
    changed = _swept()
    changed["interventions"]["patching"]["writes"]["patch"]["pos"] = {"sweep": [-1, -3]}
    changed["steps"]["score"]["saves"] = changed["steps"]["score"]["saves"][:1]
    return first, _plan(changed, tmp, engines)


def _clean(plan, folder: Path) -> dict[str, bytes]:
    write_mod.write(plan, folder, plan.provenance)
    return _snapshot(folder)


@pytest.mark.parametrize("over_previous", [False, True])
def test_a_kill_at_any_write_leaves_the_previous_run_or_an_incomplete_folder(plans, tmp_path, over_previous):
    """``over_previous``: the killed write is a changed document's, over the first one's folder."""
    first, second = plans
    before = _clean(first, tmp_path / "first") if over_previous else {}
    after = _clean(second, tmp_path / "second")
    assert before != after
    n, kills = 1, 0
    while True:
        out = tmp_path / f"kill{n}"
        if over_previous:
            write_mod.write(first, out, first.provenance)
        if not _write_killed_at(second, out, n):
            assert _snapshot(out) == after  # not killed: the write finished
            break
        kills += 1
        got = _snapshot(out) if out.exists() else {}
        if write_mod.state(out) == "complete":  # a result is a whole run, the old one or the new
            # (beside it, at most the leftovers of the killed write, which the next write removes)
            assert _without_leftovers(got) in (before, after), f"kill {n}: a complete folder mixing runs"
        else:
            assert write_mod.state(out) in ("incomplete", "empty"), n
            assert got == {} or "run.json" not in got or ".causalab-incomplete" in got
        write_mod.write(second, out, second.provenance)  # a rerun after the kill
        assert _snapshot(out) == after, f"kill {n}: the rerun is not a clean run's folder"
        n += 1
    assert kills >= 10  # every step of the commit was reached: staging, mark, moves, commit


@pytest.mark.parametrize("over_previous", [False, True])
def test_a_kill_after_the_files_land_and_before_run_json_is_never_a_finished_run(plans, tmp_path, over_previous):
    """Killed with every data file of the new run in place and its run.json not yet renamed there
    (the commit's last step): ``open`` refuses the folder, and a rerun into it is a clean run's."""
    first, second = plans
    after = _clean(second, tmp_path / "clean")
    out = tmp_path / "out"
    if over_previous:
        write_mod.write(first, out, first.provenance)
    run_json = out / write_mod.RUN

    def at_the_commit(count, name, args):  # the rename of run.json's temporary file onto run.json
        return name == "replace" and Path(args[1]) == run_json

    assert _write_killed_when(second, out, at_the_commit)
    _assert_data_in_place_and_unfinished(second, out, after)
    assert write_mod.state(out) == "complete" and cm.open(out).record["files"] == sorted(set(after) - {write_mod.RUN})


def _assert_data_in_place_and_unfinished(plan, out: Path, after: dict) -> None:
    """A write killed with every data file in place and no run.json: the mark is there, the folder
    is incomplete, ``open`` refuses it, and a rerun into it gives a clean run's bytes."""
    got = _without_leftovers(_snapshot(out))
    assert write_mod.RUN not in got and write_mod.INCOMPLETE in got
    assert {rel: data for rel, data in got.items() if rel != write_mod.INCOMPLETE} == \
        {rel: data for rel, data in after.items() if rel != write_mod.RUN}
    assert write_mod.state(out) == "incomplete"
    with pytest.raises(PlanError, match="did not finish"):
        cm.open(out)
    write_mod.write(plan, out, plan.provenance)  # the rerun into the same folder
    assert _snapshot(out) == after


@pytest.mark.parametrize("over_previous", [False, True])
def test_a_kill_between_the_data_writes_and_the_barrier_is_never_a_finished_run(plans, tmp_path, over_previous):
    """Killed with every data file moved into place but before the barrier that makes them durable
    (and so before run.json): the folder is incomplete, ``open`` refuses it, a rerun is clean."""
    first, second = plans
    after = _clean(second, tmp_path / "clean")
    out = tmp_path / "out"
    if over_previous:
        write_mod.write(first, out, first.provenance)
    assert _write_killed_when(second, out, lambda count, name, args: name == BARRIER)
    _assert_data_in_place_and_unfinished(second, out, after)


@pytest.mark.parametrize("over_previous", [False, True])
def test_a_run_is_made_durable_by_one_barrier_before_its_commit_record(plans, tmp_path, monkeypatch, over_previous):
    """However many files a run writes, the writer flushes none of them alone: one barrier over the
    folder, after every data file is in place and before run.json is renamed there — into an empty
    folder (written in place) as over an earlier run (staged, then moved)."""
    first, second = plans
    after = _clean(second, tmp_path / "clean")
    out = tmp_path / "out"
    if over_previous:
        write_mod.write(first, out, first.provenance)
    events = []
    original_barrier, original_replace, original_fsync = write_mod.barrier, os.replace, os.fsync

    inside = [False]

    def barrier(folder, written=()):
        written = list(written)
        events.append(("barrier", Path(folder), sorted(str(p.relative_to(out)) for p in written),
                       _without_leftovers(_snapshot(out))))
        inside[0] = True
        try:
            return original_barrier(folder, written)
        finally:
            inside[0] = False

    def replace(src, dst, *args, **kwargs):
        events.append(("replace", Path(dst)))
        return original_replace(src, dst, *args, **kwargs)

    def fsync(fd):
        if not inside[0]:
            events.append(("fsync", fd))
        return original_fsync(fd)

    monkeypatch.setattr(write_mod, "barrier", barrier)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    write_mod.write(second, out, second.provenance)
    assert _snapshot(out) == after
    barriers = [e for e in events if e[0] == "barrier"]
    assert len(barriers) == 1 and barriers[0][1] == out
    # It covers every file of the run but run.json, each already in its place with its bytes.
    assert barriers[0][2] == sorted(set(after) - {write_mod.RUN})
    in_place = barriers[0][3]
    assert write_mod.RUN not in in_place and write_mod.INCOMPLETE in in_place
    assert {rel: data for rel, data in in_place.items() if rel != write_mod.INCOMPLETE} == \
        {rel: data for rel, data in after.items() if rel != write_mod.RUN}
    at = events.index(barriers[0])
    commit = next(i for i, e in enumerate(events) if e[0] == "replace" and e[1] == out / write_mod.RUN)
    assert at < commit
    # No file flushed on its own outside the barrier (which, off Linux, fsyncs inside itself).
    assert [e for e in events if e[0] == "fsync"] == []


def test_a_scratch_commit_takes_no_barrier_and_is_the_same_folder(plans, tmp_path, monkeypatch):
    """``durable=False`` (the plugin's scratch folders): the same bytes, committed the same way, with
    nothing flushed — into an empty folder and over an earlier run."""
    first, second = plans
    after = _clean(second, tmp_path / "clean")
    flushed = []
    monkeypatch.setattr(write_mod, "barrier", lambda *args, **kwargs: flushed.append(args))
    monkeypatch.setattr(os, "fsync", lambda fd: flushed.append(fd))
    for name, earlier in (("empty", None), ("over", first)):
        out = tmp_path / name
        if earlier is not None:
            write_mod.write(earlier, out, earlier.provenance)
            assert flushed  # the earlier, durable write took its barrier
            flushed.clear()
        write_mod.commit(out, write_mod.manifest(second, second.provenance), durable=False)
        assert _snapshot(out) == after and write_mod.state(out) == "complete"
        assert flushed == []


def test_a_write_that_fails_half_way_leaves_the_previous_run(plans, tmp_path, monkeypatch):
    """A full disk: the staging write fails on its third file; the previous run stays whole."""
    first, second = plans
    out = tmp_path / "out"
    before = _clean(first, out)
    calls = [0]
    original = write_mod.write_new

    def full(path, data):
        calls[0] += 1
        if calls[0] == 3:
            raise OSError(28, "No space left on device")
        return original(path, data)

    monkeypatch.setattr(write_mod, "write_new", full)
    with pytest.raises(WriteError, match="No space left on device while staging the run; the previous run "
                                         "there is as it was"):
        write_mod.write(second, out, second.provenance)
    assert _snapshot(out) == before and write_mod.state(out) == "complete"


@pytest.mark.parametrize("failing", [1, 3])
def test_a_first_write_that_fails_leaves_an_empty_folder(plans, tmp_path, monkeypatch, failing):
    """A full disk on a first run, at the mark (write 1) or at a data file (write 3): a typed
    refusal, nothing of the run left (the folder reads as empty), and a rerun is a clean run's."""
    _, second = plans
    after = _clean(second, tmp_path / "clean")
    out = tmp_path / "out"
    calls = [0]
    original = write_mod.write_new

    def full(path, data):
        calls[0] += 1
        if calls[0] == failing:
            raise OSError(28, "No space left on device")
        return original(path, data)

    monkeypatch.setattr(write_mod, "write_new", full)
    with pytest.raises(WriteError, match="No space left on device while writing the run; no run is there"):
        write_mod.write(second, out, second.provenance)
    assert _snapshot(out) == {} and write_mod.state(out) == "empty"
    monkeypatch.setattr(write_mod, "write_new", original)
    write_mod.write(second, out, second.provenance)
    assert _snapshot(out) == after


def test_files_take_the_umask(plans, tmp_path):
    old = os.umask(0o022)
    try:
        write_mod.write(plans[0], tmp_path / "out", plans[0].provenance)
    finally:
        os.umask(old)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert modes == {0o644}


@pytest.mark.parametrize("make_out, problem", [
    (lambda p: (p.write_text("x"), p)[1], "is a file"),
    (lambda p: (p.mkdir(), p.chmod(0o500), p / "sub")[-1], "cannot be written"),
])
def test_an_out_that_cannot_take_a_run_is_refused_before_the_model_loads(tmp_path, make_out, problem):
    import subprocess

    if problem == "cannot be written" and os.geteuid() == 0:
        # root writes anywhere; the refusal rests on os.access, which says so too
        pytest.skip("root can write into a read-only folder")
    out = make_out(tmp_path / "out")
    doc = tmp_path / "doc.causalab.json"
    doc.write_text(json.dumps(patching_document()))
    done = subprocess.run([*cli_command(), "run", str(doc), "--engine", "hooks", "--models", str(MODELS),
                           "--data", str(DATA), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "error: EngineError: --out:" in done.stderr and problem in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("size", [0, -1])
def test_a_batch_size_that_is_not_a_number_of_rows_is_refused(engines, tmp_path, size):
    raw = patching_document()
    doc = tmp_path / "doc.causalab.json"
    engine = engines(raw, "hooks", document=doc)
    with pytest.raises(EngineError, match="not a number of rows"):
        cm.run(cm.read(raw, path=doc), loaded=engine, data=[DATA], batch_size=size)


def test_state_tells_a_result_from_an_interrupted_write(plans, tmp_path):
    out = tmp_path / "out"
    assert write_mod.state(out) == "empty"
    write_mod.write(plans[0], out, plans[0].provenance)
    assert write_mod.state(out) == "complete"
    (out / write_mod.INCOMPLETE).write_text("{}")
    assert write_mod.state(out) == "incomplete"
    shutil.rmtree(out)


_FULL_DISK = r'''
import json, os, subprocess, sys
mnt, cli = sys.argv[1], json.loads(sys.argv[2])
small, swept = sys.argv[3], sys.argv[4]

def mount(how, size):
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"{how}size={size}", "tmpfs", mnt], check=True)

def run(doc):
    done = subprocess.run([*cli, "run", doc, "--engine", "hooks", "--quiet", "--out", mnt + "/out"],
                          capture_output=True, text=True)
    return {"rc": done.returncode, "stderr": done.stderr}

def snapshot():
    out = {}
    for root, _, files in os.walk(mnt + "/out"):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, mnt + "/out")] = open(p, "rb").read().hex()
    return out

def used():
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize

report = {}
mount("", "12k")                       # too small for any run: nothing may be left that reads as one
report["too_small"] = {**run(swept), "files": snapshot()}
mount("remount,", "4m")
report["small"] = {**run(small), "files": snapshot()}
mount("remount,", str(used() + 8192))  # room for a few pages more: the swept run cannot stage
report["full"] = {**run(swept), "files": snapshot()}
mount("remount,", "4m")
report["rerun"] = {**run(swept), "files": snapshot()}
print(json.dumps(report))
'''


def test_a_full_filesystem_leaves_the_previous_run_and_a_rerun_is_a_clean_run(tmp_path):
    """A real full disk (a tmpfs of a few pages, in a mount namespace): the CLI refuses with a
    typed error naming what the folder holds, leaves the previous run whole, and a rerun once
    there is room writes exactly what a clean run writes."""
    import subprocess

    small = str(V2 / "patching.causalab.json")
    swept = str(V2 / "pos_sweep.causalab.json")
    unshare = shutil.which("unshare")
    probe = unshare and subprocess.run([unshare, "--user", "--map-root-user", "--mount", "true"],
                                       capture_output=True)
    if not probe or probe.returncode != 0:
        pytest.skip("this machine cannot make a mount namespace to hold a small filesystem")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run([unshare, "--user", "--map-root-user", "--mount", sys.executable, "-c", _FULL_DISK,
                           str(mnt), json.dumps(cli_command()), small, swept],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    clean = tmp_path / "clean"
    subprocess.run([*cli_command(), "run", small, "--engine", "hooks", "--quiet", "--out", str(clean / "small")],
                   check=True, capture_output=True)
    subprocess.run([*cli_command(), "run", swept, "--engine", "hooks", "--quiet", "--out", str(clean / "swept")],
                   check=True, capture_output=True)
    as_hex = {name: {k: v.hex() for k, v in _snapshot(clean / name).items()} for name in ("small", "swept")}
    for r in report.values():  # the subprocess's files as _snapshot reads them: run.json's timing left out
        r["files"] = {k: untimed_bytes(k, bytes.fromhex(v)).hex() for k, v in r.get("files", {}).items()}

    for case, left in (("too_small", "no run is there"), ("full", "the previous run there is as it was")):
        r = report[case]
        assert r["rc"] == 2 and r["stderr"].startswith("error: WriteError: "), r["stderr"]
        # Into an empty folder the files are written in place, over a run they are staged first.
        doing = "writing" if case == "too_small" else "staging"
        assert f"No space left on device while {doing} the run; {left}" in r["stderr"]
        assert "Traceback" not in r["stderr"]
    assert report["too_small"]["files"] == {}
    assert report["small"]["rc"] == 0 and report["small"]["files"] == as_hex["small"]
    assert report["full"]["files"] == as_hex["small"], "the full disk left the previous run, byte for byte"
    assert report["rerun"]["rc"] == 0 and report["rerun"]["files"] == as_hex["swept"]


def test_a_save_whose_place_is_a_folder_is_refused_before_the_compute(tmp_path, monkeypatch, capsys):
    """Known from the plan alone, so the CLI refuses it after compiling and before the first forward."""
    from causalab_mini import cli
    from causalab_mini.engine.hooks import HooksEngine

    def tripwire(*args, **kwargs):
        raise AssertionError("the plan was run")

    monkeypatch.setattr(HooksEngine, "execute", tripwire)
    doc = tmp_path / "doc.causalab.json"
    doc.write_text(json.dumps(_swept()))
    out = tmp_path / "out"
    (out / "pos=-2" / "iia.json").mkdir(parents=True)
    code = cli.main(["run", str(doc), "--engine", "hooks", "--models", str(MODELS), "--data", str(DATA),
                     "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: PlanError: pos=-2/iia.json: {out}/pos=-2/iia.json is a folder")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["pos=-2", "pos=-2/iia.json"]


def test_a_folder_where_the_mark_goes_is_refused_before_the_compute(plans, tmp_path, monkeypatch, capsys):
    """No write makes ``.causalab-incomplete`` a folder, so a rerun cannot clean it: refused by name,
    before the first forward, with what is in ``out`` left as it was; once it is gone the run lands."""
    from causalab_mini import cli
    from causalab_mini.engine.hooks import HooksEngine

    first, _ = plans
    out = tmp_path / "out"
    write_mod.write(first, out, first.provenance)
    (out / write_mod.INCOMPLETE).mkdir()
    (out / write_mod.INCOMPLETE / "notes.txt").write_text("a person's")
    before = _snapshot(out)
    with pytest.raises(PlanError, match=f"{write_mod.INCOMPLETE} is a folder"):
        write_mod.write(first, out, first.provenance)
    assert _snapshot(out) == before

    def tripwire(*args, **kwargs):
        raise AssertionError("the plan was run")

    doc = tmp_path / "doc.causalab.json"
    doc.write_text(json.dumps(_swept()))
    argv = ["run", str(doc), "--engine", "hooks", "--models", str(MODELS), "--data", str(DATA), "--out", str(out),
            "--quiet"]
    with monkeypatch.context() as m:
        m.setattr(HooksEngine, "execute", tripwire)
        code = cli.main(argv)
    err = capsys.readouterr().err
    mark = out / write_mod.INCOMPLETE
    assert code == 2 and err.startswith(f"error: PlanError: {write_mod.INCOMPLETE}: {mark} is a folder"), err
    assert f"remove {mark}" in err and _snapshot(out) == before
    shutil.rmtree(mark)
    assert cli.main(argv) == 0
    assert write_mod.state(out) == "complete" and not mark.exists()

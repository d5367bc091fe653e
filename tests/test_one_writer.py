"""One writer per folder: runs committing into one ``--out`` at once each leave a folder that is
exactly one run; an out folder that cannot be written is refused before the load; a symbolic
link inside ``--out`` cannot send a run's files elsewhere; killed cache writes are swept.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import time

import pytest
from paths import V2
from samples import cli_command

import causalab_mini as cm
from causalab_mini.cache.store import ORPHAN_AGE, Store
from causalab_mini.outputs.write import RUN, commit, state


def _files(writer: int, point: int) -> dict[str, bytes]:
    """What run ``writer`` commits the ``point``-th time: its own files (a set other writers do not
    share) and run.json listing them, each stamped with the writer and the point."""
    names = [f"w{writer}/a.json", f"w{writer}/b.json"] if writer % 2 else [f"x{writer}.json"]
    files = {n: json.dumps({"writer": writer, "point": point, "file": n}).encode() for n in names}
    files[RUN] = json.dumps({"writer": writer, "point": point, "files": sorted(files)}).encode()
    return files


def _commit_many(out: str, writer: int, times: int) -> None:
    for point in range(times):
        commit(out, _files(writer, point))


def _is_one_run(out) -> bool:
    """The folder holds exactly the files its run.json lists, every one from that run."""
    record = json.loads((out / RUN).read_text())
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    if on_disk != sorted([*record["files"], RUN]):
        return False
    return all(json.loads((out / n).read_text())[k] == record[k] for n in record["files"] for k in ("writer", "point"))


def test_concurrent_commits_into_one_folder_leave_exactly_one_run(tmp_path):
    out = tmp_path / "out"
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_commit_many, args=(str(out), w, 15)) for w in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=300)
        assert w.exitcode == 0
    assert state(out) == "complete"
    assert _is_one_run(out)


def test_two_cli_runs_of_different_documents_into_one_out_leave_one_of_them_whole(tmp_path):
    out = tmp_path / "out"
    runs = [subprocess.Popen([*cli_command(), "run", str(V2 / doc), "--engine", "hooks", "--quiet", "--out",
                              str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for doc in ("pos_sweep.causalab.json", "patching.causalab.json")]
    for r in runs:
        _, err = r.communicate(timeout=600)
        assert r.returncode == 0, err
    ran = cm.open(out)  # whichever committed last: whole, and nothing of the other
    record = json.loads((out / RUN).read_text())
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert on_disk == sorted([*record["files"], RUN])
    assert record["document"] in ("pos_sweep", "patching") and ran.points


def test_an_out_folder_the_file_system_refuses_is_refused_before_the_load(tmp_path):
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    started = time.monotonic()
    done = subprocess.run([*cli_command(), "run", str(V2 / "patching.causalab.json"), "--engine", "hooks",
                           "--out", "/proc/causalab-out"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: EngineError: --out: /proc/causalab-out cannot be written into")
    with pytest.raises(cm.EngineError, match="cannot be written into"):
        cm.run(V2 / "patching.causalab.json", engine="no such engine", out="/proc/causalab-out")
    assert time.monotonic() - started < 300


def test_a_refused_out_check_leaves_no_folder_behind(tmp_path):
    """The check tries the nearest existing folder with a probe of its own, and removes it."""
    from causalab_mini.outputs.write import check_out

    check_out(tmp_path / "a" / "b" / "c")
    assert list(tmp_path.iterdir()) == []


def test_a_symlinked_folder_inside_out_is_refused_before_anything_is_written(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    cm.run(V2 / "pos_sweep.causalab.json", engine="hooks", out=out)
    point = next(p for p in out.iterdir() if p.is_dir())
    for f in point.iterdir():
        f.unlink()
    point.rmdir()
    point.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(cm.PlanError, match="is a symbolic link"):
        cm.run(V2 / "pos_sweep.causalab.json", engine="hooks", out=out)
    assert list(elsewhere.iterdir()) == []


def test_killed_cache_writes_are_swept_and_a_writers_own_are_not(tmp_path):
    store = Store(tmp_path / "cache")
    old = store.root / "blobs" / ".abc.x1y2.tmp"
    fresh = store.root / "entries" / ".def.json.z3.tmp"
    for f in (old, fresh):
        f.write_bytes(b"half")
    past = time.time() - ORPHAN_AGE - 60
    os.utime(old, (past, past))
    Store(tmp_path / "cache")
    assert not old.exists() and fresh.exists()

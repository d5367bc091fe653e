"""Fuzzing three more inputs: a model directory, a result-cache entry, and a run's folder before a rerun.

**Model directories** (``fuzzing_models.mutated_model``): a copy of tiny-llama with its config's fields,
its safetensors header (the length, the JSON's bytes, dtypes, shapes, data_offsets, tensors renamed,
dropped, added, reshaped), its bytes (cut at any offset) or its files (missing, a folder, a FIFO, a
link to /dev/zero, a second shard, an index) changed. The checks a load makes before anything is
allocated (``weights_digest``, ``check_config`` and transformers' read of the config,
``check_weight_files``, ``check_fits``) pass or refuse it with a ``CausalabError``: never another
exception, never a hang (hypothesis's deadline for a slow example, and a hard one — SIGALRM — for a
call that would never return). Of the directories that pass, a
handful per run are loaded on the hooks engine: each loads with every parameter equal, bit for bit,
to the weight file's tensor of its name (nothing initialised at random, nothing read from elsewhere),
or is refused typed. ``scripts/fuzz_models.py`` runs the same two properties over a thousand.

**Cache entries**: a cache filled by one real run (patching.causalab.json, hooks), then its entry's
bytes and JSON fields, the digests and sizes it names, the paths of its files and the blobs themselves
(bytes changed, swapped, removed, replaced by a folder or a link, a value edited and stored under its
new digest) damaged. ``Store.get`` never raises, and returns None, or an entry whose scored rows and
files are exactly the ones computed — never rows or bytes that disagree with them — or one whose file
names are not the point's (listed in another order, renamed, one more), which a run takes for a miss
(``cache.serve``: the store has no way to know the names a point saves; the run does).

**A run's folder before a rerun**: a finished pos_sweep run (or another document's run, an empty
folder, a file in its place), then files deleted, cut or replaced by junk, a person's own files added,
the incomplete mark or run.json left with garbage (listing anything: a person's file, "../x", "*", a
NUL), a staging folder left with junk (or a file or a link in its place), orphaned temporary files, a
file where a folder should be and a folder where a file should be, links out of the folder and links
that loop. The rerun
(``write.commit`` with a clean run's bytes) is refused with a ``CausalabError`` naming the folder, or
leaves exactly the clean run's files (``state`` "complete") beside the person's files, untouched; the
files a link points at outside the folder are never touched.

``CAUSALAB_FUZZ_EXAMPLES`` sets the counts, as for tests/test_fuzz.py.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import causalab_mini as cm
from causalab_mini import cache
from causalab_mini.cache import Store
from causalab_mini.errors import CausalabError
from causalab_mini.outputs import write
from fuzzing import EXAMPLES, JSON, V2, Blob, holder, mutate, paths
from fuzzing_models import ORIGINAL, Hang, ModelCase, deadline, loaded_whole, mutated_model, preflight

pytest.importorskip("transformers")
pytestmark = [pytest.mark.usefixtures("one_thread"),
              # a mutated shape of 0: torch says so, once per process, from the meta build of check_fits
              pytest.mark.filterwarnings("ignore:Initializing zero-element tensors:UserWarning")]

PATCHING = V2 / "patching.causalab.json"
POS_SWEEP = V2 / "pos_sweep.causalab.json"
HARD = 60.0  # seconds: past the hypothesis deadline, a call that has not returned is stopped (fuzzing_models.Hang)


class Held(dict):
    """A module fixture's values, shown by their names only: hypothesis prints a failing example's fixtures."""

    def __repr__(self) -> str:
        return f"Held({', '.join(self)})"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))


def _event(outcome) -> None:
    event("passed" if outcome is None else f"refused: {type(outcome).__name__}")


# --- model directories --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_roots(tmp_path_factory) -> Path:
    """A folder for the mutated model directories; the checks and a load run once on an unchanged
    copy first, unmeasured (the imports a process's first load makes are not an example's time)."""
    roots = tmp_path_factory.mktemp("fuzzed-models")
    folder = ModelCase().materialize(roots / "warm")
    assert preflight(folder) is None
    assert not isinstance(loaded_whole(folder), CausalabError)
    return roots


@settings(max_examples=max(EXAMPLES // 4, 100), deadline=10_000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=mutated_model())
def test_a_mutated_model_directory_passes_the_checks_or_is_refused_typed(model_roots, case):
    root = Path(tempfile.mkdtemp(dir=model_roots))
    try:
        folder = case.materialize(root)
        with deadline(HARD):
            _event(preflight(folder))
    finally:
        shutil.rmtree(root)


@settings(max_examples=max(EXAMPLES // 50, 8), deadline=30_000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(case=mutated_model(rounds=(1, 2)))
def test_a_mutated_model_directory_that_passes_the_checks_loads_whole_or_is_refused_typed(model_roots, case):
    root = Path(tempfile.mkdtemp(dir=model_roots))
    try:
        folder = case.materialize(root)
        with deadline(HARD):
            passed = preflight(folder) is None
        assume(passed)  # a load costs a second: only the directories the checks let through
        with deadline(HARD):
            outcome = loaded_whole(folder)
        event(f"refused at load: {type(outcome).__name__}" if isinstance(outcome, CausalabError) else "loaded whole")
    finally:
        shutil.rmtree(root)


def test_the_deadline_stops_a_call_that_hangs():
    """The hard deadline the examples run under does stop a call (a read that blocks included)."""
    read, written = os.pipe()
    try:
        with pytest.raises(Hang):
            with deadline(0.2):
                os.read(read, 1)
    finally:
        os.close(read)
        os.close(written)


def test_the_unchanged_directory_passes_and_loads_whole(model_roots):
    root = Path(tempfile.mkdtemp(dir=model_roots))
    folder = ModelCase().materialize(root)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == ORIGINAL
    assert preflight(folder) is None
    assert not isinstance(loaded_whole(folder), CausalabError)


# --- cache entries ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def filled(engines, tmp_path_factory) -> dict:
    """A cache holding patching.causalab.json run on the hooks engine: its folder, the point's key and
    parts, and the entry as ``Store.get`` returns it, undamaged."""
    loaded = engines(PATCHING, "hooks")
    folder = tmp_path_factory.mktemp("fuzzed-cache") / "filled"
    cm.run(PATCHING, loaded=loaded, cache=folder)
    key = cache.keys(cm.read(PATCHING), loaded)["patching"]
    store = Store(folder)
    parts = json.loads(store.entry_path(key).read_text())["parts"]
    entry = store.get(key, parts)
    assert entry is not None and entry.files and entry.scored
    blobs = sorted(p.name for p in (folder / "blobs").iterdir())
    return Held(folder=folder, key=key, parts=parts, entry=entry, blobs=blobs,
                roots=tmp_path_factory.mktemp("fuzzed-caches"))


def _served(entry) -> tuple:
    """What an entry serves: every scored metric (step, name, file, rows), and every file (path, bytes)."""
    return [(s.step, s.name, s.file, s.result.rows) for s in entry.scored], list(entry.files.items())


def _refs(raw) -> list:
    """The places in an entry's JSON that name a blob: its scored rows and each file."""
    out = []
    if isinstance(raw, dict):
        if isinstance(raw.get("scored"), dict):
            out.append(raw["scored"])
        if isinstance(raw.get("files"), list):
            out += [f for f in raw["files"] if isinstance(f, dict)]
    return out


def _spoil(draw, data: bytes) -> bytes:
    """``data`` with bytes flipped, inserted or deleted, cut, or given a tail."""
    data = bytearray(data)
    how = draw(st.sampled_from(["set", "insert", "delete", "cut", "tail", "empty"]))
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    junk = draw(st.binary(min_size=1, max_size=8) | st.sampled_from([b'"', b"}", b"]", b"0", b"-", b"\xff", b"\x00"]))
    if how == "set":
        data[at:at + len(junk)] = junk
    elif how == "insert":
        data[at:at] = junk
    elif how == "delete":
        del data[at:at + len(junk)]
    elif how == "cut":
        del data[at:]
    elif how == "tail":
        data += junk
    else:
        data = bytearray()
    return bytes(data)


CACHE_DAMAGE = ["entry bytes", "entry json", "digest", "digest", "size", "path", "files", "blob bytes", "blob swap",
                "blob kind", "re-addressed", "entry kind"]


def _damage_cache(draw, folder: Path, action: str, blobs: list) -> None:
    """One damage to the cache in ``folder`` (``draw`` decides the details, from what is there now)."""
    entry_path = next((folder / "entries").glob("*.json"), None)
    blob_paths = sorted((folder / "blobs").iterdir())
    if action == "entry bytes" and entry_path is not None and entry_path.is_file():
        entry_path.write_bytes(_spoil(draw, entry_path.read_bytes()))
        return
    if action in ("blob bytes", "blob swap", "blob kind", "re-addressed") and blob_paths:
        _damage_blob(draw, folder, action, blob_paths, entry_path)
        return
    if action == "entry kind" and entry_path is not None:
        how = draw(st.sampled_from(["gone", "folder", "dangling", "deep", "empty object", "other key"]))
        raw = _json(entry_path)
        _remove_path(entry_path)
        if how == "folder":
            entry_path.mkdir()
        elif how == "dangling":
            entry_path.symlink_to(folder / "nowhere")
        elif how == "deep":
            entry_path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
        elif how == "empty object":
            entry_path.write_bytes(b"{}")
        elif how == "other key" and isinstance(raw, dict):
            raw["key"] = "0" * 64
            entry_path.write_text(json.dumps(raw))
        return
    raw = _json(entry_path) if entry_path is not None and entry_path.is_file() else None
    if raw is None:
        return
    refs = _refs(raw)
    if action == "entry json":
        mutate(draw, raw, rounds=(1, 2))
    elif action == "digest" and refs:  # another blob's digest (with its size, or not), or not a digest
        ref = draw(st.sampled_from(refs))
        sha = ref.get("sha256") if isinstance(ref.get("sha256"), str) else "0" * 64
        other = draw(st.sampled_from(blobs))
        ref["sha256"] = draw(st.sampled_from([
            other, other, sha.upper(), sha[:-1], sha + "0", sha[:-1] + ("0" if sha[-1:] != "0" else "1"),
            "", "../" + other, other + "/", None, 0, [other], {"sha256": other}, "g" * 64, "/" * 64]))
        if draw(st.booleans()) and isinstance(ref["sha256"], str) and (folder / "blobs" / ref["sha256"]).is_file():
            ref["size"] = (folder / "blobs" / ref["sha256"]).stat().st_size
    elif action == "size" and refs:
        ref = draw(st.sampled_from(refs))
        size = ref.get("size") if isinstance(ref.get("size"), int) else 0
        ref["size"] = draw(st.sampled_from([size + 1, size - 1, 0, -1, 2 ** 64, 10 ** 400, 2075.0, 0.5, str(size),
                                            None, True, [size]]))
    elif action == "path" and isinstance(raw.get("files"), list) and raw["files"]:
        ref = draw(st.sampled_from(raw["files"]))
        if isinstance(ref, dict):
            names = [f.get("path") for f in raw["files"] if isinstance(f, dict)]
            ref["path"] = draw(st.sampled_from(names + ["", "../iia.json", "/etc/passwd", "iia.json ", "IIA.json",
                                                        None, 0, ["iia.json"]]) | st.text(max_size=8))
    elif action == "files" and isinstance(raw.get("files"), list):
        files = raw["files"]
        how = draw(st.sampled_from(["reverse", "duplicate", "drop", "scored", "empty", "not a list"]))
        if how == "reverse":
            files.reverse()
        elif how == "duplicate" and files:
            files.append(copy.deepcopy(draw(st.sampled_from(files))))
        elif how == "drop" and files:
            files.pop(draw(st.integers(0, len(files) - 1)))
        elif how == "scored" and files and isinstance(files[0], dict):  # the scored rows named by a file's blob
            raw["scored"] = {k: v for k, v in files[0].items() if k != "path"}
        elif how == "empty":
            raw["files"] = []
        else:
            raw["files"] = {"iia.json": files}
    entry_path.write_bytes(json.dumps(raw, allow_nan=True).encode("utf-8", "surrogatepass"))


def _json(path):
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def _remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _damage_blob(draw, folder: Path, action: str, blobs: list, entry_path) -> None:
    blob = draw(st.sampled_from(blobs))
    if action == "blob bytes" and blob.is_file():
        blob.write_bytes(_spoil(draw, blob.read_bytes()))
    elif action == "blob swap":  # two blobs' contents exchanged, or one copied over another
        other = draw(st.sampled_from(blobs))
        if blob.is_file() and other.is_file():
            a, b = blob.read_bytes(), other.read_bytes()
            blob.write_bytes(b)
            if draw(st.booleans()):
                other.write_bytes(a)
    elif action == "blob kind":
        how = draw(st.sampled_from(["gone", "folder", "dangling", "link to another"]))
        other = draw(st.sampled_from(blobs))
        _remove_path(blob)
        if how == "folder":
            blob.mkdir()
        elif how == "dangling":
            blob.symlink_to(folder / "nowhere")
        elif how == "link to another" and other != blob:
            blob.symlink_to(other)
    elif action == "re-addressed" and blob.is_file():
        # A number changed in one blob's rows, written as its writer writes it and stored under its new
        # digest, the entry naming it: the scored rows and the metric files saved beside them now
        # disagree, which the store checks. (An edit this deliberate that changes nothing a comparison of
        # the rows sees — 0.0 written 0, the file re-indented — is served: see the report.)
        rows = _json(blob)
        raw = _json(entry_path) if entry_path is not None and entry_path.is_file() else None
        numbers = [p for p, v in paths(rows) if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if rows is None or not isinstance(raw, dict) or not numbers:
            return
        where = draw(st.sampled_from(numbers))
        target = holder(rows, where)
        old = target[where[-1]]
        new = draw(st.sampled_from([0, -1, 1e-9, 1e300, None, "0"]) | st.floats(allow_nan=False, allow_infinity=False))
        target[where[-1]] = new if new != old else old + 1
        scored = isinstance(raw.get("scored"), dict) and raw["scored"].get("sha256") == blob.name
        data = (json.dumps(rows, ensure_ascii=False, sort_keys=True).encode("utf-8") if scored
                else write.json_bytes(rows))
        sha = hashlib.sha256(data).hexdigest()
        (folder / "blobs" / sha).write_bytes(data)
        for ref in _refs(raw):
            if ref.get("sha256") == blob.name:
                ref.update(sha256=sha, size=len(data))
        entry_path.write_text(json.dumps(raw))


@settings(max_examples=max(EXAMPLES // 2, 100), deadline=5_000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_a_damaged_cache_entry_is_a_miss_or_serves_exactly_what_was_computed(filled, data):
    folder = Path(tempfile.mkdtemp(dir=filled["roots"])) / "cache"
    try:
        shutil.copytree(filled["folder"], folder, symlinks=True)
        for action in data.draw(st.lists(st.sampled_from(CACHE_DAMAGE), min_size=1, max_size=3), label="damages"):
            _damage_cache(data.draw, folder, action, filled["blobs"])
        with deadline(HARD):
            got = Store(folder).get(filled["key"], filled["parts"])
        if got is None:
            event("a miss")
            return
        if list(got.files) != list(filled["entry"].files):
            # Not the files the point saves, in its order: a run takes it for a miss and computes the
            # point (cache.serve.hits, run_cached). The store cannot know the names; the run does.
            event("a miss at the run: other file names")
            return
        assert _served(got) == _served(filled["entry"])
        event("served, as computed")
    finally:
        shutil.rmtree(folder.parent)


def test_an_undamaged_entry_is_served(filled):
    assert _served(Store(filled["folder"]).get(filled["key"], filled["parts"])) == _served(filled["entry"])


# --- a run's folder before a rerun --------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(engines, tmp_path_factory) -> dict:
    """pos_sweep run on the hooks engine into a clean folder (its files' bytes, in the order a run
    writes them), and patching's finished run folder: an earlier run of another document."""
    loaded = engines(POS_SWEEP, "hooks")
    base = tmp_path_factory.mktemp("fuzzed-outs")
    clean = cm.run(POS_SWEEP, loaded=loaded, out=base / "clean")
    files = {p.relative_to(base / "clean").as_posix(): p.read_bytes() for p in clean.files}
    assert write.state(base / "clean") == "complete" and write.RUN in files
    cm.run(PATCHING, loaded=engines(PATCHING, "hooks"), out=base / "other")
    return Held(files=files, clean=base / "clean", other=base / "other", base=base)


def _tree(folder: Path, dirs: bool = False) -> dict:
    """Every file and link under ``folder`` (links not followed): relative path -> bytes, or ("link", target);
    with ``dirs``, every folder too (as "folder")."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_file():
                out[rel] = path.read_bytes()
            elif dirs:
                out[rel] = "folder"
    return out


NAMES = st.sampled_from(["notes.txt", "iia.json", "pos=-1/notes.md", "pos=-4/iia.json", "mine/a.json", ".hidden",
                         "pos=-2/.keep", "document.json.bak", "run.json~", "pos=-1/iia.json.orig"]) | \
    st.text(st.characters(whitelist_categories=["Ll", "Nd"], whitelist_characters="._-="), min_size=1, max_size=10)
LISTED = st.sampled_from(["document.json", "pos=-1/iia.json", "notes.txt", "mine/a.json", "../outside/kept.txt",
                          "pos=-1", "pos=-1/../notes.txt", "a\x00b", "", ".", "/", "run.json", "*", "*.json",
                          "pos=-[12]/iia.json", "loop", "loop/iia.json", write.INCOMPLETE, write.STAGING,
                          "pos=-1/../../outside/kept.txt"]) | st.text(max_size=10) | JSON


@st.composite
def out_damage(draw, ours: list):
    """(the state the folder starts from, the damages: (action, relative path, bytes, a number) each)."""
    start = draw(st.sampled_from(["clean", "clean", "clean", "other", "other", "empty", "a file"]))
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["delete", "cut", "junk", "person", "person", "mark", "mark", "staging", "tmp",
                                       "file for folder", "folder for file", "link out", "loop", "run.json"]))
        if action in ("delete", "cut", "junk", "folder for file", "link out", "loop"):
            rel = draw(st.sampled_from(ours + ["document.json", "iia.json", "logit_diff.json", write.STAGING, "loop"]))
        elif action == "file for folder":
            rel = draw(st.sampled_from(["pos=-1", "pos=-2", "pos=-3", write.STAGING]))
        else:
            rel = draw(NAMES)
        if action == "mark" or action == "run.json":
            what = draw(st.sampled_from(["listing", "listing", "bytes", "json"]))
            if what == "listing":
                listed = draw(st.lists(LISTED, max_size=5))
                payload = Blob(json.dumps({"files": listed if draw(st.booleans()) else draw(
                    st.sampled_from([listed, "notes.txt", {"notes.txt": 1}, 5, None, True]))},
                    allow_nan=True).encode("utf-8", "surrogatepass"))
            elif what == "bytes":
                payload = Blob(draw(st.binary(max_size=40)))
            else:
                payload = Blob(json.dumps(draw(JSON), allow_nan=True).encode("utf-8", "surrogatepass"))
        else:
            payload = Blob(draw(st.binary(max_size=40)))
        at = draw(st.integers(0, 4096))
        steps.append((action, rel, payload, at))
    return start, steps


def _apply(out: Path, outside: Path, action: str, rel: str, payload: bytes, at: int) -> None:
    target = out / rel
    try:
        if action == "delete":
            _remove_path(target)
        elif action == "cut" and target.is_file():
            target.write_bytes(target.read_bytes()[: at % (target.stat().st_size + 1)])
        elif action == "junk" and target.is_file():
            target.write_bytes(payload)
        elif action == "person":  # a file of the person's own, where no run writes one
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.write_bytes(payload)
        elif action == "mark":
            (out / write.INCOMPLETE).write_bytes(payload)
        elif action == "run.json":
            (out / write.RUN).write_bytes(payload)
        elif action == "staging":
            stage = out / write.STAGING
            if stage.is_dir() or not stage.exists():
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                (stage / rel).write_bytes(payload)
        elif action == "tmp":  # an orphaned temporary file of one of ours, or of a person's file
            name = Path(rel).name
            target.parent.mkdir(parents=True, exist_ok=True)
            (target.parent / f".{name}.x{at}{'.tmp'}").write_bytes(payload)
        elif action == "file for folder":
            _remove_path(target)
            target.write_bytes(payload)
        elif action == "folder for file":
            _remove_path(target)
            (target / "inside.txt").parent.mkdir(parents=True, exist_ok=True)
            (target / "inside.txt").write_bytes(payload)
        elif action == "link out":  # one of ours a link to a file outside, or its folder (or staging) a link outside
            if rel == write.STAGING:
                _remove_path(target)
                target.symlink_to(outside, target_is_directory=True)
            elif at % 2 and target.parent != out:
                _remove_path(target.parent)
                target.parent.symlink_to(outside, target_is_directory=True)
            else:
                _remove_path(target)
                target.symlink_to(outside / "kept.txt")
        elif action == "loop":  # a link to itself, where a file or folder of ours (or a person's) is
            _remove_path(target)
            target.symlink_to(target.name)
    except OSError:  # a path the damage before made impossible (a file where its folder would be): skip
        pass


def _listed(path: Path) -> set:
    """The names a run.json or mark lists: its "files", when that is a list, the strings in it."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    listed = value.get("files") if isinstance(value, dict) else None
    return {rel for rel in listed if isinstance(rel, str)} if isinstance(listed, list) else set()


def _resolved(out: Path, rel: str):
    """Where a listed name lands, links followed — None outside the folder, or where no path can be
    (a NUL, a link that loops): the only places the writer removes a file of an earlier run."""
    try:
        root, target = out.resolve(), (out / rel).resolve()
    except (OSError, ValueError, RuntimeError):
        return None
    return target if root in target.parents else None


def _theirs(out: Path, files: dict) -> dict:
    """The files a person put in ``out`` that no run lists: not a file the rerun writes, not one the
    previous run.json or the incomplete mark lists (where it lands, inside the folder), not the mark or
    the staging folder, nor a temporary file of any of those (``.iia.json.<random>.tmp`` beside it)."""
    if not out.is_dir():
        return {}
    root = out.resolve()
    listed = _listed(out / write.RUN) | _listed(out / write.INCOMPLETE)
    landed = {_resolved(out, rel) for rel in set(files) | listed | {write.INCOMPLETE}} - {None}
    gone = {root / rel for rel in files} | {root / write.INCOMPLETE} | {_resolved(out, rel) for rel in listed}
    kept = {}
    for rel, data in _tree(out).items():
        path = root / rel
        if rel.split("/")[0] == write.STAGING or path in gone:
            continue
        name = path.name
        if any(q.parent == path.parent and name.startswith(f".{q.name}.") and name.endswith(".tmp")
               and len(name) >= len(q.name) + 6 for q in landed):
            continue  # an orphan of one of ours: the writer's to remove
        kept[rel] = data
    return kept


@settings(max_examples=max(EXAMPLES // 4, 100), deadline=10_000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_a_rerun_into_a_damaged_folder_is_refused_typed_or_leaves_a_clean_run(runs, data):
    files = runs["files"]
    start, steps = data.draw(out_damage(sorted(files)), label="damage")
    here = Path(tempfile.mkdtemp(dir=runs["base"]))
    out, outside = here / "out", here / "outside"
    try:
        outside.mkdir()
        (outside / "kept.txt").write_bytes(b"not the run's")
        if start in ("clean", "other"):
            shutil.copytree(runs[start], out)
        elif start == "empty":
            out.mkdir()
        else:  # a file where the run's folder should be
            out.write_bytes(b"a file")
        for action, rel, payload, at in steps if out.is_dir() else ():
            _apply(out, outside, action, rel, payload, at)
        theirs = _theirs(out, files)
        before_outside = _tree(outside, dirs=True)
        try:
            with deadline(HARD):
                write.commit(out, files)
        except CausalabError as err:
            assert str(out) in str(err), err
            event(f"refused: {type(err).__name__}")
        else:
            assert write.state(out) == "complete"
            left = _tree(out)
            assert {rel: left.get(rel) for rel in files} == files
            assert {rel: data for rel, data in left.items() if rel not in files} == theirs
            event("a clean run, and the person's files")
        assert _tree(outside, dirs=True) == before_outside
    finally:
        shutil.rmtree(here)


def test_a_rerun_over_a_finished_run_gives_its_bytes(runs, tmp_path):
    shutil.copytree(runs["other"], tmp_path / "out")
    write.commit(tmp_path / "out", runs["files"])
    assert _tree(tmp_path / "out") == runs["files"] == _tree(runs["clean"])

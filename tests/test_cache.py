"""The result cache (``cm.run(..., cache=DIR)``): a point whose results cannot have changed is not computed.

Held to runs without a cache: a served run calls the model 0 times (counted by a pre-hook on
the transformers model) and gives the same rows, tensors and files, byte for byte, run.json
included; each part of the key changed alone (the experiment, the engine, the dtype served,
the batch size, the package's source, the weights' revision, the dataset's rows) is a miss
that computes what a run without the cache computes; a sweep after two of its points ran alone
computes only the others; a damaged entry is recomputed and replaced; a folder that cannot
hold a cache is refused before anything loads or runs.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading

import pytest
from model_calls import counting_calls, folder_bytes as files, untimed_record
from paths import CORPUS, DATA, MODELS, V2

import causalab_mini as cm
from causalab_mini import CacheError, cache, cli
from causalab_mini.cache import Entry, Store, served
from causalab_mini.engine import provenance
from causalab_mini.model import loading
from causalab_mini.outputs.results import Result, Scored

pytestmark = pytest.mark.usefixtures("one_thread")

LAYER_POS = V2 / "layer_pos_sweep.causalab.json"  # 6 points, sharing their counterfactual pass
PATCHING = V2 / "patching.causalab.json"  # unswept
PROBE = V2 / "generate_probe.causalab.json"  # saves tensors
SEARCH = dict(models=[MODELS], data=[DATA])  # for documents written outside documents/


def rows(run) -> dict:
    """Every result of every point, as rows: ``lookup()`` (results() and step/name) and ``saved()``."""
    return {p.name: {"lookup": {n: r.rows for n, r in p.lookup().items()},
                     "saved": {n: r.rows for n, r in p.saved().items()},
                     "results": {n: r.rows for n, r in p.results().items()}} for p in run.points}


def edited(tmp_path, source, change, name=None):
    """``source`` rewritten by ``change(raw)`` into ``tmp_path`` (same file name unless ``name``)."""
    raw = json.loads(source.read_text())
    change(raw)
    path = tmp_path / (name or source.name)
    path.write_text(json.dumps(raw, indent=1))
    return path


# --- a hit ------------------------------------------------------------------------------------

def test_a_second_run_computes_nothing_and_writes_the_same_bytes(engines, tmp_path):
    loaded = engines(LAYER_POS, "hooks")
    store = tmp_path / "cache"
    with counting_calls(loaded) as calls:
        first = cm.run(LAYER_POS, loaded=loaded, out=tmp_path / "first", cache=store)
    assert calls and served(first) == []
    plain = cm.run(LAYER_POS, loaded=loaded, out=tmp_path / "plain")
    with counting_calls(loaded) as calls:
        second = cm.run(LAYER_POS, loaded=loaded, out=tmp_path / "second", cache=store)
    assert calls == []
    assert served(second) == [p.name for p in plain.points]
    assert second.cached == served(second)
    # The same files, byte for byte, run.json included: a miss and a hit write what no cache writes.
    assert files(tmp_path / "first") == files(tmp_path / "plain") == files(tmp_path / "second")
    assert [f.relative_to(tmp_path / "second") for f in second.files] == \
        [f.relative_to(tmp_path / "plain") for f in plain.files]
    assert untimed_record(second.record) == untimed_record(plain.record)
    assert rows(second) == rows(first) == rows(plain)
    assert [(p.name, p.coords, p.produced_by, p.engine) for p in second.points] == \
        [(p.name, p.coords, p.produced_by, p.engine) for p in plain.points]
    assert second.grid("iia", "layers", "pos").values == plain.grid("iia", "layers", "pos").values
    assert rows(cm.open(tmp_path / "second")) == rows(cm.open(tmp_path / "plain"))


@pytest.mark.parametrize("engine", ["hooks", "nnterp"])
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_every_corpus_document_is_served_with_the_bytes_computing_it_writes(engines, tmp_path, path, engine):
    """A run that stores, and a run that is served, write what a run without a cache writes; the
    served run calls the model for none of the document's points — except an estimated sweep's,
    which the cache never serves (its verification is the whole sweep's) and which recomputes."""
    loaded = engines(path, engine)
    plain = cm.run(path, loaded=loaded, out=tmp_path / "plain")
    stored = cm.run(path, loaded=loaded, out=tmp_path / "stored", cache=tmp_path / "cache")
    with counting_calls(loaded) as calls:
        again = cm.run(path, loaded=loaded, out=tmp_path / "served", cache=tmp_path / "cache")
    estimated = any("estimate" in step for step in json.loads(path.read_text()).get("steps", {}).values())
    assert served(stored) == [] and served(again) == ([] if estimated else [p.name for p in plain.points])
    assert bool(calls) == estimated
    assert files(tmp_path / "plain") == files(tmp_path / "stored") == files(tmp_path / "served")
    assert rows(again) == rows(plain)


def test_without_out_a_hit_gives_the_same_results(engines, tmp_path):
    loaded = engines(PATCHING, "hooks")
    plain = cm.run(PATCHING, loaded=loaded)
    cm.run(PATCHING, loaded=loaded, cache=tmp_path)
    with counting_calls(loaded) as calls:
        again = cm.run(PATCHING, loaded=loaded, cache=tmp_path)
    assert calls == [] and served(again) == [plain.points[0].name] == ["patching"]
    assert rows(again) == rows(plain)
    assert untimed_record(again.record) == untimed_record(plain.record) and again.files == [] and again.plan is None


def test_served_points_have_the_saved_tensors(engines, tmp_path):
    loaded = engines(PROBE, "hooks")
    plain = cm.run(PROBE, loaded=loaded, out=tmp_path / "plain")
    cm.run(PROBE, loaded=loaded, cache=tmp_path / "cache")
    with counting_calls(loaded) as calls:
        again = cm.run(PROBE, loaded=loaded, out=tmp_path / "again", cache=tmp_path / "cache")
    assert calls == [] and len(served(again)) == len(plain.points)
    assert files(tmp_path / "again") == files(tmp_path / "plain")
    assert rows(again) == rows(plain)
    for mine, theirs in zip(again.points, plain.points):
        got, want = mine.saved_tensors(), theirs.saved_tensors()
        assert want and list(got) == list(want)
        for file in want:
            assert list(got[file]) == list(want[file])
            for name, tensor in want[file].items():
                assert got[file][name].dtype == tensor.dtype and got[file][name].equal(tensor.cpu())


# --- every part of the key ----------------------------------------------------------------------

def assert_miss(loaded, go, store):
    """``go(cache=store)`` computes (the model is called), serves nothing, gives what a run without
    the cache gives, and is stored: the same run again computes nothing."""
    with counting_calls(loaded) as calls:
        missed = go(cache=store)
    assert calls and served(missed) == []
    fresh = go(cache=None)
    assert rows(missed) == rows(fresh) and untimed_record(missed.record) == untimed_record(fresh.record)
    with counting_calls(loaded) as calls:
        again = go(cache=store)
    assert calls == [] and served(again) == [p.name for p in fresh.points]
    assert rows(again) == rows(fresh)
    return fresh


@pytest.fixture
def filled(engines, tmp_path):
    """A cache holding patching.causalab.json on the hooks engine, and that engine."""
    loaded = engines(PATCHING, "hooks")
    store = tmp_path / "cache"
    cm.run(PATCHING, loaded=loaded, cache=store)
    return loaded, store


def test_another_experiment_is_a_miss(filled, tmp_path):
    loaded, store = filled
    other = edited(tmp_path, PATCHING, lambda raw: raw["sites"]["target"].update(layers=[1]))
    assert cm.read(other).points[0].spec.produced_by != cm.read(PATCHING).points[0].spec.produced_by
    assert_miss(loaded, lambda cache: cm.run(other, loaded=loaded, cache=cache, **SEARCH), store)


def test_a_reworded_header_is_a_hit_and_writes_its_own_document(filled, tmp_path):
    loaded, store = filled
    reworded = edited(tmp_path, PATCHING, lambda raw: raw["header"].update(description="Reworded."))
    assert cm.read(reworded).points[0].spec.produced_by == cm.read(PATCHING).points[0].spec.produced_by
    with counting_calls(loaded) as calls:
        cm.run(reworded, loaded=loaded, out=tmp_path / "served", cache=store, **SEARCH)
    assert calls == []
    cm.run(reworded, loaded=loaded, out=tmp_path / "plain", **SEARCH)
    assert files(tmp_path / "served") == files(tmp_path / "plain")
    assert json.loads((tmp_path / "served" / "document.json").read_text())["header"]["description"] == "Reworded."


def test_another_engine_is_a_miss_and_its_hit_writes_its_own_run_json(engines, filled, tmp_path):
    _, store = filled
    loaded = engines(PATCHING, "nnterp")
    assert_miss(loaded, lambda cache: cm.run(PATCHING, loaded=loaded, cache=cache), store)
    with counting_calls(loaded) as calls:
        cm.run(PATCHING, loaded=loaded, out=tmp_path / "served", cache=store)
    assert calls == []
    cm.run(PATCHING, loaded=loaded, out=tmp_path / "plain")
    assert files(tmp_path / "served") == files(tmp_path / "plain")


def test_another_served_dtype_is_a_miss(engines, filled):
    _, store = filled
    # The document says fp32; the engine serves bf16: the key has what was served.
    loaded = engines({"key": "tiny-llama", "dtype": "bf16"}, "hooks")
    fresh = assert_miss(loaded, lambda cache: cm.run(PATCHING, loaded=loaded, cache=cache), store)
    assert fresh.record["served_dtype"] == "torch.bfloat16"


def test_another_batch_size_is_a_miss(filled):
    loaded, store = filled
    assert_miss(loaded, lambda cache: cm.run(PATCHING, loaded=loaded, batch_size=7, cache=cache), store)


def test_another_package_source_is_a_miss(filled, monkeypatch):
    loaded, store = filled
    before = cm.run(PATCHING, loaded=loaded).record["causalab_mini"]
    monkeypatch.setattr(provenance, "source_digest", lambda: "0" * 64)
    fresh = assert_miss(loaded, lambda cache: cm.run(PATCHING, loaded=loaded, cache=cache), store)
    assert fresh.record["causalab_mini"] == "0" * 64 != before


def test_other_weights_are_a_miss(engines, tmp_path):
    """A copy of the model with one weight byte changed: another revision, under the same name."""
    unpinned = edited(tmp_path, PATCHING, lambda raw: raw["model"].pop("revision"))
    models = tmp_path / "models"
    shutil.copytree(MODELS / "tiny-llama", models / "tiny-llama")
    weights = models / "tiny-llama" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    first = 8 + int.from_bytes(data[:8], "little")  # the first tensor byte, after the header
    data[first] ^= 1  # the lowest bit of one weight
    weights.write_bytes(bytes(data))
    assert loading.weights_digest(models / "tiny-llama") != loading.weights_digest(MODELS / "tiny-llama")

    original = engines(unpinned, "hooks")
    store = tmp_path / "cache"
    cm.run(unpinned, loaded=original, cache=store, **SEARCH)
    changed = cm.load(unpinned, engine="hooks", models=[models])
    assert_miss(changed, lambda cache: cm.run(unpinned, loaded=changed, cache=cache, data=[DATA]), store)


def test_other_rows_in_the_dataset_file_are_a_miss(filled, tmp_path):
    """The document names the dataset, not what its file holds: the compiled rows are in the key."""
    loaded, store = filled
    data = tmp_path / "data"
    shutil.copytree(DATA / "weekdays", data / "weekdays")
    train = data / "weekdays" / "train.jsonl"
    train.write_text("".join(reversed(train.read_text().splitlines(keepends=True))))
    assert_miss(loaded, lambda cache: cm.run(PATCHING, loaded=loaded, cache=cache, data=[data]), store)


# --- a partial hit ------------------------------------------------------------------------------

def test_a_sweep_after_two_of_its_points_ran_alone_computes_only_the_others(engines, tmp_path):
    loaded = engines(LAYER_POS, "hooks")
    doc = cm.read(LAYER_POS)
    names = [p.name for p in doc.points]
    alone = [names[0], names[4]]
    store = tmp_path / "cache"
    for name in alone:
        # A point run alone has the key it has inside its sweep.
        assert cache.keys(doc.point(name), loaded)[name] == cache.keys(doc, loaded)[name]
        cm.run(doc.point(name), loaded=loaded, cache=store)
    rest = cm.Document(doc.raw, doc.path, tuple(p for p in doc.points if p.name not in alone))
    with counting_calls(loaded) as expected:
        cm.run(rest, loaded=loaded)
    plain = cm.run(doc, loaded=loaded, out=tmp_path / "plain")
    with counting_calls(loaded) as calls:
        mixed = cm.run(doc, loaded=loaded, out=tmp_path / "mixed", cache=store)
    assert len(calls) == len(expected) < len(names) + 1
    assert served(mixed) == alone
    assert [p.name for p in mixed.points] == names
    assert files(tmp_path / "mixed") == files(tmp_path / "plain")
    assert rows(mixed) == rows(plain)
    computed = {p.name for p in mixed.points if p.plan is not None}
    assert computed == set(names) - set(alone)
    # run.json does not name the served points: only their seconds, null, tell them apart.
    seconds = json.loads((tmp_path / "mixed" / "run.json").read_text())["timing"]["points"]
    assert [n for n, s in seconds.items() if s is None] == alone


# --- damage and refusals -----------------------------------------------------------------------

@pytest.mark.parametrize("damaged", ["entry", "blob"])
def test_a_damaged_entry_is_a_miss_and_is_replaced(filled, damaged):
    loaded, store = filled
    key = cache.keys(cm.read(PATCHING), loaded)["patching"]
    entry = Store(store).entry_path(key)
    if damaged == "entry":
        target = entry
    else:
        target = store / "blobs" / json.loads(entry.read_text())["files"][0]["sha256"]
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    assert_miss(loaded, lambda cache: cm.run(PATCHING, loaded=loaded, cache=cache), store)


def _scored_blob(store, key):
    return store / "blobs" / json.loads(Store(store).entry_path(key).read_text())["scored"]["sha256"]


def _edited_rows(data: bytes) -> bytes:
    """The stored rows with every value changed: what an edit that makes a failing test pass does."""
    scored = json.loads(data)
    for s in scored:
        for row in s["rows"]:
            if row.get("value") is not None:
                row["value"] = 0.999
    return json.dumps(scored, ensure_ascii=False, sort_keys=True).encode("utf-8")


def test_rows_edited_in_place_are_a_miss(filled):
    """The scored rows are a blob named by its digest: an edit of its bytes is seen on read."""
    loaded, store = filled
    blob = _scored_blob(store, cache.keys(cm.read(PATCHING), loaded)["patching"])
    blob.write_bytes(_edited_rows(blob.read_bytes()))
    fresh = assert_miss(loaded, lambda cache: cm.run(PATCHING, loaded=loaded, cache=cache), store)
    assert 0.999 not in fresh.point().result("logit_diff").values


def test_rows_rewritten_under_their_own_digest_disagree_with_the_saved_files_and_are_a_miss(filled):
    """A forger who writes edited rows as a new blob and points the entry at it still serves
    nothing: a saved metric's rows must be its saved file's, which is digest-checked too."""
    loaded, store = filled
    key = cache.keys(cm.read(PATCHING), loaded)["patching"]
    forged = _edited_rows(_scored_blob(store, key).read_bytes())
    sha = hashlib.sha256(forged).hexdigest()
    (store / "blobs" / sha).write_bytes(forged)
    entry = Store(store).entry_path(key)
    raw = json.loads(entry.read_text())
    raw["scored"] = {"sha256": sha, "size": len(forged)}
    entry.write_text(json.dumps(raw))
    assert Store(store).get(key, raw["parts"]) is None
    assert_miss(loaded, lambda cache: cm.run(PATCHING, loaded=loaded, cache=cache), store)


def _retyped_rows(data: bytes) -> bytes:
    """The stored rows with every whole float written as an int (``1.0`` as ``1``): values Python
    calls equal to the saved file's, in other bytes."""
    scored = json.loads(data)
    for s in scored:
        for row in s["rows"]:
            if isinstance(row.get("value"), float) and row["value"].is_integer():
                row["value"] = int(row["value"])
    return json.dumps(scored, ensure_ascii=False, sort_keys=True).encode("utf-8")


def test_rows_equal_in_value_but_not_in_bytes_to_the_saved_file_are_a_miss(filled):
    """A forged blob under its own digest whose rows compare equal to the saved file's (1 == 1.0)
    is not served: a hit gives the bytes computed, not values that merely compare equal."""
    loaded, store = filled
    key = cache.keys(cm.read(PATCHING), loaded)["patching"]
    original = _scored_blob(store, key).read_bytes()
    forged = _retyped_rows(original)
    assert forged != original and json.loads(forged) == json.loads(original)
    sha = hashlib.sha256(forged).hexdigest()
    (store / "blobs" / sha).write_bytes(forged)
    entry = Store(store).entry_path(key)
    raw = json.loads(entry.read_text())
    raw["scored"] = {"sha256": sha, "size": len(forged)}
    entry.write_text(json.dumps(raw))
    assert Store(store).get(key, raw["parts"]) is None
    fresh = assert_miss(loaded, lambda cache: cm.run(PATCHING, loaded=loaded, cache=cache), store)
    # The entry stored by the miss serves the computed rows as JSON text, not only as values.
    again = cm.run(PATCHING, loaded=loaded, cache=store)
    assert served(again) == ["patching"]
    as_text = lambda run: json.dumps(rows(run), sort_keys=True)  # noqa: E731
    assert as_text(again) == as_text(fresh)
    assert _scored_blob(store, key).read_bytes() == original


def test_an_entry_missing_its_blob_is_a_miss(filled):
    loaded, store = filled
    for blob in (store / "blobs").iterdir():
        blob.unlink()
    assert_miss(loaded, lambda cache: cm.run(PATCHING, loaded=loaded, cache=cache), store)


def test_a_file_as_the_cache_is_refused_naming_it_before_any_compute(engines, tmp_path):
    loaded = engines(PATCHING, "hooks")
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("")
    with counting_calls(loaded) as calls, pytest.raises(CacheError) as err:
        cm.run(PATCHING, loaded=loaded, out=tmp_path / "out", cache=not_a_folder)
    assert str(not_a_folder) in str(err.value) and isinstance(err.value, cm.CausalabError)
    assert calls == [] and not (tmp_path / "out").exists()
    # A cache folder whose entries folder is a file cannot be used either.
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "entries").write_text("")
    with pytest.raises(CacheError, match="odd"):
        cm.run(PATCHING, loaded=loaded, cache=tmp_path / "odd")


def test_a_remote_run_is_refused_before_the_model_loads(tmp_path):
    with pytest.raises(CacheError, match="remote"):
        cm.run(PATCHING, engine="ndif", cache=tmp_path)


def test_writers_of_one_key_never_leave_a_half_entry(tmp_path):
    """Several writers storing one key while a reader reads it: the reader finds the entry whole or
    none, never a damaged one; the last rename wins, with the same bytes."""
    rows_ = [{"example_id": "0", "value": 0.5, "eligible": True}]
    entry = Entry((Scored("score", "iia", Result("iia", rows_), "iia.json"),),
                  {"iia.json": json.dumps(rows_).encode(), "acts.safetensors": b"x" * 100_000})
    parts = {"format": cache.FORMAT, "what": "a test"}
    key = cache.digest(parts)
    stores = [Store(tmp_path) for _ in range(4)]
    seen, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            got = stores[0].get(key, parts)
            seen.append(got is None or (got.files == entry.files and got.scored[0].result.rows == rows_))

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=lambda s=s: [s.put(key, parts, entry) for _ in range(20)]) for s in stores]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    reader.join()
    assert seen and all(seen)
    got = stores[1].get(key, parts)
    assert got is not None and got.files == entry.files
    assert stores[1].get(key, {**parts, "what": "other"}) is None  # other parts: a miss


# --- the command line ---------------------------------------------------------------------------

def test_cli_run_with_a_cache_says_which_points_were_served(tmp_path, capsys):
    common = ["run", str(LAYER_POS), "--engine", "hooks", "--cache", str(tmp_path / "cache"),
              "--models", str(MODELS), "--data", str(DATA)]
    assert cli.main([*common, "--out", str(tmp_path / "first")]) == 0
    first = capsys.readouterr()
    assert "cached:" not in first.err
    assert cli.main([*common, "--out", str(tmp_path / "second")]) == 0
    second = capsys.readouterr()
    names = [p.name for p in cm.read(LAYER_POS).points]
    assert f"cached: {len(names)} of {len(names)} points ({', '.join(names[:3])}, …)" in second.err
    assert second.out == first.out.replace(str(tmp_path / "first"), str(tmp_path / "second"))
    assert files(tmp_path / "first") == files(tmp_path / "second")


@pytest.mark.parametrize("planted", ["fifo entry", "endless blob"])
def test_a_special_file_in_the_cache_is_a_miss_not_a_hang(filled, planted):
    """A FIFO where an entry goes would block a read forever, and /dev/zero under a blob's name
    would never end: each is read as a regular file of bounded size, so each is a miss."""
    loaded, store = filled
    key = cache.keys(cm.read(PATCHING), loaded)["patching"]
    entry = Store(store).entry_path(key)
    parts = json.loads(entry.read_text())["parts"]
    if planted == "fifo entry":
        entry.unlink()
        os.mkfifo(entry)
    else:
        blob = store / "blobs" / json.loads(entry.read_text())["files"][0]["sha256"]
        blob.unlink()
        blob.symlink_to("/dev/zero")
    got = []
    reader = threading.Thread(target=lambda: got.append(Store(store).get(key, parts)), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive() and got == [None]

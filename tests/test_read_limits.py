"""What reading refuses, by name, before anything is expanded or compiled.

Documents and data rows that Python's ``json`` would accept but that fail later and far
away — nesting deep enough to exhaust the stack, integers past the interpreter's digit
limit, lone surrogates, files in another encoding — and sweeps too large to lower.
"""
from __future__ import annotations

import copy
import json

import pytest

from causalab_mini import data as data_mod
from causalab_mini.document import read as front
from causalab_mini.document.sweep import MAX_POINTS
from causalab_mini.errors import DataError, DocumentError, SweepError
from causalab_mini.jsontext import MAX_DEPTH
from causalab_mini.plan import compile as compiler
from paths import DATA, DOCUMENTS, MODELS, V2
from samples import patching_document

HOSTILE = {
    "deep": ("[" * 700 + "]" * 700).encode(),
    "latin-1": '{"header": {"description": "café"}}'.encode("latin-1"),
    "utf-16": "{}".encode("utf-16"),
    "big integer": ('{"a": ' + "9" * 5000 + "}").encode(),
    "lone surrogate": b'{"header": {"description": "\\ud800"}}',
    "surrogate key": b'{"\\udfff": 1}',
}
WHAT = {"deep": f"nested deeper than {MAX_DEPTH} levels", "latin-1": "not UTF-8", "utf-16": "not UTF-8",
        "big integer": "4300 digits", "lone surrogate": "lone surrogate", "surrogate key": "lone surrogate"}


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_document_is_refused_at_read(tmp_path, kind):
    path = tmp_path / "d.causalab.json"
    path.write_bytes(HOSTILE[kind])
    with pytest.raises(DocumentError, match=WHAT[kind]):
        front.read(path)


@pytest.mark.parametrize("kind", [k for k in HOSTILE if k not in ("utf-16",)])
def test_a_hostile_data_row_is_refused_at_read(tmp_path, kind):
    folder = tmp_path / "data" / "set"
    folder.mkdir(parents=True)
    good = json.dumps({"input": "x"}).encode()
    (folder / "train.jsonl").write_bytes(good + b"\n" + HOSTILE[kind].replace(b"\n", b" ") + b"\n")
    with pytest.raises(DataError, match=WHAT[kind]) as caught:
        data_mod.load("set/train", [tmp_path / "data"], path="steps.score.rows.base")
    assert str(caught.value).startswith("steps.score.rows.base:")


def test_the_cli_refuses_them_without_a_traceback(tmp_path):
    import subprocess

    from samples import cli_command

    path = tmp_path / "d.causalab.json"
    path.write_bytes(HOSTILE["deep"])
    done = subprocess.run([*cli_command(), "validate", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error: DocumentError:")
    assert "Traceback" not in done.stderr


def test_a_sweep_over_the_point_limit_is_refused_before_it_is_expanded():
    raw = patching_document()
    raw["interventions"]["patching"]["writes"]["patch"]["pos"] = {"sweep": {"range": [0, 2 ** 64]}}
    with pytest.raises(SweepError, match=f"over the limit of {MAX_POINTS} points"):
        front.points(raw)
    raw = patching_document()
    raw["sites"]["target"]["layers"] = [{"sweep": {"range": [0, 200]}}]
    raw["interventions"]["patching"]["writes"]["patch"]["pos"] = {"sweep": {"range": [-100, 0]}}
    with pytest.raises(SweepError, match=r"= 20000 points, over the limit") as caught:
        front.points(raw)
    assert "layers 200 x pos 100" in str(caught.value)
    raw["interventions"]["patching"]["writes"]["patch"]["pos"] = {"sweep": {"range": [-10, 0]}}
    assert len(front.points(raw)) == 2000  # under the limit: lowered


def _save(file_path):
    return lambda raw: raw["steps"]["score"].__setitem__("saves", [{"value": "iia", "file_path": file_path}])


def _pos(pos):
    return lambda raw: raw["interventions"]["patching"]["writes"]["patch"].__setitem__("pos", pos)


@pytest.mark.parametrize("edit, where, what", [
    (_save("a\0b.json"), "steps.score.saves.0.file_path", "NUL"),
    (_save("a" * 300 + ".json"), "steps.score.saves.0.file_path", "over 255 bytes"),
    (_save("run.json"), "steps.score.saves.0.file_path", "the run's own record"),
    (lambda r: r["model"].__setitem__("key", "m" * 300), "model.key", "over 255 bytes"),
    (lambda r: r["model"].__setitem__("key", "tiny\0llama"), "model.key", "NUL"),
    (lambda r: r["steps"]["score"]["rows"].__setitem__("base", "w" * 300 + "/train"),
     "steps.score.rows.base", "over 255 bytes"),
    (lambda r: r["steps"]["score"]["rows"].__setitem__("base", "week\0days/train"), "steps.score.rows.base", "NUL"),
    (lambda r: r["sites"]["target"].__setitem__("layers", [True]), "sites.target.layers.0", "expected an integer, not true"),
    (lambda r: r["sites"]["target"].__setitem__("layers", ["0"]), "sites.target.layers.0",
     'expected an integer, not "0"; write 0 without quotes'),
    (lambda r: r["sites"]["target"].__setitem__("units", [1.0]), "sites.target.units.0",
     "expected an integer, not 1.0; write 1"),
    (_pos({"index": -1, "scope": {"segment": 2}}), "interventions.patching.writes.patch.pos", "not 2"),
    (_pos({"index": -1, "scope": {"variable": []}}), "interventions.patching.writes.patch.pos", "not []"),
    (lambda r: r.__setitem__("featurizers", {"f": {"kind": "pca", "site": "target", "file_path": "/etc/passwd"}}),
     "featurizers.f.file_path", "not a .safetensors file"),
])
def test_names_and_types_are_refused_at_their_path_before_any_file_is_touched(edit, where, what):
    raw = patching_document()
    edit(raw)
    with pytest.raises(DocumentError) as caught:
        front.points(raw)
        compiler.compile_plan(raw, models=[], data=[])  # the dataset checks come with the compile
    assert str(caught.value).startswith(f"{where}:") and what in str(caught.value), str(caught.value)


def _das(edit):
    def apply(raw):
        fit = json.loads((V2 / "das.causalab.json").read_text())
        raw.clear()
        raw.update(fit)
        edit(raw)
    return apply


def _fit_step(raw):
    return next(s for s in raw["steps"].values() if s["kind"] == "fit")


@pytest.mark.parametrize("edit, what", [
    (_das(lambda r: _fit_step(r).__setitem__("params", [])), "lists none"),
    (_das(lambda r: _fit_step(r).__setitem__("epochs", 10 ** 9)), "less than or equal to 100000"),
    (_das(lambda r: _fit_step(r).__setitem__("seed", 2 ** 63)), "less than 9223372036854775808"),
    (_das(lambda r: _fit_step(r).__setitem__("seed", -1)), "greater than or equal to 0"),
])
def test_a_fit_that_cannot_train_or_would_not_end_is_refused_before_it_is_compiled(edit, what):
    raw = patching_document()
    edit(raw)
    with pytest.raises(DocumentError, match=what):
        front.points(raw)


def _expect(threshold):
    return lambda r: r["header"].__setitem__("expect", [{"result": "iia", "mean": threshold}])


@pytest.mark.parametrize("edit, where, what", [
    # pydantic's lax mode would take each of these; the project's types are JSON's, strictly.
    (_das(lambda r: _fit_step(r).__setitem__("lr", "0.01")), "steps.fit.lr",
     'expected a number, not "0.01"; write 0.01 without quotes'),
    (_das(lambda r: _fit_step(r).__setitem__("epochs", "3")), "steps.fit.epochs",
     'expected an integer, not "3"; write 3 without quotes'),
    (_das(lambda r: _fit_step(r).__setitem__("batch_size", True)), "steps.fit.batch_size",
     "expected an integer, not true; write an integer"),
    (_das(lambda r: _fit_step(r).__setitem__("seed", 7.0)), "steps.fit.seed", "expected an integer, not 7.0; write 7"),
    (_das(lambda r: _fit_step(r).__setitem__("objective", [["1.0", "ce"]])), "steps.fit.objective.0.0",
     'expected a number, not "1.0"'),
    (_das(lambda r: _fit_step(r).__setitem__("objective", [[1.0, 5]])), "steps.fit.objective.0.1",
     "expected a string, not 5"),
    (_das(lambda r: r["featurizers"]["rot"].__setitem__("k", "4")), "featurizers.rot.k", 'expected an integer, not "4"'),
    (lambda r: r["model"].__setitem__("key", 7), "model.key", "expected a string, not 7"),
    (lambda r: r["steps"]["score"]["saves"][0].__setitem__("file_path", ["iia.json"]),
     "steps.score.saves.0.file_path", "expected a string, not an array"),
    (_expect({"between": ["0", "1"]}), "header.expect.0.mean.between.0", 'expected a number, not "0"'),
    (_expect({">": True}), "header.expect.0.mean.>", "a threshold is a number, not a boolean"),
    (_expect("0.5"), "header.expect.0.mean", "a threshold is a number or one comparison"),
])
def test_quoted_numbers_and_booleans_are_refused_where_a_number_goes(edit, where, what):
    raw = patching_document()
    edit(raw)
    with pytest.raises(DocumentError) as caught:
        front.points(raw)
    assert str(caught.value).startswith(f"{where}: {what}"), str(caught.value)


def test_strictness_keeps_what_json_means():
    """An integer is a number (lr 1), and a pair or a range is a JSON array."""
    raw = patching_document()
    _das(lambda r: _fit_step(r).update(lr=1, objective=[[1, "ce"]]))(raw)
    raw["header"]["expect"] = [{"result": "iia", "mean": {"between": [0, 1]}}]
    (point,) = front.points(raw)
    assert point.spec.steps["fit"].lr == 1.0 and point.spec.steps["fit"].objective == [(1.0, "ce")]


def test_a_protocol_document_is_as_strict():
    raw = json.loads((DOCUMENTS / "protocol" / "pos_sweep.causalab.json").read_text())
    raw["method"]["decode"] = "3"
    with pytest.raises(DocumentError) as caught:
        front.points(raw)
    assert str(caught.value).startswith('method.decode: expected an integer, not "3"; write 3 without quotes')


@pytest.mark.parametrize("answer, what", [([" Friday"], "an array"), ({"text": " Friday"}, "an object"),
                                          (True, "a boolean")])
def test_an_answer_that_is_not_text_is_refused_naming_the_row(tmp_path, answer, what):
    """``str`` would score a list as the text "[' Friday']"; a number is an answer's digits."""
    rows = [json.loads(line) for line in
            (DATA / "weekdays" / "train.jsonl").read_text().splitlines()]
    rows[2]["cf_answer"] = answer
    folder = tmp_path / "data" / "weekdays"
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from causalab_mini.errors import DataError

    with pytest.raises(DataError) as caught:
        compiler.compile_plan(patching_document(), models=[MODELS], data=[tmp_path / "data"])
    assert str(caught.value).startswith("interventions.patching.metrics.iia.expected: weekdays/train row 2: "
                                        f"column 'cf_answer' holds {what}, not an answer's text"), str(caught.value)


@pytest.mark.parametrize("content", [b"\xff" * 8 + b"garbage", b"\x80\x04\x95" + b"pickle" * 10,
                                     (2).to_bytes(8, "little") + b"[]"])
def test_a_featurizer_file_that_is_not_safetensors_is_refused_by_name(tmp_path, content):
    """A renamed pickle or garbage under a .safetensors name: refused, its declared length never allocated."""
    from causalab_mini.errors import CompileError

    raw = json.loads((V2 / "das_apply.causalab.json").read_text())
    feat = next(iter(raw["featurizers"]))
    (tmp_path / "fake.safetensors").write_bytes(content)
    raw["featurizers"][feat]["file_path"] = "fake.safetensors"
    with pytest.raises(CompileError, match="is not a safetensors file") as caught:
        compiler.compile_plan(raw, document=tmp_path / "d.causalab.json", models=[MODELS],
                              data=[DATA])
    assert str(caught.value).startswith(f"featurizers.{feat}.file_path:")


def test_two_steps_saving_one_file_are_refused_at_validation():
    raw = patching_document()
    raw["steps"]["again"] = copy.deepcopy(raw["steps"]["score"])
    with pytest.raises(DocumentError) as caught:
        front.points(raw)
    assert str(caught.value).startswith("steps.again.saves.0.file_path:") and "steps.score.saves.0" in str(caught.value)
    raw = patching_document()
    raw["steps"]["score"]["saves"] = [{"value": "iia", "file_path": "a.json"},
                                      {"value": "logit_diff", "file_path": "a.json/b.json"}]
    with pytest.raises(DocumentError, match="needs a folder 'a.json'"):
        front.points(raw)


def test_a_prompt_longer_than_the_model_was_built_for_is_refused_naming_the_row(tmp_path):
    """tiny-gpt2 has a 128-row position table: a longer prompt would index past it mid-forward."""
    from causalab_mini.errors import CompileError

    limit = json.loads((MODELS / "tiny-gpt2" / "config.json").read_text())["n_positions"]
    rows = [json.loads(line) for line in
            (DATA / "weekdays" / "train.jsonl").read_text().splitlines()]
    rows[1]["input"] = "Monday, " * limit + rows[1]["input"]
    folder = tmp_path / "data" / "weekdays"
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = patching_document()
    raw["model"]["key"] = "tiny-gpt2"
    with pytest.raises(CompileError) as caught:
        compiler.compile_plan(raw, models=[MODELS], data=[tmp_path / "data"])
    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(MODELS / "tiny-gpt2")(rows[1]["input"])["input_ids"])
    assert n > limit
    assert str(caught.value) == (f"roles.base.field: weekdays/train row 1 is {n} tokens, over the {limit} positions "
                                 "tiny-gpt2 was built for; shorten the prompts, or use a model with a longer context")


def test_a_split_over_the_row_or_size_limit_is_refused_before_its_rows_are_parsed(tmp_path):
    folder = tmp_path / "data" / "set"
    folder.mkdir(parents=True)
    line = json.dumps({"input": "x"}) + "\n"
    (folder / "train.jsonl").write_text(line * (data_mod.MAX_ROWS + 1))
    with pytest.raises(DataError) as caught:
        data_mod.load("set/train", [tmp_path / "data"], path="steps.score.rows.base")
    assert f"has more than {data_mod.MAX_ROWS:,} rows, the most a split may hold" in str(caught.value)
    (folder / "train.jsonl").write_text(line * data_mod.MAX_ROWS)  # at the limit: read
    assert len(data_mod.load("set/train", [tmp_path / "data"])) == data_mod.MAX_ROWS
    # the byte bound is checked on the file's size, before it is read: a sparse file of one byte more
    data_mod.clear_cache()
    with open(folder / "train.jsonl", "wb") as fh:
        fh.truncate(data_mod.MAX_BYTES + 1)
    with pytest.raises(DataError, match=f"over the {data_mod.MAX_BYTES >> 20} MiB a split may hold"):
        data_mod.load("set/train", [tmp_path / "data"])


def test_a_row_over_the_line_limit_is_refused_before_it_is_parsed(tmp_path):
    """One row is one example: a megabyte of it would be tokenized whole (some 80 times its size
    in Python objects) before any prompt-length check; refused at read, naming the line."""
    folder = tmp_path / "data" / "set"
    folder.mkdir(parents=True)
    head = json.dumps({"input": "x"}) + "\n"
    text = "\u00e9" * ((data_mod.MAX_LINE_BYTES - 13) // 2) + "x"  # 13: the bytes of {"input": ""}
    at_limit = json.dumps({"input": text}, ensure_ascii=False)
    assert len(at_limit.encode()) == data_mod.MAX_LINE_BYTES  # bytes are counted, not characters
    (folder / "train.jsonl").write_text(head + at_limit + "\n", encoding="utf-8")
    assert len(data_mod.load("set/train", [tmp_path / "data"])) == 2
    data_mod.clear_cache()
    over = json.dumps({"input": text + "x"}, ensure_ascii=False)
    (folder / "train.jsonl").write_text(head + over + "\n", encoding="utf-8")
    with pytest.raises(DataError) as caught:
        data_mod.load("set/train", [tmp_path / "data"], path="steps.score.rows.base")
    assert str(caught.value) == (f"steps.score.rows.base: {folder / 'train.jsonl'}:2: row 1 is 1,048,577 bytes, "
                                 "over the 1 MiB a row may hold; keep a row to one example: its prompts and "
                                 "answers, not a corpus of text")

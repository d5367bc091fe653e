"""causalab_mini.data: datasets, field paths, the variable-anchor rule, roots, caching, refusals."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from causalab_mini import data
from causalab_mini.data import (
    Dataset,
    available,
    check_variable,
    column_values,
    data_roots,
    describe,
    describe_json,
    find_data_root,
    format_field,
    get_field,
    load,
    parse_field,
    variable_text,
    variables_field,
)
from causalab_mini.errors import CausalabError, DataError

ROW0 = {
    "answer": " Friday",
    "base_answer": " Friday",
    "cf_answer": " Sunday",
    "counterfactual_inputs": ["If today is Saturday, tomorrow is"],
    "counterfactual_inputs_variables": [{"entity": "Saturday"}],
    "entity": "Thursday",
    "input": "If today is Thursday, tomorrow is",
    "label": " Sunday",
    "split": "all",
}


def _row(base: str, cf: str, nxt: dict) -> dict:
    return {
        "answer": nxt[base], "base_answer": nxt[base], "cf_answer": nxt[cf],
        "counterfactual_inputs": [f"If today is {cf}, tomorrow is"],
        "counterfactual_inputs_variables": [{"entity": cf}],
        "entity": base, "input": f"If today is {base}, tomorrow is",
        "label": nxt[cf], "split": "all",
    }


NEXT = {"Thursday": " Friday", "Friday": " Saturday", "Saturday": " Sunday",
        "Sunday": " Monday", "Monday": " Tuesday"}
WEEKDAYS = [ROW0, _row("Friday", "Sunday", NEXT), _row("Saturday", "Monday", NEXT),
            _row("Sunday", "Thursday", NEXT)]
COLUMNS = ("answer", "base_answer", "cf_answer", "counterfactual_inputs",
           "counterfactual_inputs_variables", "entity", "input", "label", "split")


def write_jsonl(root: Path, ref: str, rows, *, raw: str | None = None) -> Path:
    name, split = ref.split("/")
    path = root / name / f"{split}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = raw if raw is not None else "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _isolate(monkeypatch, tmp_path):
    """No test sees the repository's documents/data, the caller's $CAUSALAB_DATA, or another test's cache."""
    monkeypatch.delenv(data.ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    data.clear_cache()
    yield
    data.clear_cache()


@pytest.fixture
def root(tmp_path) -> Path:
    r = tmp_path / "data"
    write_jsonl(r, "weekdays/train", WEEKDAYS)
    return r


@pytest.fixture
def ds(root) -> Dataset:
    return load("weekdays/train", [root])


def refused(fn, *args, **kwargs) -> DataError:
    with pytest.raises(DataError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, CausalabError)
    return info.value


# --------------------------------------------------------------------------- loading


def test_load_weekdays(ds, root):
    assert ds.ref == "weekdays/train"
    assert ds.name == "weekdays" and ds.split == "train"
    assert ds.path == root / "weekdays" / "train.jsonl"
    assert len(ds.rows) == len(ds) == 4
    assert ds.rows[0] == ROW0
    assert ds.columns == COLUMNS
    assert "4 rows" in repr(ds) and "Thursday" not in repr(ds)


def test_columns_are_the_union_of_keys(tmp_path):
    write_jsonl(tmp_path, "u/test", [{"b": 1}, {"a": 2, "c": 3}])
    assert load("u/test", [tmp_path]).columns == ("a", "b", "c")


def test_blank_lines_are_skipped(tmp_path):
    write_jsonl(tmp_path, "b/train", None, raw='{"a": 1}\n\n   \n{"a": 2}')
    assert [r["a"] for r in load("b/train", [tmp_path]).rows] == [1, 2]


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85"])
def test_a_string_holding_a_character_splitlines_cuts_at_is_one_row(tmp_path, char):
    """JSON lets a string hold these line breaks of Unicode's as themselves (json.dumps with
    ensure_ascii=False writes them so; it escapes the ASCII ones), and JSON Lines ends a row at
    "\n" only: the row is read as written, not cut in two and refused as broken JSON."""
    rows = [{"input": f"If today is{char} Thursday", "n": 1}, {"input": "x", char: char}]
    write_jsonl(tmp_path, "sep/train", None, raw="".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows))
    assert load("sep/train", [tmp_path]).rows == tuple(rows)


def test_first_root_with_the_file_wins(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    write_jsonl(first, "d/train", [{"who": "one"}])
    write_jsonl(second, "d/train", [{"who": "two"}])
    write_jsonl(second, "only/train", [{"who": "two"}])
    assert load("d/train", [first, second]).rows[0]["who"] == "one"
    assert load("d/train", [second, first]).rows[0]["who"] == "two"
    assert load("only/train", [first, second]).rows[0]["who"] == "two"
    # an os.pathsep-joined string is accepted as the roots too
    assert load("d/train", f"{second}{os.pathsep}{first}").rows[0]["who"] == "two"


def test_available(tmp_path, root):
    write_jsonl(root, "weekdays_full/test", [{"a": 1}])
    write_jsonl(root, "weekdays_full/train", [{"a": 1}])
    (root / "weekdays" / "notes.txt").write_text("not a split")
    other = tmp_path / "other"
    write_jsonl(other, "weekdays/train", [{"a": 1}])  # duplicated across roots: listed once
    write_jsonl(other, "arith/all", [{"a": 1}])
    assert available([root, other, tmp_path / "nowhere"]) == [
        "arith/all", "weekdays/train", "weekdays_full/test", "weekdays_full/train"]
    assert available([]) == []


# --------------------------------------------------------------------------- caching


def test_cache_returns_the_same_object_for_an_unchanged_file(root):
    a = load("weekdays/train", [root])
    b = load("weekdays/train", [root])
    assert a is b


def test_cache_reads_a_sweep_once(root, monkeypatch):
    calls = []
    real = data._parse
    monkeypatch.setattr(data, "_parse", lambda f, p: calls.append(f) or real(f, p))
    for _ in range(32):
        load("weekdays/train", [root], path="data.base")
    assert len(calls) == 1


def test_cache_reloads_after_modification(root):
    a = load("weekdays/train", [root])
    path = write_jsonl(root, "weekdays/train", WEEKDAYS[:2])
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # coarse clocks
    b = load("weekdays/train", [root])
    assert b is not a
    assert len(b.rows) == 2 and len(a.rows) == 4
    assert load("weekdays/train", [root]) is b


def test_cache_reloads_after_same_size_rewrite(root):
    """A same-size edit with a different mtime is read again (the stamp is mtime, size and inode)."""
    path = write_jsonl(root, "s/train", [{"v": "a"}])
    a = load("s/train", [root])
    write_jsonl(root, "s/train", [{"v": "b"}])
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert load("s/train", [root]).rows[0]["v"] == "b" and a.rows[0]["v"] == "a"


# --------------------------------------------------------------------------- refusals while loading


@pytest.mark.parametrize("ref", ["weekdays", "weekdays/train/x", "/train", "weekdays/", "",
                                 "../weekdays", "weekdays/..", "week days/train", 3, None])
def test_refuses_a_ref_not_of_the_form_name_split(ref, root):
    err = refused(load, ref, [root], path="data.base")
    assert err.path == "data.base"
    assert "name/split" in str(err)


def test_ref_without_split_suggests_one(root):
    err = refused(load, "weekdays", [root])
    assert '"weekdays/train"' in err.fix


def test_ref_naming_a_file_is_refused_with_the_ref_to_write(root):
    err = refused(load, "weekdays/train.jsonl", [root], path="data.base")
    assert err.fix.endswith('"weekdays/train"')


def test_not_found_names_roots_and_lists_available(tmp_path, root):
    write_jsonl(root, "arith/all", [{"a": 1}])
    missing = tmp_path / "nowhere"
    err = refused(load, "nope/train", [missing, root], path="data.base")
    assert err.path == "data.base"
    assert str(root) in err.problem and f"{missing} (missing)" in err.problem
    assert "nope/train.jsonl" in err.problem
    assert err.fix == "datasets here: arith/all, weekdays/train"


def test_not_found_split_lists_that_datasets_splits(root):
    write_jsonl(root, "weekdays/test", [{"a": 1}])
    err = refused(load, "weekdays/validation", [root])
    assert err.fix == 'weekdays has split(s): test, train; write e.g. "weekdays/test"'


def test_not_found_in_roots_without_datasets(tmp_path):
    err = refused(load, "weekdays/train", [tmp_path / "empty"])
    assert "--data" in err.fix and data.ENV_VAR in err.fix


def test_no_data_root_at_all():
    err = refused(load, "weekdays/train", [], path="data.base")
    assert err.path == "data.base"
    assert "no data root" in err.problem
    assert "--data" in err.fix and "CAUSALAB_DATA" in err.fix


def test_malformed_line_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path, "bad/train", None, raw='{"a": 1}\n{"a": 2}\n{"a": \n')
    err = refused(load, "bad/train", [tmp_path], path="data.base")
    assert f"{path}:3:" in err.problem and "not valid JSON" in err.problem
    assert "JSON Lines" in err.fix


def test_row_not_an_object(tmp_path):
    path = write_jsonl(tmp_path, "bad/train", None, raw='{"a": 1}\n\n["a", 2]\n')
    err = refused(load, "bad/train", [tmp_path])
    assert f"{path}:3:" in err.problem and "array, not an object" in err.problem


@pytest.mark.parametrize("raw", ["", "\n\n  \n"])
def test_empty_file(tmp_path, raw):
    path = write_jsonl(tmp_path, "empty/train", None, raw=raw)
    err = refused(load, "empty/train", [tmp_path])
    assert str(path) in err.problem and "empty" in err.problem


def test_not_utf8(tmp_path):
    path = tmp_path / "latin" / "train.jsonl"
    path.parent.mkdir()
    path.write_bytes('{"a": "caf\u00e9"}\n'.encode("latin-1"))
    err = refused(load, "latin/train", [tmp_path])
    assert "UTF-8" in err.problem


def test_a_bad_file_is_not_cached(tmp_path):
    path = write_jsonl(tmp_path, "fix/train", None, raw="{")
    refused(load, "fix/train", [tmp_path])
    write_jsonl(tmp_path, "fix/train", [{"a": 1}])
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert load("fix/train", [tmp_path]).rows == ({"a": 1},)


# --------------------------------------------------------------------------- roots


def test_find_data_root_walks_up_from_a_file(tmp_path, root):
    doc = tmp_path / "documents" / "v2" / "entity_patch.json"
    doc.parent.mkdir(parents=True)
    doc.write_text("{}")
    assert find_data_root(doc) == root.resolve()
    assert find_data_root(doc.parent) == root.resolve()
    assert find_data_root(tmp_path) == root.resolve()


def test_find_data_root_finds_documents_data(tmp_path):
    repo = tmp_path / "repo"
    shipped = repo / "documents" / "data"
    write_jsonl(shipped, "weekdays/train", WEEKDAYS)
    (repo / "src" / "pkg").mkdir(parents=True)
    assert find_data_root(repo) == shipped.resolve()  # running from the repository root
    assert find_data_root(repo / "src" / "pkg") == shipped.resolve()
    doc = repo / "documents" / "v2" / "x.causalab.json"  # need not exist
    assert find_data_root(doc) == shipped.resolve()


def test_find_data_root_nearest_wins_and_data_before_documents_data(tmp_path):
    outer = tmp_path / "outer"
    write_jsonl(outer / "data", "a/train", [{"a": 1}])
    inner = outer / "project"
    write_jsonl(inner / "documents" / "data", "b/train", [{"b": 1}])
    assert find_data_root(inner) == (inner / "documents" / "data").resolve()
    write_jsonl(inner / "data", "c/train", [{"c": 1}])
    assert find_data_root(inner) == (inner / "data").resolve()


def test_find_data_root_ignores_a_data_dir_without_datasets(tmp_path):
    (tmp_path / "a" / "data" / "empty").mkdir(parents=True)
    (tmp_path / "a" / "data" / "loose.jsonl").write_text('{"a": 1}\n')  # not <name>/<split>.jsonl
    assert find_data_root(tmp_path / "a") is None
    write_jsonl(tmp_path / "data", "x/train", [{"x": 1}])
    assert find_data_root(tmp_path / "a") == (tmp_path / "data").resolve()
    assert find_data_root(None) is None


def test_data_roots_order_explicit_env_then_discovered(tmp_path, monkeypatch):
    discovered = tmp_path / "proj" / "data"
    write_jsonl(discovered, "d/train", [{"who": "discovered"}])
    doc = tmp_path / "proj" / "doc.causalab.json"
    e1, e2, x1, x2 = (tmp_path / n for n in ("e1", "e2", "x1", "x2"))
    monkeypatch.setenv(data.ENV_VAR, f"{e1}{os.pathsep}{e2}")
    assert data_roots(f"{x1}{os.pathsep}{x2}", doc) == [x1, x2, e1, e2, discovered.resolve()]
    assert data_roots([x1, str(x2)], doc) == [x1, x2, e1, e2, discovered.resolve()]
    assert data_roots(None, doc) == [e1, e2, discovered.resolve()]
    monkeypatch.delenv(data.ENV_VAR)
    assert data_roots(None, doc) == [discovered.resolve()]
    assert data_roots(None, tmp_path / "elsewhere" / "doc.json") == []


def test_data_roots_precedence_decides_which_file_loads(tmp_path, monkeypatch):
    discovered = tmp_path / "proj" / "data"
    env = tmp_path / "env"
    explicit = tmp_path / "explicit"
    for r in (discovered, env, explicit):
        write_jsonl(r, "d/train", [{"who": r.name}])
    doc = tmp_path / "proj" / "doc.causalab.json"
    assert load("d/train", data_roots(None, doc)).rows[0]["who"] == "data"
    monkeypatch.setenv(data.ENV_VAR, str(env))
    assert load("d/train", data_roots(None, doc)).rows[0]["who"] == "env"
    assert load("d/train", data_roots(str(explicit), doc)).rows[0]["who"] == "explicit"
    # a root earlier in the order that lacks the dataset falls through to later ones
    write_jsonl(explicit, "other/train", [{"who": "x"}])
    (explicit / "d" / "train.jsonl").unlink()
    assert load("d/train", data_roots(str(explicit), doc)).rows[0]["who"] == "env"


def test_data_roots_without_a_document_walks_up_from_cwd(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    write_jsonl(repo / "documents" / "data", "weekdays/train", WEEKDAYS)
    monkeypatch.chdir(repo)
    assert data_roots(None, None) == [(repo / "documents" / "data").resolve()]
    assert load("weekdays/train", data_roots(None, None)).rows[0] == ROW0


def test_data_roots_deduplicates(tmp_path, monkeypatch):
    r = tmp_path / "data"
    write_jsonl(r, "d/train", [{"a": 1}])
    monkeypatch.setenv(data.ENV_VAR, str(r))
    assert data_roots([r, str(r)], tmp_path) == [r]


# --------------------------------------------------------------------------- field paths


@pytest.mark.parametrize("field, parts", [
    ("input", ("input",)),
    ("counterfactual_inputs[0]", ("counterfactual_inputs", 0)),
    ("counterfactual_inputs[12]", ("counterfactual_inputs", 12)),
    ("a.b[1].c", ("a", "b", 1, "c")),
    ("a[0][1]", ("a", 0, 1)),
    ("base-answer", ("base-answer",)),
])
def test_parse_field(field, parts):
    assert parse_field(field) == parts
    assert format_field(parts) == field


@pytest.mark.parametrize("field", ["", "a[", "[0]", "a..b", "a.", ".a", "a]", "a[x]", "a[-1]",
                                   "a[0]b", "a b", "a[ 0]", "a.[0]"])
def test_parse_field_refuses_malformed(field):
    err = refused(parse_field, field, path="roles.base.field")
    assert err.path == "roles.base.field"
    assert "counterfactual_inputs[0]" in err.fix


def test_parse_field_refuses_non_strings():
    refused(parse_field, 3)
    refused(parse_field, None)


def test_get_field(ds):
    row = ds.rows[0]
    assert get_field(row, "input") == "If today is Thursday, tomorrow is"
    assert get_field(row, "counterfactual_inputs[0]") == "If today is Saturday, tomorrow is"
    assert get_field(row, "counterfactual_inputs_variables[0].entity") == "Saturday"
    assert get_field(row, "counterfactual_inputs") == ["If today is Saturday, tomorrow is"]


def test_get_field_returns_chat_messages_as_they_are():
    chat = [{"role": "user", "content": "Name a weekday."},
            {"role": "assistant", "content": "Thursday."},
            {"role": "user", "content": "If today is Thursday, tomorrow is"}]
    row = {"chat": chat, "cf": [chat]}
    assert get_field(row, "chat") is chat
    assert get_field(row, "cf[0]") is chat
    assert get_field(row, "chat[2].content") == "If today is Thursday, tomorrow is"


def test_get_field_missing_column_names_field_row_and_columns(ds):
    err = refused(get_field, ds.rows[0], "inputt", path="roles.base.field", row_index=3)
    assert err.path == "roles.base.field"
    assert "row 3" in err.problem and "'inputt'" in err.problem
    assert "columns: answer, base_answer" in err.problem
    assert "'input'" in err.fix  # did you mean


def test_get_field_index_out_of_range(ds):
    err = refused(get_field, ds.rows[0], "counterfactual_inputs[1]", row_index=0)
    assert "row 0" in err.problem and "counterfactual_inputs[1]" in err.problem
    assert "1 item(s)" in err.problem


def test_get_field_wrong_shapes(ds):
    row = ds.rows[0]
    err = refused(get_field, row, "input[0]")
    assert "the row" in err.problem and "string, not a list" in err.problem
    err = refused(get_field, row, "counterfactual_inputs.x")
    assert "array, not an object" in err.problem
    err = refused(get_field, row, "counterfactual_inputs_variables[0].entiy")
    assert "keys: entity" in err.problem
    refused(get_field, {"a": []}, "a[0]")


def test_get_field_refuses_a_malformed_field(ds):
    refused(get_field, ds.rows[0], "a[", path="p")


# --------------------------------------------------------------------------- the variable rule


@pytest.mark.parametrize("field, sibling", [
    ("input", "input_variables"),
    ("counterfactual_inputs[0]", "counterfactual_inputs_variables[0]"),
    ("a.b[1]", "a.b_variables[1]"),
    ("a.b[1].c", "a.b[1].c_variables"),
    ("chat", "chat_variables"),
])
def test_variables_field(field, sibling):
    assert variables_field(field) == sibling


def test_variable_text_sibling_then_column(ds):
    row = ds.rows[0]
    assert variable_text(row, "input", "entity") == "Thursday"  # no input_variables: the column
    assert variable_text(row, "counterfactual_inputs[0]", "entity") == "Saturday"  # the sibling
    assert [variable_text(r, "counterfactual_inputs[0]", "entity") for r in ds.rows] == [
        "Saturday", "Sunday", "Monday", "Thursday"]
    assert [variable_text(r, "input", "entity") for r in ds.rows] == [
        "Thursday", "Friday", "Saturday", "Sunday"]


def test_variable_text_sibling_wins_over_column():
    row = {"input": "x", "input_variables": {"entity": "Sib"}, "entity": "Col"}
    assert variable_text(row, "input", "entity") == "Sib"
    # a sibling that lacks the name falls through to the column
    assert variable_text({**row, "input_variables": {"other": 1}}, "input", "entity") == "Col"
    # a sibling index past the end falls through too
    row = {"cf": ["a", "b"], "cf_variables": [{"entity": "A"}], "entity": "Col"}
    assert variable_text(row, "cf[0]", "entity") == "A"
    assert variable_text(row, "cf[1]", "entity") == "Col"


def test_variable_text_null_and_absent_and_numbers():
    assert variable_text({"input": "x", "entity": None}, "input", "entity") is None
    assert variable_text({"input": "x", "input_variables": {"entity": None}, "entity": "C"},
                         "input", "entity") is None  # a present sibling key decides, even null
    assert variable_text({"input": "x"}, "input", "entity") is None  # absent on this row
    assert variable_text({"input": "x", "n": 3}, "input", "n") == "3"


@pytest.mark.parametrize("value", [["a"], {"a": 1}, True])
def test_variable_text_refuses_non_text(value):
    err = refused(variable_text, {"input": "x", "entity": value}, "input", "entity",
                  path="roles.base", row_index=2)
    assert err.path == "roles.base" and "row 2" in err.problem


def test_check_variable_accepts_both_places(ds):
    check_variable(ds, "input", "entity")
    check_variable(ds, "counterfactual_inputs[0]", "entity")
    check_variable(ds, "counterfactual_inputs[0]", "label")  # a column works for any field


def test_check_variable_refuses_a_misspelling_naming_both_places(ds):
    err = refused(check_variable, ds, "counterfactual_inputs[0]", "entiy",
                  path="interventions.patching.writes.patch.pos.scope.variable")
    assert err.path == "interventions.patching.writes.patch.pos.scope.variable"
    assert err.problem.startswith(
        "variable 'entiy' is neither in counterfactual_inputs_variables[0] (keys there: entity) "
        "nor a column of weekdays/train (columns: answer, base_answer, cf_answer,")
    assert "did you mean 'entity'?" in err.fix
    err = refused(check_variable, ds, "input", "entiy")
    assert "neither in input_variables (no row has one) nor a column of weekdays/train" in err.problem


def test_check_variable_is_satisfied_by_any_row(tmp_path):
    write_jsonl(tmp_path, "r/train", [{"input": "a"}, {"input": "b", "entity": "b"}])
    ds = load("r/train", [tmp_path])
    check_variable(ds, "input", "entity")
    assert variable_text(ds.rows[0], "input", "entity") is None


def test_check_variable_refuses_non_text_values(tmp_path):
    write_jsonl(tmp_path, "r/train", [{"input": "a", "entity": "a"}, {"input": "b", "entity": [1]}])
    err = refused(check_variable, load("r/train", [tmp_path]), "input", "entity", path="p")
    assert "row 1" in err.problem


def test_check_variable_refuses_a_malformed_field(ds):
    refused(check_variable, ds, "a..b", "entity")


# --------------------------------------------------------------------------- columns and ids


def test_column_values_with_nulls(tmp_path):
    write_jsonl(tmp_path, "n/train", [{"answer": " Friday"}, {"answer": None}, {"other": 1}])
    ds = load("n/train", [tmp_path])
    assert column_values(ds, "answer") == (" Friday", None, None)


def test_column_values_refuses_an_unknown_column(ds):
    assert column_values(ds, "label") == (" Sunday", " Monday", " Tuesday", " Friday")
    err = refused(column_values, ds, "lable", path="metrics.iia.column")
    assert err.path == "metrics.iia.column"
    assert "weekdays/train has no column 'lable'" in err.problem
    assert "columns: answer, base_answer" in err.problem
    assert "'label'" in err.fix


def test_example_ids_positional_by_default(ds):
    assert ds.example_ids() == ("0", "1", "2", "3")


def test_example_ids_from_the_column(tmp_path):
    write_jsonl(tmp_path, "e/train", [{"example_id": "Thursday"}, {"example_id": 7}])
    assert load("e/train", [tmp_path]).example_ids() == ("Thursday", "7")


def test_example_ids_fall_back_when_a_row_lacks_one(tmp_path):
    write_jsonl(tmp_path, "e/train", [{"example_id": "a"}, {"x": 1}, {"example_id": None}])
    assert load("e/train", [tmp_path]).example_ids() == ("0", "1", "2")


def test_example_ids_refuse_duplicates(tmp_path):
    write_jsonl(tmp_path, "e/train", [{"example_id": "a"}, {"example_id": "b"},
                                      {"example_id": "a"}, {"example_id": 1}, {"example_id": "1"}])
    err = refused(load("e/train", [tmp_path]).example_ids, path="data.base")
    assert err.path == "data.base"
    assert "'a' on rows 0, 2" in err.problem and "'1' on rows 3, 4" in err.problem


# --------------------------------------------------------------------------- describe


def test_describe(ds):
    assert describe(ds) == "\n".join([
        "weekdays/train: 4 rows",
        "  columns: answer, base_answer, cf_answer, counterfactual_inputs, "
        "counterfactual_inputs_variables, entity, input, label, split",
        "  splits:  all",
        '  sample:  {"answer": " Friday", "base_answer": " Friday", "cf_answer": " Sunday", '
        '"counterfactual_inputs": ["If today is Saturday, tomorrow is"], '
        '"counterfactual_inputs_variables": [{"entity": "Saturday"}], "entity": "Thursday", '
        '"input": "If today is Thursday, tomorrow is", "label": " Sunday", "split": "all"}',
    ])


def test_describe_without_a_split_column_and_non_ascii(tmp_path):
    write_jsonl(tmp_path, "x/test", [{"w": "caf\u00e9"}])
    text = describe(load("x/test", [tmp_path]))
    assert text.splitlines()[0] == "x/test: 1 row"
    assert "  splits:  -" in text and '{"w": "caf\u00e9"}' in text


def test_describe_several_splits(tmp_path):
    write_jsonl(tmp_path, "x/all", [{"split": "train"}, {"split": "test"}, {"split": "train"},
                                    {"split": None}])
    assert "  splits:  test, train" in describe(load("x/all", [tmp_path]))


def test_describe_json(ds):
    out = describe_json(ds)
    assert out == {"ref": "weekdays/train", "rows": 4, "columns": list(COLUMNS),
                   "splits": ["all"], "sample": ROW0}
    json.dumps(out)


def test_import_is_stdlib_only():
    import subprocess
    import sys

    code = ("import sys, causalab_mini.data; "
            "bad = [m for m in ('torch', 'pydantic', 'transformers', 'numpy') if m in sys.modules]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""

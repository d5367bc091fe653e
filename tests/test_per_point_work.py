"""What a sweep does once rather than once per point, held to what doing it per point gives.

A sweep's points read the same prompts, answers and cuts and run on one tokenizer, so the
compile, the walk and the writer ask for each of those once (issue 29: a sweep's own Python work,
not its forwards, was most of its cost over a hand-written loop). Each shortcut is held here to
the long way: the rows a tokenizer encodes together are each row's own encoding, the answers
likewise, a kept cut is the cut, a walk asks its tokenizer for its prefix once however many points
it has, and a folder's files are the same whether its point folders move into place whole (a
first run) or file by file (a rerun). No timing is asserted.
"""
from __future__ import annotations

import pytest

import causalab_mini as cm
from causalab_mini.errors import CompileError, PlanError
from causalab_mini.ops import locate
from causalab_mini.outputs import write as write_mod
from causalab_mini.plan.tokens import answer_tokens, answers_tokens
from causalab_mini.shapes import Where
from paths import DATA, MODELS
from samples import patching_document

transformers = pytest.importorskip("transformers")

FAMILIES = ("tiny-llama", "tiny-gpt2", "tiny-gemma2")
TEXTS = ["", " ", "a", "If today is Thursday, tomorrow is", "  leading", "trailing  ", "ünïcödé ☃ 日本語",
         "\n\nnew\nlines\t", "<s> special </s>", "<|endoftext|>", "x" * 300]
ANSWERS = ["Friday", " Friday", "", "  ", "日本", "<s>", 7, 3.5, "Monday", "Friday"]


@pytest.fixture(scope="module", params=FAMILIES)
def tok(request):
    return transformers.AutoTokenizer.from_pretrained(str(MODELS / request.param))


def test_rows_encoded_together_are_each_rows_own_encoding(tok):
    ids, mask = locate.encode_rows(tok, TEXTS)
    alone = [list(tok(t)["input_ids"]) for t in TEXTS]
    width = max(map(len, alone))
    assert [list(row[width - len(a):]) for row, a in zip(ids, alone)] == alone
    assert [sum(m) for m in mask] == [len(a) for a in alone]
    assert all(set(row[:width - len(a)]) <= {locate.pad_id(tok)} for row, a in zip(ids, alone))


def test_answers_asked_together_are_each_answers_own(tok):
    def alone(value):
        try:
            return answer_tokens(tok, value, path="p")
        except CompileError:
            return None
    assert answers_tokens(tok, ANSWERS) == [alone(v) for v in ANSWERS]
    assert answers_tokens(tok, []) == [] and answers_tokens(tok, ["", " "]) == [None, None]


@pytest.mark.parametrize("where", [Where(index=-1), Where(index=0), Where(index=5), Where(last=3),
                                   Where(span=(1, 4)), Where(span=(-3, -1)), Where(all=True)])
def test_a_kept_fixed_cut_is_the_cut_of_every_row(where):
    spans = ((1, 9), (3, 9), (0, 0), (8, 9), (2, 9))
    windows, reasons = locate.fixed_windows(spans, where)
    cut = locate.cut_rows(spans, where)
    assert windows == tuple(w or () for w in cut)
    assert reasons == tuple("" if w else locate.OUTSIDE for w in cut)
    assert locate.fixed_windows(spans, where) is locate.fixed_windows(spans, Where(**where.__dict__))


def _swept(points: int) -> dict:
    """The patching document swept over the last ``points`` positions, read and written alike."""
    raw = patching_document()
    iv = raw["interventions"]["patching"]
    iv["writes"]["patch"]["pos"] = iv["reads"]["v_cf"]["pos"] = {"sweep": list(range(-points, 0)), "as": "pos"}
    return raw


def test_a_walk_asks_its_tokenizer_for_its_prefix_as_often_at_four_points_as_at_two(engines, tmp_path, monkeypatch):
    asked = []
    real = locate.special_prefix
    monkeypatch.setattr(locate, "special_prefix", lambda tok: asked.append(1) or real(tok))
    counts = {}
    for points in (2, 4):
        raw = _swept(points)
        doc = cm.read(raw, path=tmp_path / "doc.causalab.json")
        loaded = engines(raw, "hooks", document=tmp_path / "doc.causalab.json")
        asked.clear()
        ran = cm.run(doc, loaded=loaded, data=[DATA])
        assert len(ran.points) == points
        counts[points] = len(asked)
    assert counts[4] == counts[2] <= 3  # the compile's prompts once, the walk once (the share's forward included)


def test_a_run_outside_a_walk_still_asks_its_tokenizer(engines, tmp_path, monkeypatch):
    """``passes.resolve`` called on its own (no walk around it) asks the tokenizer itself."""
    from causalab_mini.engine import passes

    raw = patching_document()
    loaded = engines(raw, "hooks", document=tmp_path / "doc.causalab.json")
    plan = cm.compile(cm.read(raw, path=tmp_path / "doc.causalab.json"), loaded=loaded, data=[DATA])
    asked = []
    real = locate.special_prefix
    monkeypatch.setattr(locate, "special_prefix", lambda tok: asked.append(1) or real(tok))
    alone, positions = passes.resolve(loaded, plan.steps["score"].forwards)
    assert asked == [1]  # asked itself, with no walk to ask once for it
    with passes.walking():
        walked, _ = passes.resolve(loaded, plan.steps["score"].forwards)
    assert positions is None
    assert [f.windows for f in alone] == [f.windows for f in walked] and all(f.windows for f in alone)


def test_kept_is_by_identity_and_keeps_no_refusal():
    """``memo.kept``: equal but distinct objects are not one entry; a ``make`` that raises stores
    nothing, so the next ask makes it afresh."""
    from causalab_mini.memo import kept

    store, made = {}, []
    a, b = [1, 2], [1, 2]
    assert kept(store, a, lambda: made.append("a") or "A") == "A"
    assert kept(store, a, lambda: made.append("again") or "X") == "A"
    assert kept(store, b, lambda: made.append("b") or "B") == "B"
    assert kept(store, a, lambda: "Y", "other key") == "Y" and made == ["a", "b"]

    def refuse():
        raise ValueError("no")
    with pytest.raises(ValueError):
        kept(store, (3,), refuse)
    c = (3,)
    assert kept(store, c, lambda: "made afresh") == "made afresh"


def _files(folder) -> dict:
    """Every file under ``folder``: relative path -> bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_first_run_and_a_rerun_into_its_folder_leave_the_same_files(tmp_path):
    files = {"document.json": b"{}\n", write_mod.RUN: b"{}\n", "p=1/document.json": b"1\n", "p=1/iia.json": b"[]\n",
             "p=1/deep/er.json": b"2\n", "p=2/document.json": b"3\n", "top.json": b"4\n"}
    first = write_mod.commit(tmp_path / "first", dict(files))
    again = write_mod.commit(tmp_path / "first", dict(files))
    assert first == again == [tmp_path / "first" / rel for rel in files]
    assert _files(tmp_path / "first") == {**files, write_mod.RUN: _files(tmp_path / "first")[write_mod.RUN]}
    assert write_mod.state(tmp_path / "first") == "complete"


def test_a_point_folder_that_holds_a_users_file_takes_the_runs_files_beside_it(tmp_path):
    out = tmp_path / "out"
    (out / "p=1").mkdir(parents=True)
    (out / "p=1" / "notes.txt").write_text("mine")
    write_mod.commit(out, {"document.json": b"{}\n", write_mod.RUN: b"{}\n", "p=1/iia.json": b"[]\n"})
    assert (out / "p=1" / "notes.txt").read_text() == "mine" and (out / "p=1" / "iia.json").read_bytes() == b"[]\n"
    assert not (out / write_mod.STAGING).exists()


def test_a_later_file_of_a_checked_folder_whose_place_is_a_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    (out / "p=1" / "b.json").mkdir(parents=True)
    with pytest.raises(PlanError, match=r"b\.json is a folder, and the run writes a file there"):
        write_mod.check_targets(out, ["document.json", "p=1/a.json", "p=1/b.json"])
    write_mod.check_targets(out, ["document.json", "p=2/a.json", "p=2/b.json"])  # an absent folder holds nothing


def test_a_path_spelled_with_dots_lands_where_it_says(tmp_path):
    out = tmp_path / "out"
    files = {"document.json": b"{}\n", write_mod.RUN: b"{}\n", "p=1/../p=2/a.json": b"1\n", "p=3/./b.json": b"2\n"}
    write_mod.commit(out, files)
    assert (out / "p=2" / "a.json").read_bytes() == b"1\n" and (out / "p=3" / "b.json").read_bytes() == b"2\n"

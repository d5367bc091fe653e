"""vocab.FEATURIZERS, the record of featurizer kinds, held to the classes that implement them.

Everything the record says is measured here on featurizers actually built
(ops/featurizers.py): what has parameters a gradient reaches, what can be built
without a bundle, how wide the feature space is, which document fields change what
is built. Then the one refusal the record exists for: a fit that names a featurizer
with nothing to train, refused at validation with the document path of the name.
"""
from __future__ import annotations

import json
import subprocess

import pytest
import torch

from causalab_mini import vocab
from causalab_mini.document.spec import Featurizer, validate_spec
from causalab_mini.errors import DocumentError
from causalab_mini.ops import featurizers as feat
from causalab_mini.vocab import FEATURIZER_KINDS, FEATURIZERS
from paths import REPO
from samples import cli_command

D, K = 6, 3  # a small site and a rank below it, so "the site's width" and "k" can be told apart


def bundle(kind: str) -> dict:
    """Tensors a bundle of ``kind`` could hold: its recorded basis tensor, orthonormal columns."""
    record = FEATURIZERS[kind]
    if record.space == "units":
        return {record.tensor: torch.linspace(-1.0, 1.0, D)}
    q, _ = torch.linalg.qr(torch.randn(D, K, generator=torch.Generator().manual_seed(7)))
    return {record.tensor: q}


def built(kind: str, *, loaded: bool):
    """A featurizer of ``kind``: identity's one instance, else built fresh or from a bundle."""
    if kind == "identity":
        return feat.IDENTITY
    return feat.build(kind, D, K, tensors=bundle(kind) if loaded else None)


def can_build_fresh(kind: str) -> bool:
    try:
        feat.build(kind, D, K)
    except ValueError:
        return False
    return True


def parameters(obj) -> list:
    return list(getattr(obj, "parameters", lambda: [])())


def trains(kind: str) -> bool:
    """Measured, not read from the record: built the way a run builds it, does it hand AdamW anything?"""
    obj = built(kind, loaded=not can_build_fresh(kind))
    params = parameters(obj)
    return bool(params) and all(p.requires_grad for p in params)


def trainable_kinds() -> list[str]:
    return sorted(k for k in FEATURIZER_KINDS if trains(k))


# --------------------------------------------------------------------------- the record and the classes


def test_the_record_covers_exactly_the_kinds_a_document_may_declare():
    declarable = set(Featurizer.model_json_schema()["properties"]["kind"]["enum"])
    assert {k for k, f in FEATURIZERS.items() if f.declared} == declarable == set(FEATURIZER_KINDS)
    assert [k for k, f in FEATURIZERS.items() if not f.declared] == ["identity"]
    for kind in FEATURIZER_KINDS:
        assert built(kind, loaded=True).kind == kind


@pytest.mark.parametrize("loaded", [False, True], ids=["fresh", "loaded"])
@pytest.mark.parametrize("kind", list(FEATURIZERS))
def test_trainable_means_a_gradient_reaches_parameters(kind, loaded):
    if not loaded and kind != "identity" and not can_build_fresh(kind):
        pytest.skip(f"a {kind} is only ever loaded")
    obj = built(kind, loaded=loaded)
    params = parameters(obj)
    assert (bool(params) and all(p.requires_grad for p in params)) == FEATURIZERS[kind].trainable
    if FEATURIZERS[kind].trainable:
        # One write through it, in training mode as a fit runs it: the gradient reaches every
        # parameter — loaded from a file or fresh, a trainable kind trains.
        obj.training = True
        x = torch.randn(4, D, generator=torch.Generator().manual_seed(1))
        f, err = obj.featurize(x)
        obj.inverse(f + 1.0, err, x).square().sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    else:
        hidden = [n for n, v in vars(obj).items() if isinstance(v, torch.Tensor) and v.requires_grad]
        assert hidden == []
        # What a fit naming it would meet at run time, without the compile-time refusal.
        with pytest.raises(ValueError, match="empty parameter list"):
            torch.optim.AdamW(params)


@pytest.mark.parametrize("kind", FEATURIZER_KINDS)
def test_loads_says_whether_a_bundle_is_needed_and_every_declared_kind_round_trips(kind):
    assert can_build_fresh(kind) == (FEATURIZERS[kind].loads == "optional")
    assert FEATURIZERS[kind].loads in ("optional", "always")
    original = built(kind, loaded=True)
    again = feat.build(kind, D, K, tensors=original.tensors())
    assert original.tensors().keys() == again.tensors().keys()
    for name, tensor in original.tensors().items():
        assert torch.equal(again.tensors()[name], tensor), name


def test_identity_has_nothing_to_load_or_save():
    assert FEATURIZERS["identity"].loads == "never" and FEATURIZERS["identity"].tensor is None
    assert not hasattr(feat.IDENTITY, "tensors")


@pytest.mark.parametrize("kind", list(FEATURIZERS))
def test_space_and_tensor_match_what_is_built(kind):
    record = FEATURIZERS[kind]
    obj = built(kind, loaded=kind != "identity")
    f, _ = obj.featurize(torch.randn(2, D))
    assert f.shape[-1] == (D if record.space == "units" else K)
    if record.tensor is not None:
        assert obj.tensors()[record.tensor].shape[0] == D  # its first axis is the site's width


DOCUMENT_FIELDS = set(Featurizer.model_fields) - {"kind", "site"}
VALUES = {"k": 2, "seed": 5, "file_path": "f.safetensors", "start": 0.5}


def test_every_kind_dependent_field_is_some_kinds_and_the_record_names_only_those():
    assert VALUES.keys() == DOCUMENT_FIELDS
    assert set().union(*(f.params for f in FEATURIZERS.values())) == DOCUMENT_FIELDS
    for record in FEATURIZERS.values():
        assert set(record.needs_without_file) <= set(record.params)


@pytest.mark.parametrize("kind", [k for k in FEATURIZER_KINDS if FEATURIZERS[k].loads == "optional"])
@pytest.mark.parametrize("field,one,other", [("k", 2, 3), ("seed", 0, 1), ("start", 0.5, -0.5)])
def test_a_field_changes_what_is_built_exactly_when_the_kind_takes_it(kind, field, one, other):
    args = {"k": K, "seed": 0, "start": None}

    def tensors(value):
        return feat.build(kind, D, **{**args, field: value}).tensors()

    a, b = tensors(one), tensors(other)
    same = a.keys() == b.keys() and all(a[n].shape == b[n].shape and torch.equal(a[n], b[n]) for n in a)
    assert (not same) == (field in FEATURIZERS[kind].params)


def _with_featurizer(kind: str, **fields) -> dict:
    doc = json.loads((REPO / "documents/v2/das.causalab.json").read_text())
    record = FEATURIZERS[kind]
    declared = {"kind": kind, "site": "target"}
    if record.loads == "always":
        declared["file_path"] = "extra.safetensors"
    declared.update({f: VALUES[f] for f in record.needs_without_file})
    declared.update(fields)
    doc["featurizers"]["extra"] = declared
    return doc


@pytest.mark.parametrize("kind", FEATURIZER_KINDS)
@pytest.mark.parametrize("field", sorted(DOCUMENT_FIELDS))
def test_a_field_is_refused_at_its_path_on_a_kind_that_does_not_take_it(kind, field):
    doc = _with_featurizer(kind, **{field: VALUES[field]})
    if field in FEATURIZERS[kind].params:
        validate_spec(doc)
        return
    with pytest.raises(DocumentError) as info:
        validate_spec(doc)
    assert info.value.path == f"featurizers.extra.{field}"
    assert f"a {kind}" in info.value.problem and field in info.value.problem


# --------------------------------------------------------------------------- the refusal


@pytest.mark.parametrize("kind", FEATURIZER_KINDS)
def test_a_fit_naming_a_kind_with_nothing_to_train_is_refused_at_the_name(kind):
    # Beside a subspace that does train: the one that does not must not pass unnoticed.
    doc = _with_featurizer(kind)
    doc["steps"]["fit"]["params"] = ["rot", "extra"]
    if trains(kind):
        assert validate_spec(doc).steps["fit"].params == ["rot", "extra"]
        return
    with pytest.raises(DocumentError) as info:
        validate_spec(doc)
    err = info.value
    assert err.path == "steps.fit.params.1"
    assert f"featurizer 'extra' is a {kind}" in err.problem and "never trained" in err.problem
    assert f"only the kinds {', '.join(trainable_kinds())}" in err.fix and "'extra'" in err.fix


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_the_cli_refuses_an_sae_in_a_fit_before_anything_runs(tmp_path):
    doc = _with_featurizer("sae")
    doc["steps"]["fit"]["params"] = ["extra"]
    path = tmp_path / "fit_sae.causalab.json"
    path.write_text(json.dumps(doc))
    done = cli("validate", str(path))
    assert done.returncode == 2, done
    assert done.stderr.startswith("error: DocumentError: steps.fit.params.0: featurizer 'extra' is a sae")
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------- causalab-mini vocab


def test_vocab_lists_each_featurizer_kind_with_whether_it_trains():
    done = cli("vocab")
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        words = line.split()
        if len(words) > 1 and words[0] in FEATURIZERS and words[1].startswith("trainable="):
            rows[words[0]] = words
    assert rows.keys() == FEATURIZERS.keys()
    for kind, words in rows.items():
        measured = kind != "identity" and trains(kind)
        assert words[1] == f"trainable={'yes' if measured else 'no'}"
        assert words[2] == f"file_path={FEATURIZERS[kind].loads}"


def test_vocab_json_has_the_featurizer_table():
    done = cli("vocab", "--json")
    assert done.returncode == 0, done.stderr
    table = json.loads(done.stdout)["featurizer_kinds"]
    assert table.keys() == FEATURIZERS.keys()
    for kind, row in table.items():
        assert row["trainable"] == (kind != "identity" and trains(kind))
        assert row["declared"] == (kind in FEATURIZER_KINDS)
        assert row["params"] == list(FEATURIZERS[kind].params)
    assert table == vocab.as_json()["featurizer_kinds"]

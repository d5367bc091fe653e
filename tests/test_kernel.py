"""The kernel (``causalab_mini/kernel.py``): the code a stock server runs, in the form its serializer keeps.

nnsight 0.7.0 rebuilds a module shipped by value from its functions' source, with module globals
re-imported by name: the lint below holds the file to what that rebuild reproduces (each rule is a
failure measured on a stock server: a class or dataclass, a decorator, a closure, an annotation
evaluated without ``from __future__``, module state). The package's own arithmetic is the kernel's
functions (checked by identity), and the kernel's data-form path — a featurizer held as a dict, a
write as a program entry — equals the package's objects bit for bit.
"""
from __future__ import annotations

import ast
import inspect

import pytest
import torch
from pickles import imported_modules

from causalab_mini import kernel
from causalab_mini.engine import nnterp, request, taps
from causalab_mini.ops import featurizers, intervene, mechanisms, reduce

SOURCE = inspect.getsource(kernel)
TREE = ast.parse(SOURCE)


def test_the_kernel_imports_torch_and_nothing_else():
    imports = [n for n in ast.walk(TREE) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(n) for n in imports] == ["import torch"]


def test_the_kernel_is_plain_functions_without_what_the_serializer_drops():
    problems = []
    for node in TREE.body:
        if isinstance(node, ast.FunctionDef):
            if node.decorator_list:
                problems.append(f"{node.name}: a decorator")
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if arg is not None and arg.annotation is not None:
                    problems.append(f"{node.name}: an annotated argument {arg.arg}")
            if node.returns is not None:
                problems.append(f"{node.name}: a return annotation")
            for inner in ast.walk(node):
                if inner is not node and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                                            ast.ClassDef)):
                    problems.append(f"{node.name}: a nested {type(inner).__name__}")
                if isinstance(inner, (ast.Global, ast.Nonlocal)):
                    problems.append(f"{node.name}: a {type(inner).__name__} statement")
        elif isinstance(node, ast.Assign):
            # Module state is a constant: a tuple of strings (nothing a request could change).
            value = ast.literal_eval(node.value)
            if not (isinstance(value, tuple) and all(isinstance(v, str) for v in value)):
                problems.append(f"{ast.unparse(node.targets[0])}: module state that is not a constant")
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        elif not isinstance(node, ast.Import):
            problems.append(f"line {node.lineno}: a {type(node).__name__} at module level")
    assert problems == []


def test_the_shipped_copy_is_the_kernel_by_value_under_a_name_no_server_has():
    import cloudpickle

    shipped = request.shipped_kernel()
    assert shipped.__name__ == request.SHIPPED and shipped is not kernel
    assert inspect.getsource(shipped.run) == inspect.getsource(kernel.run)
    # By value: the pickle rebuilds the function (cloudpickle's constructor) and imports neither the
    # shipped module's name nor this package (a server has neither); the package's own copy would be
    # a reference. (nnsight's serializer sends the same functions as their source: test_ndif_wire.)
    imported = imported_modules(cloudpickle.dumps(shipped.vectors_mean))
    assert "cloudpickle.cloudpickle" in imported
    assert not {m.split(".")[0] for m in imported} & {request.SHIPPED, "causalab_mini"}
    assert "causalab_mini.kernel" in imported_modules(cloudpickle.dumps(kernel.vectors_mean))


def test_the_packages_arithmetic_is_the_kernels():
    for name in kernel.MECHANISMS:
        assert mechanisms.REGISTRY[name] is getattr(kernel, name) is kernel.mechanism(name)
    assert featurizers.cayley is kernel.cayley
    assert featurizers.select_features is kernel.select_features
    assert featurizers.merge_features is kernel.merge_features
    assert taps.conform is kernel.conform and taps.fires is kernel.fires
    x = torch.randn(3, 4, 5)
    assert torch.equal(reduce.mean(x), kernel.vectors_mean(x))
    pattern = torch.randn(2, 3, 4, 4)
    point = nnterp._Point(("attention_probs", 0), None, "output", nnterp.PATTERN)
    assert torch.equal(point.get(pattern), kernel.get_value(nnterp.PATTERN, pattern))
    assert torch.equal(point.put(pattern, point.get(pattern)), pattern)


def _featurizers(d: int, k: int):
    """Each built-in kind as the package builds it, and as the kernel holds it (request.featurizer_data)."""
    gen = torch.Generator().manual_seed(7)
    w_enc, w_dec = torch.randn(d, k, generator=gen), torch.randn(k, d, generator=gen)
    b_enc, b_dec = torch.randn(k, generator=gen), torch.randn(d, generator=gen)
    q, _ = torch.linalg.qr(torch.randn(d, k, generator=gen))
    made = {
        "identity": featurizers.IDENTITY,
        "subspace": featurizers.Subspace(d, k, seed=3),
        "pca": featurizers.PCA(q),
        "sae": featurizers.Dictionary("sae", w_enc, b_enc, w_dec, b_dec),
        "linear": featurizers.Dictionary("linear", w_enc, b_enc, None, b_dec),
        "gate": featurizers.Gate(d, theta=torch.randn(d, generator=gen)),
    }
    return {kind: (f, request.featurizer_data(kind, f)) for kind, f in made.items()}


@pytest.mark.parametrize("mechanism", kernel.MECHANISMS)
def test_a_write_held_as_data_equals_the_packages_write_bit_for_bit(mechanism):
    d, k = 16, 6
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(4, 3, d, generator=gen)
    f0 = torch.randn(4, 3, d, generator=gen)
    params = {"t": 0.3, "std": 0.5, "seed": 2, "scale": -1.5, "min": -0.2, "max": 0.4}
    for kind, (made, data) in _featurizers(d, k).items():
        for features in (None, (0, 2, 3)):
            width = d if kind in ("identity", "gate") else k
            spec = intervene.vocab.MECHANISMS[mechanism]
            operand = torch.randn(width, generator=gen) if spec.operand else None
            checked = intervene.check_params(mechanism, {p: v for p, v in params.items()
                                                         if p in intervene.vocab.MECHANISMS[mechanism].params})
            if kind == "gate" and features is not None:
                continue  # a gate masks every unit of the site: no feature cut
            ours = intervene.apply_write(x, featurizer=made, mechanism=mechanism, params=checked, operand=operand,
                                         f0=f0 if spec.needs_f0 else None, features=features)
            entry = {"mechanism": mechanism, "params": checked, "features": features}
            theirs = kernel.feature_write(x, data, entry, None if operand is None else operand,
                                          f0 if spec.needs_f0 else None)
            assert torch.equal(ours, theirs), (kind, features)
            assert not torch.equal(ours, x) or mechanism == "clamp"  # the write did something to compare


@pytest.mark.parametrize("kind", kernel.METRIC_KINDS)
def test_each_built_in_metric_kind_scores_with_the_kernels_function(kind):
    """What a stock server scores a metric with is what the scorer calls here: equal to the bit on the
    same logits (ties and a kind's parameters included)."""
    from causalab_mini.metric_kinds import BUILT_IN, METRICS

    record = METRICS[kind]
    assert record.origin == BUILT_IN
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 11, generator=gen)
    logits[0, 3] = logits[0, 4] = logits[0].max() + 1  # a tie at the top
    ids = [torch.randint(0, 11, (6,), generator=gen) for _ in record.columns]
    reads = {slot: torch.randn(6, 11, generator=gen) for slot in record.reads}
    params = {"k": 3} if kind == "top_k" else {"measure": "prob_diff", "min_denominator": 0.05} \
        if kind == "normalized_effect" else {}
    ours = record.compute(logits, *ids, **reads, **params)
    theirs = kernel.call_metric(kernel.metric_kind(kind), logits, ids, reads, params)
    for a, b in zip(ours if isinstance(ours, tuple) else (ours,), theirs if isinstance(theirs, tuple) else (theirs,)):
        assert torch.equal(a, b)

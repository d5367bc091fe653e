"""The run files' JSON writer (``causalab_mini/jsonindent.py``) against ``json.dumps`` itself.

Every file a run writes must keep its bytes, so the fast writer is held to the standard
library's ``json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False)`` on drawn
values of every JSON shape (and the tuples, non-string keys and number subclasses a result
can hold), and raises where it raises.
"""
from __future__ import annotations

import enum
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from causalab_mini import jsonindent
from causalab_mini.formats import json_bytes
from causalab_mini.errors import PlanError


def reference(value) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False)


scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
           | st.text())  # any code point but lone surrogates: control characters, quotes, non-ASCII
keys = st.text() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.booleans() | st.none()
values = st.recursive(scalars, lambda inner: (st.lists(inner, max_size=5) | st.tuples(inner, inner)
                                              | st.dictionaries(keys, inner, max_size=5)), max_leaves=40)


@settings(max_examples=400, deadline=None)
@given(values)
def test_the_writer_spells_every_value_as_json_dumps_does(value):
    assert jsonindent.dumps(value) == reference(value)


class Level(enum.IntEnum):
    LOW = 3


class Weight(float):
    pass


@pytest.mark.parametrize("value", [
    [], {}, [[]], {"a": {}}, "", "é\u2028\x00\"\\", 0.1, -0.0, 1e300, 5e-324, 2**80, True, None,
    {"nested": [{"a": [1, 2.5, None]}, ()]}, {1: "int key", 2.5: "float key", True: "t", None: "n"},
    [Level.LOW, Weight(0.25)],
])
def test_the_shapes_a_run_file_holds(value):
    assert jsonindent.dumps(value) == reference(value)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, [1.0, math.nan], {"x": math.inf}, {math.nan: 1}])
def test_a_value_json_refuses_is_refused_the_same_way(bad):
    with pytest.raises(ValueError):
        reference(bad)
    with pytest.raises(ValueError):
        jsonindent.dumps(bad)
    with pytest.raises(PlanError, match="NaN or infinite"):
        json_bytes(bad)


@pytest.mark.parametrize("bad", [{1, 2}, object(), {(1, 2): "tuple key"}, b"bytes"])
def test_what_json_cannot_hold_is_a_type_error_as_in_json(bad):
    with pytest.raises(TypeError):
        reference(bad)
    with pytest.raises(TypeError):
        jsonindent.dumps(bad)


def test_keys_equal_as_dict_keys_keep_their_own_spellings():
    """1, 1.0 and True are one dict key but three spellings; dicts at the same depth do not share them."""
    value = [{1: "a", "k": 0}, {True: "b", "k": 1}, {1.0: "c"}, {None: 1, "k": 2}]
    assert jsonindent.dumps(value) == json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False)

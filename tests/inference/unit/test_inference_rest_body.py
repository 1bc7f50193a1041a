"""REST body decoding bounds (inference.rest_body): nesting depth counted outside
strings, data checked against the declared shape before conversion, only the read
parameters kept."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mcp26.inference import rest_body as RB
from mcp26.inference.errors import InvalidArgument

SPECS = {"x": ("FP32", (-1, 4))}


@pytest.mark.parametrize("text, depth", [
    (b"{}", 1), (b"[[[]]]", 3), (b'{"a": "[[[[[["}', 1), (b'{"a": "\\"[[[", "b": [[1]]}', 3),
    (b'"no brackets"', 0), (b"[" * 64 + b"]" * 64, 64),
])
def test_json_depth_counts_brackets_outside_strings(text, depth):
    assert RB.json_depth(text) == depth
    assert RB.json_depth(b"[" * 5000 + b"]" * 5000) > RB.MAX_JSON_DEPTH


def test_depth_over_the_cap_is_refused_before_parsing():
    with pytest.raises(InvalidArgument, match="deeper than 64"):
        RB.parse_json(b'{"a": ' + b"[" * 65 + b"]" * 65 + b"}")
    assert RB.parse_json(b'{"a": ' + b"[" * 63 + b"]" * 63 + b"}")["a"]


def body(data, **extra) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": data}], **extra}).encode()


def test_decode_body_keeps_what_is_read_and_drops_the_rest():
    b = RB.decode_body(body([[1, 2, 3, 4], [5, 6, 7, 8]], id="r1",
                            parameters={"priority": 2, "junk": list(range(1000))}), b"", "m", SPECS, 1)
    np.testing.assert_array_equal(b.arrays["x"], np.arange(1, 9, dtype=np.float32).reshape(2, 4))
    assert b.doc == {"parameters": {"priority": 2}, "id": "r1"} and b.parameters == {"priority": 2}


@pytest.mark.parametrize("data, words", [
    (list(range(10**6)), "1000000 elements for shape [2, 4]"),
    ([[[1]] * 4] * 2, "nested deeper or wider"),
    ([[]] * 8, "0 elements for shape [2, 4]"),
    ([[[]] * 1000], "nested deeper or wider"),
    ([1] * 7, "7 elements for shape [2, 4]"),
])
def test_data_that_does_not_fit_the_shape_is_refused(data, words):
    with pytest.raises(InvalidArgument) as e:
        RB.decode_body(body(data), b"", "m", SPECS, 1)
    assert words in e.value.message


def test_more_outputs_than_the_model_has_and_a_non_string_id_are_refused():
    with pytest.raises(InvalidArgument, match="3 outputs requested; the model has 1"):
        RB.decode_body(body([0] * 8, outputs=[{"name": "y"}] * 3), b"", "m", SPECS, 1)
    with pytest.raises(InvalidArgument, match="'id' must be a string"):
        RB.decode_body(body([0] * 8, id={"a": 1}), b"", "m", SPECS, 1)

"""The built-in JSON serde: its C fast paths give exactly what the standard library gives, and
every input the fast path declines still decodes (or fails) as ``json.loads`` does."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from sparkpoint import serde as serde_module
from sparkpoint.serde import JsonSerde

VALUES: list[Any] = [
    {"user": "user-00012", "count": 12},
    {"b": [1, 2.5, None, True, False], "a": {"z": "é ü 中", "y": -0.0}},
    "plain",
    'quote " backslash \\ control \x01',
    17,
    -(2**70),
    1e300,
    [],
    {},
    [{"nested": [[[]]]}],
    {"emoji": "😀"},
]


def test_the_fast_paths_exist_on_cpython() -> None:
    assert serde_module._JSON_ENCODE_FAST is not None
    assert serde_module._JSON_DECODE_FAST is not None


@pytest.mark.parametrize("value", VALUES)
def test_encode_matches_the_standard_library_and_round_trips(value: Any) -> None:
    expected = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    data = JsonSerde().to_bytes(value)
    assert data == expected
    assert JsonSerde().from_bytes(data) == value


def test_nan_and_infinity_encode_as_the_standard_library_does() -> None:
    data = JsonSerde().to_bytes([math.nan, math.inf, -math.inf])
    assert data == b"[NaN,Infinity,-Infinity]"
    back = JsonSerde().from_bytes(data)
    assert math.isnan(back[0]) and back[1:] == [math.inf, -math.inf]


@pytest.mark.parametrize(
    "data, value",
    [
        (b'  {"a": 1}  ', {"a": 1}),  # surrounding whitespace: the fast path declines
        (b'{"a":1}\n', {"a": 1}),
        ('{"a":"é"}'.encode("utf-16"), {"a": "é"}),  # UTF-16 with a BOM
        ('["x"]'.encode("utf-32-le"), ["x"]),
    ],
)
def test_inputs_the_fast_path_declines_still_decode(data: bytes, value: Any) -> None:
    assert JsonSerde().from_bytes(data) == value


@pytest.mark.parametrize("data", [b"", b"{", b'{"a":1} x', b'{"a":1}{"b":2}', b"nope", b"\xff"])
def test_bad_json_fails_as_json_loads_does(data: bytes) -> None:
    with pytest.raises(ValueError) as expected:
        json.loads(data)
    with pytest.raises(ValueError) as got:
        JsonSerde().from_bytes(data)
    assert type(got.value) is type(expected.value)
    assert str(got.value) == str(expected.value)


def test_a_cycle_is_named_by_the_checked_encoder() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular reference"):
        JsonSerde().to_bytes(cycle)


def test_an_unencodable_value_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        JsonSerde().to_bytes({"s": {1, 2}})

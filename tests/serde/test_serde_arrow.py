"""Arrow columns encoded in bulk give the bytes each serde's ``to_bytes`` gives per value."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint.serde import load_serde
from sparkpoint.serde.arrow import encode_array


def per_value(serde_name: str, array: pa.Array) -> list[bytes | None]:
    serde = load_serde(serde_name)
    return [None if v is None else serde.to_bytes(v) for v in array.to_pylist()]


TEXT = st.text(st.characters(codec="utf-8"), max_size=8) | st.sampled_from(["", "a b", "ü", '"'])
INTS = st.integers(-(2**63), 2**63 - 1)
ROW = st.fixed_dictionaries(
    {"user": st.none() | TEXT, "count": st.none() | INTS, "ok": st.none() | st.booleans()}
)
STRUCT = pa.struct([("user", pa.string()), ("count", pa.int64()), ("ok", pa.bool_())])
NESTED = pa.struct([("z", pa.int32()), ("inner", STRUCT), ("a", pa.string())])


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.none() | ROW, max_size=12), plain=st.booleans())
def test_json_objects_match_the_serde_byte_for_byte(rows: list[Any], plain: bool) -> None:
    if plain:  # mostly text that goes through in bulk
        rows = [None if r is None else {**r, "user": "user-1"} for r in rows]
    array = pa.array(rows, STRUCT)
    got = encode_array(load_serde("json"), array)
    if got is not None:
        assert got == per_value("json", array)
    if plain and rows:
        assert got is not None


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.none() | st.tuples(st.none() | INTS, st.none() | ROW, TEXT), max_size=8))
def test_nested_structs_match_the_serde(rows: list[Any]) -> None:
    values = [None if r is None else {"z": None, "inner": r[1], "a": r[2]} for r in rows]
    array = pa.array(values, NESTED)
    got = encode_array(load_serde("json"), array)
    if got is not None:
        assert got == per_value("json", array)


@pytest.mark.parametrize(
    ("serde", "array"),
    [
        ("json", pa.array(["plain", None, "with space"])),
        ("json", pa.array([1, None, -(2**63)], pa.int64())),
        ("json", pa.array([True, None, False])),
        ("json", pa.array([{"b": 1, "a": "x"}, None])),
        ("string", pa.array(["ü", None, ""])),
        ("bytes", pa.array([b"\x00", None])),
    ],
)
def test_bulk_types_match_the_serde(serde: str, array: pa.Array) -> None:
    assert encode_array(load_serde(serde), array) == per_value(serde, array)


@pytest.mark.parametrize(
    ("serde", "array"),
    [
        ("json", pa.array(['needs "escaping"'])),
        ("json", pa.array(["é"])),  # ensure_ascii
        ("json", pa.array([1.5])),  # Python's float text
        ("json", pa.array([[1, 2]])),
        ("json", pa.array([{"a": 1.0}])),
        ("integer", pa.array([1])),
        ("string", pa.array([1])),
    ],
)
def test_other_values_take_the_per_value_path(serde: str, array: pa.Array) -> None:
    assert encode_array(load_serde(serde), array) is None

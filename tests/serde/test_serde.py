"""The built-in JSON serde: its fast paths (orjson where provably the same, then CPython's C
encoder and scanner) give exactly what the standard library gives, and every input a fast path
declines still decodes (or fails) as ``json.loads`` does."""

from __future__ import annotations

import enum
import json
import math
import uuid
from collections import OrderedDict, namedtuple
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

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


def stdlib(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 is not 1.0; NaN equals NaN; -0.0 is not
    0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    return bool(a == b)


# every JSON value, with the corners where orjson and the standard library part ways: tiny and
# non-finite floats, integers past 64 bits, non-ASCII, DEL and control characters, lone
# surrogates, and text that looks like those ("null", "e-", "0.0000") inside strings
CORNER_TEXT = st.sampled_from(["null", "1e-7", "0.00001", "\x7f", "é", "\ud800", "page-e-1", ""])
TEXT = st.one_of(st.text(st.characters(codec=None, exclude_categories=())), CORNER_TEXT)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),
    st.floats(min_value=-1e-3, max_value=1e-3),
    TEXT,
)
VALUES_ANY = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(TEXT, inner, max_size=5)),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(VALUES_ANY)
@example({"user": "user-00001", "ts": 12345678901234567890123})
@example({"x": 1e-7, "y": 5e-5, "z": 1e-4})
@example([math.nan, None, "null"])
def test_any_value_encodes_as_the_standard_library_does_and_decodes_back(value: Any) -> None:
    expected = stdlib(value)
    assert JsonSerde().to_bytes(value) == expected
    assert same(JsonSerde().from_bytes(expected), json.loads(expected))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=40),
        VALUES_ANY.map(stdlib),
        # valid JSON, then one byte changed: near misses the two parsers may treat differently
        st.tuples(VALUES_ANY.map(stdlib), st.integers(0, 200), st.integers(0, 255)).map(
            lambda t: t[0][: t[1]] + bytes([t[2]]) + t[0][t[1] + 1 :]
        ),
        st.sampled_from(
            [
                b"NaN",
                b"-Infinity",
                b"1e400",
                b"\xef\xbb\xbf[1]",
                b'"\\udc00"',
                b"-9223372036854775809",
            ]
        ),
    )
)
def test_any_bytes_decode_or_fail_as_json_loads_does(data: bytes) -> None:
    try:
        expected = json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        with pytest.raises(ValueError) as got:
            JsonSerde().from_bytes(data)
        assert type(got.value) is type(exc)
        return
    assert same(JsonSerde().from_bytes(data), expected)


@pytest.mark.parametrize(
    "data, value",
    [
        (b'{"n":123456789012345678901234567890}', {"n": 123456789012345678901234567890}),
        (b"[-9223372036854775809]", [-9223372036854775809]),
        (b"18446744073709551616", 18446744073709551616),
        (b'{"n":1.5,"big":18446744073709551617}', {"n": 1.5, "big": 18446744073709551617}),
        # past 128 bytes the digit runs are found by another path (a digit-dense hex pad)
        (
            b'{"pad":"' + b"0123456789abcdef" * 16 + b'","v":[18446744073709551617]}',
            {"pad": "0123456789abcdef" * 16, "v": [18446744073709551617]},
        ),
    ],
)
def test_integers_past_64_bits_stay_integers(data: bytes, value: Any) -> None:
    """orjson reads these as floats; the serde must not."""
    assert same(JsonSerde().from_bytes(data), value)


@pytest.mark.parametrize("size", [100, 128, 129, 1000])
@pytest.mark.parametrize("run", [18, 19])
def test_a_run_of_19_digits_is_found_at_any_length(size: int, run: int) -> None:
    """Short and long texts take different searches; both find the same runs."""
    from sparkpoint.serde import _has_long_number

    digits = ("1234567890" * 2)[:run]
    text = ("ab" * size)[: size - run - 2] + " " + digits + " "
    assert len(text) == size
    assert _has_long_number(text.encode()) is (run == 19)
    assert _has_long_number(memoryview(text.encode())) is (run == 19)


def nested(levels: int) -> Any:
    """``1`` inside ``levels`` lists."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


Point = namedtuple("Point", "x y")


class Name(str):
    pass


@pytest.mark.parametrize("ascii_only", [True, False])
def test_uuids_and_enums_are_written_the_same_on_every_path(ascii_only: bool) -> None:
    """orjson writes a UUID as its string and an Enum as its value; the standard library's path
    (taken here for non-ASCII text) must write the same bytes."""
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    value = {"id": u, "colour": Colour.RED, "level": Level.HIGH, "name": "x" if ascii_only else "é"}
    name = "x" if ascii_only else "\\u00e9"
    expected = f'{{"colour":"red","id":"{u}","level":3,"name":"{name}"}}'.encode()
    assert JsonSerde().to_bytes(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        OrderedDict([("b", 1), ("a", 2)]),
        {"p": Point(1, 2)},
        {"n": Name("subclass")},
        {"deep": nested(62)},
        {1: "int keys"},
        {"tiny": 1e-300, "exp": 1e16},
    ],
)
def test_subclasses_namedtuples_and_non_string_keys_match_the_standard_library(value: Any) -> None:
    assert JsonSerde().to_bytes(value) == stdlib(value)


def test_nesting_past_orjson_s_limit_still_encodes_and_decodes() -> None:
    value = nested(400)  # orjson stops at 255 levels
    data = JsonSerde().to_bytes(value)
    assert data == stdlib(value)
    assert JsonSerde().from_bytes(data) == value

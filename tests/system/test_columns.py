"""Arrow columns of records: the gather and the newline-joined JSON text built in numpy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sparkpoint.system.base import Record
from sparkpoint.system.columns import (
    SPARSE_SLICE_BYTES,
    RecordColumns,
    binary_array,
    newline_joined,
)


def test_binary_array_gathers_slices_with_nulls_and_empties() -> None:
    data = np.frombuffer(b"..abc..de...f", np.uint8)
    starts = np.array([2, 7, 0, 12, 5])
    lengths = np.array([3, 2, -1, 1, 0])
    got = binary_array(data, starts, lengths)
    assert got.to_pylist() == [b"abc", b"de", None, b"f", b""]
    assert got.type == pa.binary() and got.null_count == 1


def test_binary_array_gathers_slices_out_of_order_or_overlapping_too() -> None:
    data = np.frombuffer(b"abcdefgh", np.uint8)
    for starts, lengths, want in (
        ([4, 0], [2, 3], [b"ef", b"abc"]),  # out of order
        ([0, 2], [4, 3], [b"abcd", b"cde"]),  # overlapping
        ([0, 3, 5], [3, 2, 3], [b"abc", b"de", b"fgh"]),  # back to back, to the end
    ):
        got = binary_array(data, np.array(starts), np.array(lengths))
        assert got.to_pylist() == want


@pytest.mark.parametrize("gap", [1, SPARSE_SLICE_BYTES * 2], ids=["dense", "sparse"])
def test_binary_array_gathers_dense_and_sparse_slices_alike(gap: int) -> None:
    """Slices close together are picked with a byte mask, far apart copied one by one."""
    rng = np.random.default_rng(7)
    lengths = np.array([5, -1, 0, 300, 1, 2000, -1, 17])
    starts = np.cumsum(np.maximum(lengths, 0) + gap) - np.maximum(lengths, 0)
    data = rng.integers(0, 256, int(starts[-1] + lengths[-1] + gap), np.uint8)
    got = binary_array(data, starts, lengths)
    want = [
        None if n < 0 else data[s : s + n].tobytes() for s, n in zip(starts, lengths, strict=True)
    ]
    assert got.to_pylist() == want
    assert got.null_count == 2


def test_newline_joined_follows_each_value_with_a_newline_also_in_a_slice() -> None:
    values = pa.array([b"{}", b'{"a":1}', b"", b'{"b":"x"}', b"last"])
    assert newline_joined(values) == b'{}\n{"a":1}\n\n{"b":"x"}\nlast\n'
    assert newline_joined(values.slice(1, 3)) == b'{"a":1}\n\n{"b":"x"}\n'
    assert newline_joined(values.slice(2, 1)) == b"\n"
    assert newline_joined(values.slice(0, 0)) == b""
    assert newline_joined(pa.array(["text"], pa.string())) == b"text\n"
    with pytest.raises(ValueError, match="nulls"):
        newline_joined(pa.array([b"x", None]))


def test_columns_and_records_convert_both_ways() -> None:
    records = [Record("7", b"k", b"v", 1), Record("8", None, None, 2), Record("9", b"", b"", 3)]
    columns = RecordColumns.from_records(records)
    assert columns.records() == records
    assert (len(columns), columns.last_offset) == (3, "9")
    assert len(RecordColumns.from_records([])) == 0

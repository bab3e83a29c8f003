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


@pytest.mark.parametrize("seed", range(8))
def test_the_numpy_compaction_gives_the_record_loop_s_bytes_and_refuses_a_damaged_record(
    seed: int,
) -> None:
    """``columnar.compacted`` against ``format.compacted`` on random logs (keyless records,
    tombstones, repeated keys, random bounds and tombstone cut-offs, a log that starts past
    byte 0): the same log bytes, index, count and last tombstone dropped. A flipped byte in
    a judged record gives ``None`` (the caller's record loop then names it), one past the
    bound is not judged, as in the loop."""
    import random

    from sparkpoint.system.filelog import columnar
    from sparkpoint.system.filelog import format as fmt

    rng = random.Random(seed)
    n = rng.choice([1, 2, 50, 2_000])
    records = []
    for _ in range(n):
        key = None if rng.random() < 0.05 else f"k{rng.randrange(max(1, n // 8))}".encode()
        value = None if rng.random() < 0.2 else b"v" * rng.randrange(0, 30)
        records.append(("", key, value, rng.randrange(-5, 10**6)))
    base = rng.choice([0, 4096])
    buf, index, _ = fmt.encode_many(rng.randrange(10**6), records, base=base)
    offsets = fmt.index_offsets(index)
    for _ in range(6):
        up_to = rng.choice([None, offsets[0], offsets[-1] + 1, rng.choice(offsets)])
        cut = rng.choice([None, 0, 500_000, 2 * 10**6])
        want = fmt.compacted(buf, index, up_to, cut)
        assert columnar.compacted(buf, index, up_to, cut) == want, (up_to, cut)
    judged = rng.randrange(n)
    damaged = bytearray(buf)
    damaged[(fmt.INDEX.unpack_from(index, judged * fmt.INDEX_SIZE)[1] - base) + 30] ^= 0xFF
    with pytest.raises(fmt.FormatError):
        fmt.compacted(bytes(damaged), index, offsets[judged] + 1)
    assert columnar.compacted(bytes(damaged), index, offsets[judged] + 1) is None
    if judged:  # past the bound: copied, not judged, by both
        up_to = offsets[judged]
        assert columnar.compacted(bytes(damaged), index, up_to) == fmt.compacted(
            bytes(damaged), index, up_to
        )

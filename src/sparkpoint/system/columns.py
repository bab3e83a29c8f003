"""Records of one SSP as Arrow columns: what a DataFrame batch reads, without a Python object
per record.

:meth:`sparkpoint.system.base.SystemConsumer.read_columns` returns :class:`RecordColumns`. Its
default builds them from :meth:`~sparkpoint.system.base.SystemConsumer.read`'s records; the
embedded log decodes its file bytes straight into columns
(:func:`sparkpoint.system.filelog.columnar.decode_columns`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sparkpoint.system.record import Record


@dataclass(frozen=True)
class RecordColumns:
    """``offsets`` (string), ``keys`` and ``values`` (binary, null for a null key or value) and
    ``timestamps`` (int64, ms) of consecutive records of one SSP, in offset order."""

    offsets: pa.Array
    keys: pa.Array
    values: pa.Array
    timestamps: pa.Array

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def last_offset(self) -> str:
        return str(self.offsets[-1].as_py())

    @classmethod
    def from_records(cls, records: Sequence[Record]) -> RecordColumns:
        return cls(
            pa.array([r.offset for r in records], pa.string()),
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            pa.array([r.timestamp for r in records], pa.int64()),
        )

    def take(self, indices: Sequence[int]) -> RecordColumns:
        """The records at ``indices`` (in that order)."""
        picked = pa.array(indices, pa.int64())
        return RecordColumns(
            self.offsets.take(picked),
            self.keys.take(picked),
            self.values.take(picked),
            self.timestamps.take(picked),
        )

    def records(self) -> list[Record]:
        """The records, one object each (for the slow paths: per-record decoding, errors)."""
        return [
            Record(*row)
            for row in zip(
                self.offsets.to_pylist(),
                self.keys.to_pylist(),
                self.values.to_pylist(),
                self.timestamps.to_pylist(),
                strict=True,
            )
        ]


def binary_array(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary array of ``data[starts[i] : starts[i] + lengths[i]]`` (``data``: uint8), null
    where ``lengths[i] < 0``, gathered in one numpy pass."""
    n = len(starts)
    valid = lengths >= 0
    sizes = np.where(valid, lengths, 0)
    bounds = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=bounds[1:])
    total = int(bounds[-1])
    picked = _in_order(data, starts[sizes > 0], sizes[sizes > 0])
    if picked is None:  # slices out of order or overlapping: an index per byte
        picked = data[np.repeat(starts - bounds[:-1], sizes) + np.arange(total)]
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    if total >= 2**31:
        return pa.Array.from_buffers(
            pa.large_binary(), n, [bitmap, pa.py_buffer(bounds), pa.py_buffer(picked)]
        ).cast(pa.binary())  # raises: one chunk of more than 2 GiB
    offsets = pa.py_buffer(bounds.astype(np.int32))
    return pa.Array.from_buffers(pa.binary(), n, [bitmap, offsets, pa.py_buffer(picked)])


#: the bytes of ``data`` per slice from which slices are copied one by one rather than picked
#: with a byte mask: the mask costs a few passes over all of ``data``, a copy a fixed cost per
#: slice (about 1 us), so the copies win where slices are sparse (large values, or the keys
#: between them: a 1 GB changelog of 16 KB values decoded 8x faster, docs/performance.md)
SPARSE_SLICE_BYTES = 1024


def _in_order(data: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray | None:
    """The bytes of non-empty slices that follow one another in ``data`` without overlapping
    (a log's keys, or its values), picked with a byte mask made of runs (gap, slice, gap, ...):
    one byte of scratch per byte of ``data``, against eight for an index per byte, and about
    10x faster; or, where slices are sparse (:data:`SPARSE_SLICE_BYTES`), copied one by one;
    ``None`` when they do not follow one another."""
    n = len(starts)
    if not n:
        return np.empty(0, np.uint8)
    ends = starts + sizes
    if starts[0] < 0 or ends[-1] > len(data) or not bool((starts[1:] >= ends[:-1]).all()):
        return None
    if len(data) >= SPARSE_SLICE_BYTES * n:
        return np.concatenate(
            list(map(data.__getitem__, map(slice, starts.tolist(), ends.tolist())))
        )
    runs = np.empty(2 * n + 1, np.int64)
    runs[0] = starts[0]
    runs[1:-1:2] = sizes
    runs[2:-1:2] = starts[1:] - ends[:-1]
    runs[-1] = len(data) - ends[-1]
    picked = np.zeros(2 * n + 1, np.bool_)
    picked[1::2] = True
    return data[np.repeat(picked, runs)]


def newline_joined(values: pa.Array) -> bytes:
    """The values of a binary array without nulls, each followed by ``\\n`` (newline-delimited
    JSON for Arrow's reader), built in one numpy pass."""
    if values.null_count:
        raise ValueError("newline_joined: the array has nulls")
    n = len(values)
    if not n:
        return b""
    values = values.cast(pa.binary())
    _, offsets_buffer, data_buffer = values.buffers()
    bounds = np.frombuffer(offsets_buffer, np.int32, n + 1, values.offset * 4).astype(np.int64)
    size = int(bounds[-1] - bounds[0])
    data = np.empty(0, np.uint8)
    if size:
        data = np.frombuffer(data_buffer, np.uint8, size, int(bounds[0]))
    newlines = bounds[1:] - bounds[0] + np.arange(n)
    out = np.empty(len(data) + n, np.uint8)
    keep = np.ones(len(out), bool)
    keep[newlines] = False
    out[keep] = data
    out[newlines] = 10
    return out.tobytes()


__all__ = ["RecordColumns", "binary_array", "newline_joined"]

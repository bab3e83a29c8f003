"""The embedded log's records decoded straight into Arrow columns (a DataFrame batch's read).

Kept apart from :mod:`sparkpoint.system.filelog.format`, which the task API's workers import
before they fork: numpy and pyarrow start threads when imported, so they are imported only
where columns are read.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa

from sparkpoint.system.columns import RecordColumns, binary_array
from sparkpoint.system.filelog.format import (
    BODY,
    HEADER_SIZE,
    INDEX_SIZE,
    MAGIC,
    decode_span,
)

#: a record's header and fixed body fields as one numpy record (big-endian, as on disk)
FIXED = np.dtype(
    [
        ("magic", "u1"),
        ("crc", ">u4"),
        ("length", ">u4"),
        ("offset", ">i8"),
        ("timestamp", ">i8"),
        ("klen", ">i4"),
        ("vlen", ">i4"),
    ]
)
assert FIXED.itemsize == HEADER_SIZE + BODY.size
#: an index entry
INDEX_ENTRY = np.dtype([("offset", ">i8"), ("position", ">u8"), ("max_timestamp", ">i8")])
assert INDEX_ENTRY.itemsize == INDEX_SIZE


def index_entries(raw: bytes) -> np.ndarray:
    """Whole index entries of ``raw`` as :data:`INDEX_ENTRY` records (no copy)."""
    return np.frombuffer(raw, INDEX_ENTRY, len(raw) // INDEX_SIZE)


def decode_columns(buf: bytes, offsets: np.ndarray, positions: np.ndarray) -> RecordColumns:
    """:func:`~sparkpoint.system.filelog.format.decode_span` into Arrow columns, in a few numpy
    passes instead of a Python step per record. ``buf`` holds the records at ``positions``
    of the log (``buf`` starts at ``positions[0]``), which must have ``offsets``. Every check
    of ``decode_span`` is made (framing, offsets, lengths, each record's CRC); on a failure
    ``decode_span`` runs instead: it raises its precise :class:`FormatError`, or returns the
    records when only the index's positions were off (it reads the records one after the
    other)."""
    n = len(offsets)
    if n == 0:
        return RecordColumns.from_records([])
    data = np.frombuffer(buf, np.uint8)
    starts = positions.astype(np.int64) - int(positions[0])
    inside = bool((starts + FIXED.itemsize <= len(data)).all())
    fixed = (
        data[starts[:, None] + np.arange(FIXED.itemsize)].view(FIXED).reshape(n)
        if inside
        else np.zeros(n, FIXED)
    )
    body = starts + HEADER_SIZE
    end = body + fixed["length"].astype(np.int64)
    klen = fixed["klen"].astype(np.int64)
    vlen = fixed["vlen"].astype(np.int64)
    kpos = body + BODY.size
    vpos = kpos + np.maximum(klen, 0)
    sound = (
        inside
        and bool((fixed["magic"] == MAGIC).all())
        and bool((fixed["length"] >= BODY.size).all())
        and bool((fixed["offset"] == offsets).all())
        and bool((end[:-1] == starts[1:]).all())
        and int(end[-1]) == len(data)
        and bool((vpos + np.maximum(vlen, 0) == end).all())
    )
    if sound:  # the CRCs: C calls only (a copied slice of bytes checks faster than a view)
        crcs = map(zlib.crc32, map(buf.__getitem__, map(slice, body.tolist(), end.tolist())))
        sound = bool((np.fromiter(crcs, np.uint32, n) == fixed["crc"]).all())
    if not sound:  # the record decoder names the bad record, or (the index's positions
        # were off, the records sound) reads them
        return RecordColumns.from_records(decode_span(buf, offsets.tolist()))
    return RecordColumns(
        pa.array(fixed["offset"].astype(np.int64)).cast(pa.string()),
        binary_array(data, kpos, klen),
        binary_array(data, vpos, vlen),
        pa.array(fixed["timestamp"].astype(np.int64)),
    )


__all__ = ["FIXED", "INDEX_ENTRY", "RecordColumns", "decode_columns", "index_entries"]

"""The embedded log's records decoded straight into Arrow columns (a DataFrame batch's read),
and staged records renumbered in their bytes (an exactly-once publish).

Kept apart from :mod:`sparkpoint.system.filelog.format`, which the task API's workers import
before they fork: numpy and pyarrow start threads when imported, so they are imported only
where columns are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sparkpoint.system.base import Entries
from sparkpoint.system.columns import RecordColumns, binary_array
from sparkpoint.system.filelog.format import (
    BODY,
    HEADER,
    HEADER_SIZE,
    INDEX_SIZE,
    MAGIC,
    count_records,
    crc32,
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


def _checked(
    buf: bytes, offsets: np.ndarray, positions: np.ndarray, crcs_checked: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The fixed fields of the records at ``positions`` of ``buf`` (which starts at
    ``positions[0]``), with each record's start, body start and end in ``buf``, once every
    check of ``decode_span`` passed (framing, offsets, lengths, each record's CRC, unless
    ``crcs_checked``: a checksum of the whole of ``buf`` matched); ``None`` if one failed."""
    n = len(offsets)
    data = np.frombuffer(buf, np.uint8)
    starts = positions.astype(np.int64) - int(positions[0])
    if not bool((starts + FIXED.itemsize <= len(data)).all()):
        return None
    # each record's fixed fields, gathered by row from a window view of the bytes (no copy
    # until the gather): 4x faster than an index per byte
    windows = np.lib.stride_tricks.sliding_window_view(data, FIXED.itemsize)
    fixed = windows[starts].view(FIXED).reshape(n)
    body = starts + HEADER_SIZE
    end = body + fixed["length"].astype(np.int64)
    _kpos, _klen, vpos, vlen = _key_value_spans(fixed, body)
    sound = (
        bool((fixed["magic"] == MAGIC).all())
        and bool((fixed["length"] >= BODY.size).all())
        and bool((fixed["offset"] == offsets).all())
        and bool((end[:-1] == starts[1:]).all())
        and int(end[-1]) == len(data)
        and bool((vpos + np.maximum(vlen, 0) == end).all())
    )
    if sound and not crcs_checked:  # the CRCs: C calls only (a copied slice checks faster)
        crcs = map(crc32, map(buf.__getitem__, map(slice, body.tolist(), end.tolist())))
        sound = bool((np.fromiter(crcs, np.uint32, n) == fixed["crc"]).all())
    return (fixed, starts, body, end) if sound else None


def decode_columns(buf: bytes, offsets: np.ndarray, positions: np.ndarray) -> RecordColumns:
    """:func:`~sparkpoint.system.filelog.format.decode_span` into Arrow columns, in a few numpy
    passes instead of a Python step per record. ``buf`` holds the records at ``positions``
    of the log (``buf`` starts at ``positions[0]``), which must have ``offsets``. Every check
    of ``decode_span`` is made (:func:`_checked`); on a failure ``decode_span`` runs instead:
    it raises its precise :class:`FormatError`, or returns the records when only the index's
    positions were off (it reads the records one after the other)."""
    if len(offsets) == 0:
        return RecordColumns.from_records([])
    checked = _checked(buf, offsets, positions)
    if checked is None:
        return RecordColumns.from_records(decode_span(buf, offsets.tolist()))
    fixed, _starts, body, _end = checked
    data = np.frombuffer(buf, np.uint8)
    kpos, klen, vpos, vlen = _key_value_spans(fixed, body)
    return RecordColumns(
        pa.array(fixed["offset"].astype(np.int64)).cast(pa.string()),
        binary_array(data, kpos, klen),
        binary_array(data, vpos, vlen),
        pa.array(fixed["timestamp"].astype(np.int64)),
    )


def decode_entries(buf: bytes, offsets: np.ndarray, positions: np.ndarray) -> Entries:
    """:func:`decode_columns`'s keys and values as lists of bytes, each sliced straight out of
    ``buf`` (one copy; no Arrow array between), with the same checks."""
    if len(offsets) == 0:
        return Entries([], [], None)
    checked = _checked(buf, offsets, positions)
    if checked is None:
        records = decode_span(buf, offsets.tolist())
        return Entries([r.key for r in records], [r.value for r in records], records[-1].offset)
    fixed, _starts, body, _end = checked
    kpos, klen, vpos, vlen = _key_value_spans(fixed, body)
    return Entries(_slices(buf, kpos, klen), _slices(buf, vpos, vlen), str(int(offsets[-1])))


def _key_value_spans(
    fixed: np.ndarray, body: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where each checked record's key and value start in the buffer, and their lengths (-1
    for a null)."""
    klen = fixed["klen"].astype(np.int64)
    kpos = body + BODY.size
    return kpos, klen, kpos + np.maximum(klen, 0), fixed["vlen"].astype(np.int64)


def _slices(buf: bytes, starts: np.ndarray, lengths: np.ndarray) -> list[bytes | None]:
    """``buf[starts[i] : starts[i] + lengths[i]]``, ``None`` where ``lengths[i] < 0``."""
    ends = starts + np.maximum(lengths, 0)
    out: list[bytes | None] = list(map(buf.__getitem__, map(slice, starts.tolist(), ends.tolist())))
    for i in np.flatnonzero(lengths < 0).tolist():
        out[i] = None
    return out


def compacted(
    buf: bytes, index: bytes, up_to: int | None, drop_tombstones_before_ms: int | None = None
) -> tuple[bytes, bytes, int, int | None] | None:
    """:func:`~sparkpoint.system.filelog.format.compacted` in a few numpy passes and C calls
    instead of a Python step per record: the same bytes, or ``None`` when a record fails one
    of its checks (the caller runs that function then, which names the record). A changelog
    compaction runs in the driver beside the batches, so its Python steps took the driver's
    interpreter from it (docs/performance.md)."""
    entries = index_entries(index)
    n = len(entries)
    if n == 0:
        return b"", b"", 0, None
    offsets = entries["offset"].astype(np.int64)
    positions = entries["position"].astype(np.int64)
    starts = positions - int(positions[0])
    stops = np.append(starts[1:], len(buf))
    bound = n if up_to is None else int(np.searchsorted(offsets, up_to, "left"))
    keep = np.ones(n, bool)
    dropped: int | None = None
    if bound:
        judged = buf if bound == n else buf[: int(stops[bound - 1])]
        checked = _checked(judged, offsets[:bound], positions[:bound])
        if checked is None:
            return None
        fixed, _starts, body, _end = checked
        kpos, klen, _vpos, vlen = _key_value_spans(fixed, body)
        keyed = np.flatnonzero(klen >= 0)
        newest = dict(zip(_slices(judged, kpos[keyed], klen[keyed]), keyed.tolist(), strict=True))
        keep[:bound] = klen < 0  # every keyless record, and the newest of each key
        latest = np.fromiter(newest.values(), np.int64, len(newest))
        keep[latest] = True
        if drop_tombstones_before_ms is not None:
            old = (vlen < 0) & (fixed["timestamp"] < drop_tombstones_before_ms) & (klen >= 0)
            gone = np.zeros(n, bool)
            gone[latest] = old[latest]
            gone[bound - 1] = False  # the last record judged stays: the log's next offset
            if gone.any():
                dropped = int(offsets[np.flatnonzero(gone)[-1]])
                keep &= ~gone
    kept = np.flatnonzero(keep)
    first, last = starts[kept], stops[kept]
    if not bool(((first >= 0) & (first <= last - FIXED.itemsize) & (last <= len(buf))).all()):
        return None
    data = np.frombuffer(buf, np.uint8)
    windows = np.lib.stride_tricks.sliding_window_view(data, FIXED.itemsize)
    stamps = windows[first].view(FIXED).reshape(len(kept))["timestamp"].astype(np.int64)
    sizes = last - first
    out = np.empty(len(kept), INDEX_ENTRY)
    out["offset"] = offsets[kept]
    out["position"] = np.cumsum(sizes) - sizes
    out["max_timestamp"] = np.maximum.accumulate(stamps)
    # the kept records' bytes, a slice per run of neighbours (a whole tail is one)
    breaks = np.flatnonzero(np.diff(kept) != 1) + 1
    run_first = np.concatenate(([0], breaks))
    run_last = np.concatenate((breaks, [len(kept)])) - 1
    spans = map(slice, first[run_first].tolist(), last[run_last].tolist())
    return b"".join(map(buf.__getitem__, spans)), out.tobytes(), len(kept), dropped


@dataclass(frozen=True)
class StagedRecords:
    """Staged parts' records, checked (:func:`check_staged`), ready to be renumbered."""

    buf: bytes
    fixed: np.ndarray
    starts: np.ndarray
    body: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)


def check_staged(
    parts: list[bytes], indexes: Sequence[bytes | None] | None = None
) -> StagedRecords:
    """Staged parts (each a log of records numbered from 0) checked as ``decode_span`` checks
    them, without a Python object per record; a bad record raises its :class:`FormatError`.
    ``indexes``: per part, its index entries when a checksum of the whole part (and of them)
    matched (:mod:`~sparkpoint.system.filelog.staging`), or ``None``. When every part has
    them, the records' positions come from them and their CRCs are not checked one by one;
    the framing still is, so entries that do not fit the part fail the check."""
    buf = b"".join(parts)
    indexed = indexes is not None and all(ix is not None for ix in indexes)
    starts: list[list[int] | np.ndarray | None]
    if indexed:
        assert indexes is not None
        given = [index_entries(ix or b"")["position"] for ix in indexes]
        starts = [g.astype(np.int64) for g in given]
        if not all(_fits(g, len(p)) for g, p in zip(given, parts, strict=True)):
            starts, indexed = [_starts(p) for p in parts], False
    else:  # by the lengths in the headers (one C call a record)
        starts = [_starts(p) for p in parts]
    if all(s is not None for s in starts):
        n = sum(0 if s is None else len(s) for s in starts)
        if n == 0:  # (a part's index of no entries fits only an empty part)
            empty = np.empty(0, np.int64)
            return StagedRecords(b"", np.empty(0, FIXED), empty, empty, empty)
        bases = np.cumsum([0] + [len(p) for p in parts[:-1]])
        positions = np.concatenate(
            [np.asarray(s, np.int64) + b for s, b in zip(starts, bases, strict=True)]
        )
        offsets = np.concatenate(
            [np.arange(0 if s is None else len(s), dtype=np.int64) for s in starts]
        )
        checked = _checked(buf, offsets, positions, crcs_checked=indexed)
        if checked is not None:
            return StagedRecords(buf, *checked)
        if indexed:  # entries that do not fit their part: by the headers instead
            return check_staged(parts)
    for part in parts:  # the record decoder names the bad record
        decode_span(part, list(range(count_records(part))))
    raise AssertionError("records that failed the columnar check passed decode_span")


def _fits(positions: np.ndarray, size: int) -> bool:
    """Whether index positions can be a part's of ``size`` bytes: from 0 (none for an empty
    part), increasing, inside it. The records' framing is checked against them after."""
    if len(positions) == 0:
        return size == 0
    return (
        int(positions[0]) == 0
        and int(positions[-1]) < size
        and bool((positions[1:] > positions[:-1]).all())
    )


def renumber(
    staged: StagedRecords, first_offset: int, base: int, max_ts: int
) -> tuple[bytes, bytes, int]:
    """The checked staged records numbered from ``first_offset`` on, to be written at byte
    ``base`` of a log after records whose largest timestamp is ``max_ts``: (log bytes, index
    bytes, records), the bytes :func:`~sparkpoint.system.filelog.format.encode_many` makes of
    their decoded records, without a Python object per record: the offsets are written over
    and the CRCs made again in numpy and C calls."""
    n = len(staged)
    if n == 0:
        return b"", b"", 0
    body, end, starts = staged.body, staged.end, staged.starts
    out = bytearray(staged.buf)
    data = np.frombuffer(out, np.uint8)
    renumbered = np.arange(first_offset, first_offset + n, dtype=">i8")
    data[body[:, None] + np.arange(8)] = renumbered.view(np.uint8).reshape(n, 8)
    for field, at in (("klen", 16), ("vlen", 20)):  # a null is -1, as encode_many writes it
        null = staged.fixed[field] < 0
        data[(body[null] + at)[:, None] + np.arange(4)] = 0xFF
    view = memoryview(out)
    crcs = np.fromiter(
        map(crc32, map(view.__getitem__, map(slice, body.tolist(), end.tolist()))),
        np.uint32,
        n,
    )
    view.release()
    data[(starts + 1)[:, None] + np.arange(4)] = crcs.astype(">u4").view(np.uint8).reshape(n, 4)
    index = np.empty(n, INDEX_ENTRY)
    index["offset"] = renumbered
    index["position"] = starts + base
    index["max_timestamp"] = np.maximum.accumulate(
        np.maximum(staged.fixed["timestamp"].astype(np.int64), max_ts)
    )
    return bytes(out), index.tobytes(), n


def _starts(part: bytes) -> list[int] | None:
    """Where each record of ``part`` starts, by its header's length; ``None`` when the last
    one is torn."""
    out = []
    pos, size, unpack = 0, len(part), HEADER.unpack_from
    while pos + HEADER_SIZE <= size:
        out.append(pos)
        pos += HEADER_SIZE + unpack(part, pos)[2]
    return out if pos == size else None


__all__ = [
    "FIXED",
    "INDEX_ENTRY",
    "RecordColumns",
    "StagedRecords",
    "check_staged",
    "decode_columns",
    "index_entries",
    "renumber",
]

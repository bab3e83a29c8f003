"""The on-disk format of a filelog partition: records in a log file, fixed-width index entries.

Record: a 9-byte header ``magic (u8) | crc32 (u32) | body length (u32)`` then the body
``offset (i64) | timestamp ms (i64) | key length (i32, -1 = None) | value length (i32) | key |
value``. The CRC covers the whole body. Index entry (24 bytes): ``offset (i64) | position of the
record in the log (u64) | the largest timestamp up to and including this record (i64)``; offsets
and running-max timestamps both increase along the index, so both are found by binary search.
"""

from __future__ import annotations

import array
import bisect
import mmap
import struct
import sys
from collections.abc import Iterable, Sequence

# zlib's CRC-32, computed with SIMD: the same checksums (the format is unchanged), about 3x
# faster for a record of 1 KB (docs/performance.md, "Changelog restore")
from zlib_ng.zlib_ng import crc32 as crc32

from sparkpoint.system.base import Record, RecordFields

MAGIC = 0xA7
HEADER = struct.Struct(">BII")
BODY = struct.Struct(">qqii")
INDEX = struct.Struct(">qQq")
HEADER_SIZE = HEADER.size
INDEX_SIZE = INDEX.size
MIN_TIMESTAMP = -(2**63)
#: a :class:`~sparkpoint.system.base.Record` or a plain tuple of its fields (offset, key, value,
#: timestamp): what :func:`encode_many` reads, by position
assert array.array("q").itemsize * 3 == INDEX_SIZE  # index_offsets reads entries as 3 int64s


class FormatError(Exception):
    """A record that is torn or fails its checksum; ``position`` is its byte position and
    ``offset`` the offset expected there (-1 when unknown)."""

    def __init__(self, position: int, reason: str, offset: int = -1) -> None:
        super().__init__(reason)
        self.position = position
        self.reason = reason
        self.offset = offset


def encode(offset: int, key: bytes | None, value: bytes | None, timestamp: int) -> bytes:
    """One record, ready to append."""
    k = b"" if key is None else key
    v = b"" if value is None else value
    body = BODY.pack(
        offset, timestamp, -1 if key is None else len(k), -1 if value is None else len(v)
    )
    body = body + k + v
    return HEADER.pack(MAGIC, crc32(body), len(body)) + body


def encode_many(
    first_offset: int,
    records: Iterable[RecordFields],
    base: int = 0,
    max_ts: int = MIN_TIMESTAMP,
) -> tuple[bytes, bytes, int]:
    """Records numbered from ``first_offset`` (their own ``offset`` is ignored), to be written
    at byte ``base`` of the log after records whose largest timestamp is ``max_ts``: (log
    bytes, index bytes, records)."""
    parts: list[bytes] = []
    index: list[bytes] = []
    add, note = parts.append, index.append
    pack_body, pack_header, pack_index = BODY.pack, HEADER.pack, INDEX.pack
    pos = base
    offset = first_offset
    for _, key, value, ts in records:  # encode(), inlined: this runs once per record written
        k = b"" if key is None else key
        v = b"" if value is None else value
        body = pack_body(offset, ts, -1 if key is None else len(k), -1 if value is None else len(v))
        body = body + k + v
        add(pack_header(MAGIC, crc32(body), len(body)))
        add(body)
        if ts > max_ts:
            max_ts = ts
        note(pack_index(offset, pos, max_ts))
        pos += HEADER_SIZE + len(body)
        offset += 1
    return b"".join(parts), b"".join(index), offset - first_offset


def index_offsets(raw: bytes | mmap.mmap) -> list[int]:
    """The offsets of whole index entries ``raw``, in one pass in C."""
    return _index_ints(raw)[0::3].tolist()


def _index_ints(raw: bytes | mmap.mmap) -> array.array[int]:
    """Whole index entries ``raw`` as int64s in this machine's byte order (3 per entry)."""
    entries = array.array("q")
    entries.frombytes(raw)
    if sys.byteorder == "little":
        entries.byteswap()  # the index is big-endian
    return entries


def rebase_index(raw: bytes, base: int) -> bytes:
    """Whole index entries ``raw`` with ``base`` taken off each record's position (the
    entries of records kept when the log before ``base`` is cut). The array module rather
    than numpy: a retention pass runs in the driver, where importing numpy cost about 23 MB
    of RSS for the life of the job (docs/performance.md, "A long run")."""
    entries = _index_ints(raw)
    entries[1::3] = array.array("q", [position - base for position in entries[1::3]])
    if sys.byteorder == "little":
        entries.byteswap()  # back to the index's big-endian
    return entries.tobytes()


def compacted(
    buf: bytes,
    index: bytes | mmap.mmap,
    up_to: int | None,
    drop_tombstones_before_ms: int | None = None,
) -> tuple[bytes, bytes, int, int | None]:
    """The log ``buf`` (starting at its first record) with index entries ``index``, keeping
    only the newest record per key among those before offset ``up_to`` (all of them when
    ``None``) and every record from it on, and every keyless one: (log bytes, index bytes,
    records kept, the largest offset of a tombstone dropped or ``None``), the kept records'
    bytes copied as they are (offsets and CRCs unchanged).

    With ``drop_tombstones_before_ms``, a key whose newest record before ``up_to`` is a
    tombstone (a null value) timestamped before it loses that record too: nothing of the key
    is left, and replaying the log from its start gives the same state. (A reader that
    replays from a position before the tombstone, with the key's earlier value, would keep
    it: the caller records how far tombstones went.) The last record judged is always kept,
    so the log keeps its next offset.

    The records it judges (those before ``up_to``) are checked as :func:`decode_span` checks
    them (framing, offset, checksum, and their extent agreeing with the index), so a damaged
    record raises :class:`FormatError` instead of deciding what is dropped; no value is
    decoded and no record re-encoded, which made compacting a changelog during a run cost a
    windowed job a third of its throughput (docs/performance.md)."""
    entries = _index_ints(index)
    offsets, positions = entries[0::3], entries[1::3]
    n = len(offsets)
    base = positions[0] if n else 0
    size = len(buf)
    bound = n if up_to is None else bisect.bisect_left(offsets, up_to)
    newest: dict[bytes, int] = {}
    keyless: list[int] = []
    old_tombstones: set[int] = set()  # tombstones timestamped before the cut-off
    cut_off = MIN_TIMESTAMP if drop_tombstones_before_ms is None else drop_tombstones_before_ms
    unpack_header, unpack_body, body_size = HEADER.unpack_from, BODY.unpack_from, BODY.size
    view = memoryview(buf)
    for i in range(bound):
        pos = positions[i] - base
        want = offsets[i]
        if not 0 <= pos <= size - HEADER_SIZE:
            raise FormatError(pos, "the index points outside the log", want)
        magic, crc, length = unpack_header(buf, pos)
        body = pos + HEADER_SIZE
        end = body + length
        if magic != MAGIC or length < body_size or end > size:
            raise FormatError(pos, "bad magic byte or torn record", want)
        if end != (positions[i + 1] - base if i + 1 < n else size):
            raise FormatError(pos, "record size disagrees with the index", want)
        if crc32(view[body:end]) != crc:
            raise FormatError(pos, "checksum mismatch", want)
        offset, ts, klen, vlen = unpack_body(buf, body)
        if offset != want:
            raise FormatError(pos, f"record says offset {offset}", want)
        if klen < 0:
            keyless.append(i)
        else:
            newest[buf[body + body_size : body + body_size + klen]] = i
            if vlen < 0 and ts < cut_off:
                old_tombstones.add(i)
    judged = [*newest.values(), *keyless]
    dropped: int | None = None
    if old_tombstones:
        gone = old_tombstones.intersection(newest.values())
        gone.discard(bound - 1)  # the last record judged stays: the log's next offset
        if gone:
            judged = [i for i in judged if i not in gone]
            dropped = int(offsets[max(gone)])
    kept = sorted(judged)
    kept += range(bound, n)
    spans = [
        (offsets[i], positions[i] - base, positions[i + 1] - base if i + 1 < n else size)
        for i in kept
    ]
    index_out = _index_of(buf, spans, 0, MIN_TIMESTAMP)
    data = b"".join([buf[start:stop] for _, start, stop in spans])
    return data, index_out, len(kept), dropped


def _index_of(buf: bytes, spans: Sequence[tuple[int, int, int]], at: int, max_ts: int) -> bytes:
    """The index entries of the records at ``spans`` (offset, start, stop) of ``buf`` once
    they are written one after the other from byte ``at`` of a log, after records whose
    largest timestamp is ``max_ts`` (each entry's running maximum made again from the
    records' own timestamps)."""
    out = []
    for offset, start, stop in spans:
        if not 0 <= start <= stop - HEADER_SIZE - BODY.size or stop > len(buf):
            raise FormatError(start, "the index points outside the log", offset)
        ts = BODY.unpack_from(buf, start + HEADER_SIZE)[1]
        if ts > max_ts:
            max_ts = ts
        out.append(INDEX.pack(offset, at, max_ts))
        at += stop - start
    return b"".join(out)


def index_max_timestamp(raw: bytes) -> int:
    """The largest timestamp the last of the index entries ``raw`` records."""
    return int(INDEX.unpack_from(raw, len(raw) - INDEX_SIZE)[2])


def moved_index(raw: bytes, log: bytes, old_start: int, new_start: int, max_ts: int) -> bytes:
    """The index entries ``raw`` of the records ``log`` holds (which were at byte
    ``old_start`` of their log) for the same records at byte ``new_start`` of another, after
    records whose largest timestamp is ``max_ts``."""
    entries = list(INDEX.iter_unpack(raw))
    starts = [position - old_start for _offset, position, _max in entries]
    stops = [*starts[1:], len(log)] if starts else []
    spans = [(e[0], a, b) for e, a, b in zip(entries, starts, stops, strict=True)]
    return _index_of(log, spans, new_start, max_ts)


def record_size_at(buf: bytes | memoryview, pos: int) -> int:
    """Total size of the complete, valid record at ``pos``, or raise :class:`FormatError`."""
    if pos + HEADER_SIZE > len(buf):
        raise FormatError(pos, "torn header")
    magic, crc, length = HEADER.unpack_from(buf, pos)
    if magic != MAGIC:
        raise FormatError(pos, f"bad magic byte {magic:#x}")
    end = pos + HEADER_SIZE + length
    if length < BODY.size or end > len(buf):
        raise FormatError(pos, "torn record")
    if crc32(buf[pos + HEADER_SIZE : end]) != crc:
        raise FormatError(pos, "checksum mismatch")
    return HEADER_SIZE + int(length)


def decode_at(buf: bytes | memoryview, pos: int) -> tuple[Record, int, int]:
    """The record at ``pos``, its offset and its total size; :class:`FormatError` if bad."""
    size = record_size_at(buf, pos)
    body = pos + HEADER_SIZE
    offset, ts, klen, vlen = BODY.unpack_from(buf, body)
    kpos = body + BODY.size
    vpos = kpos + max(klen, 0)
    if vpos + max(vlen, 0) != pos + size:
        raise FormatError(pos, "lengths disagree with the record size")
    key = None if klen < 0 else bytes(buf[kpos:vpos])
    value = None if vlen < 0 else bytes(buf[vpos : vpos + vlen])
    return Record(str(offset), key, value, ts), offset, size


def count_records(buf: bytes) -> int:
    """How many records ``buf`` holds by their headers alone (a torn last one counts; the
    decoder that reads them then says it is torn)."""
    n = pos = 0
    size = len(buf)
    unpack = HEADER.unpack_from
    while pos + HEADER_SIZE <= size:
        pos += HEADER_SIZE + unpack(buf, pos)[2]
        n += 1
    return n + (pos < size)


def decode_span(buf: bytes, offsets: list[int]) -> list[Record]:
    """Decode consecutive records from the start of ``buf``, which must have ``offsets``.

    The hot read path: one pass, no per-record function calls. Any record whose framing,
    checksum or offset disagrees raises :class:`FormatError` naming the expected offset.
    """
    out: list[Record] = []
    append = out.append
    new = tuple.__new__  # Record(...) without the named tuple's Python-level __new__
    unpack_header = HEADER.unpack_from
    unpack_body = BODY.unpack_from
    view = memoryview(buf)
    size = len(buf)
    body_size = BODY.size
    pos = 0
    for want in offsets:
        if pos + HEADER_SIZE > size:
            raise FormatError(pos, "torn header", want)
        magic, crc, length = unpack_header(buf, pos)
        body = pos + HEADER_SIZE
        end = body + length
        if magic != MAGIC or length < body_size or end > size:
            raise FormatError(pos, "bad magic byte or torn record", want)
        if crc32(view[body:end]) != crc:
            raise FormatError(pos, "checksum mismatch", want)
        offset, ts, klen, vlen = unpack_body(buf, body)
        if offset != want:
            raise FormatError(pos, f"record says offset {offset}", want)
        kpos = body + body_size
        vpos = kpos + (klen if klen > 0 else 0)
        if vpos + (vlen if vlen > 0 else 0) != end:
            raise FormatError(pos, "lengths disagree with the record size", want)
        key = None if klen < 0 else buf[kpos:vpos]
        append(new(Record, (str(offset), key, None if vlen < 0 else buf[vpos:end], ts)))
        pos = end
    return out

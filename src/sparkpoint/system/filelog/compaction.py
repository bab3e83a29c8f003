"""A filelog partition's compaction and retention: a new generation written with the
records kept, and ``CURRENT`` switched to it atomically (``TOMBSTONES`` first, when tombstones
are dropped)."""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from sparkpoint.errors import CorruptRecordError
from sparkpoint.fsutil import atomic_write
from sparkpoint.system.base import Record
from sparkpoint.system.filelog import format as fmt
from sparkpoint.system.filelog.files import TOMBSTONES
from sparkpoint.system.filelog.transactions import LogTransactions

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)
#: bytes a retention pass copies per system call (:class:`_FileTail`)
_COPY_CHUNK = 64 * 1024 * 1024


@dataclass(frozen=True)
class _Compaction:
    """A partition's records compacted from a snapshot (:meth:`PartitionLog.compact`): its
    generation (-1: unknown), index entries and end position, how many records it had, and
    the log and index bytes of the records kept, and the largest offset of a tombstone it
    dropped (None: none)."""

    gen: int
    raw: bytes
    end: int
    records: int
    data: bytes
    entries: bytes
    kept: int
    dropped: int | None = None


@dataclass(frozen=True)
class _FileTail:
    """The bytes of ``path`` from ``start`` to its end, copied to another file by the kernel
    (``os.sendfile``) rather than through Python objects."""

    path: Path
    start: int

    def copy_to(self, out: BinaryIO) -> None:
        out.flush()
        with open(self.path, "rb") as src:
            end = os.fstat(src.fileno()).st_size
            at = self.start
            while at < end:
                sent = os.sendfile(out.fileno(), src.fileno(), at, min(end - at, _COPY_CHUNK))
                if sent == 0:
                    raise OSError(f"{self.path} ended at byte {at} while being copied")
                at += sent


class LogCompaction(LogTransactions):
    """Compaction (the newest record per key; tombstones dropped after a while) and retention."""

    def compact(
        self, up_to: int | None = None, drop_tombstones_before_ms: int | None = None
    ) -> tuple[int, int]:
        """Keep only the newest record per key (keyless records are all kept); with ``up_to``,
        only among the records before that offset, keeping every record from it on.

        Offsets are preserved (they become sparse). Deletes (value ``None``) are kept as
        tombstones so that readers replaying the stream learn of them, except those
        timestamped before ``drop_tombstones_before_ms`` (Kafka's ``delete.retention.ms``):
        their keys go from the log altogether, and ``TOMBSTONES`` records how far
        (:meth:`tombstones_dropped_through`). Replaying the compacted partition from its start
        up to any offset at or after ``up_to`` gives the same value per key as before. Returns
        records before and after. Readers see the old or the new generation, never a mix.
        """
        committed = self.committed_end()  # uncommitted records may yet be aborted
        if committed is not None:
            up_to = committed if up_to is None else min(up_to, committed)
        # without the lock: the task's appends go on
        plan = self._compaction(up_to, drop_tombstones_before_ms)
        if plan.kept == plan.records:
            return plan.records, plan.kept
        with self._locked():
            log_path, index_path = self._files()
            self._recover(log_path, index_path)
            if not self._switch_compacted(plan):  # the log moved under it: again, locked
                plan = self._compaction(up_to, drop_tombstones_before_ms)
                if plan.kept != plan.records:
                    switched = self._switch_compacted(plan)
                    assert switched, "nothing moves under the lock"
            return plan.records, plan.kept

    def tombstones_dropped_through(self) -> int | None:
        """The largest offset of a tombstone compaction dropped (None: none ever was)."""
        try:
            return int((self.path / TOMBSTONES).read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            raise CorruptRecordError(
                f"{self.label}: {self.path / TOMBSTONES} is not an offset; write the partition's "
                "newest offset there (a reader behind it then rebuilds its copy from the start)"
            ) from None

    def _compaction(self, up_to: int | None, drop_tombstones_before_ms: int | None) -> _Compaction:
        """The compacted records of a snapshot of the current generation (none kept of none
        when it is empty), or :class:`CorruptRecordError` naming a damaged record it would
        judge."""
        gen = self._gen()
        with self._snapshot() as (index, log_file):
            n = len(index)
            if n == 0:
                return _Compaction(gen, b"", 0, 0, b"", b"", 0)
            raw = index.raw(0, n)
            base, last = index[0][1], index[n - 1][1]
            log_file.seek(base)
            buf = log_file.read()  # to the end of the file: records appended meanwhile too
        from sparkpoint.system.filelog import columnar  # numpy: only where it runs

        try:
            end = last - base + fmt.record_size_at(buf, last - base)
            done = columnar.compacted(buf[:end], raw, up_to, drop_tombstones_before_ms)
            if done is None:  # a damaged record: the record decoder names it
                done = fmt.compacted(buf[:end], raw, up_to, drop_tombstones_before_ms)
            data, entries, kept, dropped = done
        except fmt.FormatError as exc:
            offset = exc.offset if exc.offset >= 0 else fmt.index_offsets(raw)[-1]
            raise self._corrupt(offset, exc.reason) from None
        gen = gen if self._gen() == gen else -1  # switched meanwhile: which one is unknown
        return _Compaction(gen, raw, base + end, n, data, entries, kept, dropped)

    def _switch_compacted(self, plan: _Compaction) -> bool:
        """Switch to ``plan``'s records, then every record appended after its snapshot, as
        they are (under the lock); False when the log changed otherwise since the snapshot
        (another compaction, retention, a repair), which leaves it as it is."""
        with self._snapshot() as (index, log_file):
            n = len(index)
            same = self._gen() == plan.gen and n >= plan.records
            if not same or index.raw(0, plan.records) != plan.raw:
                return False
            tail_index = index.raw(plan.records, n)
            log_file.seek(plan.end)
            tail = log_file.read()  # exact: the tail was recovered under this lock
        if plan.dropped is not None:  # before the switch: no reader misses it
            before = self.tombstones_dropped_through()
            through = plan.dropped if before is None else max(before, plan.dropped)
            atomic_write(self.path / TOMBSTONES, str(through).encode())
        last_max = fmt.index_max_timestamp(plan.entries)
        moved = fmt.moved_index(tail_index, tail, plan.end, len(plan.data), last_max)
        first = fmt.index_offsets(plan.entries[: fmt.INDEX_SIZE])[0]
        self._switch(plan.data + tail, plan.entries + moved, first)
        return True

    def delete_before(self, offset: int) -> int:
        """Drop every record before ``offset``, as retention does (the oldest offset moves up;
        offsets are kept, and never reused). The records kept are copied as they are, bytes and
        index, without decoding them. Returns how many records were dropped."""
        with self._locked():
            log_path, index_path = self._files()
            self._recover(log_path, index_path)
            with self._snapshot() as (index, log_file):
                n = len(index)
                i = index.first_at_or_after(offset)
                if i == 0:
                    return 0
                first = index[i][0] if i < n else index[-1][0] + 1
                base = index[i][1] if i < n else os.fstat(log_file.fileno()).st_size
                entries = fmt.rebase_index(index.raw(i, n), base) if i < n else b""
            # the kept records go from file to file: a retention pass of a large partition
            # holds none of them in memory (reading them whole was a one-time driver RSS step
            # of about 30 MB in a long run: the allocator keeps what it once handed out)
            self._switch(_FileTail(log_path, base), entries, first)
            return i

    def retention_start(
        self, retention_ms: int | None, retention_bytes: int | None, now_ms: int
    ) -> int:
        """The oldest offset retention keeps: the records within the newest
        ``retention_bytes`` bytes of the log and not older than ``retention_ms`` (by the
        index's timestamps: a record is kept while any record at or before it is that new, so
        an out-of-order timestamp keeps more, never less). The upcoming offset when nothing
        is kept; ``None`` for both keeps everything."""
        with self._snapshot() as (index, log_file):
            n = len(index)
            if n == 0:
                return self._upcoming(index)
            first = 0
            if retention_bytes is not None:
                size = os.fstat(log_file.fileno()).st_size
                first = bisect.bisect_left(
                    range(n), True, key=lambda i: size - index[i][1] <= retention_bytes
                )
            if retention_ms is not None:
                first = max(first, index.first_with_timestamp(now_ms - retention_ms))
            return index[first][0] if first < n else self._upcoming(index)

    def _rewrite(self, keep: Sequence[Record], start: int = 0, floor: int | None = None) -> None:
        """Switch atomically to a new generation holding ``keep`` (under the lock); with no
        record kept, the next append gets offset ``start``; ``floor`` raises the least offset
        of the next append (kept as it is by default)."""
        parts, index_bytes, pos, max_ts = [], bytearray(), 0, -(2**63)
        for rec in keep:
            data = fmt.encode(int(rec.offset), rec.key, rec.value, rec.timestamp)
            max_ts = max(max_ts, rec.timestamp)
            index_bytes += fmt.INDEX.pack(int(rec.offset), pos, max_ts)
            parts.append(data)
            pos += len(data)
        first = int(keep[0].offset) if keep else start
        self._switch(b"".join(parts), bytes(index_bytes), first, floor)

    def _switch(
        self, data: bytes | _FileTail, entries: bytes, start: int, floor: int | None = None
    ) -> None:
        """Switch atomically to a new generation of log ``data`` (bytes, or the tail of the
        current log file) and index ``entries`` (under the lock); ``start``: its first offset
        (the next append's when it is empty)."""
        log_path, index_path = self._files()
        gen = self._gen() + 1
        new_log, new_index = self.path / f"{gen}.log", self.path / f"{gen}.index"
        for path, content in ((new_log, data), (new_index, entries)):
            with open(path, "wb") as f:
                if isinstance(content, _FileTail):
                    content.copy_to(f)
                else:
                    f.write(content)
                f.flush()
                os.fsync(f.fileno())
        floor = self._current_all()[2] if floor is None else floor
        self._write_current(gen, start, floor)
        log_path.unlink(missing_ok=True)
        index_path.unlink(missing_ok=True)

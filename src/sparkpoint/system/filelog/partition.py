"""One partition of a filelog stream on disk.

Files in the partition directory: ``CURRENT`` names the generation in use (a number), then the
offset a generation with no records starts at (so that offsets never repeat after retention
deleted every record; Kafka's log start offset), then the least offset the next append may take
(raised by :meth:`PartitionLog.repair`, so that offsets cut from the log are never handed out
again); the generation's records are in ``<gen>.log`` and its index in ``<gen>.index``; ``lock``
is the cross-process lock; ``LOST`` lists the offset ranges a repair cut (JSON lines). Compaction
writes a new generation and switches ``CURRENT`` atomically; ``TOMBSTONES`` holds the largest
offset of a tombstone a compaction dropped (written before the switch), so that a reader that
last read before it knows its copy may hold keys deleted since. ``staged/``, ``PUBLISHED`` and
``PUBLISHING`` hold exactly-once output (:mod:`sparkpoint.system.filelog.publishing`): readers never
read at or past the first offset ``PUBLISHING`` names, and whoever takes the lock next finishes
a publish a crash interrupted. ``COMMITTED`` and ``ABORTED`` make a partition *transactional*
(an exactly-once job's changelog): read-committed readers read only below the offset
``COMMITTED`` names, which moves up when a checkpoint covering those records is written, and
never read the offset ranges ``ABORTED`` lists (JSON lines: records a restore discarded).

Contracts:

* Appends take an exclusive ``flock`` on ``lock``, so any number of processes may append to one
  partition; offsets are assigned under the lock (last offset + 1) and never repeat.
* An append writes the records, fsyncs the log, then writes and fsyncs their index entries.
  Readers only read records the index lists, so they never see a torn or half-written record.
* Every append first *recovers* the tail: complete valid records past the index are indexed,
  and a torn tail past the index (a crash mid-write, never read by anyone) is cut off.
* A publish of staged records is one append whose first offset ``PUBLISHING`` names while it
  runs: readers stop before it, so nobody sees part of a transaction.
* ``COMMITTED`` only moves up, and a range is aborted only above it: a record a committed reader
  read is never aborted. Compaction judges only committed records.
* A record the index lists was durable before it was listed, and readers may have read it and
  committed past it: when it is damaged (checksum, or the log ends inside it) that is
  corruption, reported with the partition and offset, never skipped and never cut as a torn
  tail. Only an explicit :meth:`PartitionLog.repair` removes it: its offset is not reused, the
  range is recorded in ``LOST``, and every read over that range logs it as lost.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, BinaryIO, TypeVar

from sparkpoint.errors import UserError
from sparkpoint.fsutil import USER_ERRNOS
from sparkpoint.system.base import Entries, PartitionMetadata, Record, RecordFields
from sparkpoint.system.filelog import format as fmt
from sparkpoint.system.filelog.files import _Index, _next_offset
from sparkpoint.system.filelog.publishing import finish_interrupted
from sparkpoint.system.filelog.repair import LogRepair

if TYPE_CHECKING:
    import numpy as np

    from sparkpoint.system.columns import RecordColumns
    from sparkpoint.system.filelog.columnar import StagedRecords

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class PartitionLog(LogRepair):
    """Reads and appends one partition. Instances are cheap and hold no open files.

    Its sections, one module each, build on one another: files (:mod:`.files`), transactions
    (:mod:`.transactions`), compaction and retention (:mod:`.compaction`), repair
    (:mod:`.repair`); reading and appending are here."""

    def metadata(self, committed: bool = False) -> PartitionMetadata:
        """Oldest, newest and upcoming offset; ``committed``: of what read-committed readers
        read (up to ``COMMITTED``)."""
        with self._snapshot() as (index, _log):
            stable = self.publishing_from()
            if committed and (bound := self.committed_end()) is not None:
                stable = bound if stable is None else min(stable, bound)
            n = len(index) if stable is None else index.first_at_or_after(stable)
            _gen, start, floor = self._current_all()
            if len(index) == 0:  # from where it starts: a reader there is not out of range
                return PartitionMetadata(str(start), None, str(_next_offset(index, start, floor)))
            first = index[0][0]
            if start < first <= floor:  # a reader at the offsets a repair removed before it
                first = start
            if n == 0:
                return PartitionMetadata(str(first), None, str(index[0][0]))
            last = index[n - 1][0]
            if n < len(index):  # up to the records not readable yet (past a repair's floor)
                upcoming = max(last + 1, min(floor, index[n][0]))
            else:
                upcoming = _next_offset(index, start, floor)
            return PartitionMetadata(str(first), str(last), str(upcoming))

    def empty_through(self, start: int, end: int) -> int:
        """The last offset before ``end`` up to which, from ``start``, no record is and none
        will be: before the next record at or after ``start``, or (with none) before the
        offset the next append gets. ``start - 1`` when ``start`` may still get one."""
        with self._snapshot() as (index, _log):
            i = index.first_at_or_after(start)
            following = index[i][0] if i < len(index) else self._upcoming(index)
        return min(following, end) - 1

    def read(
        self,
        start: int,
        end: int,
        max_records: int | None,
        max_bytes: int | None = None,
        committed: bool = False,
    ) -> list[Record]:
        """Records with ``start <= offset < end`` (at most ``max_records``, and those starting
        within ``max_bytes`` of the first one's start, see :meth:`_span`); ``committed``: only
        what read-committed readers read (:meth:`committed_bounds`)."""
        decoded = self._decoded(
            start,
            end,
            max_records,
            max_bytes,
            lambda buf, index, i, j: fmt.decode_span(buf, index.offsets(i, j)),
            committed,
        )
        return [] if decoded is None else decoded

    def read_columns(
        self,
        start: int,
        end: int,
        max_records: int | None,
        max_bytes: int | None = None,
        committed: bool = False,
    ) -> RecordColumns:
        """:meth:`read` as Arrow columns, decoded without a Python object per record."""
        from sparkpoint.system.filelog import columnar

        decoded = self._decoded_columnar(
            start, end, max_records, max_bytes, columnar.decode_columns, committed
        )
        return columnar.RecordColumns.from_records([]) if decoded is None else decoded

    def read_entries(
        self,
        start: int,
        end: int,
        max_records: int | None,
        max_bytes: int | None = None,
        committed: bool = False,
    ) -> Entries:
        """:meth:`read`'s keys and values, sliced out of the log's bytes (a replay's read)."""
        from sparkpoint.system.filelog import columnar

        decoded = self._decoded_columnar(
            start, end, max_records, max_bytes, columnar.decode_entries, committed
        )
        return Entries([], [], None) if decoded is None else decoded

    def _decoded_columnar(
        self,
        start: int,
        end: int,
        max_records: int | None,
        max_bytes: int | None,
        decode: Callable[[bytes, np.ndarray, np.ndarray], _T],
        committed: bool,
    ) -> _T | None:
        """:meth:`_decoded` by a columnar decoder, given the records' offsets and positions
        from the index."""
        from sparkpoint.system.filelog import columnar

        def by_index(buf: bytes, index: _Index, i: int, j: int) -> _T:
            entries = columnar.index_entries(index.raw(i, j))
            return decode(buf, entries["offset"], entries["position"])

        return self._decoded(start, end, max_records, max_bytes, by_index, committed)

    def _decoded(
        self,
        start: int,
        end: int,
        max_records: int | None,
        max_bytes: int | None,
        decode: Callable[[bytes, _Index, int, int], _T],
        committed: bool = False,
    ) -> _T | None:
        """What ``decode(log bytes, index, i, j)`` makes of the records with ``start <= offset
        < end`` (bounded as :meth:`_span` says; index positions ``i`` to ``j - 1``) that are
        readable (not being published; with ``committed``, as :meth:`committed_bounds` says);
        ``None`` if there are none. A record that fails its checks raises
        :class:`CorruptRecordError` naming its offset."""
        self._report_lost(start, end)
        with self._snapshot() as (index, log_file):
            stable = self.publishing_from()
            end = end if stable is None else min(end, stable)
            if committed:
                start, end = self._committed_bounds(index, start, end)
            span = self._span(index, log_file, start, end, max_records, max_bytes)
            if span is None:
                return None
            buf, i, j = span
            try:
                return decode(buf, index, i, j)
            except fmt.FormatError as exc:
                raise self._corrupt(exc.offset, exc.reason) from None

    def _span(
        self,
        index: _Index,
        log_file: BinaryIO,
        start: int,
        end: int,
        max_records: int | None,
        max_bytes: int | None = None,
    ) -> tuple[bytes, int, int] | None:
        """The log bytes of the records with ``start <= offset < end`` (at most
        ``max_records``) and their index positions ``i`` to ``j - 1``; ``None`` if none.

        With ``max_bytes``, only the records that start within ``max_bytes`` of the first
        one's start (the first always): at most ``max_bytes`` plus one record in memory."""
        i = index.first_at_or_after(start)
        j = index.first_at_or_after(end)
        if max_records is not None:
            j = min(j, i + max_records)
        if i >= j:
            return None
        first_pos = index[i][1]
        if max_bytes is not None and j - i > 1:
            limit = first_pos + max_bytes
            j = i + 1 + bisect.bisect_right(range(i + 1, j), limit, key=lambda k: index[k][1])
        last_offset, last_pos, _ = index[j - 1]
        log_file.seek(last_pos)
        head = log_file.read(fmt.HEADER_SIZE)
        if len(head) < fmt.HEADER_SIZE:
            raise self._corrupt(last_offset, "indexed record is missing from the log")
        end_pos = last_pos + fmt.HEADER_SIZE + fmt.HEADER.unpack(head)[2]
        log_file.seek(first_pos)
        return log_file.read(end_pos - first_pos), i, j

    def offset_for_timestamp(self, ts: int) -> int:
        """First offset whose timestamp is >= ``ts``; the upcoming offset if none is (past
        what retention or a repair removed)."""
        with self._snapshot() as (index, _log):
            i = index.first_with_timestamp(ts)
            return index[i][0] if i < len(index) else self._upcoming(index)

    def append(self, records: Sequence[RecordFields]) -> tuple[int, int]:
        """Append durably (offsets are assigned here: the records' own are ignored); returns
        the first and last offsets assigned."""
        if not records:
            raise ValueError("nothing to append")
        try:
            return self._append(records)
        except OSError as exc:
            if exc.errno not in USER_ERRNOS:
                raise  # transient ones stay OSErrors: callers may retry them
            raise UserError(
                f"cannot append to {self.label} under {self.path}: {exc.strerror} (a full disk, "
                f"a quota or a read-only directory? fix it and retry: records of this append "
                f"may be in the log already, so a retry can write them twice)"
            ) from None

    def _append(self, records: Sequence[RecordFields]) -> tuple[int, int]:
        with self._locked():
            return self.append_locked(records)

    def next_offset_locked(self) -> int:
        """The offset the next append takes, the tail recovered first (under the lock)."""
        return self._recover(*self._files())[0]

    def append_locked(self, records: Sequence[RecordFields]) -> tuple[int, int]:
        """:meth:`append` for a caller that holds the lock (:meth:`locked`)."""
        return self._append_locked(lambda first, at, ts: fmt.encode_many(first, records, at, ts))

    def append_staged_locked(self, staged: StagedRecords) -> tuple[int, int]:
        """:meth:`append_locked` of checked staged records, as they are: renumbered in their
        bytes (:func:`columnar.renumber`), not decoded."""
        from sparkpoint.system.filelog import columnar  # numpy: only where it runs

        return self._append_locked(lambda first, at, ts: columnar.renumber(staged, first, at, ts))

    def _append_locked(
        self, encode: Callable[[int, int, int], tuple[bytes, bytes, int]]
    ) -> tuple[int, int]:
        """Append what ``encode(first offset, byte position, largest timestamp so far)``
        makes: (log bytes, index bytes, records); the first and last offsets appended."""
        log_path, index_path = self._files()
        next_offset, max_ts = self._recover(log_path, index_path)
        with open(log_path, "ab") as log_file:
            data, index_bytes, n = encode(next_offset, log_file.tell(), max_ts)
            log_file.write(data)
            log_file.flush()
            os.fsync(log_file.fileno())
        with open(index_path, "ab") as index_file:
            index_file.write(index_bytes)
            index_file.flush()
            os.fsync(index_file.fileno())
        return next_offset, next_offset + n - 1

    def _finish_publish(self) -> None:
        finish_interrupted(self)

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
import contextlib
import fcntl
import json
import logging
import mmap
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

from sparkpoint.errors import CorruptRecordError, UserError
from sparkpoint.fsutil import USER_ERRNOS, atomic_write
from sparkpoint.system.base import Entries, PartitionMetadata, Record, RecordFields
from sparkpoint.system.filelog import format as fmt
from sparkpoint.system.filelog.publishing import PUBLISHING, finish_interrupted

if TYPE_CHECKING:
    import numpy as np

    from sparkpoint.system.columns import RecordColumns
    from sparkpoint.system.filelog.columnar import StagedRecords

log = logging.getLogger(__name__)
_T = TypeVar("_T")
#: bytes a retention pass copies per system call (:class:`_FileTail`)
_COPY_CHUNK = 64 * 1024 * 1024


class _Index(Sequence[tuple[int, int, int]]):
    """A read view of an index file's complete entries (offset, position, max timestamp)."""

    def __init__(self, data: bytes | mmap.mmap) -> None:
        self._data = data
        self._n = len(data) // fmt.INDEX_SIZE

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> tuple[int, int, int]:  # type: ignore[override]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        entry: tuple[int, int, int] = fmt.INDEX.unpack_from(self._data, i * fmt.INDEX_SIZE)
        return entry

    def raw(self, i: int, j: int) -> bytes:
        """The bytes of entries ``i`` to ``j - 1``."""
        return self._data[i * fmt.INDEX_SIZE : j * fmt.INDEX_SIZE]

    def offsets(self, i: int, j: int) -> list[int]:
        """The offsets of entries ``i`` to ``j - 1``, read in one pass."""
        return fmt.index_offsets(self.raw(i, j))

    def first_at_or_after(self, offset: int) -> int:
        """Index position of the first record with an offset >= ``offset``."""
        return bisect.bisect_left(range(self._n), offset, key=lambda i: self[i][0])

    def first_with_timestamp(self, ts: int) -> int:
        """Index position of the first record whose timestamp is >= ``ts``."""
        return bisect.bisect_left(range(self._n), ts, key=lambda i: self[i][2])


#: the file holding the largest offset of a tombstone compaction dropped
TOMBSTONES = "TOMBSTONES"
#: the file naming the first offset read-committed readers may not read yet
COMMITTED = "COMMITTED"
#: the file listing the offset ranges read-committed readers never read
ABORTED = "ABORTED"


def _next_offset(index: _Index, start: int, floor: int) -> int:
    """:meth:`PartitionLog._upcoming` given ``CURRENT``'s start offset and floor."""
    return max(index[-1][0] + 1 if len(index) else start, floor)


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


class PartitionLog:
    """Reads and appends one partition. Instances are cheap and hold no open files."""

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label  # "system.stream partition N", for messages
        self._lost = os.path.join(path, "LOST")  # a str: reads check it without pathlib
        self._publishing = os.path.join(path, PUBLISHING)
        self._committed = os.path.join(path, COMMITTED)
        self._aborted = os.path.join(path, ABORTED)

    def publishing_from(self) -> int | None:
        """The first offset of a publish in progress, or None: readers stop before it. Read
        after the index snapshot, so a publish that began later is not in that snapshot."""
        try:
            with open(self._publishing, "rb") as f:
                return int(json.loads(f.read())["first"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            raise CorruptRecordError(
                f"{self.label}: {self._publishing} is damaged; it names the first offset of a "
                f"publish of staged output that did not finish (delete it only if nothing was "
                f"appended after the last record `sparkpoint stream read` shows)"
            ) from None

    # -- transactions: records a checkpoint commits (an exactly-once job's changelog)
    def committed_end(self) -> int | None:
        """The first offset read-committed readers may not read yet; ``None`` when the
        partition is not transactional (every record is committed)."""
        try:
            with open(self._committed, "rb") as f:
                return int(f.read())
        except FileNotFoundError:
            return None
        except ValueError:
            raise CorruptRecordError(
                f"{self.label}: {self._committed} is not an offset; it names the first offset a "
                "checkpoint has not committed yet: write the changelog offset of the owning "
                "task's last checkpoint there, plus one"
            ) from None

    def commit_through(self, end: int | None) -> int | None:
        """Make the records below ``end`` committed (``COMMITTED`` only moves up; the first
        call makes the partition transactional); ``None`` makes every record committed and the
        partition not transactional. Durable when it returns; the committed end it leaves."""
        with self._locked():
            if end is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._committed)
                return None
            now = self.committed_end()
            if now is None or end > now:
                atomic_write(Path(self._committed), str(end).encode())
                return end
            return now

    def abort(self, first: int, end: int) -> None:
        """Records ``first <= offset < end`` are never read by read-committed readers (a
        restore discarded them). Only records not committed can be aborted: a reader may have
        read a committed one. Durable when it returns."""
        if first >= end:
            return
        with self._locked():
            committed = self.committed_end()
            if committed is not None and first < committed:
                raise UserError(
                    f"{self.label}: records {first}..{end - 1} cannot be aborted: those below "
                    f"{committed} are committed, and readers may have read them"
                )
            line = json.dumps({"first": first, "end": end}).encode() + b"\n"
            with open(self._aborted, "a+b") as f:
                f.seek(0)
                text = f.read()
                if text and not text.endswith(b"\n"):  # an abort that never returned
                    f.truncate(text.rfind(b"\n") + 1)
                f.write(line)
                f.flush()
                os.fsync(f.fileno())

    def aborted_ranges(self) -> list[tuple[int, int]]:
        """The aborted offset ranges ``(first, end)`` (end exclusive), by first offset."""
        try:
            with open(self._aborted) as f:
                lines = f.read().split("\n")
        except FileNotFoundError:
            return []
        lines.pop()  # "" after the last newline, or a line whose abort never returned
        out = []
        for n, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
                out.append((int(entry["first"]), int(entry["end"])))
            except (ValueError, KeyError, TypeError):
                raise CorruptRecordError(
                    f"{self.label}: line {n} of {self._aborted} is damaged; it lists offset "
                    'ranges no committed reader may read ({"first": F, "end": E}): repair the '
                    "line from the restores' log messages"
                ) from None
        return sorted(out)

    def committed_bounds(self, start: int, end: int) -> tuple[int, int]:
        """The part ``[start', end')`` of ``[start, end)`` a read-committed reader reads next
        (see :meth:`_committed_bounds`)."""
        with self._snapshot() as (index, _log):
            return self._committed_bounds(index, start, end)

    def _committed_bounds(self, index: _Index, start: int, end: int) -> tuple[int, int]:
        """The part ``[start', end')`` of ``[start, end)`` a read-committed reader reads next:
        below ``COMMITTED``, from past the aborted ranges ``start`` is in (and the offsets
        without a record before one: compaction removed them), up to the next aborted range
        (a read never spans one)."""
        bound = self.committed_end()
        if bound is not None:
            end = min(end, bound)
        if os.path.exists(self._aborted):
            for first, stop in self.aborted_ranges():
                if stop <= start:
                    continue
                if first <= start or index.first_at_or_after(start) == index.first_at_or_after(
                    first
                ):
                    start = max(start, stop)
                    continue
                end = min(end, first)
                break
        return start, end

    # -- files
    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        for name in ("0.log", "0.index", "lock"):
            (self.path / name).touch()
        if not (self.path / "CURRENT").exists():
            self._write_current(0)

    def _write_current(self, gen: int, start: int = 0, floor: int = 0) -> None:
        text = f"{gen} {start}" if floor <= 0 else f"{gen} {start} {floor}"
        atomic_write(self.path / "CURRENT", text.encode())

    def _current(self) -> tuple[int, int]:
        """(generation, offset an empty generation starts at); "N" alone is generation N."""
        gen, start, _floor = self._current_all()
        return gen, start

    def _current_all(self) -> tuple[int, int, int]:
        """(generation, offset an empty generation starts at, least next offset)."""
        try:
            parts = (self.path / "CURRENT").read_text().split()
            values = [int(p) for p in parts[:3]]
        except FileNotFoundError:
            raise self._missing() from None
        except (UnicodeDecodeError, ValueError):
            raise CorruptRecordError(
                f"{self.label}: {self.path / 'CURRENT'} is not '<generation> <start offset>'; "
                f"write the number of the newest <N>.log there (and its first offset)"
            ) from None
        values += [0] * (3 - len(values))
        return values[0], values[1], values[2]

    def _missing(self) -> CorruptRecordError:
        return CorruptRecordError(
            f"{self.label}: {self.path} is missing or has no CURRENT file, though the stream's "
            f"stream.json lists this partition; restore the directory, or recreate the stream "
            f"(its readers then stop until a startpoint says where they resume)"
        )

    def _gen(self) -> int:
        return self._current()[0]

    def _files(self) -> tuple[Path, Path]:
        gen = self._gen()
        return self.path / f"{gen}.log", self.path / f"{gen}.index"

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """The appenders' lock, for a caller that appends several times as one step."""
        return self._locked()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            lock = open(self.path / "lock", "a+b")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            raise self._missing() from None
        with lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                if os.path.exists(self._publishing):  # its publisher died holding the lock
                    finish_interrupted(self)
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[tuple[_Index, BinaryIO]]:
        """The index and log of the current generation, consistent with each other.

        An index that does not cover the whole log (lost, truncated or emptied; or an append
        that has written the log but not yet its index) is repaired under the appenders' lock
        before it is used, so a reader never mistakes a damaged index for the end of the data.
        """
        repaired = False
        for _attempt in range(6):
            log_path, index_path = self._files()
            try:
                log_file = open(log_path, "rb")  # noqa: SIM115
            except FileNotFoundError:
                continue  # compaction switched generations between reading CURRENT and opening
            try:
                index_file = open(index_path, "rb")  # noqa: SIM115
            except FileNotFoundError:
                log_file.close()
                if log_path.exists() and not repaired:
                    self._repair()
                    repaired = True
                continue
            with index_file, log_file:
                size = os.fstat(index_file.fileno()).st_size
                size -= size % fmt.INDEX_SIZE
                data: bytes | mmap.mmap = (
                    mmap.mmap(index_file.fileno(), size, access=mmap.ACCESS_READ) if size else b""
                )
                try:
                    index = _Index(data)
                    if not repaired and self._index_behind(index, log_file):
                        repaired = True
                    else:
                        yield index, log_file
                        return
                finally:
                    if isinstance(data, mmap.mmap):
                        data.close()
            self._repair()
        raise CorruptRecordError(f"{self.label}: files of the current generation are missing")

    @staticmethod
    def _index_behind(index: _Index, log_file: BinaryIO) -> bool:
        """Whether the log holds bytes after the last indexed record."""
        log_size = os.fstat(log_file.fileno()).st_size
        if len(index) == 0:
            return log_size > 0
        pos = index[-1][1]
        log_file.seek(pos)
        head = log_file.read(fmt.HEADER_SIZE)
        if len(head) < fmt.HEADER_SIZE:
            return True
        length: int = fmt.HEADER.unpack(head)[2]
        return pos + fmt.HEADER_SIZE + length < log_size

    def _repair(self) -> None:
        """Re-index the log (and cut a torn tail) under the appenders' lock."""
        with self._locked():
            log_path, index_path = self._files()
            if not log_path.exists():
                return
            if not index_path.exists():
                log.warning("%s: index file is missing; rebuilding it from the log", self.label)
                index_path.touch()
            self._recover(log_path, index_path)

    # -- reading
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

    def _upcoming(self, index: _Index) -> int:
        """The offset the next append gets: after the last record, or where an empty
        generation starts, and never below the least next offset a repair left (the offsets
        of the records it removed at the end are not given again)."""
        _gen, start, floor = self._current_all()
        return _next_offset(index, start, floor)

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

    def _corrupt(self, offset: int, reason: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"corrupt record in {self.label} at offset {offset}: {reason} (`sparkpoint stream "
            f"repair` removes damaged records; their offsets are not reused)"
        )

    def _damaged(self, offset: int, reason: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"corrupt record in {self.label} at offset {offset}: {reason}; the index lists it, "
            f"so readers may have read it and committed past it, and it is not cut as a torn "
            f"tail. Nothing was written. `sparkpoint stream repair <job> <stream> --partition "
            f"<n>` removes damaged records (their offsets are not reused, and readers report "
            f"them as lost)"
        )

    # -- repair
    def lost_ranges(self) -> list[tuple[int, int]]:
        """The offset ranges (first, last, inclusive) a repair removed, oldest first."""
        try:
            with open(self._lost) as lost:
                text = lost.read()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entry = json.loads(line)
                out.append((int(entry["first"]), int(entry["last"])))
        return out

    def _report_lost(self, start: int, end: int) -> None:
        """Log every repaired range that a read of ``[start, end)`` passes over."""
        if not os.path.exists(self._lost):  # one stat: the common case, nothing was repaired
            return
        for first, last in self.lost_ranges():
            if first < end and last >= start:
                log.error(
                    "%s: records %d..%d were damaged and removed by `stream repair`; this read "
                    "of offsets %d..%d passes over them: their messages are lost",
                    self.label,
                    first,
                    last,
                    start,
                    end - 1,
                )

    def _scan(self, index: _Index) -> Iterator[tuple[int, Record | None]]:
        """Each indexed offset with its record, or None where the record is damaged."""
        log_path, _index = self._files()
        data = log_path.read_bytes()
        for i in range(len(index)):
            offset, pos, _ts = index[i]
            try:
                rec, own, _size = fmt.decode_at(data, pos)
                yield offset, (rec if own == offset else None)
            except fmt.FormatError:
                yield offset, None

    def repair(self) -> list[tuple[int, int]]:
        """Remove damaged indexed records and a torn tail, keeping every offset handed out:
        the next append continues after the highest offset the index ever listed, the removed
        ranges go to ``LOST``, and reads over them log them. Returns the ranges removed."""
        with self._locked():
            log_path, index_path = self._files()
            if not log_path.exists():
                return []
            if not index_path.exists():
                index_path.touch()
            index = _Index(index_path.read_bytes())
            scanned = list(self._scan(index))
            keep = [rec for _offset, rec in scanned if rec is not None]
            lost: list[tuple[int, int]] = []
            for offset, rec in scanned:
                if rec is None:
                    if lost and lost[-1][1] == offset - 1:
                        lost[-1] = (lost[-1][0], offset)
                    else:
                        lost.append((offset, offset))
            _gen, start, floor = self._current_all()
            highest = scanned[-1][0] if scanned else start - 1
            if not lost:
                self._recover(log_path, index_path)  # a torn tail past the index only
                return []
            with open(self._lost, "a") as out:
                for first, last in lost:
                    entry = {"first": first, "last": last, "at": int(time.time() * 1000)}
                    out.write(json.dumps(entry) + "\n")
                out.flush()
                os.fsync(out.fileno())
            self._rewrite(keep, start=highest + 1, floor=max(floor, highest + 1))
            for first, last in lost:
                log.warning("%s: removed damaged records %d..%d", self.label, first, last)
            return lost

    def offset_for_timestamp(self, ts: int) -> int:
        """First offset whose timestamp is >= ``ts``; the upcoming offset if none is (past
        what retention or a repair removed)."""
        with self._snapshot() as (index, _log):
            i = index.first_with_timestamp(ts)
            return index[i][0] if i < len(index) else self._upcoming(index)

    # -- writing
    def _recover(self, log_path: Path, index_path: Path) -> tuple[int, int]:
        """Make log and index agree (under the lock); returns (next offset, max timestamp)."""
        if not index_path.exists():
            log.warning("%s: index file is missing; rebuilding it from the log", self.label)
            index_path.touch()
        with open(index_path, "r+b") as index_file, open(log_path, "r+b") as log_file:
            isize = os.fstat(index_file.fileno()).st_size
            log_size = os.fstat(log_file.fileno()).st_size
            width = fmt.INDEX_SIZE
            n = isize // width
            base, valid_end = 0, 0
            max_ts = -(2**63)
            _gen, start, floor = self._current_all()
            last_offset = start - 1
            # the last indexed record was durable before it was listed: damaged, it is
            # corruption that readers may have read past, never a torn tail to cut
            # (entries out of order are an index write the OS never persisted, e.g. zeros
            # after a power loss: dropped, their records are indexed again from the log)
            while n > 0:
                index_file.seek((n - 1) * width)
                offset, pos, mts = fmt.INDEX.unpack(index_file.read(width))
                if n > 1:
                    index_file.seek((n - 2) * width)
                    prev_offset, prev_pos, _ = fmt.INDEX.unpack(index_file.read(width))
                    if offset <= prev_offset or pos <= prev_pos:
                        n -= 1
                        continue
                log_file.seek(pos)
                raw = log_file.read(max(0, log_size - pos))
                try:
                    _rec, own, size = fmt.decode_at(raw, 0)
                except fmt.FormatError as exc:
                    raise self._damaged(offset, exc.reason) from None
                if own != offset:
                    n -= 1
                    continue
                valid_end = pos + size
                base, last_offset, max_ts = pos, offset, mts
                break
            if n == 0:
                log_file.seek(0)
                raw = log_file.read()
            if n * width != isize:
                index_file.truncate(n * width)
            # index complete records beyond the index; cut a torn tail
            new_entries = []
            pos = valid_end
            while pos < log_size:
                try:
                    rec, offset, size = fmt.decode_at(raw, pos - base)
                except fmt.FormatError as exc:
                    log.warning(
                        "%s: cutting torn tail of %d bytes at byte %d (%s)",
                        self.label,
                        log_size - pos,
                        pos,
                        exc.reason,
                    )
                    break
                max_ts = max(max_ts, rec.timestamp)
                new_entries.append(fmt.INDEX.pack(offset, pos, max_ts))
                last_offset = offset
                pos += size
            if pos < log_size:
                log_file.truncate(pos)
                os.fsync(log_file.fileno())
            if new_entries:
                index_file.seek(n * width)
                index_file.write(b"".join(new_entries))
            if new_entries or n * width != isize:
                os.fsync(index_file.fileno())
            return max(last_offset + 1, floor), max_ts

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

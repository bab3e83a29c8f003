"""A filelog partition's files: ``CURRENT`` and its generations of log and index, the
cross-process lock, consistent snapshots of index and log, and the recovery of a torn tail.

The base of :class:`~sparkpoint.system.filelog.partition.PartitionLog`, whose sections build on
it: :mod:`.transactions`, :mod:`.compaction`, :mod:`.repair`, then reading and writing in
:mod:`.partition` (the file layout and the contracts are in its docstring).
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import json
import logging
import mmap
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from sparkpoint.errors import CorruptRecordError
from sparkpoint.fsutil import atomic_write
from sparkpoint.system.filelog import format as fmt

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

#: the file holding the largest offset of a tombstone compaction dropped
TOMBSTONES = "TOMBSTONES"
#: the file naming the first offset read-committed readers may not read yet
COMMITTED = "COMMITTED"
#: the file listing the offset ranges read-committed readers never read
ABORTED = "ABORTED"
#: the file naming a publish in progress (:mod:`sparkpoint.system.filelog.publishing`)
PUBLISHING = "PUBLISHING"


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


def _next_offset(index: _Index, start: int, floor: int) -> int:
    """:meth:`PartitionLog._upcoming` given ``CURRENT``'s start offset and floor."""
    return max(index[-1][0] + 1 if len(index) else start, floor)


class LogFiles:
    """A partition's files (the sections of the partition log build on it)."""

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
                    self._finish_publish()
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

    def _upcoming(self, index: _Index) -> int:
        """The offset the next append gets: after the last record, or where an empty
        generation starts, and never below the least next offset a repair left (the offsets
        of the records it removed at the end are not given again)."""
        _gen, start, floor = self._current_all()
        return _next_offset(index, start, floor)

    def _corrupt(self, offset: int, reason: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"corrupt record in {self.label} at offset {offset}: {reason} (`sparkpoint stream "
            f"repair` removes damaged records; their offsets are not reused)"
        )

    def _damaged(self, offset: int, reason: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"corrupt record in {self.label} at offset {offset}: {reason}; the index lists it, "
            f"so readers may have read it and committed past it, and it is not cut as a torn "
            f"tail. Nothing was written to this partition. `sparkpoint stream repair <job> "
            f"<stream> --partition "
            f"<n>` removes damaged records (their offsets are not reused, and readers report "
            f"them as lost)"
        )

    def _finish_publish(self) -> None:
        """Finish the publish ``PUBLISHING`` names, whose publisher died (under the lock): the
        partition log does it (:func:`.publishing.finish_interrupted`)."""
        raise NotImplementedError

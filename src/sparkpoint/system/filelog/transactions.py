"""A filelog partition's transactions: ``COMMITTED`` and ``ABORTED``, which make it
read-committed (an exactly-once job's changelog: records become readable when a checkpoint
covers them, and a restore's discarded records are never read)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sparkpoint.errors import CorruptRecordError, UserError
from sparkpoint.fsutil import atomic_write
from sparkpoint.system.filelog.files import LogFiles, _Index

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


class LogTransactions(LogFiles):
    """Records a checkpoint commits (an exactly-once job's changelog)."""

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

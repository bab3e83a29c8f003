"""A filelog partition's repair: damaged records removed on request (``sparkpoint stream
repair``), their offsets never handed out again, the ranges recorded in ``LOST`` and reported
by every read that passes over them."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sparkpoint.system.base import Record
from sparkpoint.system.filelog import format as fmt
from sparkpoint.system.filelog.compaction import LogCompaction
from sparkpoint.system.filelog.files import _Index

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


class LogRepair(LogCompaction):
    """Removing damaged records, and reporting the ranges removed."""

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

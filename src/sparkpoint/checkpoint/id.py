"""CheckpointId: ``<millis>-<nanos>``, unique and increasing within a process.

Only :meth:`CheckpointId.create` makes new ids and :meth:`CheckpointId.parse` reads them back;
ids order by (millis, nanos), so a later commit of a task always has a greater id.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

from sparkpoint.errors import CheckpointError

_PATTERN = re.compile(r"^(\d+)-(\d+)$")
_lock = threading.Lock()
_last: tuple[int, int] = (0, 0)


@dataclass(frozen=True, order=True)
class CheckpointId:
    """The id of one commit of one task."""

    millis: int
    nanos: int

    @classmethod
    def create(cls) -> CheckpointId:
        """A new id greater than every id this process created before."""
        global _last
        with _lock:
            now = time.time_ns()
            candidate = (now // 1_000_000, now % 1_000_000)
            if candidate <= _last:
                millis, nanos = _last
                candidate = (millis, nanos + 1) if nanos + 1 < 1_000_000 else (millis + 1, 0)
            _last = candidate
        return cls(*candidate)

    @classmethod
    def parse(cls, text: str) -> CheckpointId:
        m = _PATTERN.match(text.strip())
        if not m:
            raise CheckpointError(f"invalid checkpoint id {text!r}: expected '<millis>-<nanos>'")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.millis}-{self.nanos}"

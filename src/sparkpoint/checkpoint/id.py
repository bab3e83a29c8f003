"""CheckpointId: ``<millis>-<nanos>``, unique and increasing within a process and per task.

Only :meth:`CheckpointId.create` makes new ids and :meth:`CheckpointId.parse` reads them back;
ids order by (millis, nanos), so a later commit of a task always has a greater id: a commit
passes the id it builds on (``after``), and the new id is greater than it even when this
host's clock is behind the one that wrote it (clock skew between drivers or executors, a
clock stepped back). Ids then stay ordered, and the driver never drops a commit as "older".
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

from sparkpoint import worker
from sparkpoint.errors import CheckpointError

_PATTERN = re.compile(r"^(\d+)-(\d+)$")


class _Issued:
    """The greatest id this process made (the ``checkpoint-ids`` slot of sparkpoint.worker)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: tuple[int, int] = (0, 0)


_ISSUED = worker.slot("checkpoint-ids", _Issued)


@dataclass(frozen=True, order=True)
class CheckpointId:
    """The id of one commit of one task."""

    millis: int
    nanos: int

    @classmethod
    def create(cls, after: CheckpointId | None = None) -> CheckpointId:
        """A new id greater than every id this process created before, and than ``after``
        (the checkpoint the new one builds on, whatever clock made it)."""
        with _ISSUED.lock:
            now = time.time_ns()
            candidate = (now // 1_000_000, now % 1_000_000)
            last = _ISSUED.last
            floor = last if after is None else max(last, (after.millis, after.nanos))
            if candidate <= floor:
                millis, nanos = floor
                candidate = (millis, nanos + 1) if nanos + 1 < 1_000_000 else (millis + 1, 0)
            _ISSUED.last = candidate
        return cls(*candidate)

    @classmethod
    def parse(cls, text: str) -> CheckpointId:
        m = _PATTERN.match(text.strip())
        if not m:
            raise CheckpointError(f"invalid checkpoint id {text!r}: expected '<millis>-<nanos>'")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.millis}-{self.nanos}"

"""Processing time: the one clock that store TTLs and processing-time timers read.

:func:`now_ms` is the wall clock in milliseconds since the epoch, unless a process set another
source with :func:`use_clock` (the ``clock`` slot of :mod:`sparkpoint.worker`): the test kit
and in-process tests move time forward by hand, so timer and TTL logic is tested in
milliseconds, without sleeping. Only the process that set it sees it (the driver and the
inline runner's tasks; never a Spark worker).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sparkpoint import worker


class _Source:
    """The clock this process reads; ``None`` for the wall clock."""

    def __init__(self) -> None:
        self.read: Callable[[], int] | None = None


_SOURCE = worker.slot("clock", _Source)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def now_ms() -> int:
    """Processing time now, in milliseconds since the epoch."""
    read = _SOURCE.read
    return wall_ms() if read is None else read()


@contextmanager
def use_clock(read: Callable[[], int]) -> Iterator[None]:
    """Read processing time from ``read`` inside the block (in this process only)."""
    before, _SOURCE.read = _SOURCE.read, read
    try:
        yield
    finally:
        _SOURCE.read = before


__all__ = ["now_ms", "use_clock", "wall_ms"]

"""Processing time: the one clock that store TTLs and processing-time timers read.

:func:`now_ms` is the wall clock in milliseconds since the epoch, unless a process set another
source with :func:`use_clock` (the ``clock`` slot of :mod:`sparkpoint.worker`): the test kit
and in-process tests move time forward by hand, so timer and TTL logic is tested in
milliseconds, without sleeping. Only the process that set it sees it (the driver and the
inline runner's tasks); a Spark worker takes the driver's from the batch plan (:func:`fixed_ms`
and :func:`wall_ms` there, :func:`follow` here): the test kit's fixed time, or the driver's
wall clock as an offset from the worker's, so that hosts whose clocks disagree still agree on
processing time.
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
        #: the latest time read on the driver's clock (:func:`follow`): each plan's offset
        #: is taken when it arrives, so a later phase of a batch would start back there
        self.floor = 0


_SOURCE = worker.slot("clock", _Source)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def now_ms() -> int:
    """Processing time now, in milliseconds since the epoch."""
    read = _SOURCE.read
    return wall_ms() if read is None else read()


def fixed_ms() -> int | None:
    """Processing time now if this process reads a clock of its own (the test kit's), else
    ``None`` (the wall clock): what a batch plan carries to the workers."""
    read = _SOURCE.read
    return None if read is None else read()


def follow(ms: int | None, driver_wall_ms: int | None = None) -> None:
    """A Spark worker's processing time for the plan it runs: the driver's fixed clock
    (``ms``, from :func:`fixed_ms`); else this host's wall clock moved by how far the driver's
    (``driver_wall_ms``, read when it planned the batch) is from it, so that every host
    stamps and compares store TTLs and processing-time timers on the driver's time, whatever
    their clocks' skew. It is behind the driver's by the time the plan took to arrive, never
    ahead: an entry expires, or a timer fires, late by that, never early; and it never goes
    back below what this process read before on the driver's time (the next phase of a
    batch, with the same plan). Only in a Spark worker, which runs nothing but plans: it is
    not restored."""
    if ms is not None or driver_wall_ms is None:
        _SOURCE.floor = 0  # off the driver's time
        _SOURCE.read = None if ms is None else (lambda: ms)
    else:
        skew = driver_wall_ms - wall_ms()

        def read() -> int:  # not back below what an earlier plan's phase read
            _SOURCE.floor = max(_SOURCE.floor, wall_ms() + skew)
            return _SOURCE.floor

        _SOURCE.read = read


@contextmanager
def use_clock(read: Callable[[], int]) -> Iterator[None]:
    """Read processing time from ``read`` inside the block (in this process only)."""
    before, _SOURCE.read = _SOURCE.read, read
    try:
        yield
    finally:
        _SOURCE.read = before


__all__ = ["fixed_ms", "follow", "now_ms", "use_clock", "wall_ms"]

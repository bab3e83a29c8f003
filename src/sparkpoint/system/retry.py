"""Retrying the driver's own reads and writes of its metadata streams on transient faults.

A transient fault is one a second try can get past: an I/O error, a timeout, a refused or reset
connection, an interrupted call, a Kafka error the client marks retriable. Missing files,
permissions, a full disk and every other error are not retried: they need the user. Retried
operations must be safe to repeat: reads apply records idempotently (last write wins), and a
repeated write of the same key and value is harmless on a compacted stream.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

#: errno values a second try may get past
TRANSIENT_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.EAGAIN,
        errno.EINTR,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EBUSY,
        errno.ESTALE,
    }
)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a fault a second try may get past (see the module docstring)."""
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, OSError):
        return exc.errno in TRANSIENT_ERRNOS or getattr(exc, "transient", False) is True
    retriable = getattr(exc.args[0] if exc.args else None, "retriable", None)
    return bool(callable(retriable) and retriable())  # confluent_kafka.KafkaError


def retry_transient(
    what: str, fn: Callable[[], T], *, attempts: int = 4, first_delay: float = 0.1
) -> T:
    """``fn()``, tried up to ``attempts`` times while it fails transiently, doubling the pause
    between tries; the last error (or any other) propagates. ``what`` names it in the log."""
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts or not is_transient(exc):
                raise
            log.warning(
                "%s failed (%s: %s); trying again in %.1fs (%d of %d)",
                what,
                type(exc).__name__,
                exc,
                delay,
                attempt + 1,
                attempts,
            )
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")

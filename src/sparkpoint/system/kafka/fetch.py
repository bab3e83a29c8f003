"""Taking what a librdkafka consumer has fetched, without waiting out a timeout: the one way
every Kafka reader of sparkpoint (ranges, staged parts, control topics) pulls messages.

``Consumer.consume(n, timeout)`` returns only when it holds ``n`` messages or the timeout has
passed, so a read of a range shorter than ``n`` (most reads of a micro-batch, and every read
that ends at the partition's end) waited the whole timeout each time: 0.2 s per read.
:func:`fetched` takes what is queued at once and blocks only while nothing is, until the first
message or event arrives.

Owns that call only; imports nothing of sparkpoint.
"""

from __future__ import annotations

from typing import Any


def fetched(consumer: Any, most: int, wait: float) -> list[Any]:
    """Up to ``most`` messages (or events: errors, end of partition) of ``consumer``: those
    already fetched, else the first to arrive within ``wait`` seconds (then with any that
    arrived beside it); an empty list when nothing came."""
    batch: list[Any] = consumer.consume(most, timeout=0)
    if batch:
        return batch
    first = consumer.poll(wait)
    if first is None:
        return []
    return [first, *consumer.consume(most - 1, timeout=0)] if most > 1 else [first]

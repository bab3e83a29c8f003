"""One record into a librdkafka producer's queue, waiting while the queue is full: the one way
every Kafka producer of sparkpoint (plain, staging, transactional publish) hands a record over.

Owns that call only; imports the system base.
"""

from __future__ import annotations

from typing import Any

from sparkpoint.system.base import Record


def produce(producer: Any, topic: str, partition: int, record: Record, **extra: Any) -> None:
    """``producer.produce`` of ``record`` (key, value, timestamp) to ``topic`` partition
    ``partition``, with ``extra`` (headers, on_delivery); polls while the local queue is full,
    then once without waiting, so delivery callbacks run."""
    while True:
        try:
            producer.produce(
                topic,
                value=record.value,
                key=record.key,
                partition=partition,
                timestamp=record.timestamp or 0,
                **extra,
            )
            break
        except BufferError:  # the local queue is full: let deliveries drain
            producer.poll(0.05)
    producer.poll(0)

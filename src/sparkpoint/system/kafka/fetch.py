"""Reading a partition with a librdkafka consumer without waiting on the client's timers: the
one way every Kafka reader of sparkpoint (ranges, staged parts, control topics) pulls its
messages, and the way its pooled consumers (ranges, staged parts) assign a partition.

Two waits of librdkafka's own are taken out of every read:

* ``Consumer.consume(n, timeout)`` returns only when it holds ``n`` messages or the timeout has
  passed, so a read of a range shorter than ``n`` (most reads of a micro-batch, and every read
  that ends at the partition's end) waited the whole timeout each time: 0.2 s per read.
  :func:`fetched` takes what is queued at once and blocks only while nothing is, until the
  first message or event arrives.
* A consumer that is already connected learns of a topic it has not read before only at its
  next periodic scan of unknown topics, up to a second after the assignment. A pooled consumer
  reads many topics (inputs, changelogs, checkpoints), so :class:`PooledConsumer` asks for a
  topic's metadata once, before its first assignment.

Owns those calls only; imports nothing of sparkpoint.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaException, TopicPartition

#: how long the metadata request before a first assignment may take; past it, the assignment
#: goes ahead and librdkafka finds the topic by its own scan
METADATA_TIMEOUT_S = 10.0


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


class PooledConsumer:
    """A librdkafka consumer kept between reads, and the topics whose metadata it holds."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self._topics: set[str] = set()

    def assign(self, topic: str, partition: int, offset: int) -> Any:
        """Assign the partition, reading from ``offset``; the consumer, to read with."""
        if topic not in self._topics:
            try:
                known = self.consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics
            except KafkaException:
                known = {}  # only slower: the read waits for librdkafka's own scan
            meta = known.get(topic)
            if meta is not None and meta.error is None:  # asked again until it answers
                self._topics.add(topic)
        self.consumer.assign([TopicPartition(topic, partition, offset)])
        return self.consumer

    def close(self) -> None:
        self.consumer.close()

"""Output of tasks: encode, partition and send messages to their streams' producers.

A message without an explicit partition goes where its system places its serialized key
(``SystemAdmin.partition_for_key``: crc32 on filelog, murmur2 on Kafka; a key of ``None`` goes
to partition 0), so one key always lands in one partition. An output stream that
does not exist yet is created with ``streams.<s>.partitions`` or the system's default partition
count. :meth:`OutputCollector.flush` returns only when everything sent is durable.
"""

from __future__ import annotations

import time
from typing import Any

from sparkpoint.config import Config
from sparkpoint.errors import TaskError
from sparkpoint.model import SystemStream, TaskName
from sparkpoint.serde import Serde
from sparkpoint.system.base import OutgoingMessageEnvelope, Record, SystemProducer
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import ensure_stream, stream_serdes


class OutputCollector:
    """The task's :class:`MessageCollector`; buffers per producer until :meth:`flush`."""

    def __init__(self, config: Config, systems: Systems, task: TaskName) -> None:
        self._config = config
        self._systems = systems
        self._task = task
        self._producers: dict[str, SystemProducer] = {}
        self._streams: dict[SystemStream, tuple[int, Serde[Any], Serde[Any]]] = {}
        self.sent = 0

    def _stream(self, stream: SystemStream) -> tuple[int, Serde[Any], Serde[Any]]:
        if stream not in self._streams:
            partitions = ensure_stream(self._config, self._systems, stream)
            self._streams[stream] = (partitions, *stream_serdes(self._config, stream))
        return self._streams[stream]

    def send(self, envelope: OutgoingMessageEnvelope) -> None:
        partitions, key_serde, msg_serde = self._stream(envelope.stream)
        try:
            key = None if envelope.key is None else key_serde.to_bytes(envelope.key)
            value = None if envelope.message is None else msg_serde.to_bytes(envelope.message)
        except (TypeError, ValueError) as exc:
            raise TaskError(
                f"task {self._task}: cannot encode message for {envelope.stream}: {exc}"
            ) from exc
        partition = envelope.partition
        if partition is None:
            partition = self._systems.admin(envelope.stream.system).partition_for_key(
                key, partitions
            )
        elif not 0 <= partition < partitions:
            raise TaskError(
                f"task {self._task}: partition {partition} of {envelope.stream} does not exist "
                f"(it has {partitions})"
            )
        producer = self._producers.get(envelope.stream.system)
        if producer is None:
            producer = self._producers[envelope.stream.system] = self._systems.producer(
                envelope.stream.system
            )
        ts = envelope.timestamp if envelope.timestamp is not None else int(time.time() * 1000)
        producer.send(envelope.stream.stream, partition, Record("", key, value, ts))
        self.sent += 1

    def flush(self) -> None:
        for producer in self._producers.values():
            producer.flush()

    def close(self) -> None:
        for producer in self._producers.values():
            producer.close()
        self._producers.clear()

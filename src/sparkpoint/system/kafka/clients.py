"""The Kafka system's clients: its consumer and producer on confluent-kafka (librdkafka), the
librdkafka settings of each role (:func:`client_config`), and the pool of idle clients a Python
worker keeps between reads and batches (:data:`POOL`).

Apart from the admin (:mod:`.system`) and from the staging of exactly-once output
(:mod:`.staging`), which both use these clients: neither is imported here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
)

from sparkpoint import worker
from sparkpoint.errors import ConfigError, SparkpointError, StreamNotFound, UserError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import (
    Record,
    SystemConsumer,
    SystemProducer,
    read_max_bytes,
)
from sparkpoint.system.kafka.fetch import PooledConsumer, fetched
from sparkpoint.system.kafka.produce import produce

TIMEOUT_S = 30.0
#: auto.offset.reset values that start a range before Kafka's oldest offset at its oldest
_FROM_OLDEST = ("earliest", "smallest", "beginning")


def settings_key(settings: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Client settings as a hashable key (callbacks left out): the key of a client cached per
    settings in this process."""
    return tuple(sorted((k, str(v)) for k, v in settings.items() if not callable(v)))


def client_config(system: str, config: Mapping[str, str], role: str) -> dict[str, str]:
    """librdkafka settings for ``role`` (consumer or producer) of ``system``."""
    prefix = f"systems.{system}.{role}."
    out = {k[len(prefix) :]: v for k, v in config.items() if k.startswith(prefix)}
    if "bootstrap.servers" not in out:
        servers = config.get(f"systems.{system}.consumer.bootstrap.servers") or config.get(
            f"systems.{system}.producer.bootstrap.servers"
        )
        if not servers:
            raise ConfigError(
                f"systems.{system}.consumer.bootstrap.servers is not set: the Kafka brokers of "
                f"system {system}, as host:port[,host:port...]"
            )
        out["bootstrap.servers"] = servers
    return out


class _Pool:
    """Idle librdkafka clients of this process, by kind and settings: a Spark Python worker
    runs many short reads and batches, and a new client costs a connection and a metadata
    round trip each time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, tuple[tuple[str, str], ...]], list[Any]] = {}

    @staticmethod
    def _key(kind: type[Any], settings: dict[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
        return kind.__name__, settings_key(settings)

    def take(self, kind: type[Any], settings: dict[str, Any], system: str, role: str) -> Any:
        with self._lock:
            idle = self._idle.get(self._key(kind, settings))
            if idle:
                return idle.pop()
        if kind is _ProducerClient:
            return _ProducerClient(settings, system)
        if kind is PooledConsumer:
            return PooledConsumer(new_client(Consumer, settings, system, role))
        return new_client(kind, settings, system, role)

    def give_back(self, kind: type[Any], settings: dict[str, Any], client: Any) -> None:
        with self._lock:
            self._idle.setdefault(self._key(kind, settings), []).append(client)

    def close_idle(self, bootstrap: str | None = None) -> None:
        """Close the idle clients (of the brokers ``bootstrap``, or all): a client of a broker
        that is gone would keep reconnecting, and logging it, for the life of the process."""
        with self._lock:
            keys = [
                k
                for k in self._idle
                if bootstrap is None or ("bootstrap.servers", bootstrap) in k[1]
            ]
            idle = [c for k in keys for c in self._idle.pop(k)]
        for client in idle:
            if isinstance(client, _ProducerClient):
                client.producer.flush(0)  # nothing is queued: closed by the garbage collector
            else:
                client.close()


POOL = worker.slot("kafka-clients", _Pool)


def new_client(kind: type[Any], settings: dict[str, Any], system: str, role: str) -> Any:
    try:
        return kind(settings)
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigError(
            f"systems.{system}.{role}.*: librdkafka refused the settings: {exc}"
        ) from exc


def _of(message: Any, ssp: SystemStreamPartition) -> bool:
    """Whether a consumed message or event is of ``ssp`` (not of another partition the pooled
    consumer was assigned before)."""
    return bool(message.partition() == ssp.partition and message.topic() == ssp.stream)


class KafkaConsumer(SystemConsumer):
    """Reads planned ranges with one librdkafka consumer, assigned per read."""

    def __init__(self, system: str, config: Mapping[str, str]) -> None:
        self.system = system
        self.max_bytes = read_max_bytes(system, config)  # for reads of at most N records
        settings: dict[str, Any] = {
            "group.id": f"sparkpoint-{system}",  # never joined: partitions are assigned
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # a planned range ends at or before the high watermark it was planned from: a fetch
            # that long-polls there (500 ms by default) only delays the next read's assignment
            "fetch.wait.max.ms": 10,
            "auto.offset.reset": "earliest",  # a range starting at deleted records: from the oldest
            **client_config(system, config, "consumer"),
        }
        reset = settings["auto.offset.reset"]
        if reset not in _FROM_OLDEST:
            raise ConfigError(
                f"systems.{system}.consumer.auto.offset.reset={reset}: sparkpoint reads planned "
                f"offset ranges, and a range that starts before the oldest offset Kafka still has "
                f"must start there ({', '.join(_FROM_OLDEST)}); where a job starts is set with "
                f"systems.{system}.default.stream.samza.offset.default or a startpoint"
            )
        self._settings = settings
        self._consumer: PooledConsumer | None = None
        #: per SSP, what :meth:`skipped_through` answers for its last read
        self._skipped: dict[SystemStreamPartition, str] = {}

    def register(self, ssp: SystemStreamPartition, offset: str) -> None:
        int(offset)  # offsets are integers; anything else is a bug upstream

    def new_client(self) -> PooledConsumer:
        if self._consumer is None:
            self._consumer = POOL.take(
                PooledConsumer, dict(self._settings), self.system, "consumer"
            )
        return self._consumer

    def read(
        self, ssp: SystemStreamPartition, start: str, end: str, max_records: int | None = None
    ) -> Sequence[Record]:
        self._skipped.pop(ssp, None)
        first, stop = int(start), int(end)
        limit = stop - first if max_records is None else min(max_records, stop - first)
        if limit <= 0:
            return []
        max_bytes = None if max_records is None else self.max_bytes
        out, end_of_data = self._assigned_read(ssp, first, stop, limit, max_bytes)
        if not out and end_of_data is not None and first < end_of_data <= stop:
            # nothing but offsets that are no records (transaction markers, aborted records)
            # before the end of the readable data. Confirmed by a second read of its own
            # assignment, so no event left from an earlier one can move the reader: the
            # readable end is the last stable offset, so an open transaction is never passed
            again, confirmed = self._assigned_read(ssp, first, stop, limit, max_bytes)
            if again:
                return again
            if confirmed == end_of_data:
                self._skipped[ssp] = str(end_of_data - 1)
        return out

    def skipped_through(self, ssp: SystemStreamPartition) -> str | None:
        return self._skipped.get(ssp)

    def messages(self, stream: str, partition: int, first: int, stop: int) -> list[Any]:
        """librdkafka's messages of offsets ``[first, stop)`` (headers included), for ranges
        that end at or before the partition's end: the staging of exactly-once output."""
        consumer = self.new_client().assign(stream, partition, first)
        out: list[Any] = []
        expected = first
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while expected < stop:
                batch = fetched(consumer, 10_000, 0.2)
                for m in batch:
                    if m.topic() != stream or m.partition() != partition:
                        continue
                    err = m.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            raise SparkpointError(
                                f"reading {stream} partition {partition} from offset {first}: "
                                f"{err.str()}"
                            )
                        if m.offset() >= expected:
                            return out
                        continue
                    if m.offset() < expected:
                        continue
                    if m.offset() >= stop:
                        return out
                    out.append(m)
                    expected = m.offset() + 1
                if batch:
                    deadline = time.monotonic() + TIMEOUT_S
                elif time.monotonic() > deadline:
                    raise SparkpointError(
                        f"reading {stream} partition {partition} offsets [{first}, {stop}): "
                        f"nothing for {TIMEOUT_S:.0f}s after offset {expected - 1}"
                    )
        finally:
            consumer.unassign()
        return out

    def _assigned_read(
        self, ssp: SystemStreamPartition, first: int, stop: int, limit: int, max_bytes: int | None
    ) -> tuple[list[Record], int | None]:
        consumer = self.new_client().assign(ssp.stream, ssp.partition, first)
        try:
            return self._drain(consumer, ssp, first, stop, limit, max_bytes)
        finally:
            consumer.unassign()

    def _drain(
        self,
        consumer: Any,
        ssp: SystemStreamPartition,
        first: int,
        stop: int,
        limit: int,
        max_bytes: int | None,
    ) -> tuple[list[Record], int | None]:
        """The records read, and the end of the readable data when the partition's end was
        reached (librdkafka's end-of-partition event: the high watermark, or under
        ``read_committed`` the last stable offset)."""
        out: list[Record] = []
        size = 0  # bytes of keys and values so far, against max_bytes
        expected = first  # records before it are stale prefetches of an earlier assignment
        deadline = time.monotonic() + TIMEOUT_S
        while len(out) < limit:
            batch = fetched(consumer, min(limit - len(out), 10_000), 0.2)
            for m in batch:
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise SparkpointError(f"reading {ssp} from offset {first}: {err.str()}")
                    if m.offset() >= expected and _of(m, ssp):
                        return out, m.offset()  # nothing more readable for now
                    continue
                offset = m.offset()
                if not _of(m, ssp) or offset < expected:
                    continue
                if offset >= stop:
                    return out, None
                ts_type, ts = m.timestamp()
                stamp = 0 if ts_type == TIMESTAMP_NOT_AVAILABLE else int(ts)
                key, value = m.key(), m.value()
                out.append(Record(str(offset), key, value, stamp))
                expected = offset + 1
                if expected == stop or len(out) == limit:
                    return out, None
                if max_bytes is not None:
                    size += len(key or b"") + len(value or b"")
                    if size >= max_bytes:
                        return out, None
            if batch:
                deadline = time.monotonic() + TIMEOUT_S
            elif time.monotonic() > deadline:
                raise SparkpointError(
                    f"reading {ssp} offsets [{first}, {stop}): no record for {TIMEOUT_S:.0f}s "
                    f"after offset {expected - 1}"
                )
        return out, None

    def close(self) -> None:
        if self._consumer is not None:
            # unassigned after each read
            POOL.give_back(PooledConsumer, self._settings, self._consumer)
            self._consumer = None


class _ProducerClient:
    """A librdkafka producer with the failed deliveries it reported since its last flush."""

    def __init__(self, settings: dict[str, Any], system: str) -> None:
        self.failures: list[str] = []
        self.producer = new_client(
            Producer, {**settings, "on_delivery": self._delivered}, system, "producer"
        )

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failures.append(f"{msg.topic()} partition {msg.partition()}: {err.str()}")


class KafkaProducer(SystemProducer):
    """Idempotent; ``flush`` raises if any record sent since the last flush was not written."""

    def __init__(self, system: str, config: Mapping[str, str]) -> None:
        self.system = system
        self._settings: dict[str, Any] = {
            "enable.idempotence": True,
            **client_config(system, config, "producer"),
        }
        self._client: _ProducerClient | None = POOL.take(
            _ProducerClient, self._settings, system, "producer"
        )
        self._known: dict[str, int] = {}

    @property
    def _producer(self) -> Any:
        if self._client is None:
            raise SparkpointError(f"kafka system {self.system}: producer used after close()")
        return self._client.producer

    def _check(self, stream: str, partition: int) -> None:
        if stream not in self._known:
            meta = self._producer.list_topics(timeout=TIMEOUT_S).topics.get(stream)
            if meta is None or meta.error is not None or not meta.partitions:
                raise StreamNotFound(f"stream {self.system}.{stream} does not exist")
            self._known[stream] = len(meta.partitions)
        n = self._known[stream]
        if not 0 <= partition < n:
            raise UserError(
                f"partition {partition} of {self.system}.{stream} does not exist "
                f"(partitions 0..{n - 1})"
            )

    def send(self, stream: str, partition: int, record: Record) -> None:
        self.produce(stream, partition, record)

    def produce(
        self,
        stream: str,
        partition: int,
        record: Record,
        headers: list[tuple[str, bytes]] | None = None,
        on_delivery: Any = None,
    ) -> None:
        """:meth:`send`, with Kafka record headers and a delivery callback of its own
        (``on_delivery(err, msg)``: the staging of exactly-once output uses both)."""
        self._check(stream, partition)
        extra: dict[str, Any] = {}
        if headers:
            extra["headers"] = headers
        if on_delivery is not None:  # replaces the client's: failures are still counted
            client = self._client
            assert client is not None  # self._producer raised otherwise

            def delivered(err: KafkaError | None, msg: Any) -> None:
                client._delivered(err, msg)
                on_delivery(err, msg)

            extra["on_delivery"] = delivered
        produce(self._producer, stream, partition, record, **extra)

    def flush(self) -> None:
        if self._client is None:
            return
        left = self._client.producer.flush(TIMEOUT_S)
        failures, self._client.failures = self._client.failures, []
        if failures:
            raise SparkpointError(
                f"kafka system {self.system}: {len(failures)} record(s) not written, first: "
                f"{failures[0]}"
            )
        if left:
            raise SparkpointError(
                f"kafka system {self.system}: {left} record(s) still unacknowledged after "
                f"{TIMEOUT_S:.0f}s"
            )

    def close(self) -> None:
        """Flush, then leave the client to this process's next producer of the system (a
        client whose flush failed is dropped, not reused)."""
        if self._client is None:
            return
        client = self._client
        try:
            self.flush()
        finally:
            self._client = None
        POOL.give_back(_ProducerClient, self._settings, client)

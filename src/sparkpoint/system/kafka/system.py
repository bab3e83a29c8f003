"""The Kafka system: admin, consumer and producer on confluent-kafka (librdkafka).

Config, with Samza's names where it has them:

* ``systems.<s>.consumer.bootstrap.servers`` (or ``...producer.bootstrap.servers``): the brokers;
* ``systems.<s>.consumer.*`` and ``systems.<s>.producer.*``: passed to librdkafka as they are
  (``security.protocol``, ``sasl.*``, ``ssl.*``, ``isolation.level``, ``linger.ms``, ...); the
  admin client uses the consumer's connection and security settings; secret values are masked
  in every listing, like the blob store's;
* topic properties for topics sparkpoint creates, from ``systems.<s>.default.stream.<p>`` and
  ``streams.<topic>.<p>`` (see :func:`sparkpoint.system.streams.stream_spec`), among them
  ``replication.factor`` (default: the broker's); compacted streams (changelogs, checkpoint and
  coordinator streams) get ``cleanup.policy=compact``, and an existing one is refused if the
  broker would delete its records by age or compact them sooner than the spec allows.

Offsets are Kafka's, as decimal strings. The consumer reads exactly the planned range of an SSP
(assign and seek: no consumer group, no committed offsets; the checkpoint is the only position;
fetches do not long-poll, ``fetch.wait.max.ms=10``, since a range never reads past the data),
skipping offsets Kafka does not return (compacted away, transaction markers, aborted records
under ``isolation.level=read_committed``, librdkafka's default). The producer is idempotent, and
its ``flush`` waits for every acknowledgement, raising on any failed delivery; the runtime
flushes in the synchronous part of a commit. Keyed records are placed by Kafka's murmur2
partitioner (:mod:`.partitioner`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic, OffsetSpec

from sparkpoint import worker
from sparkpoint.config import ConfigKey
from sparkpoint.errors import ConfigError, SparkpointError, StreamNotFound, UserError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import (
    READ_MAX_BYTES,
    IntegerOffsets,
    PartitionMetadata,
    Record,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemFactory,
    SystemProducer,
    read_max_bytes,
)
from sparkpoint.system.kafka.fetch import PooledConsumer, fetched
from sparkpoint.system.kafka.partitioner import kafka_partition
from sparkpoint.system.kafka.produce import produce
from sparkpoint.system.kafka.staging import (
    INTERNAL_PREFIXES,
    STAGING_RETENTION,
    KafkaStaging,
    close_publishers,
    settings_key,
)

TIMEOUT_S = 30.0
#: how long a process trusts a topic's partition count it read: a worker keeps its systems
#: between batches and runs (an existing SparkSession), and keys placed by the count a topic
#: had before it grew would reach tasks that do not hold their state. Growing a topic is
#: refused while the job runs, so a run after one starts well after the last read.
PARTITION_COUNT_TTL_S = 1.0
#: Kafka's own topics (sparkpoint's checkpoint and coordinator topics start with "__" as well)
_KAFKA_INTERNAL = frozenset({"__consumer_offsets", "__transaction_state"})
#: client settings the admin shares with the consumer (connection and security)
_SHARED = ("bootstrap.servers", "client.id", "security.", "sasl.", "ssl.", "socket.", "broker.")


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
            return PooledConsumer(_client(Consumer, settings, system, role))
        return _client(kind, settings, system, role)

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


def close_idle_clients(bootstrap: str | None = None) -> None:
    """Close this process's idle Kafka clients (of ``bootstrap``, or all), and its publishers
    of exactly-once output."""
    _POOL.close_idle(bootstrap)
    close_publishers(bootstrap)


_POOL = worker.slot("kafka-clients", _Pool)


def _client(kind: type[Any], settings: dict[str, Any], system: str, role: str) -> Any:
    try:
        return kind(settings)
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigError(
            f"systems.{system}.{role}.*: librdkafka refused the settings: {exc}"
        ) from exc


class KafkaAdmin(IntegerOffsets, SystemAdmin):
    def __init__(self, system: str, config: Mapping[str, str]) -> None:
        self.system = system
        consumer = client_config(system, config, "consumer")
        self._settings = {k: v for k, v in consumer.items() if k.startswith(_SHARED)}
        self._admin = _client(AdminClient, dict(self._settings), system, "consumer")
        self._partitions: dict[str, tuple[int, float]] = {}  # topic -> (count, read at)
        self._lock = threading.Lock()
        self._config = dict(config)
        self._staging: KafkaStaging | None = None

    def output_staging(self) -> KafkaStaging:
        with self._lock:
            if self._staging is None:
                self._staging = KafkaStaging(self, self._config)
            return self._staging

    def _topic_metadata(self) -> dict[str, Any]:
        try:
            return dict(self._admin.list_topics(timeout=TIMEOUT_S).topics)
        except KafkaException as exc:
            raise self._fail("listing topics", exc) from exc

    def topics(self) -> dict[str, int]:
        """Every topic, with its partition count (one metadata request; staging topics too)."""
        return {t: len(m.partitions) for t, m in self._topic_metadata().items() if m.error is None}

    def _fail(self, what: str, exc: BaseException) -> SparkpointError:
        return SparkpointError(f"kafka system {self.system}: {what} failed: {exc}")

    def create_stream(self, spec: StreamSpec) -> bool:
        if spec.partitions < 1:
            raise UserError(f"stream {spec.name}: partitions must be >= 1, not {spec.partitions}")
        props = dict(spec.properties)
        replication = int(props.pop("replication.factor", "-1"))
        if spec.compacted:
            policy = props.setdefault("cleanup.policy", "compact")
            if "compact" not in policy:
                raise ConfigError(
                    f"stream {self.system}.{spec.name} must be compacted, but its configured "
                    f"cleanup.policy is {policy}: use compact (or compact,delete)"
                )
        topic = NewTopic(spec.name, spec.partitions, replication, config=props)
        future = self._admin.create_topics([topic], request_timeout=TIMEOUT_S)[spec.name]
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise self._fail(f"creating topic {spec.name}", exc) from exc
        self._wait_for(spec.name)
        return True

    def validate_stream(self, spec: StreamSpec) -> None:
        """Refuse a compacted stream the broker would delete by age, or compact sooner than
        ``min.compaction.lag.ms`` in the spec allows (a broker that does not report a setting,
        as Tansu does for the ones never set, is taken at its word)."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, spec.name)
        try:
            entries = self._admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
        except KafkaException as exc:
            raise self._fail(f"reading the configs of topic {spec.name}", exc) from exc
        have = {k: e.value for k, e in entries.items() if e.value is not None}
        fix = f"kafka-configs.sh --alter --topic {spec.name} --add-config"
        policy = have.get("cleanup.policy")
        if spec.compacted and policy is not None and "compact" not in policy:
            raise ConfigError(
                f"topic {spec.name} has cleanup.policy={policy}: the broker deletes its records "
                f"by age and a restore would lose them; fix: {fix} cleanup.policy=compact"
            )
        wanted = spec.properties.get("min.compaction.lag.ms")
        lag = have.get("min.compaction.lag.ms")
        if wanted is not None and lag is not None and int(lag) < int(wanted):
            raise ConfigError(
                f"topic {spec.name} has min.compaction.lag.ms={lag}, below {wanted}: the broker "
                f"may compact away a checkpointed value that a write after the checkpoint "
                f"overwrote, and a restore would lose it; fix: {fix} min.compaction.lag.ms={wanted}"
            )

    def add_partitions(self, stream: str, partitions: int) -> None:
        """Kafka's CreatePartitions; then until the metadata shows them."""
        try:
            self._admin.create_partitions([NewPartitions(stream, partitions)])[stream].result(
                timeout=TIMEOUT_S
            )
        except KafkaException as exc:
            raise self._fail(f"adding partitions to topic {stream}", exc) from exc
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            meta = self._admin.list_topics(timeout=TIMEOUT_S).topics.get(stream)
            if meta is not None and len(meta.partitions) >= partitions:
                break
            time.sleep(0.05)
        with self._lock:
            self._partitions.pop(stream, None)

    def compacted(self, stream: str) -> bool:
        """From the topic's ``cleanup.policy`` (Kafka's default, when the broker reports
        none, is ``delete``)."""
        self.partition_count(stream)  # names a missing topic
        resource = ConfigResource(ConfigResource.Type.TOPIC, stream)
        try:
            entries = self._admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
        except KafkaException as exc:
            raise self._fail(f"reading the configs of topic {stream}", exc) from exc
        policy = entries.get("cleanup.policy")
        return policy is not None and policy.value is not None and "compact" in policy.value

    def _wait_for(self, topic: str) -> None:
        """Until the new topic's partitions are in the metadata (creation is asynchronous)."""
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            meta = self._admin.list_topics(timeout=TIMEOUT_S).topics.get(topic)
            if meta is not None and meta.error is None and meta.partitions:
                return
            time.sleep(0.05)

    def list_streams(self) -> list[str]:
        return sorted(
            t
            for t in self._topic_metadata()
            if t not in _KAFKA_INTERNAL and not t.startswith(INTERNAL_PREFIXES)
        )

    def partition_count(self, stream: str) -> int:
        return self._count(stream, PARTITION_COUNT_TTL_S)

    def current_partition_count(self, stream: str) -> int:
        return self._count(stream, 0)

    def _count(self, stream: str, max_age: float) -> int:
        """The topic's partition count, read again when this process's is ``max_age`` old."""
        with self._lock:
            cached = self._partitions.get(stream)
            if cached is not None and time.monotonic() - cached[1] < max_age:
                return cached[0]
        try:  # all topics: a request naming one may auto-create it on some brokers
            meta = self._admin.list_topics(timeout=TIMEOUT_S).topics.get(stream)
        except KafkaException as exc:
            raise self._fail(f"reading metadata of topic {stream}", exc) from exc
        if meta is None or meta.error is not None or not meta.partitions:
            known = ", ".join(self.list_streams()) or "none"
            raise StreamNotFound(
                f"stream {self.system}.{stream} does not exist; topics in {self.system}: {known}"
            )
        with self._lock:
            self._partitions[stream] = (len(meta.partitions), time.monotonic())
        return len(meta.partitions)

    def _list_offsets(
        self, ssps: Sequence[SystemStreamPartition], spec: Any
    ) -> dict[SystemStreamPartition, int]:
        for ssp in ssps:
            self._check_partition(ssp)
        if not ssps:
            return {}
        request = {TopicPartition(s.stream, s.partition): spec(s) for s in ssps}
        try:
            futures = self._admin.list_offsets(request, request_timeout=TIMEOUT_S)
            answers = {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
        except KafkaException as exc:
            raise self._fail("listing offsets", exc) from exc
        return {s: int(answers[(s.stream, s.partition)]) for s in ssps}

    def _check_partition(self, ssp: SystemStreamPartition) -> None:
        # a partition within a count read before exists still (topics never shrink): a
        # metadata request only for one beyond it
        n = self._count(ssp.stream, math.inf)
        if ssp.partition >= n:
            n = self._count(ssp.stream, 0.0)
        if not 0 <= ssp.partition < n:
            raise UserError(
                f"partition {ssp.partition} of {self.system}.{ssp.stream} does not exist "
                f"(partitions 0..{n - 1})"
            )

    def get_metadata(
        self, ssps: Iterable[SystemStreamPartition]
    ) -> dict[SystemStreamPartition, PartitionMetadata]:
        ssps = list(ssps)
        low = self._list_offsets(ssps, lambda _: OffsetSpec.earliest())
        high = self._list_offsets(ssps, lambda _: OffsetSpec.latest())
        return {
            s: PartitionMetadata(
                str(low[s]), str(high[s] - 1) if high[s] > low[s] else None, str(high[s])
            )
            for s in ssps
        }

    def offset_for_timestamp(self, ssp: SystemStreamPartition, timestamp_ms: int) -> str:
        found = self._list_offsets([ssp], lambda _: OffsetSpec.for_timestamp(timestamp_ms))[ssp]
        if found < 0:  # every record is older
            return self.get_metadata([ssp])[ssp].upcoming
        return str(found)

    def partition_for_key(self, key: bytes | None, partitions: int) -> int:
        return kafka_partition(key, partitions)

    def delete_records_before(self, stream: str, partition: int, offset: str) -> int:
        ssp = SystemStreamPartition(self.system, stream, partition)
        before = int(self.get_metadata([ssp])[ssp].oldest)
        request = [TopicPartition(stream, partition, int(offset))]
        try:
            futures = self._admin.delete_records(request, request_timeout=TIMEOUT_S)
            (deleted,) = (f.result() for f in futures.values())
        except KafkaException as exc:
            raise self._fail(f"deleting records of {ssp} before offset {offset}", exc) from exc
        return max(0, int(deleted.low_watermark) - before)


#: librdkafka's names for "from the oldest offset" when a read starts below it (deleted records)
_FROM_OLDEST = ("earliest", "smallest", "beginning")


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

    def _client(self) -> PooledConsumer:
        if self._consumer is None:
            self._consumer = _POOL.take(
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
        consumer = self._client().assign(stream, partition, first)
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
        consumer = self._client().assign(ssp.stream, ssp.partition, first)
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
            _POOL.give_back(PooledConsumer, self._settings, self._consumer)
            self._consumer = None


class _ProducerClient:
    """A librdkafka producer with the failed deliveries it reported since its last flush."""

    def __init__(self, settings: dict[str, Any], system: str) -> None:
        self.failures: list[str] = []
        self.producer = _client(
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
        self._client: _ProducerClient | None = _POOL.take(
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
        _POOL.give_back(_ProducerClient, self._settings, client)


class KafkaSystemFactory(SystemFactory):
    """``systems.<name>.factory: kafka``."""

    config_keys = (
        ConfigKey(
            "systems.<s>.consumer.bootstrap.servers",
            None,
            "host:port[,host:port...]",
            "kafka: the brokers (producer.bootstrap.servers works too)",
        ),
        ConfigKey(
            "systems.<s>.consumer.<setting>",
            None,
            "a librdkafka consumer setting",
            "kafka: passed to the consumer as it is (security.protocol, sasl.*, ssl.*, "
            "isolation.level, fetch.*); the admin client uses its connection and security "
            "settings; auto.offset.reset must stay earliest",
        ),
        ConfigKey(
            "systems.<s>.producer.<setting>",
            None,
            "a librdkafka producer setting",
            "kafka: passed to the producer as it is (linger.ms, compression.type, acks, ...); "
            "the producer is idempotent",
        ),
        ConfigKey(
            "systems.<s>.default.stream.replication.factor",
            None,
            "an integer >= 1",
            "kafka: replication of the topics sparkpoint creates (default: the broker's)",
        ),
        READ_MAX_BYTES,
        STAGING_RETENTION,
    )

    def get_admin(self, system: str, config: Mapping[str, str]) -> KafkaAdmin:
        return KafkaAdmin(system, config)

    def get_consumer(self, system: str, config: Mapping[str, str]) -> KafkaConsumer:
        return KafkaConsumer(system, config)

    def get_producer(self, system: str, config: Mapping[str, str]) -> KafkaProducer:
        return KafkaProducer(system, config)

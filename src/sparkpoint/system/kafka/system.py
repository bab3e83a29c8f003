"""The Kafka system: its admin and factory on confluent-kafka (librdkafka); the consumer and
producer are :mod:`.clients`, the staging of exactly-once output :mod:`.staging`.

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
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic, OffsetSpec

from sparkpoint.config import ConfigKey
from sparkpoint.errors import ConfigError, SparkpointError, StreamNotFound, UserError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import (
    READ_MAX_BYTES,
    IntegerOffsets,
    PartitionMetadata,
    StreamSpec,
    SystemAdmin,
    SystemFactory,
)
from sparkpoint.system.kafka.clients import (
    POOL,
    TIMEOUT_S,
    KafkaConsumer,
    KafkaProducer,
    client_config,
    new_client,
)
from sparkpoint.system.kafka.partitioner import kafka_partition
from sparkpoint.system.kafka.staging import (
    INTERNAL_PREFIXES,
    STAGING_RETENTION,
    KafkaStaging,
    close_publishers,
)

#: how long a process trusts a topic's partition count it read: a worker keeps its systems
#: between batches and runs (an existing SparkSession), and keys placed by the count a topic
#: had before it grew would reach tasks that do not hold their state. Growing a topic is
#: refused while the job runs, so a run after one starts well after the last read.
PARTITION_COUNT_TTL_S = 1.0
#: Kafka's own topics (sparkpoint's checkpoint and coordinator topics start with "__" as well)
_KAFKA_INTERNAL = frozenset({"__consumer_offsets", "__transaction_state"})
#: client settings the admin shares with the consumer (connection and security)
_SHARED = ("bootstrap.servers", "client.id", "security.", "sasl.", "ssl.", "socket.", "broker.")


def close_idle_clients(bootstrap: str | None = None) -> None:
    """Close this process's idle Kafka clients (of ``bootstrap``, or all), and its publishers
    of exactly-once output."""
    POOL.close_idle(bootstrap)
    close_publishers(bootstrap)


class KafkaAdmin(IntegerOffsets, SystemAdmin):
    def __init__(self, system: str, config: Mapping[str, str]) -> None:
        self.system = system
        consumer = client_config(system, config, "consumer")
        self._settings = {k: v for k, v in consumer.items() if k.startswith(_SHARED)}
        self._admin = new_client(AdminClient, dict(self._settings), system, "consumer")
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

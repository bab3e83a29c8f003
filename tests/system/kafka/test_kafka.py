"""kafka: the system contract against a Kafka-protocol broker (Tansu, started here on loopback),
Kafka's partitioner, config errors, and each way Tansu differs from Kafka."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError, SparkpointError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.kafka import KafkaSystemFactory
from sparkpoint.system.kafka.partitioner import kafka_partition, murmur2
from sparkpoint.system.registry import Systems
from sparkpoint.testing.services import TansuKafka
from tests.system.contract import SystemContract, SystemUnderTest, rec


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[TansuKafka]:
    with TansuKafka(tmp_path / "tansu") as b:  # memory-only, starts in well under a second
        yield b


@pytest.fixture
def system(broker: TansuKafka) -> SystemUnderTest:
    return SystemUnderTest(KafkaSystemFactory(), "kafka", broker.config())


class TestKafkaContract(SystemContract):
    @pytest.mark.xfail(
        strict=True,
        reason="Tansu deviation: ListOffsets by timestamp answers the first offset of the "
        "partition instead of the first record at or after the timestamp",
    )
    def test_offset_for_timestamp(self, system: SystemUnderTest) -> None:
        super().test_offset_for_timestamp(system)

    @pytest.mark.xfail(
        strict=True,
        raises=SparkpointError,
        reason="Tansu deviation: DeleteRecords is not supported (the broker drops the "
        "connection: 'Broker transport failure')",
    )
    def test_reads_start_at_the_oldest_record_left_after_a_delete(
        self, system: SystemUnderTest
    ) -> None:
        super().test_reads_start_at_the_oldest_record_left_after_a_delete(system)


def test_murmur2_matches_kafkas_utils_test_vectors() -> None:
    """The values of Kafka's ``UtilsTest.testMurmur2`` (as signed 32-bit Java ints)."""
    vectors = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        bytes([ord("a"), ord("b"), ord("c")]): 479470107,
    }
    for data, expected in vectors.items():
        h = murmur2(data)
        assert (h - (1 << 32) if h >= 1 << 31 else h) == expected, data


def test_keys_land_where_librdkafkas_murmur2_partitioner_puts_them(broker: TansuKafka) -> None:
    """An independent implementation (librdkafka's, in C) places the same keys the same way."""
    from confluent_kafka import Producer

    admin = KafkaSystemFactory().get_admin("kafka", broker.config())
    admin.create_stream(StreamSpec("keyed", 7))
    placed: dict[bytes, int] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None
        placed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2", "batch.num.messages": 1}
    )
    keys = [f"user-{i}".encode() for i in range(200)]
    for key in keys:
        producer.produce("keyed", key=key, value=b"v", on_delivery=delivered)
    assert producer.flush(30) == 0
    assert {k: admin.partition_for_key(k, 7) for k in keys} == placed
    assert kafka_partition(None, 7) == 0


def test_missing_brokers_and_bad_settings_name_the_key(broker: TansuKafka) -> None:
    with pytest.raises(ConfigError, match=r"systems\.k\.consumer\.bootstrap\.servers"):
        KafkaSystemFactory().get_admin("k", {"systems.k.factory": "kafka"})
    config = {**broker.config(), "systems.kafka.producer.no.such.setting": "1"}
    with pytest.raises(ConfigError, match=r"systems\.kafka\.producer\.\*.*no\.such\.setting"):
        KafkaSystemFactory().get_producer("kafka", config)


def test_a_consumer_that_would_skip_deleted_ranges_is_refused(broker: TansuKafka) -> None:
    """A read that starts before the oldest offset left must start there (a changelog whose
    head was deleted is restored from what it holds), never at the end."""
    key = "systems.kafka.consumer.auto.offset.reset"
    with pytest.raises(ConfigError, match=r"auto\.offset\.reset=latest.*samza\.offset\.default"):
        KafkaSystemFactory().get_consumer("kafka", {**broker.config(), key: "latest"})
    for fine in ("earliest", "smallest"):
        KafkaSystemFactory().get_consumer("kafka", {**broker.config(), key: fine}).close()


def test_compacted_streams_are_created_with_cleanup_policy_compact(broker: TansuKafka) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = KafkaSystemFactory().get_admin("kafka", broker.config())
    assert admin.create_stream(StreamSpec("changelog", 2, compacted=True))
    resource = ConfigResource(ConfigResource.Type.TOPIC, "changelog")
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    entries = client.describe_configs([resource])[resource].result(timeout=30)
    assert entries["cleanup.policy"].value == "compact"


def test_tansu_deviation_batched_produce_leaves_the_high_watermark_wrong(
    broker: TansuKafka,
) -> None:
    """Why the test set-up sends one record per produce request (``batch.num.messages=1``).
    Fails once Tansu reports the watermark of a batched produce right: then drop the setting."""
    config = {k: v for k, v in broker.config().items() if "batch.num.messages" not in k}
    config["systems.kafka.producer.linger.ms"] = "50"
    factory = KafkaSystemFactory()
    factory.get_admin("kafka", config).create_stream(StreamSpec("batched", 1))
    producer = factory.get_producer("kafka", config)
    for i in range(10):
        producer.send("batched", 0, rec(f"k{i}", f"v{i}", i))
    producer.flush()
    ssp = SystemStreamPartition("kafka", "batched", 0)
    upcoming = factory.get_admin("kafka", config).get_metadata([ssp])[ssp].upcoming
    assert upcoming != "10"  # Kafka: 10


def test_stopping_a_broker_closes_this_processs_idle_clients_of_it(tmp_path: Path) -> None:
    """Pooled clients of a stopped broker would reconnect (and log it) for ever."""
    from sparkpoint.system.kafka import clients as kafka

    with TansuKafka(tmp_path / "t") as b:
        factory = KafkaSystemFactory()
        factory.get_admin("kafka", b.config()).create_stream(StreamSpec("s", 1))
        producer = factory.get_producer("kafka", b.config())
        producer.send("s", 0, rec("k", "v", 1))
        producer.close()
        consumer = factory.get_consumer("kafka", b.config())
        assert [
            r.value for r in consumer.read(SystemStreamPartition("kafka", "s", 0), "0", "1")
        ] == [b"v"]
        consumer.close()
        assert sum(len(v) for v in kafka.POOL._idle.values()) >= 2
    assert not any(b.bootstrap in str(k) for k in kafka.POOL._idle)


def topic_configs(broker: TansuKafka, topic: str) -> dict[str, str]:
    from confluent_kafka.admin import AdminClient, ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    entries = client.describe_configs([resource])[resource].result(timeout=30)
    return {k: e.value for k, e in entries.items()}


def changelog_job(broker: TansuKafka, tmp_path: Path, **extra: str) -> Config:
    from tests.conftest import pageviews_config

    values = pageviews_config(
        tmp_path,
        broker.config("log"),
        **{"stores.user-counts.changelog": "log.user-counts-changelog", **extra},
    )
    return load_config(None, values)


def start(config: Config) -> None:
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.runtime.driver.inline import InlineRunner

    Systems(config).admin("log").create_stream(StreamSpec("pageviews", 4))
    coordinator = JobCoordinator(config, InlineRunner())
    try:
        coordinator.start()
    finally:
        coordinator.close()


def test_changelogs_are_created_compacted_with_a_compaction_lag_and_the_streams_properties(
    broker: TansuKafka, tmp_path: Path
) -> None:
    config = changelog_job(
        broker,
        tmp_path,
        **{
            "streams.user-counts-changelog.segment.bytes": "1048576",
            "systems.log.default.stream.retention.ms": "86400000",
        },
    )
    start(config)
    got = topic_configs(broker, "user-counts-changelog")
    assert got["cleanup.policy"] == "compact"
    assert got["min.compaction.lag.ms"] == "14400000"  # Samza's default: 4 hours
    assert got["segment.bytes"] == "1048576" and got["retention.ms"] == "86400000"
    assert "samza.offset.default" not in topic_configs(broker, "pageviews")
    assert topic_configs(broker, f"__checkpoint-{config.job_name}-1")["cleanup.policy"] == "compact"


@pytest.mark.parametrize(
    ("existing", "message"),
    [
        ({"cleanup.policy": "delete"}, r"cleanup\.policy=delete.*--add-config cleanup\.policy"),
        (
            {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"},
            r"min\.compaction\.lag\.ms=0, below 14400000.*--add-config min\.compaction",
        ),
    ],
    ids=["deleted-by-age", "compacted-too-soon"],
)
def test_an_existing_changelog_that_could_lose_state_stops_the_job(
    broker: TansuKafka, tmp_path: Path, existing: dict[str, str], message: str
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = NewTopic("user-counts-changelog", 4, 1, config=existing)
    client.create_topics([topic])["user-counts-changelog"].result(timeout=30)
    with pytest.raises(ConfigError, match="store user-counts: changelog log.user-counts-changel"):
        start(changelog_job(broker, tmp_path))
    with pytest.raises(ConfigError, match=message):
        start(changelog_job(broker, tmp_path))
    # without transactional state there is no trim to protect, and no lag is needed
    if "min.compaction.lag.ms" in existing:
        start(changelog_job(broker, tmp_path, **{NON_TRANSACTIONAL: "false"}))


NON_TRANSACTIONAL = "task.transactional.state.checkpoint.enabled"


def test_kafka_secrets_are_masked_wherever_config_is_shown() -> None:
    from sparkpoint.config import redact

    for key in (
        "systems.kafka.consumer.sasl.password",
        "systems.kafka.producer.ssl.key.password",
        "systems.kafka.consumer.sasl.oauthbearer.client.secret",
        "systems.kafka.consumer.ssl.keystore.password",
    ):
        assert redact(key, "hunter2") == "****", key
    assert redact("systems.kafka.consumer.bootstrap.servers", "b:9092") == "b:9092"
    assert redact("systems.kafka.consumer.security.protocol", "SASL_SSL") == "SASL_SSL"


def transactions(broker: TansuKafka) -> list[tuple[str, bytes | None]]:
    """Three records in an aborted transaction, then two in a committed one, read back by
    sparkpoint's consumer over the partition's whole range."""
    from confluent_kafka import Producer

    factory = KafkaSystemFactory()
    factory.get_admin("kafka", broker.config()).create_stream(StreamSpec("tx", 1))
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "transactional.id": "test",
            "batch.num.messages": 1,  # Tansu: see TansuKafka
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce("tx", value=b"aborted-%d" % i, partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i in range(2):
        producer.produce("tx", value=b"committed-%d" % i, partition=0)
    producer.commit_transaction(30)
    ssp = SystemStreamPartition("kafka", "tx", 0)
    meta = factory.get_admin("kafka", broker.config()).get_metadata([ssp])[ssp]
    assert meta.upcoming == "7"  # 5 records and 2 transaction markers
    consumer = factory.get_consumer("kafka", broker.config())
    return [(r.offset, r.value) for r in consumer.read(ssp, meta.oldest, meta.upcoming)]


def test_transaction_markers_are_never_read_as_records(broker: TansuKafka) -> None:
    got = transactions(broker)
    assert ("4", b"committed-0") in got and ("5", b"committed-1") in got
    assert not {"3", "6"} & {offset for offset, _ in got}  # the markers' offsets
    # a read that finds only the trailing commit marker moves its reader past it (the end of
    # the readable data); one that found a record does not say so
    consumer = KafkaSystemFactory().get_consumer("kafka", broker.config())
    ssp = SystemStreamPartition("kafka", "tx", 0)
    assert consumer.read(ssp, "6", "7") == []
    assert consumer.skipped_through(ssp) == "6"
    assert [r.offset for r in consumer.read(ssp, "5", "7")] == ["5"]
    assert consumer.skipped_through(ssp) is None
    consumer.close()


@pytest.mark.xfail(
    strict=True,
    reason="Tansu deviation: a read_committed fetch returns the records of aborted "
    "transactions (no aborted-transaction list in its fetch responses)",
)
def test_aborted_records_are_skipped_under_read_committed(broker: TansuKafka) -> None:
    assert [value for _, value in transactions(broker)] == [b"committed-0", b"committed-1"]


@pytest.mark.parametrize("api", ["task", "dataframe"])
def test_a_job_reads_a_topic_written_in_transactions_to_its_end(
    tmp_path: Path, broker: TansuKafka, api: str, request: pytest.FixtureRequest
) -> None:
    """An input written by a transactional producer (Kafka Streams' or Flink's exactly-once
    output) ends with a commit marker: the job reads every committed record, its lag reaches
    0 and ``--until-caught-up`` ends (it waited for the marker's offset as for a record). A
    transaction still open is waited for, never skipped: its records count once committed."""
    import json
    from collections import Counter

    from confluent_kafka import Producer

    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.runtime.driver.inline import InlineRunner
    from tests.helpers import changelog_job as make
    from tests.helpers import committed_counts

    config = make(tmp_path, broker.config("log"))
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": "upstream"}
        | {"batch.num.messages": 1}  # Tansu: see TansuKafka
    )
    producer.init_transactions(30)
    expected: Counter[str] = Counter()

    def views(round_: int) -> Counter[str]:
        producer.begin_transaction()
        sent: Counter[str] = Counter()
        for i in range(20):
            user = f"user-{(i * 7 + round_) % 6}"
            value = json.dumps({"user": user, "page": "/", "ts": 1_700_000_000_000 + i})
            partition = kafka_partition(user.encode(), 4)
            producer.produce("pageviews", key=user, value=value, partition=partition)
            sent[user] += 1
        producer.flush(30)
        return sent

    if api == "task":
        runner: object = InlineRunner()
    else:
        from pageviews_pipeline import job as pipeline

        from sparkpoint.runtime.dataframe.runner import DataFrameRunner

        runner = DataFrameRunner(request.getfixturevalue("spark"), pipeline, config)

    def run_job(max_batches: int) -> str:
        coordinator = JobCoordinator(config, runner)  # type: ignore[arg-type]
        try:
            return coordinator.run(until_caught_up=True, max_batches=max_batches).stopped_by
        finally:
            coordinator.close()

    for round_ in range(2):
        expected += views(round_)
        producer.commit_transaction(30)
    assert run_job(10) == "caught up"  # not --max-batches: it ended
    assert committed_counts(config) == dict(expected)
    open_ = views(2)  # a transaction left open: its records are not readable yet
    assert run_job(3) == "reached --max-batches 3"  # not caught up: it waits for them
    assert committed_counts(config) == dict(expected)
    producer.commit_transaction(30)
    assert run_job(10) == "caught up"
    assert committed_counts(config) == dict(expected + open_)


class _QueuedConsumer:
    """librdkafka's consumer as :func:`fetched` sees it: ``consume(n, timeout)`` blocks until it
    holds ``n`` messages or the timeout passed (recorded here as the time it would block)."""

    def __init__(self, queued: list[str], arriving: list[str]) -> None:
        self.queued, self.arriving, self.blocked = queued, arriving, 0.0

    def consume(self, n: int, timeout: float) -> list[str]:
        if len(self.queued) < n:
            self.blocked += timeout
        out, self.queued = self.queued[:n], self.queued[n:]
        return out

    def poll(self, timeout: float) -> str | None:
        if not self.arriving:
            self.blocked += timeout
            return None
        first, *rest = self.arriving
        self.queued, self.arriving = self.queued + rest, []
        return first


def test_a_read_takes_what_is_fetched_without_waiting_for_a_full_batch() -> None:
    """A range shorter than the batch size used to wait the whole timeout on every read."""
    from sparkpoint.system.kafka.fetch import fetched

    c = _QueuedConsumer(["a", "b"], [])
    assert fetched(c, 10_000, 0.2) == ["a", "b"] and c.blocked == 0
    c = _QueuedConsumer([], ["c", "d", "eof"])
    assert fetched(c, 10_000, 0.2) == ["c", "d", "eof"] and c.blocked == 0
    assert fetched(c, 10_000, 0.2) == [] and c.blocked == 0.2  # nothing came: waited once
    c = _QueuedConsumer(["a", "b", "c"], [])
    assert fetched(c, 2, 0.2) == ["a", "b"] and fetched(c, 2, 0.2) == ["c"]


def test_a_pooled_consumer_asks_for_a_topics_metadata_before_its_first_read_only() -> None:
    """A connected consumer learns of a topic it has not read before at its next scan of
    unknown topics, up to a second later: the pooled one asks once, before the first read."""
    from sparkpoint.system.kafka.fetch import PooledConsumer

    class Client:
        def __init__(self) -> None:
            self.calls: list[tuple[str, object]] = []

        def list_topics(self, topic: str, timeout: float) -> object:
            self.calls.append(("metadata", topic))
            answer = SimpleNamespace(error="UNKNOWN_TOPIC" if topic == "new" else None)
            return SimpleNamespace(topics={topic: answer})

        def assign(self, partitions: list[object]) -> None:
            self.calls.append(("assign", [(p.topic, p.partition, p.offset) for p in partitions]))  # type: ignore[attr-defined]

    client = Client()
    pooled = PooledConsumer(client)
    assert pooled.assign("in", 0, 5) is client
    pooled.assign("in", 1, 0)
    pooled.assign("changelog", 0, 7)
    pooled.assign("new", 0, 0)  # not in the metadata yet (just created): asked again next time
    pooled.assign("new", 0, 0)
    assert client.calls == [
        ("metadata", "in"),
        ("assign", [("in", 0, 5)]),
        ("assign", [("in", 1, 0)]),
        ("metadata", "changelog"),
        ("assign", [("changelog", 0, 7)]),
        ("metadata", "new"),
        ("assign", [("new", 0, 0)]),
        ("metadata", "new"),
        ("assign", [("new", 0, 0)]),
    ]


def test_a_partition_count_is_read_again_once_it_may_be_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker keeps its systems between runs (an existing SparkSession): a topic grown
    between two runs must not be placed by the count the worker read in the first one."""
    from sparkpoint.system.kafka import system as kafka_system

    admin = kafka_system.KafkaAdmin("k", {"systems.k.consumer.bootstrap.servers": "127.0.0.1:9"})
    counts = {"t": 4}
    asked: list[str] = []

    def list_topics(timeout: float) -> SimpleNamespace:
        asked.append("t")
        parts = dict.fromkeys(range(counts["t"]))
        return SimpleNamespace(topics={"t": SimpleNamespace(error=None, partitions=parts)})

    monkeypatch.setattr(admin, "_admin", SimpleNamespace(list_topics=list_topics))
    now = [100.0]
    monkeypatch.setattr(kafka_system.time, "monotonic", lambda: now[0])
    assert admin.partition_count("t") == 4
    counts["t"] = 8  # grown by another process
    now[0] += kafka_system.PARTITION_COUNT_TTL_S / 2
    assert admin.partition_count("t") == 4 and len(asked) == 1  # one metadata request
    now[0] += kafka_system.PARTITION_COUNT_TTL_S
    assert admin.partition_count("t") == 8 and len(asked) == 2


def test_a_staging_topic_grows_with_its_stream_in_a_process_that_staged_before() -> None:
    """The same reused worker: after the intermediate stream grew, its staging topic is grown
    to match before anything is staged to a new partition (Tansu cannot grow a topic: a fake
    admin stands in)."""
    from sparkpoint.system.kafka.staging import KafkaStaging, staging_topic

    class Admin:
        system = "k"

        def __init__(self) -> None:
            self.count = 4
            self.topics_now: dict[str, int] = {}
            self.grown: list[tuple[str, int]] = []

        def partition_count(self, stream: str) -> int:
            return self.count

        def create_stream(self, spec: StreamSpec) -> bool:
            if spec.name in self.topics_now:
                return False
            self.topics_now[spec.name] = spec.partitions
            return True

        def topics(self) -> dict[str, int]:
            return dict(self.topics_now)

        def add_partitions(self, stream: str, partitions: int) -> None:
            self.grown.append((stream, partitions))
            self.topics_now[stream] = partitions

    admin = Admin()
    staging = KafkaStaging(admin, {"systems.k.consumer.bootstrap.servers": "127.0.0.1:9"})  # type: ignore[arg-type]
    topic = staging_topic("by-user")
    assert staging.ensure("by-user", 0) == topic and admin.topics_now == {topic: 4}
    assert staging.ensure("by-user", 3) == topic and not admin.grown
    admin.count = 8  # grown by stream add-partitions, in another process
    assert staging.ensure("by-user", 3) == topic and not admin.grown  # within: not asked
    staging.ensure("by-user", 5)
    assert admin.grown == [(topic, 8)] and admin.topics_now == {topic: 8}

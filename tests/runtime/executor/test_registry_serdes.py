"""The example job (count page views per user) with its input and output in Avro through a
Schema Registry, on the embedded log and on Kafka (Tansu): the task sees each view as a dict,
the counts are exact, and the output decodes with confluent-kafka's own AvroDeserializer. A
record that is not in the wire format stops the job naming its SSP and offset, or is dropped
under task.drop.deserialization.errors (the dead-letter stream is the next step of issue 66)."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from sparkpoint.config import Config
from sparkpoint.errors import TaskError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from sparkpoint.testing.schema_registry import schema_registry
from tests.helpers import changelog_job, committed_counts
from tests.helpers import run_job as run

VIEW = {
    "type": "record",
    "name": "PageView",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "page", "type": "string"},
        {"name": "ts", "type": "long"},
    ],
}
COUNT = {
    "type": "record",
    "name": "UserCount",
    "fields": [{"name": "user", "type": "string"}, {"name": "count", "type": "long"}],
}


@pytest.fixture
def registry() -> Iterator[str]:
    with schema_registry() as url:
        yield url


def avro_job(tmp_path: Path, log: dict[str, str], registry: str, **overrides: str) -> Config:
    system = "log"
    avsc = tmp_path / "count.avsc"
    avsc.write_text(json.dumps(COUNT))
    return changelog_job(
        tmp_path,
        log,
        2,
        **{
            f"systems.{system}.schema.registry.url": registry,
            "streams.pageviews.samza.msg.serde": "avro",
            "streams.user-counts.samza.msg.serde": "counts",
            "serializers.registry.counts.type": "avro",
            "serializers.registry.counts.schema.file": str(avsc),
            **overrides,
        },
    )


def send_views(config: Config, registry: str, n: int, seed: int) -> Counter[str]:
    """``n`` page views in Avro, written by confluent-kafka's serializer; the count per user."""
    rng = random.Random(seed)
    serialize = AvroSerializer(SchemaRegistryClient({"url": registry}), json.dumps(VIEW))
    ctx = SerializationContext("pageviews", MessageField.VALUE)
    producer = Systems(config).producer("log")
    expected: Counter[str] = Counter()
    for i in range(n):
        user = f"user-{rng.randrange(12)}"
        expected[user] += 1
        value = serialize({"user": user, "page": f"/p/{i}", "ts": 1_700_000_000_000 + i}, ctx)
        # partitioned by user, as the example's input is; one record per produce request:
        # Tansu's high watermark is wrong after a batched one
        producer.send("pageviews", int(user[5:]) % 2, Record("", user.encode(), value, 0))
        producer.flush()
    return expected


def emitted(config: Config, registry: str) -> dict[str, int]:
    """The last count per user in the output, decoded by confluent-kafka's deserializer."""
    systems = Systems(config)
    decode = AvroDeserializer(SchemaRegistryClient({"url": registry}))
    ctx = SerializationContext("user-counts", MessageField.VALUE)
    admin = systems.admin("log")
    last: dict[str, int] = {}
    for p in range(admin.partition_count("user-counts")):
        ssp = SystemStreamPartition("log", "user-counts", p)
        end = admin.get_metadata([ssp])[ssp].upcoming
        for rec in systems.consumer("log").read(ssp, "0", end):
            value = decode(rec.value, ctx)
            last[value["user"]] = max(last.get(value["user"], 0), value["count"])
    return last


def test_avro_in_and_out_through_the_registry(
    tmp_path: Path, log_system: dict[str, str], registry: str
) -> None:
    config = avro_job(tmp_path, log_system, registry)
    expected = send_views(config, registry, 300, seed=1)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert emitted(config, registry) == dict(expected)


def test_a_record_not_in_the_wire_format_stops_the_job_or_is_dropped(
    tmp_path: Path, registry: str
) -> None:
    config = avro_job(tmp_path, {"systems.log.factory": "filelog"}, registry)
    expected = send_views(config, registry, 40, seed=2)
    producer = Systems(config).producer("log")
    producer.send("pageviews", 1, Record("", b"user-1", b'{"user": "user-1"}', 0))
    producer.flush()
    with pytest.raises(
        TaskError,
        match=r"cannot decode message at log\.pageviews\.1 offset \d+: avro serde: not in the "
        r"Schema Registry wire format",
    ):
        run(config, until_caught_up=True)
    dropping = avro_job(
        tmp_path,
        {"systems.log.factory": "filelog"},
        registry,
        **{"task.drop.deserialization.errors": "true"},
    )
    run(dropping, until_caught_up=True)
    assert committed_counts(dropping) == dict(expected)

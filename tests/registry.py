"""Avro jobs through a Schema Registry, for the tests of both APIs: the page-view and count
schemas, the example job reading and writing Avro, views written by confluent-kafka's own
serializer, and the output read back by its deserializer."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from sparkpoint.config import Config
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from sparkpoint.testing.schema_registry import schema_registry
from tests.helpers import changelog_job

#: the Avro schemas of examples/avro: a page view (VIEW), and a user's count (user-count.avsc)
SCHEMAS = Path(__file__).resolve().parent.parent / "examples" / "avro"
VIEW = json.loads((SCHEMAS / "page-view.avsc").read_text())


@pytest.fixture
def registry() -> Iterator[str]:
    with schema_registry() as url:
        yield url


def avro_job(tmp_path: Path, log: dict[str, str], registry: str, **overrides: str) -> Config:
    system = "log"
    avsc = SCHEMAS / "user-count.avsc"
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


def send_views(
    config: Config,
    registry: str,
    n: int,
    seed: int,
    *,
    system: str = "log",
    users: int = 12,
    partitions: int = 2,
    one_by_one: bool = True,
) -> Counter[str]:
    """``n`` page views in Avro, written by confluent-kafka's serializer, partitioned by user
    as the example's input is; the count per user. ``one_by_one``: one record per produce
    request (Tansu's high watermark is wrong after a batched one); else each partition's in
    one call."""
    rng = random.Random(seed)
    serialize = AvroSerializer(SchemaRegistryClient({"url": registry}), json.dumps(VIEW))
    ctx = SerializationContext("pageviews", MessageField.VALUE)
    producer = Systems(config).producer(system)
    expected: Counter[str] = Counter()
    parts: list[list[Any]] = [[] for _ in range(partitions)]
    for i in range(n):
        user = f"user-{rng.randrange(users)}"
        expected[user] += 1
        value = serialize({"user": user, "page": f"/p/{i}", "ts": 1_700_000_000_000 + i}, ctx)
        partition = int(user[5:]) % partitions
        if one_by_one:
            producer.send("pageviews", partition, Record("", user.encode(), value, 0))
            producer.flush()
        else:
            parts[partition].append(("", user.encode(), value, 0))
    for partition, records in enumerate(parts):
        if records:
            producer.send_fields_many("pageviews", partition, records)
    producer.flush()
    return expected


def emitted_all(config: Config, registry: str, system: str = "log") -> dict[str, list[int]]:
    """Every count the output holds per user, decoded by confluent-kafka's deserializer."""
    systems = Systems(config)
    decode = AvroDeserializer(SchemaRegistryClient({"url": registry}))
    ctx = SerializationContext("user-counts", MessageField.VALUE)
    admin = systems.admin(system)
    out: dict[str, list[int]] = {}
    for p in range(admin.partition_count("user-counts")):
        ssp = SystemStreamPartition(system, "user-counts", p)
        end = admin.get_metadata([ssp])[ssp].upcoming
        for rec in systems.consumer(system).read(ssp, "0", end):
            value = decode(rec.value, ctx)
            out.setdefault(value["user"], []).append(value["count"])
    return out


def emitted(config: Config, registry: str, system: str = "log") -> dict[str, int]:
    """The last count per user in the output."""
    return {user: max(counts) for user, counts in emitted_all(config, registry, system).items()}

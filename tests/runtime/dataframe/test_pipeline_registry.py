"""A DataFrame pipeline over Avro input through a Schema Registry: ``batch.df``'s ``value``
struct is derived from the input's registry schema (no value_schema written by hand), and the
counts go out in Avro, read back by confluent-kafka's own deserializer. Records written with an
older version of the schema are read by the latest, as the struct is built: a field it added
holds its default there, not NULL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from avro_counts_pipeline import by_referrer
from avro_counts_pipeline import job as avro_pipeline
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from sparkpoint.runtime.dataframe.runner import DataFrameRunner, registry_value_schema
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from tests.helpers import committed_counts, run_until_caught_up
from tests.registry import VIEW, avro_job, emitted, registry, send_views

__all__ = ["registry"]  # the fixture


def test_the_value_struct_comes_from_the_registry_and_counts_are_exact(
    tmp_path: Path, spark: Any, registry: str
) -> None:
    config = avro_job(tmp_path, {"systems.log.factory": "filelog"}, registry)
    expected = send_views(config, registry, 200, seed=3)
    assert registry_value_schema(config) == "`user` STRING, `page` STRING, `ts` BIGINT"
    run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, avro_pipeline, config)))
    assert committed_counts(config) == dict(expected)
    assert emitted(config, registry) == dict(expected)


def test_older_records_read_a_field_the_latest_schema_added_as_its_default(
    tmp_path: Path, spark: Any, registry: str
) -> None:
    config = avro_job(tmp_path, {"systems.log.factory": "filelog"}, registry)
    # every view in partition 0: one task counts them all (referrers are not the input's key)
    send_views(config, registry, 30, seed=4, partitions=1)  # version 1: no referrer
    v2 = {
        **VIEW,
        "fields": [*VIEW["fields"], {"name": "referrer", "type": "string", "default": "direct"}],
    }
    serialize = AvroSerializer(SchemaRegistryClient({"url": registry}), json.dumps(v2))
    ctx = SerializationContext("pageviews", MessageField.VALUE)
    producer = Systems(config).producer("log")
    for i in range(20):
        view = {"user": "u", "page": "/", "ts": i, "referrer": "ads" if i % 2 else "direct"}
        producer.send("pageviews", 0, Record("", b"u", serialize(view, ctx), 0))
    producer.flush()
    assert registry_value_schema(config).endswith("`referrer` STRING")  # type: ignore[union-attr]
    run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, by_referrer, config)))
    assert committed_counts(config) == {"direct": 30 + 10, "ads": 10}

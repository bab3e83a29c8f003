"""A DataFrame pipeline over Avro input through a Schema Registry: ``batch.df``'s ``value``
struct is derived from the input's registry schema (no value_schema written by hand), and the
counts go out in Avro, read back by confluent-kafka's own deserializer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from avro_counts_pipeline import job as avro_pipeline

from sparkpoint.runtime.dataframe.runner import DataFrameRunner, registry_value_schema
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from tests.helpers import committed_counts, run_until_caught_up
from tests.registry import avro_job, emitted, registry, send_views

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

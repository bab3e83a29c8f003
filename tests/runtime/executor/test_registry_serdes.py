"""The example job (count page views per user) with its input and output in Avro through a
Schema Registry, on the embedded log and on Kafka (Tansu): the task sees each view as a dict,
the counts are exact, and the output decodes with confluent-kafka's own AvroDeserializer. A
record that is not in the wire format stops the job naming its SSP and offset, or is dropped
under task.drop.deserialization.errors (the dead-letter stream is the next step of issue 66)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.errors import TaskError
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from tests.helpers import committed_counts
from tests.helpers import run_job as run
from tests.registry import avro_job, emitted, registry, send_views

__all__ = ["registry"]  # the fixture


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

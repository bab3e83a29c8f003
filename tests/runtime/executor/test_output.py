"""The output collector: a batch sent with ``send_many`` or ``send_arrow`` lands exactly as the
same messages sent one by one with ``send``: same bytes, partitions and order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkpoint.config import Config, load_config
from sparkpoint.errors import TaskError
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.runtime.executor.output import OutputCollector
from sparkpoint.system.base import OutgoingMessageEnvelope
from sparkpoint.system.registry import Systems
from tests.conftest import pageviews_config

KEYS: list[Any] = [f"user-{i}" for i in range(40)] + [None]
MESSAGES: list[Any] = [{"user": k, "count": i} for i, k in enumerate(KEYS)]


def _config(tmp_path: Path) -> Config:
    streams = {f"streams.{s}.partitions": "4" for s in ("one", "many")}
    return load_config(None, {**pageviews_config(tmp_path), **streams})


def _sent(config: Config, stream: str) -> list[tuple[int, bytes | None, bytes | None]]:
    systems = Systems(config)
    consumer = systems.consumer("filelog")
    out = []
    for p in range(4):
        ssp = SystemStreamPartition("filelog", stream, p)
        consumer.register(ssp, "0")
        out += [(p, r.key, r.value) for r in consumer.read(ssp, "0", "1000000")]
    consumer.close()
    systems.close()
    return out  # partition by partition, each in offset order


def _send_many(collector: OutputCollector, keys: list[Any] | None, messages: list[Any]) -> None:
    collector.send_many(SystemStream("filelog", "many"), keys, messages)


def _send_arrow(collector: OutputCollector, keys: list[Any] | None, messages: list[Any]) -> None:
    columns = pa.array(messages)  # structs of the dicts' fields
    collector.send_arrow(
        SystemStream("filelog", "many"), None if keys is None else pa.array(keys), columns
    )


@pytest.mark.parametrize(
    ("send", "extra"),
    [(_send_many, {}), (_send_arrow, {}), (_send_arrow, {"score": 0.5})],
    ids=["send_many", "send_arrow", "send_arrow-per-value"],  # a float takes the slow path
)
def test_a_batch_lands_as_sending_one_by_one(
    tmp_path: Path, send: Callable[..., None], extra: dict[str, Any]
) -> None:
    messages = [{**m, **extra} for m in MESSAGES]
    config = _config(tmp_path)
    systems = Systems(config)
    one = OutputCollector(config, systems, TaskName("Partition 0"))
    for key, message in zip(KEYS, messages, strict=True):
        one.send(OutgoingMessageEnvelope(SystemStream("filelog", "one"), key, message))
    one.send(OutgoingMessageEnvelope(SystemStream("filelog", "one"), None, {"keyless": True}))
    one.close()
    many = OutputCollector(config, systems, TaskName("Partition 0"))
    send(many, KEYS, messages)
    send(many, None, [{"keyless": True}])
    many.close()
    systems.close()
    assert many.sent == one.sent == len(MESSAGES) + 1
    expected = _sent(config, "one")
    assert _sent(config, "many") == expected
    assert len(expected) == len(MESSAGES) + 1
    assert (0, None, b'{"keyless":true}') in expected  # no key: partition 0
    assert len({p for p, _k, _v in expected}) > 1  # the keys spread over the partitions


def test_send_many_names_the_task_and_stream_of_a_message_it_cannot_encode(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    systems = Systems(config)
    collector = OutputCollector(config, systems, TaskName("Partition 3"))
    with pytest.raises(TaskError, match=r"task Partition 3: cannot encode message for .*many"):
        collector.send_many(SystemStream("filelog", "many"), ["a"], [{"bad": {1, 2}}])
    with pytest.raises(ValueError, match="2 keys for 1 messages"):
        collector.send_many(SystemStream("filelog", "many"), ["a", "b"], [{}])
    collector.close()
    systems.close()
    assert collector.sent == 0

"""The coordinator stream metadata store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkpoint.config import Config, load_config
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore, CorruptMetadataError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return load_config(
        None, {"job.name": "j", "systems.fl.factory": "filelog", "job.data.dir": str(tmp_path)}
    )


def test_read_after_write_delete_and_many_updates(config: Config) -> None:
    store = CoordinatorStreamStore(config)
    store.put("ns", "a", "1")
    assert store.get("ns", "a") == "1"
    for i in range(50):
        store.put("ns", "b", str(i))
    assert store.get("ns", "b") == "49"
    store.delete("ns", "a")
    assert store.get("ns", "a") is None
    store.put_all("other", {"x": "1", "y": "2", "z": None})
    assert store.all("other") == {"x": "1", "y": "2"}
    assert store.all("ns") == {"b": "49"}
    assert store.namespaces() == ["ns", "other"]


def test_bootstrap_after_restart_last_write_wins(config: Config) -> None:
    first = CoordinatorStreamStore(config, source="test")
    first.put_all("set-config", {"k1": "v1", "k2": "v2"})
    first.put("set-config", "k1", "v1b")
    first.delete("set-config", "k2")
    first.close()
    again = CoordinatorStreamStore(config)
    assert again.all("set-config") == {"k1": "v1b"}
    msg = again.message("set-config", "k1")
    assert (
        msg is not None
        and msg["source"] == "test"
        and {"host", "username", "timestamp"} <= set(msg)
    )


def test_message_format_on_the_stream(config: Config) -> None:
    store = CoordinatorStreamStore(config)
    store.put("set-changelog", "Partition 0", "3")
    store.delete("set-changelog", "Partition 0")
    ssp = SystemStreamPartition("fl", store.stream, 0)
    recs = Systems(config).consumer("fl").read(ssp, "0", "10")
    assert recs[0].key == b'[1,"set-changelog","Partition 0"]'
    message = json.loads(recs[0].value or b"")
    assert message["values"] == {"Partition": "3"}  # Samza's field for changelog mappings
    assert list(message) == ["host", "source", "values", "username", "timestamp"]
    assert recs[1].key == recs[0].key and recs[1].value is None


def test_two_writers_see_each_other_after_refresh(config: Config) -> None:
    a, b = CoordinatorStreamStore(config), CoordinatorStreamStore(config)
    a.put("ns", "k", "from-a")
    assert b.get("ns", "k") is None
    b.refresh()
    assert b.get("ns", "k") == "from-a"


def test_corrupt_set_message_names_stream_and_offset(config: Config) -> None:
    store = CoordinatorStreamStore(config)
    store.put("ns", "ok", "1")
    producer = Systems(config).producer("fl")
    producer.send(store.stream, 0, Record("", b'[1,"set-config","job.name"]', b"{", 0))
    producer.flush()
    with pytest.raises(CorruptMetadataError, match=r"__coordinator-j-1\.0 offset 1"):
        CoordinatorStreamStore(config)


def test_foreign_messages_are_skipped_with_a_warning(
    config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    """TestCoordinatorStreamMessage / issue 17: a message that is not ours is never fatal."""
    store = CoordinatorStreamStore(config)
    producer = Systems(config).producer("fl")
    for key, value in (
        (b"not-json", b"{}"),
        (b'[2,"set-config","k"]', b"{}"),  # a key version we do not know
        (b'[1,"raw-ns","bin"]', b"\xff\xfe"),  # raw bytes that are not text
    ):
        producer.send(store.stream, 0, Record("", key, value, 0))
    producer.flush()
    store.put("set-config", "job.name", "j")
    again = CoordinatorStreamStore(config)
    assert again.get("set-config", "job.name") == "j"
    for what in ("offset 0: Expecting value", "unknown key version 2", "non-UTF-8 value"):
        assert what in caplog.text


SAMZA_MESSAGES = [
    (
        b'[1,"set-config","job.name"]',
        b'{"host":"127.0.0.1","source":"SamzaContainer","values":{"value":"my-job-name"},'
        b'"username":"root","timestamp":1795432102875}',
    ),
    (
        b'[1,"set-changelog","Partition 0"]',
        b'{"host":"127.0.0.1","source":"SamzaContainer","values":{"Partition":"3"},'
        b'"username":"root","timestamp":1795432102879}',
    ),
    (
        b'[1,"samza-startpoint-v1","kafka.PageViewEvent.0"]',
        b'{"@type":"StartpointSpecific","creationTimestamp":1795432102858,"specificOffset":"42"}',
    ),
]


def test_samza_written_messages_are_read(config: Config) -> None:
    """Golden messages as Samza's CoordinatorStreamValueSerde and metadata store write them."""
    store = CoordinatorStreamStore(config)
    producer = Systems(config).producer("fl")
    for key, value in SAMZA_MESSAGES:
        producer.send(store.stream, 0, Record("", key, value, 0))
    producer.flush()
    again = CoordinatorStreamStore(config)
    assert again.get("set-config", "job.name") == "my-job-name"
    assert again.get("set-changelog", "Partition 0") == "3"
    assert (
        again.get("samza-startpoint-v1", "kafka.PageViewEvent.0") == SAMZA_MESSAGES[2][1].decode()
    )


def test_raw_namespaces_are_written_as_raw_bytes_and_legacy_envelopes_still_read(
    config: Config,
) -> None:
    store = CoordinatorStreamStore(config)
    store.put("samza-startpoint-v1", "fl.in.0", '{"x":1}')
    ssp = SystemStreamPartition("fl", store.stream, 0)
    recs = Systems(config).consumer("fl").read(ssp, "0", "10")
    assert recs[-1].value == b'{"x":1}'
    legacy = b'{"host":"h","source":"s","timestamp":1,"username":"u","values":{"value":"old"}}'
    producer = Systems(config).producer("fl")
    producer.send(store.stream, 0, Record("", b'[1,"liveness","driver"]', legacy, 0))
    producer.flush()
    assert CoordinatorStreamStore(config).get("liveness", "driver") == "old"

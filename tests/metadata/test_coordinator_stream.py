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
    assert json.loads(recs[0].value or b"")["values"] == {"value": "3"}
    assert recs[1].key == recs[0].key and recs[1].value is None


def test_two_writers_see_each_other_after_refresh(config: Config) -> None:
    a, b = CoordinatorStreamStore(config), CoordinatorStreamStore(config)
    a.put("ns", "k", "from-a")
    assert b.get("ns", "k") is None
    b.refresh()
    assert b.get("ns", "k") == "from-a"


def test_corrupt_message_names_stream_and_offset(config: Config) -> None:
    store = CoordinatorStreamStore(config)
    store.put("ns", "ok", "1")
    producer = Systems(config).producer("fl")
    producer.send(store.stream, 0, Record("", b"not-json", b"{}", 0))
    producer.flush()
    with pytest.raises(CorruptMetadataError, match=r"__coordinator-j-1\.0 offset 1"):
        CoordinatorStreamStore(config)

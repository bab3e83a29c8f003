"""Samza's wire formats (issue 17): golden messages as Samza writes them are read, and what
sparkpoint writes follows Samza's field names and shapes, so Samza's readers would take it.

Golden files are in tests/golden/samza (see its README); each test names the Samza test class
whose format it covers.
"""

from __future__ import annotations

import json
from pathlib import Path

from sparkpoint.checkpoint.checkpoint import CheckpointV1, CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import load_config
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.model.startpoint import (
    Startpoint,
    StartpointOldest,
    StartpointSpecific,
    StartpointTimestamp,
    StartpointUpcoming,
)
from sparkpoint.startpoint.manager import dump_fan_out, load_fan_out
from sparkpoint.storage.blobstore.index import SnapshotIndex
from sparkpoint.storage.changelog.marker import ChangelogMarker

GOLDEN = Path(__file__).parent / "golden" / "samza"
KAFKA_FACTORY = "org.apache.samza.storage.KafkaChangelogStateBackendFactory"
BLOB_FACTORY = "org.apache.samza.storage.blobstore.BlobStoreStateBackendFactory"


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


def test_checkpoint_keys_are_samzas(tmp_path: Path) -> None:
    """TestKafkaCheckpointLogKeySerde.testBinaryCompatibility: byte for byte."""
    from sparkpoint.checkpoint.manager import CheckpointManager

    config = load_config(
        None, {"job.name": "j", "systems.fl.factory": "filelog", "job.data.dir": str(tmp_path)}
    )
    manager = CheckpointManager(config)
    task = TaskName("Partition 0")
    assert manager._key(task, 1).decode() == golden("checkpoint-key-v1.json")
    assert manager._key(task, 2).decode() == golden("checkpoint-key-v2.json")


def test_samza_checkpoint_v2_is_read_with_factory_class_names() -> None:
    """TestCheckpointV2Serde: Samza's V2 with changelog and blob store markers."""
    v2 = CheckpointV2.loads(golden("checkpoint-v2.json"))
    assert str(v2.checkpoint_id) == "1614147487244-33577"
    assert v2.input_offsets == {SystemStreamPartition("kafka", "PageViewEvent", 0): "4242"}
    assert set(v2.state_checkpoint_markers) == {"changelog", "blobstore"}
    assert v2.state_checkpoint_markers["blobstore"] == {"store1": "blob-abc123"}
    marker = ChangelogMarker.loads(v2.state_checkpoint_markers["changelog"]["store1"])
    assert marker == ChangelogMarker(
        SystemStreamPartition("kafka", "my-job-store1-changelog", 0), "17"
    )
    # written back, it is Samza's JSON again, field for field
    again = json.loads(v2.dumps())
    assert again == json.loads(golden("checkpoint-v2.json"))
    assert list(again) == list(json.loads(golden("checkpoint-v2.json")))


def test_changelog_markers_are_samzas_both_ways() -> None:
    """TestKafkaStateCheckpointMarker: the JSON marker with keyBucket, null offset included."""
    text = golden("changelog-marker-null.json")
    marker = ChangelogMarker.loads(text)
    assert marker.offset is None and marker.ssp.stream == "my-job-store1-changelog"
    assert marker.dumps() == text


def test_samza_checkpoint_v1_is_read() -> None:
    """TestCheckpointV1Serde: Samza's V1 map; the checkpoint id comes from the changelog offset."""
    v1 = CheckpointV1.loads(golden("checkpoint-v1.json"))
    assert v1.input_offsets == {
        SystemStreamPartition("kafka", "PageViewEvent", 0): "4242",
        SystemStreamPartition("kafka", "my-job-store1-changelog", 0): "1614147487244-33577:17",
    }
    assert v1.checkpoint_id == CheckpointId.parse("1614147487244-33577")
    plain = (
        '{"SystemStreamPartition [a, b, 7]":'
        '{"system":"a","partition":"7","offset":"1","stream":"b"}}'
    )
    assert CheckpointV1.loads(plain).checkpoint_id == CheckpointId(0, 0)


def test_a_samza_v1_message_on_the_checkpoint_stream_does_not_abort_the_read(
    tmp_path: Path,
) -> None:
    from sparkpoint.checkpoint.manager import CheckpointManager
    from sparkpoint.system.base import Record
    from sparkpoint.system.registry import Systems

    config = load_config(
        None,
        {
            "job.name": "j",
            "systems.fl.factory": "filelog",
            "job.data.dir": str(tmp_path),
            "task.checkpoint.read.versions": "1",
        },
    )
    manager = CheckpointManager(config)
    manager.create_resources()
    producer = Systems(config).producer("fl")
    key = golden("checkpoint-key-v1.json").encode()
    producer.send(manager.stream, 0, Record("", key, golden("checkpoint-v1.json").encode(), 0))
    producer.flush()
    got = CheckpointManager(config).read_last_checkpoint(TaskName("Partition 0"))
    assert isinstance(got, CheckpointV1) and len(got.input_offsets) == 2


def test_samza_snapshot_index_is_read_and_ours_has_its_shape(tmp_path: Path) -> None:
    """TestSnapshotIndexSerde / TestDirIndex: no schema-version, rwx permissions, names."""
    index = SnapshotIndex.loads(golden("snapshot-index.json").encode())
    files = dict(index.dir_index.all_files())
    assert files["000011.sst"].metadata.mode == 0o644
    assert files["000011.sst"].checksum == 3735928559
    assert files["OPTIONS-000010"].blobs == ()
    assert index.prev_snapshot_index_blob_id is None
    again = json.loads(index.dumps())
    assert again == json.loads(golden("snapshot-index.json"))
    # a snapshot made here has Samza's metadata forms
    from sparkpoint.storage.blobstore.diff import metadata_of

    f = tmp_path / "f"
    f.write_bytes(b"x")
    f.chmod(0o640)
    meta = metadata_of(f)
    assert meta.permissions == "rw-r-----" and not meta.owner.isdigit()


def test_samza_startpoints_are_read_and_ours_are_samzas() -> None:
    """TestStartpointObjectMapper: @type, creationTimestamp, specificOffset, timestampOffset."""
    lines = golden("startpoints.jsonl").splitlines()
    parsed = [Startpoint.loads(line) for line in lines]
    assert parsed == [
        StartpointSpecific("42", creation_timestamp=1795432102858),
        StartpointTimestamp(123456, creation_timestamp=1614147480000),
        StartpointOldest(creation_timestamp=1795432102864),
        StartpointUpcoming(creation_timestamp=1795432102865),
    ]
    assert [sp.dumps() for sp in parsed] == lines
    # the form earlier sparkpoint versions wrote is still read
    legacy = '{"type":"specific","offset":"9","creationTimestamp":5}'
    assert Startpoint.loads(legacy) == StartpointSpecific("9", creation_timestamp=5)


def test_samza_fan_outs_are_read_and_ours_are_samzas() -> None:
    """TestStartpointObjectMapper (StartpointFanOutPerTask): {timestamp, fanOuts}."""
    task = TaskName("Partition 1")
    fan_out = load_fan_out(golden("startpoint-fan-out.json"), task)
    ssp = SystemStreamPartition("system1", "stream1", 1)
    assert fan_out == {ssp: StartpointTimestamp(123456, creation_timestamp=1614147480000)}
    ours = json.loads(dump_fan_out(fan_out))
    assert set(ours) == {"timestamp", "fanOuts"}
    assert ours["fanOuts"] == json.loads(golden("startpoint-fan-out.json"))["fanOuts"]

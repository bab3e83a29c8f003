from __future__ import annotations

import pytest

from sparkpoint.checkpoint import CheckpointId, CheckpointV2
from sparkpoint.errors import CheckpointError
from sparkpoint.model import SystemStreamPartition


def test_ids_are_unique_and_increasing() -> None:
    ids = [CheckpointId.create() for _ in range(2000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert CheckpointId.parse(str(ids[5])) == ids[5]
    with pytest.raises(CheckpointError, match="expected '<millis>-<nanos>'"):
        CheckpointId.parse("12:3")


def test_v2_round_trip_with_and_without_state() -> None:
    ssp = SystemStreamPartition("fl", "pv", 3)
    plain = CheckpointV2(CheckpointId.create(), {ssp: "41"})
    assert CheckpointV2.loads(plain.dumps()) == plain
    full = CheckpointV2(CheckpointId.create(), {ssp: "41"}, {"changelog": {"s": "x:y:z"}})
    data = full.to_json()
    assert data["version"] == 2
    assert data["input-offsets"] == {"fl.pv.3": "41"}
    assert data["state-checkpoint-markers"] == {
        "org.apache.samza.storage.KafkaChangelogStateBackendFactory": {"s": "x:y:z"}
    }
    assert list(data) == ["checkpoint-id", "input-offsets", "state-checkpoint-markers", "version"]
    assert CheckpointV2.loads(full.dumps()) == full


def test_v2_is_immutable_and_bad_input_is_clear() -> None:
    ckpt = CheckpointV2(CheckpointId.create(), {SystemStreamPartition("a", "b", 0): "1"})
    with pytest.raises(TypeError):
        ckpt.input_offsets[SystemStreamPartition("a", "b", 1)] = "2"  # type: ignore[index]
    with pytest.raises(CheckpointError, match="not valid JSON"):
        CheckpointV2.loads("{")
    with pytest.raises(CheckpointError, match="not a version 2"):
        CheckpointV2.loads('{"version": 1}')
    with pytest.raises(CheckpointError, match="malformed"):
        CheckpointV2.loads('{"version": 2, "checkpoint-id": "1-2", "input-offsets": {"x": "1"}}')


def test_v1_round_trip_with_changelog_offsets() -> None:
    from sparkpoint.checkpoint import CheckpointV1

    v2 = CheckpointV2(CheckpointId.create(), {SystemStreamPartition("fl", "pv", 0): "9"})
    changelog = SystemStreamPartition("fl", "store-changelog", 0)
    v1 = CheckpointV1.from_v2(v2, {changelog: "123"})
    assert v1.input_offsets[changelog] == f"{v2.checkpoint_id}:123"
    assert CheckpointV1.loads(v1.dumps()) == v1
    with pytest.raises(CheckpointError, match="not a version 1"):
        CheckpointV1.loads(v2.dumps())


def test_marker_serde_keeps_separators_in_the_payload() -> None:
    from sparkpoint.checkpoint.markers import SerializedMarker

    marker = SerializedMarker(1, "changelog", "1700000000000-5:42")
    text = str(marker)
    assert text == "1:changelog:1700000000000-5:42"
    assert SerializedMarker.parse(text) == marker
    for bad in ("1:changelog", "x:y:z", ":a:b", "1::p"):
        with pytest.raises(CheckpointError, match="invalid state checkpoint marker"):
            SerializedMarker.parse(bad)

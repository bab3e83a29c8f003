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
    assert data["state-checkpoint-markers"] == {"changelog": {"s": "x:y:z"}}
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

"""The checkpoint stream: versions, priorities, the SEP-28 migration, forward compatibility."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkpoint.checkpoint import CheckpointId, CheckpointV1, CheckpointV2
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config, load_config
from sparkpoint.errors import CheckpointError, ConfigError
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems

T = TaskName("Partition 0")
SSP = SystemStreamPartition("fl", "in", 0)


def config(tmp_path: Path, **values: str) -> Config:
    return load_config(
        None,
        {"job.name": "j", "systems.fl.factory": "filelog", "job.data.dir": str(tmp_path), **values},
    )


def manager(tmp_path: Path, **values: str) -> CheckpointManager:
    m = CheckpointManager(config(tmp_path, **values))
    m.create_resources()
    return m


def ckpt(offset: str, markers: dict[str, dict[str, str]] | None = None) -> CheckpointV2:
    return CheckpointV2(CheckpointId.create(), {SSP: offset}, markers or {})


def raw_types(m: CheckpointManager) -> list[str]:
    systems = Systems(m._config)
    ssp = SystemStreamPartition("fl", m.stream, 0)
    recs = systems.consumer("fl").read(ssp, "0", "1000")
    return [json.loads(r.key or b"")["type"] for r in recs]


def test_dual_write_puts_both_versions_on_the_stream(tmp_path: Path) -> None:
    m = manager(tmp_path)
    m.write_checkpoint(T, ckpt("5"))
    assert raw_types(m) == ["checkpoint", "checkpoint-v2"]


def test_v2_is_read_by_default_and_v1_when_configured(tmp_path: Path) -> None:
    """A deliberate difference from Samza (default 1): V2 first, so blob-store markers are read."""
    m = manager(tmp_path)
    c = ckpt("5", {"changelog": {"s": "x"}})
    m.write_checkpoint(T, c)
    assert CheckpointManager(m._config).read_last_checkpoint(T) == c
    # switching read versions by config moves between them on the same stream
    v1 = CheckpointManager(config(tmp_path, **{"task.checkpoint.read.versions": "1"}))
    got = v1.read_last_checkpoint(T)
    assert isinstance(got, CheckpointV1) and got.input_offsets == {SSP: "5"}


def test_reader_of_v1_only_skips_v2_and_unknown_messages(tmp_path: Path) -> None:
    m = manager(tmp_path, **{"task.checkpoint.write.versions": "2"})
    m.write_checkpoint(T, ckpt("5"))
    producer = Systems(m._config).producer("fl")
    key = json.dumps({"taskName": T.name, "type": "checkpoint-v9"}).encode()
    producer.send(m.stream, 0, Record("", key, b"{}", 0))
    producer.flush()
    reader = CheckpointManager(config(tmp_path, **{"task.checkpoint.read.versions": "1"}))
    assert reader.read_all() == {}
    assert CheckpointManager(config(tmp_path, **{"task.checkpoint.read.versions": "2"})).read_all()


def test_the_five_step_migration_by_config_alone(tmp_path: Path) -> None:
    # 1. today: write V1 only, read V1
    step1 = manager(
        tmp_path,
        **{"task.checkpoint.write.versions": "1", "task.checkpoint.read.versions": "1"},
    )
    step1.write_checkpoint(T, ckpt("1"))
    assert CheckpointManager(step1._config).read_last_checkpoint(T).input_offsets[SSP] == "1"  # type: ignore[union-attr]
    # 2. write both, still read V1
    step2 = manager(tmp_path, **{"task.checkpoint.read.versions": "1"})
    c2 = ckpt("2")
    step2.write_checkpoint(T, c2)
    got = CheckpointManager(step2._config).read_last_checkpoint(T)
    assert isinstance(got, CheckpointV1) and got.input_offsets[SSP] == "2"
    # 3. read V2 first, falling back to V1 where a task has no V2 yet
    t_old = TaskName("Partition 1")
    CheckpointManager(config(tmp_path, **{"task.checkpoint.write.versions": "1"})).write_checkpoint(
        t_old, ckpt("7")
    )
    step3 = CheckpointManager(config(tmp_path, **{"task.checkpoint.read.versions": "2,1"}))
    assert step3.read_last_checkpoint(T) == c2
    assert isinstance(step3.read_last_checkpoint(t_old), CheckpointV1)
    # 4. stable on V2: write both, read V2
    c4 = ckpt("4")
    step3.write_checkpoint(T, c4)
    assert CheckpointManager(step3._config).read_last_checkpoint(T) == c4
    # 5. stop writing V1: only V2 messages are added
    step5 = manager(
        tmp_path, **{"task.checkpoint.write.versions": "2", "task.checkpoint.read.versions": "2"}
    )
    before = raw_types(step5)
    c5 = ckpt("5")
    step5.write_checkpoint(T, c5)
    assert raw_types(step5)[len(before) :] == ["checkpoint-v2"]
    assert CheckpointManager(step5._config).read_last_checkpoint(T) == c5


def test_newer_lower_priority_checkpoint_wins_only_past_max_age(tmp_path: Path) -> None:
    m = manager(tmp_path, **{"task.checkpoint.write.versions": "2"})
    old = CheckpointV2(CheckpointId(1_000_000, 0), {SSP: "1"})
    m.write_checkpoint(T, old)
    v1_only = CheckpointManager(config(tmp_path, **{"task.checkpoint.write.versions": "1"}))
    v1_only.write_checkpoint(T, CheckpointV2(CheckpointId(1_000_500, 0), {SSP: "2"}))
    prefer_v2 = config(
        tmp_path, **{"task.checkpoint.read.versions": "2,1", "task.live.checkpoint.max.age": "1000"}
    )
    assert CheckpointManager(prefer_v2).read_last_checkpoint(T) == old
    v1_only.write_checkpoint(T, CheckpointV2(CheckpointId(1_005_000, 0), {SSP: "3"}))
    newer = CheckpointManager(prefer_v2).read_last_checkpoint(T)
    assert isinstance(newer, CheckpointV1) and newer.input_offsets[SSP] == "3"


def test_crash_between_v1_and_v2_reads_one_whole_commit(tmp_path: Path) -> None:
    m = manager(tmp_path)
    first = ckpt("10", {"changelog": {"s": "m1"}})
    m.write_checkpoint(T, first)
    second = ckpt("20", {"changelog": {"s": "m2"}})
    m.write_checkpoint(T, second, versions=[1])  # the driver died before the V2 message
    for read in ("2,1", "2", "1", "1,2"):
        got = CheckpointManager(
            config(tmp_path, **{"task.checkpoint.read.versions": read})
        ).read_last_checkpoint(T)
        assert got is not None
        if isinstance(got, CheckpointV2):
            assert got == first  # V2 markers come with V2's own offsets, never V1's newer ones
        else:
            assert got.checkpoint_id == second.checkpoint_id and got.input_offsets[SSP] == "20"


def test_bad_versions_and_corrupt_messages(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="task.checkpoint.read.versions='3'"):
        manager(tmp_path, **{"task.checkpoint.read.versions": "3"})
    m = manager(tmp_path)
    producer = Systems(m._config).producer("fl")
    key = json.dumps({"taskName": T.name, "type": "checkpoint-v2"}).encode()
    producer.send(m.stream, 0, Record("", key, b'{"version": 2, "input-offsets": 5}', 0))
    producer.flush()
    with pytest.raises(
        CheckpointError, match=r"offset 0: task Partition 0: malformed checkpoint V2"
    ):
        CheckpointManager(config(tmp_path, **{"task.checkpoint.read.versions": "2"})).read_all()

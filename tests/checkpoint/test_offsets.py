"""The offset manager: checkpoint, reset and default policies, retention, dropped inputs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sparkpoint.checkpoint import CheckpointId, CheckpointV2
from sparkpoint.checkpoint.offsets import OffsetManager
from sparkpoint.config import load_config
from sparkpoint.model import SystemStreamPartition, TaskModel, TaskName
from sparkpoint.system.base import PartitionMetadata
from sparkpoint.system.registry import Systems

A = SystemStreamPartition("fl", "a", 0)
B = SystemStreamPartition("fl", "b", 0)
GONE = SystemStreamPartition("fl", "gone", 0)
TASK = TaskModel(TaskName("Partition 0"), frozenset({A, B}), 0)
META = {A: PartitionMetadata("100", "199", "200"), B: PartitionMetadata("0", "9", "10")}


def manager(tmp_path: Path, **values: str) -> OffsetManager:
    config = load_config(
        None,
        {"job.name": "j", "systems.fl.factory": "filelog", "job.data.dir": str(tmp_path), **values},
    )
    return OffsetManager(config, Systems(config))


def test_checkpoint_resumes_after_the_last_processed_offset(tmp_path: Path) -> None:
    ckpt = CheckpointV2(CheckpointId.create(), {A: "150", B: "4"})
    nxt, last = manager(tmp_path).starting_offsets(TASK, ckpt, META)
    assert nxt == {A: "151", B: "5"} and last == {A: "150", B: "4"}


def test_default_and_reset_policies(tmp_path: Path) -> None:
    nxt, last = manager(
        tmp_path, **{"streams.b.samza.offset.default": "upcoming"}
    ).starting_offsets(TASK, None, META)
    assert nxt == {A: "100", B: "10"} and last == {}
    ckpt = CheckpointV2(CheckpointId.create(), {A: "150", B: "4"})
    reset = manager(tmp_path, **{"streams.a.samza.reset.offset": "true"})
    nxt, last = reset.starting_offsets(TASK, ckpt, META)
    assert nxt == {A: "100", B: "5"} and last == {B: "4"}


def test_offset_lost_to_retention_follows_the_policy_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = CheckpointV2(CheckpointId.create(), {A: "42", B: "4", GONE: "7"})
    with caplog.at_level(logging.INFO):
        nxt, last = manager(tmp_path).starting_offsets(TASK, ckpt, META)
    assert nxt[A] == "100" and A not in last
    assert "fl.a.0 checkpointed offset 42 is no longer in the stream (oldest is 100)" in caplog.text
    assert "dropping checkpointed fl.gone.0, no longer an input" in caplog.text

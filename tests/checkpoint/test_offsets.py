"""The offset manager: checkpoint, reset and default policies, out-of-range offsets, dropped
inputs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sparkpoint.checkpoint import CheckpointId, CheckpointV2
from sparkpoint.checkpoint.offsets import OffsetManager, OffsetOutOfRange
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


def test_a_dropped_input_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ckpt = CheckpointV2(CheckpointId.create(), {A: "150", B: "4", GONE: "7"})
    with caplog.at_level(logging.INFO):
        nxt, _ = manager(tmp_path).starting_offsets(TASK, ckpt, META)
    assert nxt == {A: "151", B: "5"}
    assert "dropping checkpointed fl.gone.0, no longer an input" in caplog.text


@pytest.mark.parametrize(
    ("offset", "needles"),
    [
        # retention removed 43..99 before the job read them
        ("42", ("last processed offset 42", "holds offsets 100..199", "retention")),
        # the stream was recreated shorter: 200..249 would be skipped once the log reached 250
        ("249", ("last processed offset 249", "holds offsets 100..199", "recreated")),
        ("abc", ("offset 'abc' is not an offset of system fl",)),
    ],
    ids=["before the start", "beyond the end", "not an offset"],
)
def test_a_checkpointed_offset_outside_the_partition_stops_the_job(
    tmp_path: Path, offset: str, needles: tuple[str, ...]
) -> None:
    """Issue 37: it followed the default policy (before the start) or waited for the log to
    grow past it (beyond the end), skipping input either way with exit 0."""
    ckpt = CheckpointV2(CheckpointId.create(), {A: offset, B: "4"})
    with pytest.raises(OffsetOutOfRange) as caught:
        manager(tmp_path).starting_offsets(TASK, ckpt, META)
    text = str(caught.value)
    assert text.startswith("task Partition 0: input fl.a.0: ")
    assert "startpoint set <job> --stream a --partition 0 --oldest" in text
    for needle in needles:
        assert needle in text


def test_resuming_at_either_end_of_the_partition_is_in_range(tmp_path: Path) -> None:
    at_oldest = CheckpointV2(CheckpointId.create(), {A: "99", B: "9"})  # next 100, and caught up
    nxt, _ = manager(tmp_path).starting_offsets(TASK, at_oldest, META)
    assert nxt == {A: "100", B: "10"}
    empty = {A: PartitionMetadata("300", None, "300"), B: META[B]}  # every record retired
    nxt, _ = manager(tmp_path).starting_offsets(
        TASK, CheckpointV2(CheckpointId.create(), {A: "299", B: "4"}), empty
    )
    assert nxt[A] == "300"
    with pytest.raises(OffsetOutOfRange, match="the partition is empty"):
        manager(tmp_path).starting_offsets(
            TASK, CheckpointV2(CheckpointId.create(), {A: "150", B: "4"}), empty
        )


def test_a_reader_past_the_committed_end_but_inside_the_log_is_in_range(tmp_path: Path) -> None:
    """A table read a changelog before its job switched to exactly-once: its offset may be past
    what read-committed readers see now, and it waits there rather than stopping."""
    from sparkpoint.checkpoint.offsets import check_in_range
    from sparkpoint.system.base import StreamSpec

    config = load_config(
        None,
        {"job.name": "j", "systems.fl.factory": "filelog", "job.data.dir": str(tmp_path)},
    )
    systems = Systems(config)
    admin = systems.admin("fl")
    admin.create_stream(StreamSpec("a", 1))
    producer = systems.producer("fl")
    for i in range(10):
        producer.send_fields("a", 0, ("", b"k", b"v", i))
    producer.flush()
    admin.commit_records(A, "4")
    committed = admin.get_committed_metadata([A])[A]
    assert committed.upcoming == "4"
    check_in_range(admin, TASK.name, A, "8", committed)  # held back: not out of range
    check_in_range(admin, TASK.name, A, "10", committed)
    with pytest.raises(OffsetOutOfRange):
        check_in_range(admin, TASK.name, A, "11", committed)

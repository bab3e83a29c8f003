"""The DataFrame phase machine on its own (no Spark, no stores): every legal order of a task's
batch phases, and every wrong one refused with an error naming task, batch and phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.errors import PhaseError
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.runtime.dataframe.phases import (
    Begun,
    Phase,
    ReadEnd,
    TaskPhases,
    WholeBatch,
    step_note,
)
from sparkpoint.storage.backend import RestoreStats
from sparkpoint.storage.local import LocalTaskState

TASK = TaskName("Partition 0")
SSP = SystemStreamPartition("filelog", "pageviews", 0)
BEGUN = Begun(
    {SSP: "5"},
    {SSP: "4"},
    [RestoreStats("counts", "changelog", 3)],
    kept=False,
    promoted_copy="3",  # the finish reports the promoted standby copy to the driver
)
END = ReadEnd({SSP: "9"}, {SSP: "8"}, processed=4)


def phases(tmp_path: Path, batch: int = 7, clean_up_only: bool = False) -> TaskPhases:
    return TaskPhases(LocalTaskState(tmp_path, TASK), TASK, "run1", batch, clean_up_only)


def test_a_whole_batch_runs_begin_steps_finish(tmp_path: Path) -> None:
    p = phases(tmp_path)
    assert p.phase(["a", "b"]) is Phase.NEW and p.begun() is None
    p.begin(BEGUN)
    assert p.phase(["a", "b"]) is Phase.BEGUN
    assert p.begun() == BEGUN  # a second computation of the source reuses the start
    p.start_step("a")
    p.end_read(END)
    p.start_step("b")
    assert p.phase(["a", "b"]) is Phase.STEPPED
    assert phases(tmp_path).here(["a", "b"]) == WholeBatch(
        BEGUN, END
    )  # a later phase loads the same
    p.finished()
    assert p.phase(["a", "b"]) is Phase.FINISHED
    assert p.begun() == BEGUN  # reading again after the finish touches no state


def test_notes_of_another_batch_count_as_absent(tmp_path: Path) -> None:
    old = phases(tmp_path, batch=6)
    old.begin(BEGUN)
    old.start_step("a")
    old.end_read(END)
    old.finished()
    p = phases(tmp_path, batch=7)
    assert p.phase(["a"]) is Phase.NEW
    assert not p.step_started("a") and p.read_end() is None
    assert p.here(["a"]) is None  # not begun here: the finish restores the checkpoint


def test_a_clean_up_only_batch_is_begin_then_finish(tmp_path: Path) -> None:
    p = phases(tmp_path, clean_up_only=True)
    p.begin(BEGUN)
    p.end_read(ReadEnd({}, {}, 0))
    assert p.here([]) == WholeBatch(BEGUN, ReadEnd({}, {}, 0))
    with pytest.raises(PhaseError, match=r"task Partition 0, batch 7: stateful step 'a'.*begun"):
        p.start_step("a")
    p.finished()


def test_a_step_where_the_batch_was_not_read_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PhaseError, match=r"Partition 0: stateful step 'a' of batch 7.*'new'"):
        phases(tmp_path).start_step("a")


def test_a_step_twice_is_refused_and_says_why_it_failed(tmp_path: Path) -> None:
    p = phases(tmp_path)
    p.begin(BEGUN)
    p.start_step("a")
    p.fail_step("a", "ValueError: boom")
    with pytest.raises(PhaseError, match=r"'a' was computed twice in batch 7 \(it failed: "):
        p.start_step("a")


def test_a_step_after_the_finish_is_refused(tmp_path: Path) -> None:
    p = phases(tmp_path)
    p.begin(BEGUN)
    p.end_read(END)
    p.finished()
    with pytest.raises(PhaseError, match=r"Partition 0, batch 7: stateful step 'a' in phase "):
        p.start_step("a")


def test_a_second_finish_is_refused(tmp_path: Path) -> None:
    p = phases(tmp_path)
    p.begin(BEGUN)
    p.end_read(END)
    assert p.here([]) == WholeBatch(BEGUN, END)
    p.finished()
    with pytest.raises(PhaseError, match=r"batch 7: a second finish in phase 'finished'"):
        p.here([])


def test_establishing_state_after_the_finish_is_refused(tmp_path: Path) -> None:
    p = phases(tmp_path)
    assert p.here([]) is None  # finished elsewhere: restored here
    p.finished()
    with pytest.raises(PhaseError, match=r"establishing the task's state in phase 'finished'"):
        p.begin(BEGUN)


def test_a_dropped_batch_finishes_from_the_checkpoint_even_after_a_finish(
    tmp_path: Path,
) -> None:
    p = phases(tmp_path)
    p.begin(BEGUN)
    p.start_step("a")
    p.end_read(END)
    p.drop("a")
    assert p.phase(["a"]) is Phase.DROPPED and p.here(["a"]) is None
    p.finished()
    p.drop("a")  # a retried fused step whose first attempt finished the batch too
    assert p.phase(["a"]) is Phase.DROPPED and p.here(["a"]) is None
    p.finished()
    with pytest.raises(PhaseError, match="a second finish"):
        p.here(["a"])


def test_a_batch_partly_here_is_not_here(tmp_path: Path) -> None:
    p = phases(tmp_path)
    p.begin(BEGUN)
    p.start_step("a")
    p.end_read(END)
    assert p.here(["a", "b"]) is None  # step b ran on another executor


def test_a_batch_read_in_part_is_an_error(tmp_path: Path) -> None:
    p = phases(tmp_path)
    p.begin(BEGUN)
    with pytest.raises(Exception, match=r"batch 7 read only part of its input \(a limit\(\)"):
        p.here([])


def test_step_notes_name_the_step_safely(tmp_path: Path) -> None:
    p = phases(tmp_path)
    p.begin(BEGUN)
    p.start_step("counts/by user")
    assert step_note("counts/by user") == "FRAME-STEP-counts_by_user"
    assert (tmp_path / "Partition_0" / "FRAME-STEP-counts_by_user").is_file()
    assert sorted(LocalTaskState(tmp_path, TASK).contents()["notes"]) == [
        "FRAME-BATCH",
        "FRAME-STEP-counts_by_user",
    ]

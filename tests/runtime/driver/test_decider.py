"""The loop's decider alone: no Spark, no file system, no clock (Flink's
CheckpointRequestDecider is tested the same way)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkpoint.runtime.driver.decider import Action, Decision, Intervals, LoopState, decide

INTERVALS = Intervals(commit_ms=60_000, intermediate_ms=1_000, window_ms=-1)
# a job reading on (no target), with input to read, just after a commit
READING = LoopState(
    to_target=False,
    pending=True,
    replay=False,
    waiting=False,
    rekeying=False,
    reads_to_target=False,
    drained_before=False,
    since_commit_ms=10.0,
    since_window_ms=10.0,
)


def test_input_to_read_runs_a_batch_that_does_not_commit_before_its_time() -> None:
    assert decide(READING, INTERVALS) == Decision(Action.RUN)


def test_nothing_to_read_and_nothing_due_idles() -> None:
    assert decide(replace(READING, pending=False), INTERVALS).action is Action.IDLE


@pytest.mark.parametrize("pending", [True, False])
def test_task_commit_ms_makes_a_commit_due_whether_or_not_there_is_input(pending: bool) -> None:
    state = replace(READING, pending=pending, since_commit_ms=60_000.0)
    assert decide(state, INTERVALS) == Decision(Action.RUN, commit=True)


def test_an_idle_job_whose_state_is_committed_ticks_and_does_not_commit() -> None:
    idle = replace(READING, pending=False, changed=False, since_commit_ms=60_000.0)
    assert decide(idle, INTERVALS) == Decision(Action.RUN, tick=True)
    # input, or a change since the last commit (timers fired by a tick), commits at once
    assert decide(replace(idle, pending=True), INTERVALS) == Decision(Action.RUN, commit=True)
    assert decide(replace(idle, changed=True), INTERVALS) == Decision(Action.RUN, commit=True)
    # a global table's new version is taken at a commit, idle or not
    assert decide(replace(idle, tables_changed=True), INTERVALS).commit
    assert decide(replace(idle, since_commit_ms=59_999.0), INTERVALS).action is Action.IDLE


def test_the_window_interval_fires_windows_and_a_negative_one_never() -> None:
    idle = replace(READING, pending=False, since_window_ms=5_000.0)
    assert decide(idle, replace(INTERVALS, window_ms=5_000)) == Decision(Action.RUN, window=True)
    assert decide(idle, INTERVALS).action is Action.IDLE


def test_caught_up_with_a_target_stops() -> None:
    state = replace(READING, to_target=True, pending=False)
    assert decide(state, INTERVALS) == Decision(Action.STOP)


def test_the_last_batch_to_a_target_commits_and_waits_for_its_uploads() -> None:
    state = replace(READING, to_target=True, reads_to_target=True)
    assert decide(state, INTERVALS) == Decision(Action.RUN, commit=True, final=True, wait=True)


def test_a_global_tables_new_version_makes_the_next_batch_commit_and_wait() -> None:
    """Issue 67: the tasks move to a global table's new version at a commit every task
    completes in its batch; with nothing to read, no batch is run for it."""
    state = replace(READING, tables_changed=True)
    assert decide(state, INTERVALS) == Decision(Action.RUN, commit=True, wait=True)
    idle = replace(state, pending=False)
    assert decide(idle, INTERVALS).action is Action.IDLE


def test_a_batch_that_does_not_reach_the_target_is_not_the_last() -> None:
    state = replace(READING, to_target=True, reads_to_target=False)
    assert decide(state, INTERVALS) == Decision(Action.RUN)


@pytest.mark.parametrize(
    "change", [{"replay": True}, {"waiting": True}, {"rekeying": True}], ids=lambda c: str(c)
)
def test_a_replay_or_rekeyed_records_keep_a_batch_from_being_the_last(
    change: dict[str, bool],
) -> None:
    state = replace(READING, to_target=True, reads_to_target=True, **change)
    assert not decide(state, INTERVALS).final


def test_rekeyed_records_waiting_commit_at_the_intermediate_interval() -> None:
    state = replace(READING, waiting=True, since_commit_ms=1_000.0)
    assert decide(state, INTERVALS).commit
    assert not decide(replace(state, since_commit_ms=999.0), INTERVALS).commit
    rekeying = replace(READING, rekeying=True, since_commit_ms=1_000.0)
    assert decide(rekeying, INTERVALS).commit


def test_caught_up_but_for_waiting_records_drains_with_a_commit() -> None:
    state = replace(READING, to_target=True, pending=False, waiting=True)
    first = decide(state, INTERVALS)
    assert first == Decision(Action.RUN, commit=True, drain=True)
    # a drain after a drain waits a poll interval first: a commit may wait for its upload
    again = decide(replace(state, drained_before=True), INTERVALS)
    assert again == Decision(Action.RUN, commit=True, drain=True, pause_first=True)


def test_reading_on_never_stops_by_itself() -> None:
    for pending in (True, False):
        for waiting in (True, False):
            state = replace(READING, pending=pending, waiting=waiting, since_commit_ms=1e9)
            assert decide(state, INTERVALS).action is not Action.STOP

"""The one place that decides what the driver's loop does next: pure, no I/O, no clock.

The loop (:mod:`sparkpoint.runtime.driver.coordinator`) measures where the job stands
(:class:`LoopState`: what is left to read, what waits to be published, how long since the last
commit) and asks :func:`decide` for a :class:`Decision`: stop (caught up), idle for a poll
interval, or run a batch, and whether that batch commits, fires windows or is the last of a
run to a target. The continuous mode's loop asks the same question about its epochs.

As Flink's ``CheckpointRequestDecider``, it is tested alone (``tests/runtime/driver``): no
Spark, no file system.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class Intervals:
    """The loop's settings, in milliseconds (``task.commit.ms``,
    ``task.commit.intermediate.ms``, ``task.window.ms``; a negative window never fires)."""

    commit_ms: int
    intermediate_ms: int
    window_ms: int


@dataclass(frozen=True)
class LoopState:
    """Where the job stands before a batch."""

    #: the run reads to the ends it found at start (``until_caught_up``)
    to_target: bool
    #: some task has input left before this batch's ends, or a logged batch waits for replay
    pending: bool
    #: the next batch replays a logged batch (its ends are the logged ones)
    replay: bool
    #: re-keyed records wait to be published (staged, or named by written checkpoints)
    waiting: bool
    #: this batch re-keys records (it reads a first-stage input of a job of stages)
    rekeying: bool
    #: one batch reads every SSP up to its target (``task.batch.max.messages`` allowing)
    reads_to_target: bool
    #: the previous loop drained too (a commit may wait for its upload: no busy loop)
    drained_before: bool
    since_commit_ms: float
    since_window_ms: float
    #: a global table has a version the tasks do not see yet: it is seen from a commit that
    #: every task completes in the batch (:mod:`sparkpoint.runtime.driver.global_tables`)
    tables_changed: bool = False
    #: some batch since the last commit may have changed state: it read input, fired timers
    #: or windows, or a task skipped its commit, or startpoints moved the tasks (an idle job's
    #: state is its last checkpoint's: ``task.commit.ms`` only ticks)
    changed: bool = True


class Action(enum.Enum):
    STOP = "stop"  # caught up: the run ends (its last commit follows)
    IDLE = "idle"  # nothing to read or due: wait a poll interval
    RUN = "run"  # run a batch


@dataclass(frozen=True)
class Decision:
    action: Action
    commit: bool = False  # every task commits in the batch
    window: bool = False  # window() is called (task.window.ms)
    #: the batch is the run's last to its target: it commits and waits for the uploads
    final: bool = False
    #: caught up but for re-keyed records waiting for a commit to be published
    drain: bool = False
    #: wait a poll interval before the batch (a drain after a drain)
    pause_first: bool = False
    #: the batch's commits finish in it (uploads waited for): a final batch's, or one that
    #: moves the tasks to a global table's new version
    wait: bool = False
    #: ``task.commit.ms`` passed with nothing changed since the last commit: a batch that
    #: fires what is due (processing-time timers, idle inputs' watermarks) and commits only
    #: if that changes something (the next decision's)
    tick: bool = False


def decide(state: LoopState, intervals: Intervals) -> Decision:
    """What the loop does next (docs/architecture.md, The driver loop)."""
    caught_up = state.to_target and not state.pending
    drain = caught_up and state.waiting
    if caught_up and not drain:
        return Decision(Action.STOP)
    final = (
        state.to_target
        and state.pending
        and not state.replay
        and not (state.waiting or state.rekeying)
        and state.reads_to_target
    )
    since = state.since_commit_ms
    interval = since >= intervals.commit_ms
    # re-keyed records reach the next stage only with a checkpoint that covers them: while
    # some wait, commit at task.commit.intermediate.ms, not task.commit.ms
    commit = (
        drain
        or final
        or (state.tables_changed and state.pending)
        or (interval and (state.changed or state.pending or state.tables_changed))
        or ((state.waiting or state.rekeying) and since >= intervals.intermediate_ms)
    )
    window = intervals.window_ms >= 0 and state.since_window_ms >= intervals.window_ms
    tick = interval and not commit
    if not state.pending and not commit and not window and not tick:
        return Decision(Action.IDLE, drain=drain)
    return Decision(
        Action.RUN,
        commit=commit,
        window=window,
        final=final,
        drain=drain,
        pause_first=drain and state.drained_before,
        wait=final or (state.tables_changed and state.pending),
        tick=tick,
    )

"""The micro-batch loop (:class:`MicroBatchLoop`): the driver's ``run``, as named phases over
the coordinator's parts.

Each turn reads top to bottom::

    check      still the driver; startpoints set meanwhile applied
    poll       each SSP's ends, an input that grew, where the next batch reads to
    decide     stop, idle or run, and what the batch commits (:mod:`.decider`, pure)
    batch      JobCoordinator.run_batch: plan, run, apply, commit, maintain
    account    retention after a commit, lags, the report shown and recorded

and the run ends with :meth:`MicroBatchLoop.finish`: every task commits, a pass cleans up
after the last checkpoints, the summary goes to the listener. A continuous mode's loop, whose
long-lived tasks commit inside an epoch, is a second loop over the same parts: the coordinator's
start-up, its apply and commit phases, the decider's commit policy, the accounting.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.failpoints import maybe_pause
from sparkpoint.metadata.job_state import PartitionCountChanged
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.runtime.driver.decider import Action, Decision, Intervals, LoopState, decide
from sparkpoint.runtime.driver.global_tables import read_nothing_past
from sparkpoint.runtime.driver.reports import BatchReport, RunSummary
from sparkpoint.runtime.driver.startup import GrowthWatch, input_counts
from sparkpoint.runtime.executor.timers import MAX_FIRED_PER_BATCH
from sparkpoint.runtime.plan import TaskBatchResult
from sparkpoint.system.base import PartitionMetadata

if TYPE_CHECKING:  # the coordinator runs this loop: it imports this module
    from sparkpoint.runtime.driver.coordinator import JobCoordinator

Offsets = dict[SystemStreamPartition, str]
Meta = Mapping[SystemStreamPartition, PartitionMetadata]


@dataclass
class Poll:
    """What the poll phase found: the partitions' metadata, where the batch reads to, and the
    logged batch it replays (None: a new batch)."""

    meta: Meta
    end: Offsets
    replay_id: int | None


class MicroBatchLoop:
    """Runs a started job's batches until it is stopped (or caught up, or ``max_batches``)."""

    def __init__(
        self,
        job: JobCoordinator,
        until_caught_up: bool,
        max_batches: int | None,
        final_watermark: bool = False,
    ) -> None:
        self.job = job
        #: the run ends the input: every event-time timer fires before the last commit
        self.final_watermark = final_watermark
        self.config = job.config
        self.max_batches = max_batches
        self.summary = RunSummary()
        self.ssps = [s for _ts, s in job.tasks.ssps()]
        self.counts = input_counts(self.config, self.ssps)  # what the tasks were made for
        self.growth = GrowthWatch(self.config, job.systems)
        self.grew: PartitionCountChanged | None = None  # raised at the end
        #: the ends the run reads to (``until_caught_up``), else None: read on
        self.targets = (
            {s: m.upcoming for s, m in job.partition_metadata(self.ssps).items()}
            if until_caught_up
            else None
        )
        self.intervals = Intervals(
            commit_ms=self.config.get_int("task.commit.ms"),
            intermediate_ms=self.config.get_int("task.commit.intermediate.ms"),
            window_ms=self.config.get_int("task.window.ms"),
        )
        self.limit = self.config.get_int("task.batch.max.messages")
        self.poll_seconds = self.config.get_int("task.poll.interval.ms") / 1000
        #: intermediate streams are read to their end, not to a target set at start: their
        #: messages appear as the tasks that send them commit (staged until then)
        flagged = set(self.config.intermediate_streams)
        self.intermediate = {s for s in self.ssps if s.system_stream in flagged}
        self.drained = False
        self.last_committed = False

    def run(self) -> RunSummary:
        job = self.job
        job.count_restored_ahead(self.summary)
        started = time.monotonic()
        while not job.stop_event.is_set():
            self.check()
            poll = self.poll()
            if poll is None:
                break
            state = self.measure(poll)
            decision = decide(state, self.intervals)
            self.drained = decision.drain
            if decision.action is Action.STOP:
                job.stop("caught up")
                break
            if decision.action is Action.IDLE:
                job.stop_event.wait(self.poll_seconds)
                continue
            if decision.pause_first:  # a commit may wait for its upload: no busy loop
                job.stop_event.wait(self.poll_seconds)
            maybe_pause(self.config, "before-batch")
            report, results = job.run_batch(
                poll.end,
                commit=decision.commit,
                window=decision.window,
                wait=decision.wait,
                batch_id=poll.replay_id,
            )
            self.last_committed = all(r.state_id.committed for r in results)
            self.note_changes(state, decision, results)
            if report.committed:
                job.maintenance.after_commit(job.tasks.checkpointed(), self.checkpoints())
            self.account(report)
            if any(r.shutdown_requested for r in results):
                job.stop("a task asked to shut down")
            if self.max_batches is not None and self.summary.batches >= self.max_batches:
                job.stop(f"reached --max-batches {self.max_batches}")
        self.finish()
        self.summary.seconds = time.monotonic() - started
        self.summary.stopped_by = job.stop_reason
        if job.listener:
            job.listener.on_end(self.summary)
        if self.grew is not None:
            raise self.grew
        return self.summary

    def check(self) -> None:
        """Still the driver; startpoints a start deferred, or a tool asked to apply now."""
        job = self.job
        job.check_still_the_driver()
        job.apply_deferred_startpoints(self.summary)
        replaying = job.logged is not None and bool(job.logged.replay)
        # not while logged batches wait to be replayed: their ids come first
        if (
            job.startpoints is not None
            and not replaying
            and job.startpoints.take_apply_now_request()
        ):
            job.report(self.summary, job.apply_startpoints_now())

    def poll(self) -> Poll | None:
        """Where the next batch reads to; None when an input grew (the job stops)."""
        job = self.job
        meta = job.partition_metadata(self.ssps)
        grown = self.growth.grown(self.counts)  # after the ends: what lies before them is old
        if grown is not None:
            self.grew = grown
            job.stop(str(grown))
            return None
        job.tasks.check_resume_offsets(meta)
        end = (
            dict(self.targets)
            if self.targets is not None
            else {s: m.upcoming for s, m in meta.items()}
        )
        end.update({s: meta[s].upcoming for s in self.intermediate})
        logged = job.logged.next_replay() if job.logged is not None else None
        if logged is not None:
            return Poll(meta, job.tasks.replay_ends(logged[1]), logged[0])
        if job.exact_batches:
            end = job.tasks.bounded(end)
        return Poll(meta, end, None)

    def measure(self, poll: Poll) -> LoopState:
        """Where the job stands before the batch, for the decider."""
        job = self.job
        behind = job.tasks.behind(poll.end)
        # what the driver knows waits to be published: parts staged since the last written
        # checkpoints, parts of checkpoints written since the last batch began, and (exact
        # batches) the parts of logged batches (no file listing: a dead attempt's part is
        # never published, and is swept at the next start)
        waiting = bool(self.intermediate) and (
            job.writer.to_publish > 0
            or job.tasks.waiting_outputs()
            or (job.logged is not None and job.logged.waiting())
        )
        goal = {**(self.targets or {}), **{s: poll.meta[s].upcoming for s in self.intermediate}}
        now = time.monotonic()
        return LoopState(
            to_target=self.targets is not None,
            pending=poll.replay_id is not None or bool(behind),
            replay=poll.replay_id is not None,
            waiting=waiting,
            rekeying=bool(self.intermediate) and bool(behind - self.intermediate),
            reads_to_target=self.targets is not None and job.tasks.reads_all(goal, self.limit),
            drained_before=self.drained,
            since_commit_ms=(now - job.last_commit) * 1000,
            since_window_ms=(now - job.last_window) * 1000,
            tables_changed=job.global_tables.refresh(),
            changed=job.changed_since_commit,
        )

    def note_changes(
        self, state: LoopState, decision: Decision, results: list[TaskBatchResult]
    ) -> None:
        """Whether the state may differ from the last commit's after this batch (the
        decider's ``changed``): a commit covers its batch unless a task skipped it; a batch
        that read input or fired windows or timers changes it, and so does an earlier commit
        whose upload failed (a task reports it as skipped, in any batch). A tick that changed
        nothing counts as a commit (the state is the committed one), so the next is a commit
        interval away."""
        job = self.job
        skipped = any(r.commit_skipped for r in results)
        quiet = not (state.pending or decision.window or skipped) and not any(
            r.processed or r.timers_fired for r in results
        )
        if decision.commit:
            job.changed_since_commit = skipped
        elif not quiet:
            job.changed_since_commit = True
        if decision.tick and not job.changed_since_commit:
            job.last_commit = time.monotonic()

    def checkpoints(self) -> dict[TaskName, Checkpoint]:
        """Every task's last written checkpoint (a task that has none yet left out)."""
        return {
            ts.model.name: ts.last_checkpoint
            for ts in self.job.tasks.values()
            if ts.last_checkpoint is not None
        }

    def account(self, report: BatchReport) -> None:
        """A batch's lags measured after it ran, then counted, shown and recorded."""
        self.measure_lags(report, self.job.partition_metadata(self.ssps))
        self.job.report(self.summary, report)

    def measure_lags(self, report: BatchReport, meta: Meta) -> None:
        report.lag = self.job.tasks.lags(meta)
        report.stages = list(self.job.tasks.stage_lags)

    def end_input(self) -> None:
        """``--final-watermark``, once caught up: passes that read nothing with each task's
        watermark at the end of time, so that every event-time timer fires (the last windows
        and sessions go out), committed; one more only when a task fired its per-batch most."""
        job = self.job
        for _ in range(1000):
            report, results = job.run_batch(
                job.tasks.resumes(), commit=True, wait=True, end_of_input=True
            )
            self.last_committed = all(r.state_id.committed for r in results)
            self.account(report)
            if all(r.timers_fired < MAX_FIRED_PER_BATCH for r in results):
                return

    def finish(self) -> None:
        """The run's end: every task commits (unless the last batch did), then a pass that
        reads nothing cleans up after the final checkpoints; lags measured after that pass,
        which publishes what the last checkpoints name (re-keyed records an intermediate
        stream's readers have yet to read are lag too)."""
        job = self.job
        if self.final_watermark and job.stop_reason == "caught up":
            self.end_input()
        if not self.last_committed:
            meta = job.partition_metadata(self.ssps)
            for report in job.commit_all():
                self.measure_lags(report, meta)
                job.report(self.summary, report)
        job.clean_up()
        if all(read_nothing_past(ts) for ts in job.tasks.values()):
            job.global_tables.stopped_cleanly(
                {ts.model.name: ts.last_checkpoint for ts in job.tasks.values()},
                job.coordinator_store(),
            )
        self.summary.lag = job.tasks.lags(job.partition_metadata(self.ssps))

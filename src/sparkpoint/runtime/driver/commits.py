"""Phases 3 and 4 of a batch (docs/architecture.md, The commit): each task's result applied
to what the driver knows of it, the checkpoints it completed queued (step 4, the driver's view
moves on at once), then written in one append, and the startpoints they cover removed
(step 5). :class:`CheckpointWriter` is the only writer of the checkpoint stream.

A written checkpoint is what a restart trusts; so a failed write stops the driver for good
(no later batch is planned from a view that may not be what is written), and a commit that
forks the chain or names output the task no longer holds is never written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV2
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.errors import SparkpointError
from sparkpoint.failpoints import maybe_crash
from sparkpoint.model import TaskName
from sparkpoint.runtime.driver.affinity import HostAffinity
from sparkpoint.runtime.driver.global_tables import GlobalTableVersions
from sparkpoint.runtime.driver.reports import Transactions
from sparkpoint.runtime.driver.task_state import DriverTasks, TaskState, parts_of
from sparkpoint.runtime.plan import TaskBatchResult
from sparkpoint.startpoint.manager import StartpointManager
from sparkpoint.storage.backend import StateBackendAdmin, v1_changelog_offsets
from sparkpoint.storage.outputs import committed_parts, exactly_once, foreign_parts, uncovered
from sparkpoint.storage.state_id import check_transition
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)


class CheckpointWriter:
    """Applies task results and writes the checkpoints they completed."""

    def __init__(
        self,
        config: Config,
        systems: Systems,
        checkpoints: CheckpointManager,
        tasks: DriverTasks,
        tx: Transactions,
        check_still_the_driver: Callable[[], None],
    ) -> None:
        self.config = config
        self.systems = systems
        self.checkpoints = checkpoints
        self.tasks = tasks
        #: the driver's tally of transactions (shared with the coordinator)
        self.tx = tx
        self.check_still_the_driver = check_still_the_driver
        #: set at start: the startpoints a written checkpoint covers, where tasks committed,
        #: and the backends whose records a written checkpoint makes visible (exactly-once)
        self.startpoints: StartpointManager | None = None
        self.affinity: HostAffinity | None = None
        self.admins: list[StateBackendAdmin] = []
        #: the global tables' versions, recorded in every checkpoint written
        self.global_tables: GlobalTableVersions | None = None
        #: staged parts named by the checkpoints written since the last batch began (its
        #: clean-ups publish them)
        self.to_publish = 0
        #: checkpoints the batch's results completed, written together (:meth:`write_queued`)
        self._queued: list[tuple[TaskState, CheckpointV2]] = []
        #: why writing queued checkpoints failed: no batch runs after that
        self._unwritten: str | None = None

    def refuse_if_unwritten(self) -> None:
        """Before a batch: stop for good once a write of checkpoints failed."""
        if self._unwritten is not None:
            raise SparkpointError(
                f"job {self.config.job_label}: this driver failed to write its tasks' "
                f"checkpoints ({self._unwritten}), so what it holds of them may not be what "
                "is written: start the job again (a new driver reads the written ones)"
            )

    def apply(self, result: TaskBatchResult) -> bool:
        """Phase 3 for one task: check its state's transition, move its offsets on, and queue
        the checkpoints it completed; whether any was queued."""
        ts = self.tasks[result.task]
        check_transition(result.task, result.batch, ts.expected_state_id, result.state_id)
        ts.expected_state_id = result.state_id
        ts.resume = dict(result.next_offsets)
        ts.last_processed = dict(result.last_processed)
        ts.processed += result.processed
        # parts it held that the task no longer does: it restored, and that output is gone
        self.tx.aborted += bool(parts_of(ts.pending_outputs) - parts_of(result.staged_outputs))
        ts.pending_outputs = dict(result.staged_outputs)
        for info in result.restored:
            log.info(
                "task %s store %s: state from %s (%d entries, %d bytes, %.2fs)",
                result.task,
                info.store,
                info.source,
                info.entries,
                info.bytes,
                info.seconds,
            )
        written = False
        bases = result.completed_bases or [None] * len(result.completed_checkpoints)
        for text, base in zip(result.completed_checkpoints, bases, strict=True):
            checkpoint = CheckpointV2.loads(text)
            if not writable(ts, result, checkpoint, base):
                continue
            self._queue(ts, checkpoint)
            held = parts_of(ts.pending_outputs)
            ts.pending_outputs = uncovered(ts.pending_outputs, checkpoint)
            self.tx.committed += held != parts_of(ts.pending_outputs)
            # its parts go out with the task's next clean-up (the next batch's step 0)
            self.to_publish += len(committed_parts(checkpoint))
            written = True
            if self.affinity is not None:
                self.affinity.committed(result, str(checkpoint.checkpoint_id))
        return written

    def _queue(self, ts: TaskState, checkpoint: CheckpointV2) -> None:
        """Step 4 of the commit, queued: the driver's view moves on now, and
        :meth:`write_queued` writes the batch's checkpoints in one append before anything
        that depends on them being durable (the startpoints they cover, a publish, the batch
        log's pruning). A failed write stops the driver, so its view is never acted on."""
        self._queued.append((ts, checkpoint))
        ts.last_checkpoint = checkpoint
        for ssp, offset in checkpoint.input_offsets.items():
            if ssp in ts.model.ssps:
                ts.from_checkpoint[ssp] = self.systems.admin(ssp.system).offset_after(ssp, offset)
        ts.checkpoint_last_processed = {
            s: o for s, o in checkpoint.input_offsets.items() if s in ts.model.ssps
        }

    def write_queued(self) -> None:
        """Phase 4: write the queued checkpoints: one message per task and configured version,
        one flush; then step 5, the startpoints they cover; then where each task committed."""
        queued, self._queued = self._queued, []
        if not queued:
            return
        versions: dict[str, str] = {}
        if self.global_tables is not None:
            marked, versions = self.global_tables.mark(queued, len(self.tasks))
            queued = [(ts, c) for (ts, _), c in zip(queued, marked, strict=True)]
            for ts, c in queued:
                ts.last_checkpoint = c
        try:
            self.check_still_the_driver()
            self.checkpoints.write_checkpoints(
                [
                    (
                        ts.model.name,
                        c,
                        v1_changelog_offsets(self.config, c.state_checkpoint_markers),
                    )
                    for ts, c in queued
                ],
                after_each=lambda flush: maybe_crash(self.config, "after-checkpoint-write", flush),
            )
        except BaseException as exc:
            # the driver's view moved on with checkpoints some of which may not be written: a
            # batch planned from it could clean up after a checkpoint nobody can read
            self._unwritten = f"{type(exc).__name__}: {exc}"
            raise
        if self.global_tables is not None:
            self.global_tables.written(versions)
        if exactly_once(self.config):  # the state records they cover become visible
            written: list[tuple[TaskName, Checkpoint]] = [(ts.model.name, c) for ts, c in queued]
            for admin in self.admins:
                admin.commit_records(written)
        for ts, checkpoint in queued:
            covered = {s for s in ts.startpoints if s in checkpoint.input_offsets}
            if covered and self.startpoints is not None:
                # step 5 of the commit: the checkpoint holds offsets read after the startpoint
                self.startpoints.remove_fan_out_for_task(ts.model.name, covered)
                ts.startpoints -= covered
        if self.affinity is not None:
            self.affinity.record_commits()


def writable(
    ts: TaskState, result: TaskBatchResult, checkpoint: CheckpointV2, base: str | None
) -> bool:
    """Whether a commit the task completed may be written: newer than the last written,
    built on it, and naming no output the task no longer holds."""
    last = ts.last_checkpoint
    if last is not None and checkpoint.checkpoint_id <= last.checkpoint_id:
        return False
    last_id = None if last is None else str(last.checkpoint_id)
    if base != last_id:
        # built on another checkpoint than the last written one (the task ran on two
        # executors at once, e.g. an upload that finished after the task moved): its
        # snapshot forks the chain, and writing it would let two clean-ups delete each
        # other's blobs. Dropped; its uploads expire with their TTL.
        log.info(
            "task %s: not writing commit %s, built on %s instead of the last written %s",
            result.task,
            checkpoint.checkpoint_id,
            base,
            last_id,
        )
        return False
    foreign = foreign_parts(checkpoint, result.staged_outputs)
    if foreign:
        # a commit of a lineage the task left (it restored since): its output was
        # staged again by this one, and writing it would publish that twice
        log.warning(
            "task %s: not writing commit %s: it names output (%s) the task no longer "
            "holds since it restored",
            result.task,
            checkpoint.checkpoint_id,
            ", ".join(foreign[:3]),
        )
        return False
    return True

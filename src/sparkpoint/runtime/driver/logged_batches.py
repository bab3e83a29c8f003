"""Exact batches (DataFrame pipelines): the driver's side of the batch log
(:class:`~.batchlog.BatchLog`) and of the output each batch staged
(:mod:`.batch_outputs`).

A logged batch has a durable id and end offsets; one that not every task's checkpoint covers is
replayed under the same id after a restart or a rewind (:attr:`LoggedBatches.replay`). With
exactly-once output, a batch's staged output is kept in its log entry before any checkpoint
covering it is written, and published once every checkpoint covers it
(:meth:`LoggedBatches.prune`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from sparkpoint.config import Config
from sparkpoint.errors import SparkpointError
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.model import SystemStreamPartition
from sparkpoint.runtime.driver import batch_outputs
from sparkpoint.runtime.driver.batchlog import BatchLog
from sparkpoint.runtime.driver.reports import Transactions
from sparkpoint.runtime.plan import BatchOutputs, TaskBatchResult
from sparkpoint.storage.outputs import exactly_once, stages_output
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)

Offsets = Mapping[SystemStreamPartition, str]
Compare = Callable[[SystemStreamPartition, str, str], int]
#: a logged batch: its id and end offsets
Logged = tuple[int, dict[SystemStreamPartition, str]]


class LoggedBatches:
    """The batch log of a job run by exact batches, and the batches it replays."""

    def __init__(
        self, config: Config, systems: Systems, store: CoordinatorStreamStore, tx: Transactions
    ) -> None:
        self.config = config
        self.systems = systems
        self.log = BatchLog(store)
        #: the driver's tally of transactions (shared with the coordinator)
        self.tx = tx
        #: logged batches waiting to be replayed, under their own ids, before any new one
        self.replay: list[Logged] = []

    def open(self, checkpointed: Offsets, cmp: Compare, *, startpoints_wait: bool) -> None:
        """At start: the batches to replay (logged before the last stop, not covered by every
        task's ``checkpointed`` offsets); at-least-once, their output published now; what a
        crash left staged swept."""
        replay = self.log.uncovered(checkpointed, cmp)
        if replay and startpoints_wait:
            log.warning(
                "startpoints wait until batches %d-%d (logged before the last stop, not "
                "covered by every task's checkpoint) are replayed: they apply once the "
                "replay's checkpoints are written, so that no row those batches re-keyed is "
                "lost",
                replay[0][0],
                replay[-1][0],
            )
        if replay and not exactly_once(self.config):
            # replayed at-least-once: the replay sends its own output as it goes, which misses
            # the rows of tasks whose checkpoints cover the batch already; its re-keyed rows
            # (staged whatever the guarantee) are kept for the replay, which discards its own
            self.publish_uncovered(replay, "the job now runs at-least-once")
        self.replay = replay
        self.prune(checkpointed, cmp, sweep=True)  # what a crash left staged, whatever is published
        if replay:
            log.info(
                "replaying batches %d-%d (logged before the last stop, not yet checkpointed)",
                replay[0][0],
                replay[-1][0],
            )

    def rewind(self, checkpointed: Offsets, cmp: Compare) -> None:
        """Every task starts again from its last checkpoint: the uncovered batches replay."""
        self.replay = self.log.uncovered(checkpointed, cmp)
        if self.replay:
            log.info(
                "replaying batches %d-%d from the tasks' last checkpoints",
                self.replay[0][0],
                self.replay[-1][0],
            )

    def next_replay(self) -> Logged | None:
        """The next logged batch to replay, taken off the list; None when none waits."""
        return self.replay.pop(0) if self.replay else None

    def publish_uncovered(self, batches: list[Logged], why: str) -> None:
        """Publish the recorded output of batches not every checkpoint covers, at the start:
        the tasks whose checkpoints cover them will not read that input again, so their share
        of it would be lost (at-least-once: what other tasks read again may go out twice).
        What is bound for intermediate streams is never published so (the next stage would
        count twice what is read again): it stays in the entry, for the replay."""
        for batch, _ in batches:
            outputs = self.log.outputs.get(batch)
            if not outputs:
                continue
            inner, rest = batch_outputs.split(self.config, outputs)
            if rest:
                log.warning(
                    "%s: batch %d's staged output is published though not every task's "
                    "checkpoint covers it (what the tasks read again may go out twice)",
                    why,
                    batch,
                )
                batch_outputs.publish(self.config, self.systems, self.log, batch, rest)
                self.tx.committed += 1
            self.log.set_outputs(batch, inner or None)

    def record(
        self,
        batch: int,
        staged: BatchOutputs | None,
        results: list[TaskBatchResult],
        *,
        clean_up_only: bool,
        runner: str,
    ) -> None:
        """Exactly-once: keep the batch's staged output in its log entry, before any checkpoint
        covering it is written (``runner``: its name, for the error when it passed nothing
        on). Raises :class:`~.batch_outputs.BatchOutputsLost` when a task lost what it staged
        (the batch must be rewound)."""
        if staged is None and not clean_up_only and stages_output(self.config):
            raise SparkpointError(  # its output would wait forever
                f"job {self.config.job_label}: runner {runner} of exact batches does not pass "
                "on what its batches staged (BatchRunner.staged)"
            )
        try:
            kept = batch_outputs.record(self.config, self.systems, self.log, batch, staged, results)
        except batch_outputs.BatchOutputsLost:
            self.tx.aborted += bool(staged)
            raise
        self.tx.aborted += bool(staged) and not kept  # a replay's output, discarded

    def prune(self, checkpointed: Offsets, cmp: Compare, *, sweep: bool = False) -> None:
        """Delete the batch log's entries every checkpoint covers, publishing their output;
        then (when any was published, or ``sweep``) delete the staged parts no entry names."""
        published = []

        def publish(batch: int, outputs: BatchOutputs) -> None:
            batch_outputs.publish(self.config, self.systems, self.log, batch, outputs)
            published.append(batch)

        self.log.prune(checkpointed, cmp, publish)
        self.tx.committed += len(published)
        if published or sweep:  # parts no entry names: a failed batch's, a zombie attempt's
            # (counted as one aborted transaction: the output of one failed batch, or of a
            # crash's last one)
            self.tx.aborted += batch_outputs.sweep(self.config, self.systems, self.log) > 0

    def waiting(self) -> bool:
        """Whether output of logged batches waits to be published."""
        return bool(self.log.staged_parts())

"""A DataFrame batch's exactly-once output, seen from the driver: record, publish, discard.

A DataFrame pipeline's output is the batch's, not one task's (its rows are shuffled), so with
``job.processing.guarantee: exactly-once`` the unit of its output is the batch
(:mod:`sparkpoint.runtime.driver.batchlog`):

1. the batch's stream outputs stage one part per Spark task attempt and partition under the
   job's batch owner (:func:`~sparkpoint.storage.outputs.batch_owner`), and its sinks stage
   their files (:class:`~sparkpoint.runtime.dataframe.sinks.StagingSink`); the runner
   reports what the attempts whose results Spark kept staged
   (:class:`~sparkpoint.runtime.plan.BatchOutputs`);
2. :func:`record` keeps it in the batch's log entry before any checkpoint covering the batch is
   written; a replayed batch keeps what its first run recorded and discards its own;
3. once every task's checkpoint covers the batch, :func:`publish` makes it visible (streams:
   one publish per partition under the batch's key (the log's epoch, then the batch id), so it
   never goes out twice, even after a reset numbers batches from 1 again; sinks:
   ``publish`` on the sink unpickled from the log), oldest batch first, and the entry goes.

At the job's start, :func:`sweep` deletes every staged stream part of the batch owner that no
log entry names. A batch in which a task dropped its progress (a Spark task retried after its
state changed, a finish on another executor) cannot keep its output, since the task reads that
input again in the next batch: :func:`record` discards it and raises, before any of the
batch's checkpoints is written, and the driver rewinds every task to its last checkpoint and
replays the batches no checkpoint covers (``JobCoordinator._rewind``), without a restart.

Owns the driver's handling of batch output; imports the plan, the batch log, the DataFrame
sink protocol and the storage layer.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Sequence

from sparkpoint.config import Config
from sparkpoint.errors import SparkpointError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.runtime.dataframe.sinks import StagingSink
from sparkpoint.runtime.driver.batchlog import BatchLog
from sparkpoint.runtime.plan import BatchOutputs, TaskBatchResult
from sparkpoint.storage.outputs import batch_owner, discard_staged, publish_parts, stages_output
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)


class BatchOutputsLost(SparkpointError):
    """A batch's staged output cannot be kept: the batch fails and is replayed at restart."""


def record(
    config: Config,
    systems: Systems,
    batch_log: BatchLog,
    batch: int,
    staged: BatchOutputs | None,
    results: Sequence[TaskBatchResult],
) -> bool:
    """Keep what batch ``batch`` staged in its log entry (before its checkpoints are written);
    whether it was kept (``False``: discarded, or nothing staged). With exactly-once, a task
    that dropped its progress raises :class:`BatchOutputsLost`, whatever the batch staged: the
    task reads again input whose output some recorded batch, or this one, already holds."""
    dropped = sorted(r.task for r in results if r.dropped)
    if dropped and stages_output(config):
        if staged:
            discard(config, systems, batch_log, batch, staged)
        raise BatchOutputsLost(
            f"batch {batch}: task {dropped[0]}"
            + (f" (and {len(dropped) - 1} more)" if len(dropped) > 1 else "")
            + " dropped its progress (a retried Spark task, or a finish on another executor), "
            "so its input is read again; with job.processing.guarantee=exactly-once the "
            "batch's output cannot be split by task (nor its intermediate streams'), so it is "
            "discarded and none of the "
            "batch's checkpoints is written"
        )
    if not staged:
        return False
    if batch in batch_log.outputs:
        log.info(
            "batch %d replayed: its output is the one its first run staged; the replay's "
            "(%d parts, %d sinks) is discarded",
            batch,
            len(staged.parts()),
            len(staged.sinks),
        )
        discard(config, systems, batch_log, batch, staged)
        return False
    batch_log.set_outputs(batch, staged)
    return True


def publish(
    config: Config, systems: Systems, batch_log: BatchLog, batch: int, outputs: BatchOutputs
) -> None:
    """Make batch ``batch``'s staged output visible (idempotent)."""
    owner = batch_owner(config)
    parts = {SystemStreamPartition.parse(s): p for s, p in outputs.streams.items()}
    key = batch_log.publish_key(batch)
    records = publish_parts(systems, owner, key, parts, failpoints=config.to_dict())
    for staged in outputs.sinks:
        _sink(staged.sink, staged.name).publish(batch, staged.token)
    log.info(
        "batch %d published: %d records, %d sinks (its checkpoints are written)",
        batch,
        records,
        len(outputs.sinks),
    )


def split(config: Config, outputs: BatchOutputs) -> tuple[BatchOutputs, BatchOutputs]:
    """(the parts bound for intermediate streams, everything else) of a batch's output."""
    intermediate = set(config.intermediate_streams)
    inner, rest = BatchOutputs(), BatchOutputs(sinks=list(outputs.sinks))
    for ssp, parts in outputs.streams.items():
        into = inner if SystemStreamPartition.parse(ssp).system_stream in intermediate else rest
        into.streams[ssp] = list(parts)
    return inner, rest


def discard(
    config: Config, systems: Systems, batch_log: BatchLog, batch: int, outputs: BatchOutputs
) -> None:
    """Delete what batch ``batch`` staged and its log entry does not name: its sinks' staged
    files, and its parts (every part of the batch owner no entry names: batches run one at a
    time, so no other batch is staging now)."""
    sweep(config, systems, batch_log)
    for staged in outputs.sinks:
        _sink(staged.sink, staged.name).discard(batch, staged.token)


def sweep(config: Config, systems: Systems, batch_log: BatchLog) -> int:
    """Delete the batch owner's staged parts no log entry names (a failed batch's, a zombie
    attempt's); returns how many."""
    owner = batch_owner(config)
    return discard_staged(config, systems, owner, keep=batch_log.staged_parts()).total()


def _sink(pickled: bytes, name: str) -> StagingSink:
    try:
        sink = pickle.loads(pickled)
    except Exception as exc:
        raise SparkpointError(
            f"the staged output of sink {name} cannot be published: unpickling the sink "
            f"failed ({exc}); the sink's class must be importable where the driver runs"
        ) from exc
    if not isinstance(sink, StagingSink):
        raise SparkpointError(f"sink {name} recorded with a batch has no publish and discard")
    return sink

"""What the job coordinator reports, and to whom: :class:`BatchReport` per batch,
:class:`RunSummary` per run, the :class:`Listener` that shows them (the CLI's progress display,
metrics reporters). What runs a batch is declared in :mod:`sparkpoint.runtime.runner`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sparkpoint.model import JobModel, SystemStreamPartition
from sparkpoint.runtime.driver.placement import Move
from sparkpoint.runtime.plan import TaskBatchResult
from sparkpoint.storage.backend import RestoreStats
from sparkpoint.storage.restore import LOCAL, PROMOTED


@dataclass
class Transactions:
    """Staged output's transactions (exactly-once, intermediate streams), as a batch report
    sees them. A task's transaction is its output between two of its commits: committed when
    a written checkpoint names it, aborted when the task drops it (a restore, a rewind). A
    DataFrame pipeline's is one batch's output: committed when the batch is published, aborted
    when discarded (and a failed attempt's, when a sweep deletes it)."""

    #: since the driver started (totals: a report the metrics never see loses no count)
    committed: int = 0
    aborted: int = 0
    #: open after the batch: tasks with output no written checkpoint names yet, and batches
    #: recorded in the batch log and not published yet
    open: int = 0


@dataclass
class StandbyReport:
    """Standby copies after a batch (``job.standbytasks.replication.factor``): how many are
    kept, what the batch's catch-up did (copies seeded, copies caught up and the changelog
    records they replayed, its seconds), and per task the records its most current copy is
    behind its last written checkpoint."""

    copies: int = 0
    seeded: int = 0
    caught_up: int = 0
    records: int = 0
    seconds: float = 0.0
    lags: dict[str, int] = field(default_factory=dict)


@dataclass
class BatchReport:
    """One batch as the progress display and logs see it."""

    batch: int
    seconds: float
    processed: int
    sent: int
    committed: bool
    commit_seconds: float
    task_seconds: float  # summed over tasks: the executor time the batch's work took
    lag: dict[str, int]
    restored: list[tuple[str, RestoreStats]]
    uploads: dict[str, int] = field(default_factory=dict)  # summed upload metrics of commits
    moved: list[Move] = field(default_factory=list)  # host affinity: placed before the batch
    away: list[Move] = field(default_factory=list)  # ran away from their executor
    tasks: list[TaskBatchResult] = field(default_factory=list)  # what each task reported
    #: exactly-once: staged parts the job's start discarded (the run's first batch reports it)
    parts_discarded: int = 0
    #: exactly-once: per task, staged parts no written checkpoint names yet
    parts_open: dict[str, int] = field(default_factory=dict)
    #: staged parts the batch's written checkpoints name: the next batch publishes them
    parts_to_publish: int = 0
    transactions: Transactions = field(default_factory=Transactions)
    #: a job of stages (intermediate streams): (role, stream, lag) of each input stream, the
    #: job's own inputs (role ``input``) first, then its ``intermediate`` streams
    stages: list[tuple[str, str, int]] = field(default_factory=list)
    standby: StandbyReport = field(default_factory=StandbyReport)
    #: the restore ahead's pass (no batch: it read nothing; it established the tasks' state)
    ahead: bool = False

    @property
    def dead_letters(self) -> dict[str, int]:
        """Records its tasks sent to the dead-letter stream, per reason."""
        out: dict[str, int] = {}
        for r in self.tasks:
            for reason, n in r.dead_letters.items():
                out[reason] = out.get(reason, 0) + n
        return out

    @classmethod
    def of_batch(
        cls,
        batch: int,
        seconds: float,
        results: list[TaskBatchResult],
        *,
        committed: bool,
        moved: list[Move],
        away: list[Move],
        parts_discarded: int,
        parts_open: dict[str, int],
        parts_to_publish: int,
        transactions: Transactions,
        standby: StandbyReport,
    ) -> BatchReport:
        """The report of a batch from its tasks' results (lags are measured after it)."""
        report = cls(
            batch=batch,
            seconds=seconds,
            processed=sum(r.processed for r in results),
            sent=sum(r.sent for r in results),
            committed=committed,
            commit_seconds=max((r.commit_seconds for r in results), default=0.0),
            task_seconds=sum(r.total_seconds for r in results),
            lag={},
            restored=[(r.task, i) for r in results for i in r.restored],
            moved=moved,
            away=away,
            tasks=results,
            parts_discarded=parts_discarded,
            parts_open=parts_open,
            parts_to_publish=parts_to_publish,
            transactions=transactions,
            standby=standby,
        )
        for r in results:
            for metrics in r.upload_metrics:
                for key, value in metrics.items():
                    report.uploads[key] = report.uploads.get(key, 0) + value
        return report

    @property
    def restored_tasks(self) -> int:
        """Tasks that restored state (from a backend or a local checkpoint); a task that
        started empty (nothing committed yet) restored nothing, and a promoted one (its
        standby copy took over) is counted by :attr:`promoted_tasks`."""
        return len({task for task, i in self.restored if i.brought_state and i.source != PROMOTED})

    @property
    def promoted_tasks(self) -> int:
        """Tasks whose standby copy was promoted (for at least one store)."""
        return len({task for task, i in self.restored if i.source == PROMOTED})

    def restore_cost(self) -> tuple[int, float]:
        """Bytes fetched (from backends; a local checkpoint's files are hard-linked, not
        copied) and seconds spent restoring, over every store of the batch restored (a
        promotion's tail is :meth:`promotion_cost`)."""
        restores = [i for _, i in self.restored if i.source != PROMOTED]
        fetched = sum(i.bytes for i in restores if i.source != LOCAL)
        return fetched, sum(i.seconds for i in restores)

    def promotion_cost(self) -> tuple[int, float]:
        """Changelog records the promotions replayed (the tail after each standby copy's
        checkpoint) and their seconds."""
        promoted = [i for _, i in self.restored if i.source == PROMOTED]
        return sum(i.entries for i in promoted), sum(i.seconds for i in promoted)


@dataclass
class RunSummary:
    batches: int = 0
    processed: int = 0
    sent: int = 0
    commits: int = 0
    seconds: float = 0.0
    batch_seconds: float = 0.0
    task_seconds: float = 0.0
    stopped_by: str = ""
    lag: dict[str, int] = field(default_factory=dict)
    restores: int = 0  # task restores (a task's first batch included)
    restore_bytes: int = 0
    restore_seconds: float = 0.0
    away: int = 0  # tasks the scheduler ran away from their executor


class Listener(Protocol):
    def on_start(self, model: JobModel) -> None: ...

    def on_startpoint(self, task: str, ssp: SystemStreamPartition, offset: str, what: str) -> None:
        """A task starts reading ``ssp`` at ``offset`` because of startpoint ``what``."""

    def on_batch(self, report: BatchReport) -> None: ...

    def on_end(self, summary: RunSummary) -> None: ...

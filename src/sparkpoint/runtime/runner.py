"""The runner contract: what the driver asks of whatever runs a batch's tasks.

A runner runs one micro-batch, one plan per task, and returns their results. Beyond that call,
every hook a runner may implement is declared here with its default, so the driver never
probes a runner for an attribute (Samza's ``TaskBackupManager`` declares its hooks the same
way). The driver calls them in this order:

1. at start, once the batch log is open (runners of exact batches only):
   :meth:`BatchRunner.begin_epoch`;
2. before each batch, when :attr:`BatchRunner.places_tasks`: :meth:`BatchRunner.executors`
   (host affinity and standby placement);
3. the batch: ``runner(batch, plans)``;
4. after it returns: :attr:`BatchRunner.staged` (exactly-once output of exact batches);
5. after the batch's checkpoints are written, when :attr:`BatchRunner.places_tasks`:
   :meth:`BatchRunner.catch_up` (standby copies);

and, from another thread, at any time: :meth:`BatchRunner.cancel` (a shutdown that waited
``task.shutdown.ms`` for the batch).

A runner subclasses :class:`BatchRunner`: the driver reads the hooks of a subclass only (a plain
callable is wrapped with every default, and so is any other object with a ``__call__``: its
``exact_batches`` or ``executors`` would not be seen). A subclass that overrides
:meth:`BatchRunner.executors` or :meth:`BatchRunner.catch_up` sets ``places_tasks = True``.

The runners: :class:`~sparkpoint.runtime.spark.session.SparkRunner` (the task API on Spark),
:class:`~sparkpoint.runtime.dataframe.runner.DataFrameRunner`, the driver's own
(:mod:`.inline`: inline, process and thread pools; :mod:`.launch`: the restore ahead and the
runner made once Spark has started). A plain callable is a runner with every default
(:func:`as_runner`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from sparkpoint.metadata.locality import Executor
from sparkpoint.runtime.plan import (
    BatchOutputs,
    StandbyPlan,
    StandbyResult,
    TaskBatchPlan,
    TaskBatchResult,
)

RunBatch = Callable[[int, list[TaskBatchPlan]], list[TaskBatchResult]]


class BatchRunner(ABC):
    """Runs one micro-batch: one plan per task, results in any order."""

    #: batches bounded by ``task.batch.max.messages`` per SSP on the driver, numbered durably
    #: through the :class:`~sparkpoint.runtime.driver.batchlog.BatchLog` and replayed with the
    #: same ids and end offsets after a restart (DataFrame pipelines)
    exact_batches: bool = False
    #: runs on Spark executors the driver places tasks on (host affinity, standby copies):
    #: :meth:`executors` and :meth:`catch_up` are called; a runner of the driver's own
    #: process (tests, the restore ahead, the last pass) places nothing
    places_tasks: bool = False

    @abstractmethod
    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        """Hook 3: run the batch; one result per plan."""

    def begin_epoch(self, epoch: int) -> None:
        """Hook 1: the batch log's epoch, which tells this job's batch ids apart from those
        of an earlier run (before a ``job reset``); a runner with sinks passes it on to them.
        Default: ignored."""
        del epoch

    def executors(self) -> list[Executor] | None:
        """Hook 2: the live executors, or ``None`` in local mode (one executor: no choice).
        Called only when :attr:`places_tasks`. Default: ``None``."""
        return None

    @property
    def staged(self) -> BatchOutputs | None:
        """Hook 4: with exactly-once output, what the last batch staged, which the driver
        records in the batch log (:mod:`sparkpoint.runtime.driver.batch_outputs`); a runner
        that wraps another passes it on. Default: nothing staged."""
        return None

    def catch_up(self, plans: list[StandbyPlan]) -> list[StandbyResult]:
        """Hook 5: bring the standby copies of ``plans`` to their tasks' last written
        checkpoints. Called only when :attr:`places_tasks`. Default: none caught up."""
        del plans
        return []

    def cancel(self) -> None:
        """Hook 6, from another thread: end the batch running now (a shutdown that waited
        ``task.shutdown.ms``): it fails, and nothing it did is committed (its input is read
        again at the next start). Default: nothing to cancel (the batch runs to its end)."""
        return None


class CallableRunner(BatchRunner):
    """A plain callable as a runner: every hook at its default."""

    def __init__(self, run: RunBatch) -> None:
        self.run = run

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        return self.run(batch, plans)


def as_runner(runner: BatchRunner | RunBatch) -> BatchRunner:
    """``runner`` itself, or a plain callable wrapped as one."""
    return runner if isinstance(runner, BatchRunner) else CallableRunner(runner)

"""Batch runners that run tasks on this machine without Spark.

:class:`InlineRunner` runs every task in this process, one after another: for tests and tools
that need the runtime's exact semantics without starting Spark. :class:`LocalPoolRunner` runs
them in a pool of worker processes, and :class:`ThreadPoolRunner` on threads of this process;
the driver uses them to restore state while a local Spark session starts
(:mod:`sparkpoint.runtime.driver.launch`). All run the very same :func:`run_task_batch` that Spark
runs on executors.
"""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from sparkpoint.errors import SparkpointError
from sparkpoint.runtime.executor.task_batch import run_task_batch
from sparkpoint.runtime.plan import TaskBatchPlan, TaskBatchResult
from sparkpoint.runtime.runner import BatchRunner

log = logging.getLogger(__name__)


class WorkerProcessDied(SparkpointError):
    """A pool's worker process died (killed, out of memory) on every attempt."""


class InlineRunner(BatchRunner):
    """Runs each task's plan in the calling process."""

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        return [run_task_batch(plan) for plan in plans]


class _PoolRunner(BatchRunner):
    """Runs the plans in a pool of up to ``workers``, each task in one of them; in this
    process when there is one worker or one plan."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)

    def _pool(self, workers: int) -> Executor:
        raise NotImplementedError

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        workers = min(self.workers, len(plans))
        if workers <= 1:
            return InlineRunner()(batch, plans)
        with self._pool(workers) as pool:
            return list(pool.map(run_task_batch, plans))


class LocalPoolRunner(_PoolRunner):
    """Runs the plans in processes of this machine. The processes are spawned, not forked:
    the caller may have threads (a starting Spark session)."""

    def __init__(self, workers: int, attempts: int = 2) -> None:
        super().__init__(workers)
        self.attempts = attempts

    def _pool(self, workers: int) -> Executor:
        return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        """The plans' results; a pool whose process died (a transient fault: killed, out of
        memory) runs them again in a new pool, up to ``attempts`` times in all (every pass
        these runners run is safe to repeat: a restore that died restarts from the
        checkpoint), then :class:`WorkerProcessDied`."""
        for attempt in range(1, self.attempts + 1):
            try:
                return super().__call__(batch, plans)
            except BrokenProcessPool as exc:
                tasks = ", ".join(sorted(p.task.name.name for p in plans))
                if attempt == self.attempts:
                    raise WorkerProcessDied(
                        f"a worker process running tasks {tasks} died {attempt} times: {exc}"
                    ) from exc
                log.warning(
                    "a worker process running tasks %s died (%s); running them again", tasks, exc
                )
        raise AssertionError("unreachable")


class ThreadPoolRunner(_PoolRunner):
    """Runs the plans on threads of this process. Only for passes that run no user code and
    spend their time with the GIL released: the driver's restore ahead from a blob store
    (file transfers), which spares the processes a pool would spawn."""

    def _pool(self, workers: int) -> Executor:
        return ThreadPoolExecutor(workers, thread_name_prefix="sparkpoint-restore-task")

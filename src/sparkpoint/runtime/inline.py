"""Batch runners that run tasks on this machine without Spark.

:class:`InlineRunner` runs every task in this process, one after another: for tests and tools
that need the runtime's exact semantics without starting Spark. :class:`LocalPoolRunner` runs
them in a pool of worker processes, and :class:`ThreadPoolRunner` on threads of this process;
the driver uses them to restore state while a local Spark session starts
(:mod:`sparkpoint.runtime.launch`). All run the very same :func:`run_task_batch` that Spark
runs on executors.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

from sparkpoint.runtime.executor import run_task_batch
from sparkpoint.runtime.plan import TaskBatchPlan, TaskBatchResult


class InlineRunner:
    """Runs each task's plan in the calling process."""

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        return [run_task_batch(plan) for plan in plans]


class LocalPoolRunner:
    """Runs the plans in up to ``workers`` processes of this machine, each task in one of
    them; in this process when there is one worker or one plan. The processes are spawned, not
    forked: the caller may have threads (a starting Spark session)."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        workers = min(self.workers, len(plans))
        if workers <= 1:
            return InlineRunner()(batch, plans)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            return list(pool.map(run_task_batch, plans))


class ThreadPoolRunner:
    """Runs the plans on up to ``workers`` threads of this process. Only for passes that run
    no user code and spend their time with the GIL released: the driver's restore ahead from
    a blob store (file transfers), which spares the processes a pool would spawn."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        workers = min(self.workers, len(plans))
        if workers <= 1:
            return InlineRunner()(batch, plans)
        with ThreadPoolExecutor(workers, thread_name_prefix="sparkpoint-restore-task") as pool:
            return list(pool.map(run_task_batch, plans))

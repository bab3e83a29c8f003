"""A batch runner that runs every task in this process, one after another.

For tests and tools that need the runtime's exact semantics without starting Spark; the Spark
runner runs the very same :func:`run_task_batch` on executors.
"""

from __future__ import annotations

from sparkpoint.runtime.executor import run_task_batch
from sparkpoint.runtime.plan import TaskBatchPlan, TaskBatchResult


class InlineRunner:
    """Runs each task's plan in the calling process."""

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        return [run_task_batch(plan) for plan in plans]

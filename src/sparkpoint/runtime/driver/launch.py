"""Starting a job without waiting for Spark first.

A Spark session takes seconds to start: a JVM, then the session. :func:`start_job` starts it
on a background thread, and meanwhile the driver does the job's own start-up (metadata,
checkpoints, startpoints). In local mode the driver shares the executors' disk, so it also
restores every task's state in that time
(:meth:`~sparkpoint.runtime.driver.coordinator.JobCoordinator.restore_ahead`). That runs the same
executor code and changes no checkpoint: the first batch finds the state current and keeps it.
Tasks with state to fetch restore in as many local processes as Spark has cores (``local[N]``);
the others are set up in the driver (:class:`RestoreRunner`). A restart after losing the state
directory is then back in about the longer of the restore and Spark's start, not their sum.

In local mode the run's last pass, which reads nothing and cleans up after the final
checkpoint, also runs in the driver: one Spark job less at the end of a run.

On a cluster the state belongs on the executors' hosts, so the driver does not restore; the
first batch waits for the session. ``job.restore.while.spark.starts=false`` turns the restore
off in local mode too.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkpoint.config import Config
from sparkpoint.metadata.locality import Executor
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import (
    InlineRunner,
    LocalPoolRunner,
    ThreadPoolRunner,
    WorkerProcessDied,
)
from sparkpoint.runtime.driver.reports import Listener
from sparkpoint.runtime.executor.task_batch import restores_in_threads, state_is_on_disk
from sparkpoint.runtime.plan import (
    BatchOutputs,
    StandbyPlan,
    StandbyResult,
    TaskBatchPlan,
    TaskBatchResult,
)
from sparkpoint.runtime.runner import BatchRunner, RunBatch, as_runner
from sparkpoint.runtime.spark.session import choose_master, spark_context, spark_session

log = logging.getLogger(__name__)


class SparkStart:
    """A Spark session starting on a background thread; with ``sql=False`` in local mode only
    its SparkContext (:func:`~sparkpoint.runtime.spark.session.spark_context`), which is all a task
    API job needs, and starts faster."""

    def __init__(self, config: Config, master: str | None = None, *, sql: bool = True) -> None:
        self.master = choose_master(config, master)
        # a cluster's task job starts the session anyway: the first batch places the tasks on
        # the executors registered by then, and without spark.cores.max Spark does not wait
        # for them; the session's extra second let both of a 2-worker test cluster's register
        self.sql = sql or not self.local
        self._session: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._start, args=(config,), name="spark-start", daemon=True
        )
        self._thread.start()

    def _start(self, config: Config) -> None:
        began = time.monotonic()
        try:
            start = spark_session if self.sql else spark_context
            self._session = start(config, self.master)
            what = "session" if self.sql else "context"
            log.info("Spark %s (%s) started in %.1fs", what, self.master, time.monotonic() - began)
        except BaseException as exc:  # handed to whoever waits for the session
            self._error = exc

    @property
    def local(self) -> bool:
        return self.master.startswith("local")

    @property
    def local_cores(self) -> int:
        """The cores of a local master: ``local[N]`` N, ``local[*]`` this machine's, ``local`` 1."""
        m = re.match(r"local\[(\d+|\*)", self.master)
        if m is None:
            return 1
        return (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1))

    def session(self) -> Any:
        """The session (the SparkContext with ``sql=False``), once started; Spark's own error
        if it failed to start."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._session

    def stop(self, *, wait: bool = True) -> None:
        """Stop the session (waiting for it to finish starting first).

        ``wait=False`` is for a process about to exit: the stop runs on a daemon thread.
        pyspark's stop holds its caller for up to a second after the JVM has stopped (its
        accumulator server polls a socket once a second), and a JVM whose stop is cut short
        still stops cleanly: it exits, running Spark's shutdown hooks, when its Python parent's
        pipe closes."""
        self._thread.join()
        if self._session is None:
            return
        if wait:
            self._session.stop()
            return
        threading.Thread(target=self._session.stop, name="spark-stop", daemon=True).start()


class RestoreRunner(BatchRunner):
    """The restore ahead's runner: tasks with nothing to fetch in this process, the others in
    a pool of up to ``workers`` processes. Nothing to fetch: the local state is current, or
    every store has its copy of the last checkpoint on this disk (a restart on the same host:
    hard links), or the task starts empty (a new job: no checkpoint). A spawned process
    imports the job and sparkpoint again, about 0.5 s of CPU each, taken from the JVM starting
    beside it; keeping, linking or creating a store takes milliseconds. So tasks that restore
    only from backends that work with the GIL released (the blob store's downloads) restore on
    threads of this process, and the others (the changelog's, decoding records in Python) in
    processes."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        here: list[TaskBatchPlan] = []
        threads: list[TaskBatchPlan] = []
        processes: list[TaskBatchPlan] = []
        for plan in plans:
            if state_is_on_disk(plan):
                here.append(plan)
            else:
                (threads if restores_in_threads(plan) else processes).append(plan)
        done = InlineRunner()(batch, here) + ThreadPoolRunner(self.workers)(batch, threads)
        try:
            return done + LocalPoolRunner(self.workers)(batch, processes)
        except WorkerProcessDied as exc:
            # the restore ahead only saves time: Spark restores these tasks at their first
            # batch, with its own task retries
            log.warning("%s; their first batch on Spark restores them instead", exc)
            return done


class DeferredRunner(BatchRunner):
    """A batch runner made from the Spark session on first use: the job's start-up and
    :meth:`JobCoordinator.restore_ahead` run before anything waits for Spark. Every hook is
    passed on to the made runner (the epoch once it is made)."""

    places_tasks = True

    def __init__(
        self,
        start: SparkStart,
        make: Callable[[Any], BatchRunner | RunBatch],
        *,
        exact_batches: bool = False,
    ) -> None:
        self.start = start
        self.make = make
        self.exact_batches = exact_batches
        self._runner: BatchRunner | None = None
        self._epoch: int | None = None

    @property
    def runner(self) -> BatchRunner:
        if self._runner is None:
            self._runner = as_runner(self.make(self.start.session()))
            if self._epoch is not None:
                self._runner.begin_epoch(self._epoch)
        return self._runner

    def begin_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        if self._runner is not None:
            self._runner.begin_epoch(epoch)

    def cancel(self) -> None:
        if self._runner is not None:  # (none made yet: no batch runs)
            self._runner.cancel()

    def executors(self) -> list[Executor] | None:
        return self.runner.executors() if self.runner.places_tasks else None

    def catch_up(self, plans: list[StandbyPlan]) -> list[StandbyResult]:
        return self.runner.catch_up(plans) if self.runner.places_tasks else []

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        return self.runner(batch, plans)

    @property
    def staged(self) -> BatchOutputs | None:
        """The made runner's output staged by the last batch (see :class:`BatchRunner`)."""
        return None if self._runner is None else self._runner.staged


def start_job(
    config: Config,
    master: str | None,
    make_runner: Callable[[Any], BatchRunner],
    *,
    exact_batches: bool = False,
    listener: Listener | None = None,
    sql: bool = True,
    force: bool = False,
) -> tuple[JobCoordinator, SparkStart]:
    """A started job coordinator whose runner comes from a Spark session starting meanwhile;
    in local mode every task's state is established before this returns. The caller runs the
    coordinator, then closes it and stops the session. ``make_runner`` gets the session, or
    with ``sql=False`` (a task API job) only the SparkContext."""
    start = SparkStart(config, master, sql=sql)
    runner = DeferredRunner(start, make_runner, exact_batches=exact_batches)
    coordinator = JobCoordinator(config, runner, listener=listener, force=force)
    if start.local:  # the driver shares the executors' disk: the last pass needs no Spark job
        coordinator.local_runner = InlineRunner()
    try:
        coordinator.start()
        if start.local and config.get_bool("job.restore.while.spark.starts"):
            coordinator.restore_ahead(RestoreRunner(start.local_cores))
    except BaseException:
        coordinator.close()
        start.stop()
        raise
    return coordinator, start

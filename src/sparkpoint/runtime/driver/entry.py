"""``sparkpoint.run``: run a job from Python, on a Spark session the caller already holds (a
notebook's, Databricks', an application's) or on one it starts; and the job resolution the
``sparkpoint run`` command shares with it.

A job is a job file (YAML or .properties, task API), a :class:`~sparkpoint.Pipeline`, or its
``module:attribute``. On a session the caller gave, the job's modules (the ``*.py`` files next
to the job file or the pipeline's module) are shipped to the workers with ``addPyFile``: a
running session's workers cannot be given a new ``PYTHONPATH``. The session is left running;
a session ``run`` started is stopped at the end. Ctrl-C (SIGINT, a notebook's "interrupt") in
the main thread finishes the current batch, commits every task and returns the run's summary.
Safe to call again in the same process (a notebook re-run).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import signal
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError, UserError
from sparkpoint.runtime.driver.callers_session import on_callers_session
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.job_path import with_dir_on_path
from sparkpoint.runtime.driver.launch import start_job
from sparkpoint.runtime.driver.reports import Listener, RunSummary
from sparkpoint.runtime.runner import BatchRunner

if TYPE_CHECKING:
    from sparkpoint.runtime.dataframe.pipeline import Pipeline

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedJob:
    """A job ready to run: its config (the job's directory on the path), its pipeline (``None``
    for a task API job) and the directory of its modules."""

    config: Config
    pipeline: Pipeline | None
    directory: Path

    def runner(self, spark: Any) -> BatchRunner:
        """The batch runner on ``spark`` (a session, or a task job's SparkContext)."""
        from sparkpoint.runtime.spark.session import SparkRunner

        if self.pipeline is None:
            return SparkRunner(spark)
        from sparkpoint.runtime.dataframe.runner import DataFrameRunner

        return DataFrameRunner(spark, self.pipeline, self.config)


def resolve_job(
    job: str | Path | Pipeline, overrides: Mapping[str, str] | None = None
) -> ResolvedJob:
    """The job's config with ``overrides`` (one-off: not stored as the job's config) and its
    pipeline; a job that cannot run (no inputs, a task class that does not import, memory
    stores in a pipeline) fails here, before Spark starts."""
    values = dict(overrides or {})
    pipeline, directory = _pipeline_of(job)
    if pipeline is not None:
        from sparkpoint.runtime.dataframe.task import require_persistent_stores

        config = pipeline.load_config(values).with_one_off(values)
        config = with_dir_on_path(config, directory)
        require_persistent_stores(config)
    else:
        path = Path(job)  # type: ignore[arg-type]
        directory = path.resolve().parent
        config = with_dir_on_path(load_config(path, values).with_one_off(values), directory)
        from sparkpoint.runtime.executor.task_batch import load_task_class

        load_task_class(config.require("task.class"))  # a bad module fails before Spark starts
    if not config.inputs:
        raise UserError("task.inputs is empty: list the job's input streams as system.stream")
    return ResolvedJob(config, pipeline, directory)


def _pipeline_of(job: str | Path | Pipeline) -> tuple[Pipeline | None, Path]:
    """(the pipeline, its module's directory), or (None, cwd) for a job file. A pipeline's
    modules load only for a pipeline: a task job's start does not wait for pyspark.sql."""
    if isinstance(job, (str, Path)):
        if isinstance(job, str) and ":" in job and not Path(job).exists():
            from sparkpoint.runtime.dataframe.pipeline import load_pipeline

            return load_pipeline(job)
        return None, Path.cwd()
    from sparkpoint.runtime.dataframe.pipeline import Pipeline

    if not isinstance(job, Pipeline):
        raise ConfigError(
            f"sparkpoint.run: a job is a job file's path, a Pipeline or 'module:attribute', "
            f"not {type(job).__name__}"
        )
    try:
        directory = Path(inspect.getfile(job.build)).resolve().parent
    except (TypeError, OSError):
        directory = Path.cwd()
    return job, directory


@contextlib.contextmanager
def stop_on_interrupt(coordinator: JobCoordinator) -> Iterator[None]:
    """While the job runs in the main thread, SIGINT finishes the batch and commits (instead
    of a KeyboardInterrupt in the middle of one); the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_interrupt(_signum: int, _frame: Any) -> None:
        coordinator.stop("interrupted", bounded=True)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run(
    job: str | Path | Pipeline,
    *,
    spark: Any = None,
    until_caught_up: bool = False,
    max_batches: int | None = None,
    overrides: Mapping[str, str] | None = None,
    master: str | None = None,
    listener: Listener | None = None,
    final_watermark: bool = False,
) -> RunSummary:
    """Run ``job`` (a job file's path, a :class:`~sparkpoint.Pipeline` or its
    ``module:attribute``) on the session ``spark``, or on one started for the run (``master``,
    default ``spark.master`` or ``local[*,4]``), and return the run's summary. As ``sparkpoint
    run``: ``until_caught_up`` reads every input up to its newest offset at start, commits and
    returns (with ``final_watermark`` the input ends there: every event-time timer fires
    first); ``max_batches`` stops (with a commit) after that many batches; ``overrides`` are
    one-off config values. Ctrl-C finishes the batch, commits and returns."""
    resolved = resolve_job(job, overrides)
    config = resolved.config
    if spark is None:
        coordinator, start = start_job(
            config,
            master,
            resolved.runner,
            exact_batches=resolved.pipeline is not None,
            listener=listener,
            sql=resolved.pipeline is not None,
        )
        stop: Any = start.stop
    else:
        resolved = on_callers_session(spark, resolved, lambda: resolve_job(job, overrides))
        coordinator = JobCoordinator(resolved.config, resolved.runner(spark), listener=listener)
        stop = None
        try:
            coordinator.start()
        except BaseException:
            coordinator.close()
            raise
    try:
        with stop_on_interrupt(coordinator):
            return coordinator.run(
                until_caught_up=until_caught_up,
                max_batches=max_batches,
                final_watermark=final_watermark,
            )
    finally:
        coordinator.close()
        if stop is not None:
            stop()


__all__ = ["ResolvedJob", "resolve_job", "run", "stop_on_interrupt"]

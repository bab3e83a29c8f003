"""A job on a session the caller started (a notebook's, ``sparkpoint.run(job, spark=...)``):
its SparkContext (a Spark Connect session has none: one line), whether its Python workers can
import sparkpoint at all, and the job's own modules shipped as their current version
(:mod:`sparkpoint.runtime.executor.job_modules`).

A session built without ``PYSPARK_PYTHON`` runs its workers on the ``python3`` of the PATH,
which may lack sparkpoint: a one-task probe says so in one line, with what to set, instead of a
worker traceback at the first batch (once per session and Python).

May import the executor runtime's job modules and the config; pyspark only when it ships.
"""

from __future__ import annotations

import inspect
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkpoint import worker
from sparkpoint.errors import UserError
from sparkpoint.runtime.executor import job_modules

if TYPE_CHECKING:
    from sparkpoint.runtime.driver.entry import ResolvedJob

log = logging.getLogger(__name__)

#: the (application, worker Python) pairs whose workers imported sparkpoint
_CHECKED: set[tuple[str, str]] = worker.slot("python-checked", set)


def session_context(spark: Any) -> Any:
    """The SparkContext of the caller's session ``spark`` (or ``spark`` itself, a context). A
    session without one (Spark Connect) cannot run a job: said in one line."""
    try:
        context = spark.sparkContext if hasattr(spark, "sparkContext") else spark
        context.addPyFile  # noqa: B018 - a Connect session fails here
    except Exception as exc:  # pyspark raises its own errors for Connect sessions
        raise UserError(
            f"this Spark session cannot run a sparkpoint job: it has no SparkContext (a Spark "
            f"Connect session?); sparkpoint runs its tasks as RDD partitions: use a classic "
            f"session ({type(exc).__name__})"
        ) from None
    return context


def on_callers_session(
    spark: Any, resolved: ResolvedJob, resolve_again: Callable[[], ResolvedJob]
) -> ResolvedJob:
    """The job made ready for the caller's session (a notebook's): its workers checked for
    sparkpoint, the job's modules (those it imports) shipped as their current version, and
    the job resolved again if this process imported an older version of them."""
    context = session_context(spark)
    check_workers(context)
    pipeline_module = None
    if resolved.pipeline is not None:
        module = inspect.getmodule(resolved.pipeline.build)
        pipeline_module = None if module is None else module.__name__
    modules = job_modules.find(resolved.config, resolved.directory, pipeline_module)
    if job_modules.forget_changed(modules.files, modules.version):
        log.info("the job's modules changed since the last run: %s", ", ".join(modules.files))
        resolved = resolve_again()
    if modules.files:
        archive = ship(context, modules)
        log.info("shipped %s (%s) to the session's workers", archive, ", ".join(modules.files))
    settings = modules.settings()
    config = resolved.config.with_overrides(settings).with_one_off(settings)
    return replace(resolved, config=config)


def ship(context: Any, modules: job_modules.JobModules) -> Path:
    """Add the modules' zip to ``context`` (a SparkContext) and pickle the job's modules by
    value from now on (a step's function then travels with the plan, as edited)."""
    from pyspark import cloudpickle

    archive = job_modules.zipped(modules)
    context.addPyFile(str(archive))
    for name in modules.files:
        module = sys.modules.get(name)
        if module is not None:
            cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    return archive


def _version() -> str:
    from importlib.metadata import version

    return version("sparkpoint")


def _probe(_: Any) -> str:
    """Run on a Python worker (pickled by reference: a worker without sparkpoint cannot even
    load it)."""
    return sys.executable


def check_workers(context: Any) -> None:
    """Whether the Python workers of ``context`` (a SparkContext) import sparkpoint: one
    one-task Spark job per session and Python; a :class:`UserError` says what to set."""
    checked = _CHECKED
    key = (str(context.applicationId), str(context.pythonExec))
    if key in checked:
        return
    try:
        context.parallelize([0], 1).map(_probe).collect()
    except Exception as exc:
        missing = re.search(r"No module named '([^']+)'", str(exc))
        if missing is None:
            raise
        if "." in missing.group(1):  # sparkpoint is there, but not this version's
            raise UserError(
                f"the Spark session's Python workers ({context.pythonExec}) have another "
                f"version of sparkpoint (No module named {missing.group(1)!r}): install "
                f"sparkpoint {_version()} on them, or set PYSPARK_PYTHON={sys.executable} "
                "before the session is built"
            ) from None
        raise UserError(
            f"the Spark session's Python workers run {context.pythonExec}, which cannot import "
            f"{missing.group(1)} (No module named {missing.group(1)!r}): set PYSPARK_PYTHON="
            f"{sys.executable} before the session is built (os.environ['PYSPARK_PYTHON'] = "
            "sys.executable, then SparkSession.builder...getOrCreate()); on a cluster, install "
            "sparkpoint on the executors or ship an environment (sparkpoint pack, "
            "spark.archives)"
        ) from None
    checked.add(key)

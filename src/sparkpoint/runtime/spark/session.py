"""Running micro-batches on Spark: the session, and a runner of task batches.

The driver (this process) is the job coordinator. Each batch is one Spark job (one per executor
with host affinity) over an RDD of the task plans, dealt into groups of tasks, one Spark
partition per group (:class:`SparkRunner`); the executor side is
:func:`sparkpoint.runtime.executor.task_batch.run_task_batch`, once per task of the group. Python
workers use this interpreter (``PYSPARK_PYTHON``), so they import the same sparkpoint.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import re
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from importlib import resources
from typing import Any

from sparkpoint.config import Config
from sparkpoint.errors import (
    CommitError,
    ConfigError,
    CorruptRecordError,
    MessageDecodeError,
    MessageEncodeError,
    PhaseError,
    RestoreError,
    SparkpointError,
    TaskError,
    UserError,
)
from sparkpoint.metadata.locality import Executor
from sparkpoint.model.clock import follow
from sparkpoint.runtime.executor.standby import run_standby
from sparkpoint.runtime.executor.task_batch import run_task_batch
from sparkpoint.runtime.plan import StandbyPlan, StandbyResult, TaskBatchPlan, TaskBatchResult
from sparkpoint.runtime.runner import BatchRunner
from sparkpoint.runtime.spark import jvm_archive
from sparkpoint.runtime.spark.gateway import start_gateway
from sparkpoint.runtime.spark.locality import (
    executor_cores,
    executors_of_group,
    live_executors,
    located_rdd,
)

_ERRORS: dict[str, type[SparkpointError]] = {
    "ConfigError": ConfigError,
    "CorruptRecordError": CorruptRecordError,
    "TaskError": TaskError,
    "PhaseError": PhaseError,
    "MessageDecodeError": MessageDecodeError,
    "MessageEncodeError": MessageEncodeError,
    "StoreError": SparkpointError,
    "CheckpointError": SparkpointError,
    "StreamNotFound": UserError,
    "RestoreError": RestoreError,
    "CommitError": CommitError,
}

log = logging.getLogger(__name__)


#: local mode with up to 4 attempts per task (``local[N,F]``): a task whose Python worker dies
#: is retried, as spark.task.maxFailures (default 4) does on a cluster
DEFAULT_MASTER = "local[*,4]"


#: the local driver JVM's quick start: the C1 compiler only (the start-up is mostly
#: interpreted and C1-compiled code; C2's optimised code pays off in long JVM-heavy work)
QUICK_JIT = "-XX:TieredStopAtLevel=1"


#: on a cluster (host affinity, docs/host-affinity.md): start once every executor asked for
#: (spark.cores.max) has registered, so the first placement is balanced; and let a task wait
#: for its executor's free core rather than restore elsewhere after Spark's default 3 s
CLUSTER_DEFAULTS = {
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
    "spark.locality.wait": "30s",
}


def log4j_config() -> str:
    return str(resources.files("sparkpoint.runtime") / "conf" / "log4j2.properties")


def submitted_master() -> str | None:
    """The ``--master`` of the ``spark-submit`` that runs this driver (its JVM is up and
    waiting for this process), else ``None``."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    master = SparkConf().get("spark.master", None)
    return str(master) if master else None


def choose_master(config: Config, master: str | None = None) -> str:
    """The job's Spark master: ``master`` (``--master``), else spark-submit's, else the config's
    ``spark.master``, else :data:`DEFAULT_MASTER`."""
    return master or submitted_master() or config.get_str("spark.master") or DEFAULT_MASTER


def spark_settings(config: Config, master: str | None = None) -> tuple[str, dict[str, str]]:
    """The master and every ``spark.*`` setting of a job's Spark application: sparkpoint's
    defaults, then the config's ``spark.*`` keys. Sets the Python and loopback variables Spark
    reads from the environment (unless already set)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # bind Spark to loopback unless told otherwise: no traffic leaves the machine by default
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    master = choose_master(config, master)
    java_options = f"-Dlog4j2.configurationFile=file:{log4j_config()}"
    if config.get_bool("job.spark.class.archive"):
        java_options = f"{java_options} {jvm_archive.java_options()}".strip()
    if master.startswith("local") and config.get_bool("job.spark.driver.quick.jit"):
        java_options = f"{java_options} {QUICK_JIT}"
    settings = {
        "spark.app.name": f"sparkpoint-{config.job_name}-{config.job_id}",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.python.worker.reuse": "true",
        "spark.speculation": "false",
        "spark.driver.extraJavaOptions": java_options,
        "spark.executorEnv.PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"],
        "spark.python.daemon.module": "sparkpoint.runtime.spark.pydaemon",
        # a DataFrame batch is cached for one batch only: building compressed column batches
        # (dictionary and run-length statistics per column) was half of the JVM's work there
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    if not master.startswith("local"):
        settings.update(CLUSTER_DEFAULTS)
    for key, value in config.subset("spark.").items():
        full = key if key.startswith("spark.") else f"spark.{key}"
        if full != "spark.master":
            settings[full] = value
    return master, settings


def spark_session(config: Config, master: str | None = None) -> Any:
    """Get or create the Spark session for a job (``spark.*`` keys of the config pass through):
    for a DataFrame pipeline, and whatever else needs Spark SQL."""
    master, settings = spark_settings(config, master)
    start_gateway({"spark.master": master, **settings})
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def spark_context(config: Config, master: str | None = None) -> Any:
    """Get or create the SparkContext for a job, with the settings of :func:`spark_session`
    but no SQL session: all a local task API job runs on. Creating the session (the JVM's
    ``SparkSession`` constructor) was about 1.3-1.6 s of the 4.6-5.9 s a local Spark took to
    run its first job on this project's 2-core machines (``docs/performance.md``). A session
    made later (``SparkSession.builder.getOrCreate``) uses this context."""
    master, settings = spark_settings(config, master)
    start_gateway({"spark.master": master, **settings})
    from pyspark import SparkConf, SparkContext

    conf = SparkConf().setMaster(master).setAll(list(settings.items()))
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("WARN")
    return sc


def user_error_from(exc: BaseException) -> SparkpointError | None:
    """The sparkpoint error a failed Spark job carries in its Python traceback, if any."""
    text = str(exc)
    found = None
    for m in re.finditer(r"sparkpoint\.errors\.(\w+): (.+)", text):
        found = m
    if found is None:
        return None
    cls = _ERRORS.get(found.group(1), SparkpointError)
    return cls(found.group(2).strip())


def task_failure_from(exc: BaseException, batch: int) -> SparkpointError | None:
    """One line for a batch Spark gave up on after retrying a task (a worker that kept dying)."""
    text = str(exc)
    m = re.search(r"failed (\d+) times?, most recent failure: Lost task [^:]*: ([^\n]+)", text)
    if m is None:
        return None
    reason = re.sub(r"^[\w.$]+Exception: ", "", m.group(2)).strip()
    return SparkpointError(
        f"batch {batch}: a task failed {m.group(1)} times (Spark's attempts), last: {reason}; "
        f"nothing was committed for it: the next run resumes from the last checkpoint"
    )


class SparkRunner(BatchRunner):
    """Runs a batch as Spark jobs. The tasks are dealt into at most :data:`GROUPS_PER_CORE`
    Spark partitions per core (:func:`task_groups`), each running its tasks one after the
    other (Samza's container: a group of tasks), so that Spark's scheduling and a Python
    worker's hand-off are paid per group, not per task. On a cluster, the tasks of each
    executor (host affinity: the executor the plans name) are grouped by that executor's
    cores, and each group's partition prefers it; tasks without one are grouped by every
    executor's cores together.

    With host affinity, the batch is one Spark job **per executor** (the tasks placed there),
    submitted together from a thread each, not one job for all: a task waits for its own
    executor's busy core (``spark.locality.wait``, 30 s on a cluster) rather than run away
    from its state, and Spark's delay scheduling counts a job's locality level as reachable
    while any executor named by any of the job's tasks lives. In one job for every task, the
    tasks of an executor lost mid-batch therefore waited out the whole 30 s for it (measured:
    a 0.5 s batch took 31 s); in a job of their own, the loss leaves no executor of theirs
    alive, and Spark runs them elsewhere at once (where they restore)."""

    places_tasks = True

    def __init__(self, spark: Any) -> None:
        """``spark``: the SparkContext (:func:`spark_context`), or a session (its context is
        used): what :class:`~sparkpoint.runtime.driver.launch.SparkStart` started."""
        self.sc = getattr(spark, "sparkContext", spark)
        # kept across batches: each Python thread is a py4j connection and a JVM thread
        self._pool = ThreadPoolExecutor(thread_name_prefix="sparkpoint-batch-job")
        self._grouping: tuple[int, int] | None = None  # (tasks, partitions) last logged
        self._groups: set[str] = set()  # the running batch's Spark job groups

    def executors(self) -> list[Executor] | None:
        """The live executors on a cluster; ``None`` in local mode (one executor: no choice)."""
        return cluster_executors(self.sc)

    def cancel(self) -> None:
        """The running batch's Spark jobs (its job groups), not the session's other jobs (a
        notebook's session runs others)."""
        for group in list(self._groups):
            self.sc.cancelJobGroup(group)

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        self._groups = set()  # the batch's job groups (cancel)
        if not plans:
            return []
        if str(self.sc.master).startswith("local"):  # one executor: no placement
            groups = task_groups(plans, self.sc.defaultParallelism)
            return self._run(batch, groups, batch_job_group(self.sc, batch))
        cores = executor_cores(self.sc)
        parts = [cluster_groups(part, cores) for part in by_location(plans)]
        self._log_grouping(plans, parts)
        if len(parts) == 1:
            return self._run(batch, parts[0], batch_job_group(self.sc, batch))
        futures = [
            self._pool.submit(self._run_part, batch, i, part) for i, part in enumerate(parts)
        ]
        wait(futures)
        for future in futures:  # every job has ended: the first failure is the batch's
            future.result()
        return [r for future in futures for r in future.result()]

    def catch_up(self, plans: list[StandbyPlan]) -> list[StandbyResult]:
        """Catch the standby copies up (:func:`catch_up_standbys`)."""
        return catch_up_standbys(self.sc, plans)

    def _run_part(
        self, batch: int, part: int, groups: list[list[TaskBatchPlan]]
    ) -> list[TaskBatchResult]:
        return self._run(batch, groups, batch_job_group(self.sc, batch, part))

    def _run(
        self, batch: int, groups: list[list[TaskBatchPlan]], group: str
    ) -> list[TaskBatchResult]:
        """One Spark job: a partition per group of tasks, preferring its executor."""
        self._groups.add(group)
        rdd = task_rdd(self.sc, [g[0] for g in groups], groups).flatMap(run_task_group)
        results = collect_batch(batch, rdd)
        record_group_executors(self.sc, group, groups, results)
        return results

    def _log_grouping(
        self, plans: list[TaskBatchPlan], parts: list[list[list[TaskBatchPlan]]]
    ) -> None:
        partitions = sum(len(groups) for groups in parts)
        shape = (len(plans), partitions)
        if partitions < len(plans) and shape != self._grouping:
            log.info(
                "%d tasks run in %d Spark partitions (up to %d per core of their executor)",
                *shape,
                GROUPS_PER_CORE,
            )
        self._grouping = shape


_CATCH_UPS = itertools.count(1)  # numbers each catch-up job's group (where its tasks ran)


def catch_up_standbys(sc: Any, plans: list[StandbyPlan]) -> list[StandbyResult]:
    """One Spark job catching every executor's copies up: each :class:`StandbyPlan` split
    into a partition per core of its executor (:meth:`StandbyPlan.split`), each preferring
    that executor. Each result says where its partition ran (``ran_on``): a copy caught up on
    another executor than its own (the executor died meanwhile) is not kept by the driver."""
    if not plans:
        return []
    cores = executor_cores(sc)
    parts = [part for p in plans for part in p.split(cores.get(p.location, 1))]
    group = f"sparkpoint-{sc.applicationId}-standby-{next(_CATCH_UPS)}"
    sc.setJobGroup(group, "sparkpoint standby catch-up")
    rdd = located_rdd(sc, parts, [[p.location] for p in parts]).flatMap(run_standby)
    results: list[StandbyResult] = rdd.collect()
    where = executors_of_group(sc, group, len(parts))
    index = {(p.executor.id, c.task.name.name): i for i, p in enumerate(parts) for c in p.copies}
    for r in results:
        r.ran_on = where.get(index[(r.executor, r.task)])
    return results


def collect_batch(batch: int, rdd: Any) -> list[TaskBatchResult]:
    """The task results of ``rdd`` (a batch's tasks, run); a failed batch's error in one line
    when it is a user's error or a task that kept failing."""
    try:
        results: list[TaskBatchResult] = rdd.collect()
    except Exception as exc:
        err = user_error_from(exc) or task_failure_from(exc, batch)
        if err is not None:
            raise err from None
        raise
    return results


#: a local batch runs its tasks in at most this many Spark partitions per core (many tasks
#: on few cores: Spark's scheduling per task was up to half of a 256-task batch's time)
GROUPS_PER_CORE = 2


def task_groups(plans: list[TaskBatchPlan], cores: int) -> list[list[TaskBatchPlan]]:
    """The plans dealt into at most :data:`GROUPS_PER_CORE` groups per core, the longest
    first: each plan, most messages to read first, goes to the group with the fewest so far
    (then the fewest plans), and the groups come heaviest first, as Spark starts a job's
    partitions in order. A hot partition's task then starts at once instead of after a round
    of small ones, and the cores finish together (the "longest processing time first" rule).
    Plans of equal weight are dealt round-robin, in order."""
    n = max(1, min(len(plans), GROUPS_PER_CORE * cores))
    weights = [expected_messages(p) for p in plans]
    order = sorted(range(len(plans)), key=lambda i: -weights[i])  # stable: ties keep order
    groups: list[list[TaskBatchPlan]] = [[] for _ in range(n)]
    loads = [(0, 0, g) for g in range(n)]  # (messages, plans, group): a heap
    for i in order:
        load, count, g = heapq.heappop(loads)
        groups[g].append(plans[i])
        heapq.heappush(loads, (load + weights[i], count + 1, g))
    heaviest = sorted(loads, key=lambda x: (-x[0], x[2]))
    return [groups[g] for _, _, g in heaviest]


def expected_messages(plan: TaskBatchPlan) -> int:
    """How many messages ``plan``'s task will read at most: per SSP, its lag up to the end,
    at most ``task.batch.max.messages`` (0 for offsets that are not numbers)."""
    reads, total = plan.reads, 0
    for ssp, end in reads.end.items():
        start = reads.resume.get(ssp, plan.start.from_checkpoint.get(ssp))
        with contextlib.suppress(ValueError):
            total += min(reads.max_messages, max(0, int(end) - int(start or 0)))
    return total


def cluster_groups(
    plans: list[TaskBatchPlan], cores: Mapping[str, int]
) -> list[list[TaskBatchPlan]]:
    """The plans of one executor (or those placed nowhere) dealt into groups by the cores of
    that executor (of every executor together); one group per plan when the cores are not
    known."""
    location = plans[0].location
    n = cores.get(location, 0) if location else sum(cores.values())
    return task_groups(plans, n) if n else [[p] for p in plans]


def run_task_group(plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
    """Run several tasks' micro-batches one after the other in one Spark partition (in a
    Spark worker: on the driver's processing time, :func:`follow`)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = 0 if context is None else int(context.attemptNumber())
    results = []
    for plan in plans:
        follow(plan.clock_ms, plan.driver_wall_ms)
        results.append(run_task_batch(plan, attempt))
    return results


def by_location(plans: list[TaskBatchPlan]) -> list[list[TaskBatchPlan]]:
    """The plans grouped by preferred executor (those without one together), in order."""
    parts: dict[str | None, list[TaskBatchPlan]] = {}
    for plan in plans:
        parts.setdefault(plan.location, []).append(plan)
    return list(parts.values())


def cluster_executors(sc: Any) -> list[Executor] | None:
    if str(sc.master).startswith("local"):
        return None
    return live_executors(sc)


def batch_job_group(sc: Any, batch: int, part: int | None = None) -> str:
    """Tag the batch's Spark jobs (to find where each task ran afterwards) run by this thread
    (``part``: one of the batch's jobs, :class:`SparkRunner`); the group id."""
    group = f"sparkpoint-{sc.applicationId}-batch-{batch}"
    if part is not None:
        group = f"{group}-part-{part}"
    sc.setJobGroup(group, f"sparkpoint batch {batch}")
    return group


def task_rdd(sc: Any, plans: list[TaskBatchPlan], items: list[Any] | None = None) -> Any:
    """One partition per plan holding the plan (or ``items[i]``), preferring the plan's
    executor when it names one (host affinity)."""
    items = list(plans) if items is None else items
    locations = [[p.location] if p.location else [] for p in plans]
    if any(locations):
        return located_rdd(sc, items, locations)
    return sc.parallelize(items, max(1, len(items)))


#: the most plan bytes (all tasks' copies of the literal array together) the JVM-built plans
#: frame ships per batch; past it, each task gets only its own row, over an RDD
JVM_PLANS_MAX_BYTES = 8 * 1024 * 1024


def task_frame(spark: Any, plans: list[TaskBatchPlan], rows: list[bytes]) -> Any:
    """A DataFrame ``plan BINARY`` with one partition per plan, partition ``i`` holding
    ``rows[i]``. Without host affinity it is built in the JVM alone (a range of one id per
    partition, each picking its row from a literal array): a DataFrame over a Python RDD
    (:func:`task_rdd`) would run Python workers of their own every batch only to convert
    the rows. With affinity (the RDD carries each partition's preferred executor) or many
    large plans (:data:`JVM_PLANS_MAX_BYTES`) it is built over the RDD."""
    from pyspark.sql import functions as F

    shipped = len(rows) * sum(len(r) for r in rows)  # every task carries the whole array
    if not rows or any(p.location for p in plans) or shipped > JVM_PLANS_MAX_BYTES:
        return spark.createDataFrame(
            task_rdd(spark.sparkContext, plans, [(r,) for r in rows]), "plan BINARY"
        )
    table = F.array(*[F.lit(bytearray(r)) for r in rows])
    ids = spark.range(0, len(rows), 1, len(rows))
    return ids.select(F.element_at(table, (F.col("id") + 1).cast("int")).alias("plan"))


def record_executors(
    sc: Any, group: str, plans: list[TaskBatchPlan], results: list[TaskBatchResult]
) -> None:
    """Fill in each result's ``ran_on``: the executor its task's partition last ran on."""
    record_group_executors(sc, group, [[p] for p in plans], results)


def record_group_executors(
    sc: Any, group: str, groups: list[list[TaskBatchPlan]], results: list[TaskBatchResult]
) -> None:
    """:func:`record_executors` for partitions of ``groups`` of tasks; each result's
    ``group`` names the tasks of its partition."""
    index = {p.task.name.name: i for i, g in enumerate(groups) for p in g}
    names = [sorted(p.task.name.name for p in g) for g in groups]
    for r in results:
        i = index.get(r.task)
        if i is not None:
            r.group = names[i]
    if str(sc.master).startswith("local"):
        return
    where = executors_of_group(sc, group, len(groups))
    for r in results:
        i = index.get(r.task)
        if i is not None and i in where:
            r.ran_on = where[i]

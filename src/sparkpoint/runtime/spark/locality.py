"""Spark's side of host affinity: RDDs with preferred locations, live executors, where tasks ran.

PySpark has no public way to give a partition a preferred location. This module, the only one
that reaches into Spark's JVM for it, uses ``SparkContext.makeRDD(Seq[(T, Seq[String])])``:
one pickled item per partition with its locations, wrapped as a Python RDD. Spark's scheduler
follows narrow dependencies to find preferred locations, so ``map``/``mapPartitions`` and a
DataFrame made from it keep them. The live executors and the executor each task of a job ran
on come from Spark's status store. Any failure here (a Spark version that changed these private
APIs) logs one WARNING and falls back to no preference: the job still runs, tasks just restore
wherever they land.
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Sequence
from typing import Any

from sparkpoint.errors import BatchInterrupted
from sparkpoint.metadata.locality import Executor

log = logging.getLogger(__name__)

_warned: set[str] = set()


def _warn_once(what: str, exc: BaseException) -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning(
            "host affinity: %s failed (%s: %s); tasks run without a preferred executor",
            what,
            type(exc).__name__,
            exc,
        )


def _converters(sc: Any) -> Any:
    return sc._jvm.scala.jdk.javaapi.CollectionConverters


def _scala_seq(sc: Any, items: Sequence[Any]) -> Any:
    return _converters(sc).asScala(list(items)).toSeq()


def located_rdd(sc: Any, items: Sequence[Any], locations: Sequence[Sequence[str]]) -> Any:
    """An RDD with one partition per item, partition ``i`` preferring ``locations[i]``
    (``executor_<host>_<id>`` strings); ``sc.parallelize`` if that cannot be built."""
    try:
        from pyspark.rdd import RDD
        from pyspark.serializers import CPickleSerializer

        jvm = sc._jvm
        pairs = [
            jvm.scala.Tuple2(bytearray(pickle.dumps(item)), _scala_seq(sc, locs))
            for item, locs in zip(items, locations, strict=True)
        ]
        tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))
        jrdd = sc._jsc.sc().makeRDD(_scala_seq(sc, pairs), tag).toJavaRDD()
        return RDD(jrdd, sc, CPickleSerializer())
    except Exception as exc:  # private API: never fail the job over a preference
        _warn_once("building an RDD with preferred locations", exc)
        return sc.parallelize(list(items), max(1, len(items)))


def _active_executors(sc: Any) -> list[tuple[Executor, int]]:
    """Each active executor other than the driver, with its cores (empty in local mode or if
    unknown)."""
    try:
        summaries = _converters(sc).asJava(sc._jsc.sc().statusStore().executorList(True))
        return [
            (Executor(str(s.id()), str(s.hostPort()).rsplit(":", 1)[0]), int(s.totalCores()))
            for s in summaries
            if s.id() != "driver" and s.isActive()
        ]
    except Exception as exc:
        _warn_once("listing the live executors", exc)
        return []


def live_executors(sc: Any) -> list[Executor]:
    """The active executors other than the driver (empty in local mode or if unknown)."""
    return sorted(executor for executor, _ in _active_executors(sc))


def executor_cores(sc: Any) -> dict[str, int]:
    """The cores of each active executor other than the driver, by its location string
    (:meth:`Executor.location`); empty in local mode or if unknown."""
    return {executor.location: cores for executor, cores in _active_executors(sc)}


def executors_of_group(sc: Any, group: str, partitions: int) -> dict[int, Executor]:
    """Partition index -> the executor its successful task ran on, in the last stage of the
    last job of job group ``group`` that has ``partitions`` tasks (one per sparkpoint task: the
    batch job, or a DataFrame batch's finish, which runs on the batch's partitions; a shuffle
    stage's partitions are not tasks, so only the last matching stage counts)."""
    try:
        tracker = sc.statusTracker()
        store = sc._jsc.sc().statusStore()
        jobs = sorted(tracker.getJobIdsForGroup(group))
        info = tracker.getJobInfo(jobs[-1]) if jobs else None
        stages = [tracker.getStageInfo(s) for s in sorted(info.stageIds if info else [])]
        matching = [s for s in stages if s is not None and s.numTasks == partitions]
        if not matching:
            return {}
        stage = matching[-1]
        tasks = _converters(sc).asJava(
            store.taskList(stage.stageId, stage.currentAttemptId, 1 << 20)
        )
        return {
            int(t.index()): Executor(str(t.executorId()), str(t.host()))
            for t in tasks
            if t.status() == "SUCCESS"
        }
    except Exception as exc:
        _warn_once("reading where tasks ran", exc)
        return {}


class ExecutorWatch:
    """While a batch's Spark jobs run (job group ``group``), watch the executors its tasks
    prefer (``locations``, :attr:`Executor.location` strings); once one of them is lost,
    remember which (:attr:`lost`) and cancel the group's jobs, again at every poll, so that a
    job started meanwhile is cancelled too (the runner calls :meth:`check` before each job).
    Spark re-runs a lost executor's tasks elsewhere, but in a job whose other tasks prefer live
    executors its delay scheduling holds them for ``spark.locality.wait`` (30 s on a cluster)
    first. A context manager; polls every ``every`` seconds from a thread of its own."""

    def __init__(self, sc: Any, group: str, locations: set[str], every: float = 0.25) -> None:
        self.sc = sc
        self.group = group
        self.locations = locations
        self.every = every
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"watch-{group}", daemon=True)

    def __enter__(self) -> ExecutorWatch:
        if self.locations:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def check(self, what: str) -> None:
        """Raise :class:`BatchInterrupted` (naming ``what``) if an executor was lost."""
        if self.lost is not None:
            raise BatchInterrupted(
                f"{what}: {self.lost} was lost while the batch ran on it, and its Spark jobs "
                "were cancelled"
            )

    def _watch(self) -> None:
        while not self._stop.wait(self.every):
            if self.lost is None:
                try:
                    live = {e.location for e in live_executors(self.sc)}
                except Exception:  # the context is stopping: nothing to watch
                    return
                gone = sorted(self.locations - live)
                if not gone or not live:  # (none live: the status store is not answering)
                    continue
                self.lost = gone[0]
                log.warning(
                    "%s was lost while batch jobs %s ran on it: cancelling them, so that no "
                    "task waits for it",
                    gone[0],
                    self.group,
                )
            try:
                self.sc.cancelJobGroup(self.group)
            except Exception:  # the context is stopping
                return

"""The Spark side of host affinity (private Spark APIs, kept in one module): RDDs whose
partitions prefer an executor, and the fallback when those APIs are not there."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sparkpoint.metadata.locality import Executor
from sparkpoint.runtime.spark import locality


def _preferred(rdd: Any) -> list[list[str]]:
    """Each partition's preferred locations as Spark's scheduler sees them."""
    scala = rdd._jrdd.rdd()
    conv = rdd.ctx._jvm.scala.jdk.javaapi.CollectionConverters
    return [list(conv.asJava(scala.preferredLocations(p))) for p in scala.partitions()]


def test_each_partition_prefers_its_executor_and_keeps_it_through_map(spark: Any) -> None:
    sc = spark.sparkContext
    a, b = Executor("1", "127.0.0.1"), Executor("2", "127.0.0.1")
    rdd = locality.located_rdd(sc, ["x", "y", "z"], [[a.location], [b.location], []])
    assert _preferred(rdd) == [["executor_127.0.0.1_1"], ["executor_127.0.0.1_2"], []]
    mapped = rdd.map(str.upper)
    assert mapped.collect() == ["X", "Y", "Z"]  # one item per partition, in order
    assert mapped.getNumPartitions() == 3


def test_where_tasks_ran_is_read_back_by_job_group(spark: Any) -> None:
    sc = spark.sparkContext
    sc.setJobGroup("sparkpoint-test-locality", "test")
    rdd = locality.located_rdd(sc, [1, 2], [["executor_localhost_driver"], []])
    assert rdd.map(lambda x: x * 2).collect() == [2, 4]
    where = locality.executors_of_group(sc, "sparkpoint-test-locality", 2)
    assert sorted(where) == [0, 1]
    assert {e.id for e in where.values()} == {"driver"}  # local mode: one executor


class _BrokenContext:
    """A SparkContext whose JVM side lacks the private APIs."""

    _jvm = None

    def __init__(self, real: Any) -> None:
        self.real = real

    def parallelize(self, items: list[Any], slices: int) -> Any:
        return self.real.parallelize(items, slices)


def test_without_the_private_api_batches_run_without_a_preference(
    spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    locality._warned.clear()
    broken = _BrokenContext(spark.sparkContext)
    with caplog.at_level(logging.WARNING):
        rdd = locality.located_rdd(broken, ["a", "b"], [["executor_h_1"], ["executor_h_2"]])
        assert locality.live_executors(broken) == []
    assert rdd.collect() == ["a", "b"] and rdd.getNumPartitions() == 2
    assert "tasks run without a preferred executor" in caplog.text


def test_the_spark_runner_runs_on_a_session_or_on_its_context(spark: Any) -> None:
    """A local task job starts the SparkContext alone; a cluster's starts the session."""
    from sparkpoint.runtime.spark.session import SparkRunner

    assert SparkRunner(spark).sc is spark.sparkContext
    assert SparkRunner(spark.sparkContext).sc is spark.sparkContext

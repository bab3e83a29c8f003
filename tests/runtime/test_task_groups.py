"""Many tasks on few cores (issue 35): a batch runs its tasks in at most two Spark partitions
per core (of the executor they are placed on, on a cluster), several tasks one after the other
in each, with the same state."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkpoint.config import load_config
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.spark.session import SparkRunner, cluster_groups, task_groups
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.jobs import job_overview, overview_lines
from tests.conftest import pageviews_config
from tests.helpers import assert_at_least_once, committed_counts, emitted_counts, generate


def test_plans_are_dealt_round_robin() -> None:
    plans: list[Any] = list(range(10))
    assert task_groups(plans, 2) == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert task_groups(plans[:3], 2) == [[0], [1], [2]]  # no fewer tasks than partitions


@dataclass
class Plan:
    name: int
    location: str | None


def test_on_a_cluster_an_executors_tasks_are_grouped_by_its_cores() -> None:
    a = [Plan(i, "executor_h1_0") for i in range(6)]
    grouped = cluster_groups(a, {"executor_h1_0": 1, "executor_h2_1": 4})  # type: ignore[arg-type]
    assert [[p.name for p in g] for g in grouped] == [[0, 2, 4], [1, 3, 5]]  # 2 per core
    # placed nowhere (a first batch): every executor's cores together, 10 partitions
    free = [Plan(i, None) for i in range(12)]
    assert len(cluster_groups(free, {"executor_h1_0": 1, "executor_h2_1": 4})) == 10  # type: ignore[arg-type]
    # an executor whose cores are not known (just lost, or not listed): a partition per task
    assert len(cluster_groups(a, {})) == 6  # type: ignore[arg-type]


def test_twelve_tasks_run_in_four_spark_partitions_with_exact_state(
    tmp_path: Path, spark: Any
) -> None:
    overrides = {"task.batch.max.messages": "200", "task.commit.ms": "0"}
    config = load_config(None, pageviews_config(tmp_path, **overrides))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 12))
    expected = generate(config, tmp_path / "job.yaml", 4000, seed=3)
    coordinator = JobCoordinator(config, SparkRunner(spark.sparkContext))
    summary = coordinator.run(until_caught_up=True)
    coordinator.close()
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)
    tracker = spark.sparkContext.statusTracker()
    group = f"sparkpoint-{spark.sparkContext.applicationId}-batch-{summary.batches}"
    job = max(tracker.getJobIdsForGroup(group))  # the session's other jobs share the name
    (stage,) = tracker.getJobInfo(job).stageIds
    assert tracker.getStageInfo(stage).numTasks == 4  # 12 tasks, local[2]: 2 per core
    shown = job_overview(config)
    assert all(len(t["group"]) == 3 and t["task"] in t["group"] for t in shown["tasks"])
    line = next(x for x in overview_lines(shown) if x.startswith("  Partition 0: "))
    assert "runs in one Spark partition with Partition 4, Partition 8" in line, line

"""Many tasks on few cores (issue 35): a local batch runs its tasks in at most two Spark
partitions per core, several tasks one after the other in each, with the same state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkpoint.config import load_config
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.spark.session import SparkRunner, task_groups
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from tests.conftest import pageviews_config
from tests.helpers import assert_at_least_once, committed_counts, emitted_counts, generate


def test_plans_are_dealt_round_robin() -> None:
    plans: list[Any] = list(range(10))
    assert task_groups(plans, 2) == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert task_groups(plans[:3], 2) == [[0], [1], [2]]  # no fewer tasks than partitions


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

"""Many tasks on few cores (issue 35): a batch runs its tasks in at most two Spark partitions
per core (of the executor they are placed on, on a cluster), several tasks one after the other
in each, with the same state."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sparkpoint.config import load_config
from sparkpoint.model import SystemStreamPartition
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.plan import Reads
from sparkpoint.runtime.spark.session import SparkRunner, cluster_groups, task_groups
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.jobs import job_overview, overview_lines
from tests.conftest import pageviews_config
from tests.helpers import assert_at_least_once, committed_counts, emitted_counts, generate


@dataclass
class Plan:
    name: int
    location: str | None
    reads: Any = None
    start: Any = None


def weighted(name: int, lag: int, max_messages: int = 100) -> Any:
    """A plan whose task has ``lag`` messages to read in one SSP."""
    ssp = SystemStreamPartition.parse(f"filelog.pageviews.{name}")
    reads = Reads({ssp: "10"}, {}, {ssp: str(10 + lag)}, max_messages)
    return Plan(name, None, reads, SimpleNamespace(from_checkpoint={ssp: "0"}))


def names(groups: list[list[Any]]) -> list[list[int]]:
    return [[p.name for p in g] for g in groups]


def test_plans_of_equal_weight_are_dealt_round_robin() -> None:
    plans = [weighted(i, 50) for i in range(10)]
    assert names(task_groups(plans, 2)) == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert names(task_groups(plans[:3], 2)) == [[0], [1], [2]]  # no fewer tasks than partitions


def test_the_heaviest_tasks_start_first_and_the_groups_come_out_even() -> None:
    """Longest processing time first: a hot partition's task (3, at its batch limit) must
    not wait for a round of small ones. Spark starts partitions in order, so on two cores the
    round-robin [0], [1], [2], [3] started 3 after 0 or 1: 0.09 s + 0.40 s a batch in the
    re-key benchmark's skewed batches, where 0.40 s is the least it can take."""
    plans = [weighted(0, 12), weighted(1, 13), weighted(2, 11), weighted(3, 500)]
    assert names(task_groups(plans, 2)) == [[3], [1], [0], [2]]
    # more tasks than groups: each to the lightest group so far, the heaviest first; the
    # round-robin split was [0, 2, 4, 6] (95 messages) and [1, 3, 5, 7] (170)
    lags = [5, 90, 40, 40, 30, 30, 20, 10]
    groups = task_groups([weighted(i, lag) for i, lag in enumerate(lags)], 1)
    assert names(groups) == [[1, 5, 7, 0], [2, 3, 4, 6]]  # 135 and 130 messages


def test_on_a_cluster_an_executors_tasks_are_grouped_by_its_cores() -> None:
    a = [replace(weighted(i, 50), location="executor_h1_0") for i in range(6)]
    grouped = cluster_groups(a, {"executor_h1_0": 1, "executor_h2_1": 4})  # type: ignore[arg-type]
    assert [[p.name for p in g] for g in grouped] == [[0, 2, 4], [1, 3, 5]]  # 2 per core
    # placed nowhere (a first batch): every executor's cores together, 10 partitions
    free = [weighted(i, 50) for i in range(12)]
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
    # the last batch's groups: its tasks dealt by what each had to read (task_groups)
    groups = {tuple(sorted(t["group"])) for t in shown["tasks"]}
    assert all(t["task"] in t["group"] for t in shown["tasks"])
    assert len(groups) == 4 and sorted(x for g in groups for x in g) == sorted(config_tasks(12))
    grouped = next(t for t in shown["tasks"] if len(t["group"]) > 1)
    line = next(x for x in overview_lines(shown) if x.startswith(f"  {grouped['task']}: "))
    others = ", ".join(g for g in grouped["group"] if g != grouped["task"])
    assert f"runs in one Spark partition with {others}" in line, line


def config_tasks(n: int) -> list[str]:
    return [f"Partition {i}" for i in range(n)]

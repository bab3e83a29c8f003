"""Spark's Python workers freeze what they imported (``gc.freeze``) once, so that the full
collections a batch's young objects trigger do not walk pyspark, sparkpoint and the job's code;
the driver and test processes (``InlineRunner``) never freeze."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.config import load_config
from sparkpoint.model import SystemStream
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.runtime.executor import worker_heap
from sparkpoint.runtime.spark.session import SparkRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.streams import read_json_lines
from tests.conftest import pageviews_config
from tests.helpers import generate


def _freeze_twice(_: int) -> tuple[int, int, int, bool]:
    from sparkpoint.runtime.executor import worker_heap

    inherited = gc.get_freeze_count()  # the daemon's, plus this worker's if it froze before
    worker_heap.freeze_imported_objects()
    first = gc.get_freeze_count()
    kept = [[i] for i in range(1000)]  # new tracked objects: a second freeze would take them
    worker_heap.freeze_imported_objects()
    second = gc.get_freeze_count()
    del kept
    return inherited, first, second, worker_heap.FROZEN.done


def test_a_worker_inherits_the_daemons_frozen_imports_and_freezes_its_own_once(
    spark: Any,
) -> None:
    for inherited, first, second, frozen in (
        spark.sparkContext.parallelize(range(2), 2).map(_freeze_twice).collect()
    ):
        assert inherited > 10_000  # pyspark and sparkpoint, frozen by the daemon before forking
        assert first >= inherited
        assert second == first  # once per process: later objects stay collectable
        assert frozen


def _reports(tmp_path: Path, runner: Any) -> list[dict[str, Any]]:
    config = load_config(
        None, pageviews_config(tmp_path, **{"task.class": "heap_task:HeapReporter"})
    )
    systems = Systems(config)
    systems.admin("filelog").create_stream(StreamSpec("pageviews", 2))
    generate(config, tmp_path / "job.yaml", 40, seed=4)
    coordinator = JobCoordinator(config, runner)
    coordinator.run(until_caught_up=True)
    coordinator.close()
    return [r["value"] for r in read_json_lines(config, systems, SystemStream("filelog", "heap"))]


def test_a_task_on_spark_processes_with_its_imports_frozen(spark: Any, tmp_path: Path) -> None:
    reports = _reports(tmp_path, SparkRunner(spark.sparkContext))
    assert len(reports) == 40
    assert all(r["frozen"] and r["freeze_count"] > 10_000 for r in reports)
    assert all(r["threshold"][2] >= worker_heap.BATCH_FULL_COLLECTION_THRESHOLD for r in reports)


def test_a_task_run_in_process_freezes_nothing(tmp_path: Path) -> None:
    before = gc.get_freeze_count()
    reports = _reports(tmp_path, InlineRunner())
    assert len(reports) == 40
    assert not any(r["frozen"] for r in reports)
    assert gc.get_freeze_count() == before
    # full collections wait while a batch runs, in any process, and as before after it
    assert all(r["threshold"][2] >= worker_heap.BATCH_FULL_COLLECTION_THRESHOLD for r in reports)
    assert gc.get_threshold()[2] < worker_heap.BATCH_FULL_COLLECTION_THRESHOLD


def test_full_collections_wait_only_inside_the_block_even_when_it_fails() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), worker_heap.fewer_full_collections():
        assert gc.get_threshold() == (before[0], before[1], 1000)
        raise RuntimeError("a failed batch")
    assert gc.get_threshold() == before


def test_overlapping_batches_put_the_thresholds_back_once_the_last_one_ends() -> None:
    """A driver restores tasks ahead on several threads: their batches overlap."""
    before = gc.get_threshold()
    first, second = worker_heap.fewer_full_collections(), worker_heap.fewer_full_collections()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first ends while the second runs: still waiting
    assert gc.get_threshold()[2] == worker_heap.BATCH_FULL_COLLECTION_THRESHOLD
    second.__exit__(None, None, None)
    assert gc.get_threshold() == before

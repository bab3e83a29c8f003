"""The runtime's semantics without Spark: the inline runner runs the same executor code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config, load_config
from sparkpoint.errors import StreamNotFound, TaskError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from tests.conftest import pageviews_config
from tests.helpers import assert_at_least_once, committed_counts, emitted_counts, generate


def make(tmp_path: Path, **overrides: str) -> Config:
    values = pageviews_config(tmp_path, **overrides)
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    return config


def run(config: Config, **kwargs: object) -> JobCoordinator:
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.run(**kwargs)  # type: ignore[arg-type]
    coordinator.close()
    return coordinator


def test_counts_match_input_and_checkpoints_cover_everything(tmp_path: Path) -> None:
    config = make(tmp_path, **{"task.batch.max.messages": "300", "task.commit.ms": "0"})
    expected = generate(config, tmp_path / "job.yaml", 3000, seed=1)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)
    checkpoints = CheckpointManager(config).read_all()
    assert len(checkpoints) == 4
    total = sum(int(o) + 1 for c in checkpoints.values() for o in c.input_offsets.values())
    assert total == 3000


def test_reads_bounded_by_bytes_still_process_whole_batches(tmp_path: Path) -> None:
    """systems.<s>.read.max.bytes=1: every read returns one message, so a task reads its batch
    in as many reads, and still processes task.batch.max.messages per partition a batch: the
    same batches as with the default limit, and the same state."""
    batches = []
    for limit in ("1", "67108864"):
        work = tmp_path / limit
        overrides = {"task.batch.max.messages": "300", "task.commit.ms": "0"}
        config = make(work, **overrides, **{"systems.filelog.read.max.bytes": limit})
        expected = generate(config, work / "job.yaml", 3000, seed=4)
        coordinator = JobCoordinator(config, InlineRunner())
        summary = coordinator.run(until_caught_up=True)
        coordinator.close()
        assert committed_counts(config) == dict(expected)
        assert_at_least_once(emitted_counts(config), expected)
        checkpoints = CheckpointManager(config).read_all()
        total = sum(int(o) + 1 for c in checkpoints.values() for o in c.input_offsets.values())
        assert total == 3000
        batches.append(summary.batches)
    assert batches[0] == batches[1] >= 3000 // 4 // 300


def test_restart_without_commit_restores_checkpoint_state(tmp_path: Path) -> None:
    # commit only at the end of a run; a "crash" loses the uncommitted batches' state
    config = make(tmp_path, **{"task.batch.max.messages": "200", "task.commit.ms": "3600000"})
    expected = generate(config, tmp_path / "job.yaml", 2000, seed=2)
    first = JobCoordinator(config, InlineRunner())
    first.start()
    meta = first.partition_metadata(first.all_ssps())
    end = {s: m.upcoming for s, m in meta.items()}
    first.run_batch(end, commit=True)  # checkpoint after 200 per partition
    first.run_batch(end, commit=False)  # 200 more per partition, uncommitted: then "crash"
    first.close()
    committed_before = committed_counts(config)
    assert sum(committed_before.values()) == 800
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)


def test_failure_mid_batch_then_restart_is_exact(tmp_path: Path) -> None:
    flag = tmp_path / "fail.flag"
    flag.write_text("x")
    config = make(
        tmp_path,
        **{
            "task.class": "faulty_task:FailingCounter",
            "task.batch.max.messages": "100",
            "task.commit.ms": "0",
            "test.fail.at": "2:250",
            "test.fail.flag": str(flag),
        },
    )
    expected = generate(config, tmp_path / "job.yaml", 2000, seed=3)
    with pytest.raises(
        TaskError, match=r"task Partition 2 failed processing filelog.pageviews.2 offset 250"
    ):
        run(config, until_caught_up=True)
    assert not flag.exists()
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)


def test_missing_input_stream_names_it(tmp_path: Path) -> None:
    config = load_config(None, pageviews_config(tmp_path, **{"task.inputs": "filelog.nope"}))
    with pytest.raises(StreamNotFound, match="input stream filelog.nope does not exist"):
        JobCoordinator(config, InlineRunner()).start()


def test_max_batches_stops_with_a_commit(tmp_path: Path) -> None:
    config = make(tmp_path, **{"task.batch.max.messages": "10", "task.commit.ms": "3600000"})
    generate(config, tmp_path / "job.yaml", 400, seed=4)
    coordinator = run(config, max_batches=2)
    assert coordinator.stop_reason == "reached --max-batches 2"
    counts = committed_counts(config)
    assert sum(counts.values()) == 80  # 2 batches x 10 per partition x 4, then a commit-only batch
    offsets = [
        o for c in CheckpointManager(config).read_all().values() for o in c.input_offsets.values()
    ]
    assert offsets == ["19"] * 4


def test_metadata_streams_are_compacted_at_start(tmp_path: Path) -> None:
    config = make(tmp_path, **{"task.batch.max.messages": "50", "task.commit.ms": "0"})
    generate(config, tmp_path / "job.yaml", 1000, seed=5)
    run(config, until_caught_up=True)
    manager = CheckpointManager(config)
    before = manager.read_all()
    admin = Systems(config).admin("filelog")
    ssp = SystemStreamPartition("filelog", manager.stream, 0)
    written = int(admin.get_metadata([ssp])[ssp].upcoming)
    assert written > 40  # many commits of 4 tasks in 2 versions
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    coordinator.close()
    records = Systems(config).consumer("filelog").read(ssp, "0", str(written))
    assert len(records) == 8  # the newest V1 and V2 message per task
    assert CheckpointManager(config).read_all() == before


def test_a_batch_writes_its_tasks_checkpoints_and_localities_in_one_flush_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver's per-batch cost must not grow by a durable write per task: the checkpoints
    its tasks completed go out in one append and one flush, and where they committed in one
    write of the coordinator stream (256 tasks made 512 fsyncs a batch before)."""
    from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
    from sparkpoint.metadata.locality import TASK_LOCALITY

    flushes: list[str] = []
    flush = CheckpointManager._flush

    def flushed(self: CheckpointManager, what: str = "checkpoints") -> None:
        flushes.append(what)
        flush(self, what)

    localities: list[int] = []
    put_all = CoordinatorStreamStore.put_all

    def counted(self: CoordinatorStreamStore, namespace: str, entries: dict[str, str]) -> None:
        if namespace == TASK_LOCALITY:
            localities.append(len(entries))
        put_all(self, namespace, entries)

    monkeypatch.setattr(CheckpointManager, "_flush", flushed)
    monkeypatch.setattr(CoordinatorStreamStore, "put_all", counted)
    config = make(tmp_path, **{"task.batch.max.messages": "100", "task.commit.ms": "0"})
    expected = generate(config, tmp_path / "job.yaml", 1200, seed=21)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    end = coordinator.upcoming()
    flushes.clear()
    localities.clear()
    report, results = coordinator.run_batch(end, commit=True)
    coordinator.close()
    assert report.committed and len(results) == 4
    assert flushes == ["checkpoints"]  # one flush, for 4 tasks' checkpoints
    assert localities == [4]
    checkpoints = CheckpointManager(config).read_all()
    assert sum(int(o) + 1 for c in checkpoints.values() for o in c.input_offsets.values()) == 400
    assert sum(expected.values()) == 1200


def test_the_last_pass_of_a_run_opens_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's last pass only cleans up after the final checkpoint: it needs the stores'
    files, not their databases (an open costs RocksDB five fsyncs; a 256-task job paid 256
    for nothing). Here every RocksDB open is the first batch's restore; the state is exact
    and the next run keeps it (no restore)."""
    from sparkpoint.storage.kv.rocksdb import RocksDBEngine

    opened: list[str] = []
    init = RocksDBEngine.__init__

    def counting(self: RocksDBEngine, name: str, path: Path, **kwargs: Any) -> None:
        opened.append(str(path))
        init(self, name, path, **kwargs)

    monkeypatch.setattr(RocksDBEngine, "__init__", counting)
    config = make(tmp_path, **{"task.batch.max.messages": "1000"})
    expected = generate(config, tmp_path / "job.yaml", 2000, seed=22)
    coordinator = JobCoordinator(config, InlineRunner())
    summary = coordinator.run(until_caught_up=True)
    coordinator.close()
    assert len(opened) == 4 and len(set(opened)) == 4  # one per task: the batch that ran
    assert committed_counts(config) == dict(expected)  # (reads the checkpoints: opens them)
    opened.clear()
    expected += generate(config, tmp_path / "job.yaml", 400, seed=23)
    coordinator = JobCoordinator(config, InlineRunner())
    again = coordinator.run(until_caught_up=True)
    coordinator.close()
    assert again.restores == 0 and len(opened) == 4, (again, opened)
    assert committed_counts(config) == dict(expected)
    assert summary.batches == again.batches == 1  # each committed its batch: the last


def test_a_driver_whose_checkpoint_write_failed_runs_no_more_batches(tmp_path: Path) -> None:
    """The driver's view of its tasks moves on as it queues their checkpoints; when writing
    them fails, that view may name checkpoints nobody wrote, and a batch planned from it
    would clean up after them. So the driver stops there: a new one reads what was written."""
    from sparkpoint.errors import SparkpointError
    from sparkpoint.failpoints import InjectedCrash

    flag = tmp_path / "crash.flag"
    flag.write_text("1")  # the second task's checkpoint: the first one is written
    crash = {"testing.crash.at": "after-checkpoint-write", "testing.crash.flag": str(flag)}
    config = make(tmp_path, **{"task.batch.max.messages": "100", **crash})
    expected = generate(config, tmp_path / "job.yaml", 1200, seed=24)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    end = coordinator.upcoming()
    with pytest.raises(InjectedCrash):
        coordinator.run_batch(end, commit=True)
    assert len(CheckpointManager(config).read_all()) == 2  # tasks 0 and 1, flushed first
    with pytest.raises(SparkpointError, match="failed to write its tasks' checkpoints"):
        coordinator.run_batch(end, commit=True)
    coordinator.close()
    run(config, until_caught_up=True)  # a new driver: exact
    assert committed_counts(config) == dict(expected)


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="thread priorities are Linux's")
def test_a_changelog_compaction_pass_runs_at_a_lower_priority_than_the_batches() -> None:
    """The pass runs in a thread beside the batches; in local mode it shares the cores with
    the batches' workers, so it takes nice 10 over the driver's own priority."""
    import threading

    from sparkpoint.runtime.driver.maintenance import yield_cpu

    seen: list[int] = []

    def pass_() -> None:
        yield_cpu()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    thread = threading.Thread(target=pass_)
    thread.start()
    thread.join()
    driver = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert seen == [min(19, driver + 10)]
    assert driver == os.getpriority(os.PRIO_PROCESS, 0)  # the driver's own thread keeps its

"""Asynchronous commit: skip within the max delay, block after it, time out, surface errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.config import Config, load_config
from sparkpoint.errors import CommitError
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.testing.backends import NAME as COPY
from tests.conftest import pageviews_config
from tests.helpers import assert_committed_state_matches_its_offsets, generate


def make(tmp_path: Path, **overrides: str) -> Config:
    values = pageviews_config(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": COPY,
            "testing.copy.dir": str(tmp_path / "copies"),
            "task.batch.max.messages": "50",
            "task.commit.ms": "0",
            **overrides,
        },
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 1))
    generate(config, tmp_path / "a.yaml", 1000, seed=51, users=20)
    return config


def make_failing(
    tmp_path: Path, flag_key: str = "testing.copy.fail.flag", **overrides: str
) -> Config:
    """A job whose copy backend fails its next upload (``flag_key`` names the flag file)."""
    flag = tmp_path / "fail"
    flag.write_text("")
    return make(tmp_path, **{flag_key: str(flag), **overrides})


def batches(config: Config) -> tuple[JobCoordinator, dict]:  # type: ignore[type-arg]
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    meta = coordinator.partition_metadata(
        [s for t in coordinator.tasks.values() for s in t.model.ssps]
    )
    return coordinator, {s: m.upcoming for s, m in meta.items()}


def test_commit_is_skipped_while_the_upload_runs_within_max_delay(tmp_path: Path) -> None:
    config = make(tmp_path, **{"testing.copy.delay.ms": "600", "task.commit.max.delay.ms": "60000"})
    coordinator, end = batches(config)
    _, first = coordinator.run_batch(end, commit=True)
    assert first[0].commit_started and not first[0].completed_checkpoints
    _, second = coordinator.run_batch(end, commit=True)
    assert second[0].commit_skipped and second[0].commit_started is None
    assert second[0].total_seconds < 0.5  # processing did not wait for the 600 ms upload
    assert second[0].processed == 50
    coordinator.run_batch(end, commit=True, wait=True)  # the final commit waits for uploads
    assert coordinator.tasks["Partition 0"].last_checkpoint is not None
    coordinator.close()
    assert_committed_state_matches_its_offsets(config)


def test_commit_blocks_after_max_delay_until_the_upload_finishes(tmp_path: Path) -> None:
    config = make(tmp_path, **{"testing.copy.delay.ms": "1500", "task.commit.max.delay.ms": "0"})
    coordinator, end = batches(config)
    coordinator.run_batch(end, commit=True)
    _, second = coordinator.run_batch(end, commit=True)
    assert not second[0].commit_skipped and second[0].commit_started
    assert second[0].commit_seconds >= 0.5  # it waited for the previous (1.5 s) upload
    # the previous commit finished while we waited: it is reported for the driver to write
    assert len(second[0].completed_checkpoints) >= 1
    coordinator.close()


def test_blocked_commit_fails_after_the_timeout(tmp_path: Path) -> None:
    config = make(
        tmp_path,
        **{
            "testing.copy.delay.ms": "3000",
            "task.commit.max.delay.ms": "0",
            "task.commit.timeout.ms": "200",
        },
    )
    coordinator, end = batches(config)
    coordinator.run_batch(end, commit=True)
    with pytest.raises(
        CommitError,
        match=r"task Partition 0: commit \d+-\d+ still uploading after task.commit.timeout.ms=200",
    ):
        coordinator.run_batch(end, commit=True)
    coordinator.close()


def test_upload_error_surfaces_at_the_next_commit(tmp_path: Path) -> None:
    config = make_failing(tmp_path)
    coordinator, end = batches(config)
    _, first = coordinator.run_batch(end, commit=True)
    cid = first[0].commit_started
    # the failure happened on the commit pool; the batch itself succeeded
    with pytest.raises(
        CommitError,
        match=(
            rf"task Partition 0: commit {cid} failed: backend {COPY} upload for store\(s\) "
            r"user-counts failed: OSError: injected upload failure"
        ),
    ):
        coordinator.run_batch(end, commit=True, wait=True)
    assert coordinator.tasks["Partition 0"].last_checkpoint is None  # nothing was written
    coordinator.close()


def test_sync_mode_waits_for_the_upload_inside_the_batch(tmp_path: Path) -> None:
    config = make(
        tmp_path, **{"testing.copy.delay.ms": "300", "task.commit.async.enabled": "false"}
    )
    coordinator, end = batches(config)
    _, first = coordinator.run_batch(end, commit=True)
    assert first[0].commit_seconds >= 0.3
    assert len(first[0].completed_checkpoints) == 1
    assert first[0].state_id.text == f"ckpt:{first[0].commit_started}"
    coordinator.close()


def test_skip_commit_during_failures_logs_and_commits_next_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Samza's task.commit.skip.commit.during.failures.enabled: a failed upload is logged and
    skipped; the next commit is written, and the state matches its offsets."""
    config = make_failing(tmp_path, **{"task.commit.skip.commit.during.failures.enabled": "true"})
    coordinator, end = batches(config)
    coordinator.run_batch(end, commit=True)  # its upload fails on the commit pool
    coordinator.run_batch(end, commit=True, wait=True)
    assert "injected upload failure; skipped (1 successive commit exceptions" in caplog.text
    assert coordinator.tasks["Partition 0"].last_checkpoint is not None
    coordinator.close()
    assert_committed_state_matches_its_offsets(config)


def test_skip_commit_during_failures_fails_past_its_limit(tmp_path: Path) -> None:
    config = make_failing(
        tmp_path,
        **{
            "task.commit.skip.commit.during.failures.enabled": "true",
            "task.commit.skip.commit.exception.max.limit": "0",
        },
    )
    coordinator, end = batches(config)
    coordinator.run_batch(end, commit=True)
    with pytest.raises(CommitError, match=r"exception.max.limit=0"):
        coordinator.run_batch(end, commit=True, wait=True)
    coordinator.close()


def test_a_commit_built_on_another_checkpoint_than_the_last_written_is_not_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the soak on a cluster: an upload that finished on an executor the task had left
    was written after a commit the task made elsewhere from the same base, forking the chain of
    snapshots (two clean-ups then deleted each other's blobs). The driver now writes a commit
    only if it builds on the last written checkpoint."""
    from dataclasses import replace

    from sparkpoint.checkpoint.checkpoint import CheckpointV2
    from sparkpoint.checkpoint.id import CheckpointId

    config = make(tmp_path)
    coordinator, end = batches(config)
    _, results = coordinator.run_batch(end, commit=True, wait=True)
    written = coordinator.tasks["Partition 0"].last_checkpoint
    assert written is not None
    stale = CheckpointV2(CheckpointId.create(), written.input_offsets, {})
    forked = replace(results[0], completed_checkpoints=[stale.dumps()], completed_bases=["1-1"])
    caplog.set_level("INFO")
    assert not coordinator.apply(forked)
    assert "built on 1-1 instead of the last written" in caplog.text
    assert coordinator.tasks["Partition 0"].last_checkpoint == written
    on_top = replace(forked, completed_bases=[str(written.checkpoint_id)])
    assert coordinator.apply(on_top)
    coordinator.close()


def test_a_finished_commit_that_can_never_be_written_does_not_block_later_ones(
    tmp_path: Path,
) -> None:
    """Found by the cluster test: a task committed on executor A, moved to B before the upload
    finished, and B's commit was written. Back on A, A's finished upload (built on an older
    checkpoint) was reported every batch, refused by the driver, and held back every later
    commit of the task: the task never committed again. Such a record is now dropped."""
    import os
    import socket

    from sparkpoint.checkpoint.id import CheckpointId
    from sparkpoint.model import TaskName
    from sparkpoint.storage.commit import (
        DONE,
        CommitRecord,
        CommitScope,
        CommitSettings,
        TaskCommitManager,
    )
    from sparkpoint.storage.local import LocalTaskState

    task = TaskName("Partition 3")
    written = str(CheckpointId.create())  # written by the driver from executor B
    stale = str(CheckpointId.create())  # A's commit, newer, but built on no checkpoint
    manager = TaskCommitManager(
        CommitScope(task, "run", LocalTaskState(tmp_path, task), {}, {}, {}),
        CommitSettings(timeout_ms=1000),
        committed=written,
    )
    manager._write(
        CommitRecord("run", stale, DONE, socket.gethostname(), os.getpid(), 0, {}, base=None)
    )
    assert manager.completed(written) == []
    assert not (manager.dir / stale).exists()
    outcome = manager.commit({}, wait=False)
    assert outcome.started and not outcome.skipped
    assert [r.base for r in manager.completed(written)] == [written]


def test_a_store_write_that_fails_at_commit_names_the_task_and_store_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buffered writes reach RocksDB at the commit; a failure there (a full disk) fails the
    batch with the fix, and the restart restores the last checkpoint and redoes the batch."""
    from sparkpoint.storage.kv.rocksdb import RocksDBEngine

    config = make(tmp_path)
    coordinator, end = batches(config)
    coordinator.run_batch(end, commit=True, wait=True)  # a checkpoint to come back to
    real = RocksDBEngine.write_batch

    def full_disk(self: RocksDBEngine, puts: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RocksDBEngine, "write_batch", full_disk)
    with pytest.raises(
        CommitError,
        match=r"task Partition 0: store user-counts: writing the batch's buffered writes failed: "
        r".*No space left on device.*free space and restart",
    ):
        coordinator.run_batch(end, commit=True, wait=True)
    coordinator.close()
    monkeypatch.setattr(RocksDBEngine, "write_batch", real)
    again = JobCoordinator(config, InlineRunner())
    again.run(until_caught_up=True)
    again.close()
    assert_committed_state_matches_its_offsets(config)

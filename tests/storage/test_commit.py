"""Asynchronous commit: skip within the max delay, block after it, time out, surface errors.

One task's storage batch after batch (:class:`tests.storage.cycle.TaskCycle`), with no driver:
the commit sequence is storage's, and the driver only writes what it reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.config import Config, load_config
from sparkpoint.errors import CommitError
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.testing.backends import NAME as COPY
from tests.conftest import pageviews_config
from tests.storage.cycle import TaskCycle


def make(tmp_path: Path, **overrides: str) -> Config:
    values = pageviews_config(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": COPY,
            "testing.copy.dir": str(tmp_path / "copies"),
            "task.commit.ms": "0",
            **overrides,
        },
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 1))
    return config


def make_failing(
    tmp_path: Path, flag_key: str = "testing.copy.fail.flag", **overrides: str
) -> Config:
    """A job whose copy backend fails its next upload (``flag_key`` names the flag file)."""
    flag = tmp_path / "fail"
    flag.write_text("")
    return make(tmp_path, **{flag_key: str(flag), **overrides})


def test_commit_is_skipped_while_the_upload_runs_within_max_delay(tmp_path: Path) -> None:
    config = make(tmp_path, **{"testing.copy.delay.ms": "600", "task.commit.max.delay.ms": "60000"})
    cycle = TaskCycle(config)
    first = cycle.batch()
    assert first.outcome.started and not first.completed
    second = cycle.batch()
    assert second.outcome.skipped and second.outcome.started is None
    assert not second.completed  # it did not wait for the first commit's 600 ms upload
    cycle.batch(wait=True)  # the final commit waits for uploads
    assert cycle.last is not None
    assert cycle.assert_committed_state_matches_its_offsets() == 3


def test_commit_blocks_after_max_delay_until_the_upload_finishes(tmp_path: Path) -> None:
    config = make(tmp_path, **{"testing.copy.delay.ms": "1500", "task.commit.max.delay.ms": "0"})
    cycle = TaskCycle(config)
    first = cycle.batch()
    second = cycle.batch()
    assert not second.outcome.skipped and second.outcome.started
    # it waited for the previous (1.5 s) upload, which it reports for the driver to write
    assert first.outcome.started in [r.checkpoint_id for r in second.completed]
    assert cycle.assert_committed_state_matches_its_offsets() == 1


def test_blocked_commit_fails_after_the_timeout(tmp_path: Path) -> None:
    config = make(
        tmp_path,
        **{
            "testing.copy.delay.ms": "3000",
            "task.commit.max.delay.ms": "0",
            "task.commit.timeout.ms": "200",
        },
    )
    cycle = TaskCycle(config)
    cycle.batch()
    with pytest.raises(
        CommitError,
        match=r"task Partition 0: commit \d+-\d+ still uploading after task.commit.timeout.ms=200",
    ):
        cycle.batch()


def test_upload_error_surfaces_at_the_next_commit(tmp_path: Path) -> None:
    config = make_failing(tmp_path)
    cycle = TaskCycle(config)
    cid = cycle.batch().outcome.started
    # the failure happened on the commit pool; the batch itself succeeded
    with pytest.raises(
        CommitError,
        match=(
            rf"task Partition 0: commit {cid} failed: backend {COPY} upload for store\(s\) "
            r"user-counts failed: OSError: injected upload failure"
        ),
    ):
        cycle.batch(wait=True)
    assert cycle.last is None  # nothing was written


def test_a_failed_upload_surfaces_in_a_batch_that_does_not_commit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An idle job's batches do not commit (issue 72): a failed upload is raised by the next
    batch all the same, or, tolerated, reported as a skipped commit (the driver then commits
    again), not left until some later commit."""
    config = make_failing(tmp_path)
    cycle = TaskCycle(config)
    cycle.batch()
    with pytest.raises(CommitError, match=r"injected upload failure"):
        cycle.batch(commit=False, wait=True)
    (tmp_path / "tolerant").mkdir()
    tolerant = make_failing(
        tmp_path / "tolerant", **{"task.commit.skip.commit.during.failures.enabled": "true"}
    )
    cycle = TaskCycle(tolerant)
    cycle.batch()
    reports = []
    for _ in range(200):  # batches until the upload, on the commit pool, has failed
        reports.append(cycle.batch(commit=False).outcome.skipped)
        if reports[-1]:
            break
    assert reports[-1] and "injected upload failure; skipped" in caplog.text
    assert not cycle.batch(commit=False).outcome.skipped  # reported once


def test_sync_mode_waits_for_the_upload_inside_the_batch(tmp_path: Path) -> None:
    config = make(
        tmp_path, **{"testing.copy.delay.ms": "300", "task.commit.async.enabled": "false"}
    )
    cycle = TaskCycle(config)
    first = cycle.batch(wait=not config.get_bool("task.commit.async.enabled"))
    assert first.finished_now and len(first.completed) == 1
    assert cycle.state.text == f"ckpt:{first.outcome.started}"


def test_skip_commit_during_failures_logs_and_commits_next_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Samza's task.commit.skip.commit.during.failures.enabled: a failed upload is logged and
    skipped; the next commit is written, and the state matches its offsets."""
    config = make_failing(tmp_path, **{"task.commit.skip.commit.during.failures.enabled": "true"})
    cycle = TaskCycle(config)
    cycle.batch()  # its upload fails on the commit pool
    cycle.batch(wait=True)
    assert "injected upload failure; skipped (1 successive commit exceptions" in caplog.text
    assert cycle.assert_committed_state_matches_its_offsets() == 2


def test_skip_commit_during_failures_fails_past_its_limit(tmp_path: Path) -> None:
    config = make_failing(
        tmp_path,
        **{
            "task.commit.skip.commit.during.failures.enabled": "true",
            "task.commit.skip.commit.exception.max.limit": "0",
        },
    )
    cycle = TaskCycle(config)
    cycle.batch()
    with pytest.raises(CommitError, match=r"exception.max.limit=0"):
        cycle.batch(wait=True)


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
    batch with the fix, and the next batch restores the last checkpoint and redoes the batch."""
    from sparkpoint.storage.kv.rocksdb import RocksDBEngine

    config = make(tmp_path)
    cycle = TaskCycle(config)
    cycle.batch(wait=True)  # a checkpoint to come back to
    real = RocksDBEngine.write_batch

    def full_disk(self: RocksDBEngine, puts: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RocksDBEngine, "write_batch", full_disk)
    with pytest.raises(
        CommitError,
        match=r"task Partition 0: store user-counts: writing the batch's buffered writes failed: "
        r".*No space left on device.*free space and restart",
    ):
        cycle.batch(wait=True)
    monkeypatch.setattr(RocksDBEngine, "write_batch", real)
    cycle.batch(wait=True)
    assert cycle.restored  # from the checkpoint of batch 1, then batch 2 again
    assert cycle.assert_committed_state_matches_its_offsets() == 2

"""Restore and commit edge cases from Samza's own unit tests, and restore that never loses state.

Each test names the Samza test class whose case it ports (issue 17) or the finding of issue 11
it proves fixed. One task's storage batch after batch, with no driver
(:class:`tests.storage.cycle.TaskCycle`); what the driver does at start (a changelog deleted
while the job was stopped, stores moved off a backend, the start-up sweep,
``clean.on.container.start``) is in tests/runtime/driver/test_startup.py.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from sparkpoint.checkpoint.checkpoint import CheckpointV1, CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.errors import CommitError, RestoreError
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.storage.blobstore.manager import manager_from_config
from sparkpoint.storage.changelog.marker import ChangelogMarker
from sparkpoint.storage.commit import (
    CommitRecord,
    CommitScope,
    CommitSettings,
    TaskCommitManager,
    _active,
)
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.registry import Systems
from tests.helpers import changelog_job, changelog_records, changelog_view, committed_counts
from tests.storage.cycle import TaskCycle, state_after
from tests.storage.test_commit import make_failing

CHANGELOG_SSP = SystemStreamPartition("filelog", "user-counts-changelog", 0)
BLOB_ONLY = {"stores.user-counts.changelog": "", "stores.user-counts.backup.factories": "blobstore"}


def make(tmp_path: Path, log: dict[str, str] | None = None, **overrides: str) -> Config:
    """The example with a changelog and one task (see :func:`tests.helpers.changelog_job`)."""
    return changelog_job(tmp_path, log, 1, **overrides)


def committed(config: Config, batches: int = 3) -> TaskCycle:
    """A task that ran ``batches`` batches, each committed."""
    cycle = TaskCycle(config)
    for _ in range(batches):
        cycle.batch(wait=True)
    return cycle


def delete_data_blobs(config: Config) -> int:
    """Delete the blobs of every file the tasks' last snapshots use (not the indexes)."""
    from sparkpoint.storage.blobstore.backend import load_index

    blobs = manager_from_config(config, f"file://{config.data_dir / 'blobs'}")
    deleted = 0
    for checkpoint in CheckpointManager(config).read_all().values():
        for index_id in checkpoint.state_checkpoint_markers.get("blobstore", {}).values():
            for blob_id in load_index(blobs, index_id, "test").blobs_used():
                blobs.delete(blob_id)
                deleted += 1
    return deleted


def test_restore_from_the_local_checkpoint_trims_the_changelog(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, log_system: dict[str, str]
) -> None:
    """TestTransactionalStateTaskRestoreManager: with a usable local checkpoint the changelog
    range after the checkpointed offset is still undone, so a restore on another host later
    cannot replay the crashed batch's writes."""
    config = make(tmp_path, log_system)
    cycle = committed(config, 1)
    cycle.batch(commit=False)  # the crashed batch: logged, not committed
    assert changelog_view(config) == state_after(2)
    caplog.set_level("INFO")
    again = TaskCycle(config, run_id="run-2")  # the local checkpoint is there
    assert again.contents() == state_after(1) and again.restored
    assert "restored from changelog" not in caplog.text  # the local checkpoint was used
    assert "trimmed" in caplog.text
    assert changelog_view(config) == state_after(1)
    shutil.rmtree(config.store_base_dir)  # now another host restores from the changelog
    elsewhere = TaskCycle(config, run_id="run-3")
    assert elsewhere.contents() == state_after(1) and elsewhere.sources == {"changelog"}


def test_checkpointed_changelog_offset_older_than_the_oldest_restores_what_is_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TestTransactionalStateTaskRestoreManager (checkpointed offset out of range): the
    changelog lost its head (retention); restore what it holds, say so, and never tombstone
    keys it could not read."""
    config = make(tmp_path)
    committed(config)
    marker = ChangelogMarker.loads(
        CheckpointManager(config)
        .read_all()[TaskName("Partition 0")]
        .state_checkpoint_markers["changelog"]["user-counts"]
    )
    assert marker.offset is not None
    admin = Systems(config).admin("filelog")
    upcoming = admin.get_metadata([CHANGELOG_SSP])[CHANGELOG_SSP].upcoming
    producer = Systems(config).producer("filelog")
    producer.send("user-counts-changelog", 0, Record("", b"late", (5).to_bytes(8, "big"), 0))
    producer.flush()
    # retention drops everything up to and past the checkpointed offset: only "late" is left
    assert admin.delete_records_before("user-counts-changelog", 0, upcoming) > 0
    meta = admin.get_metadata([CHANGELOG_SSP])[CHANGELOG_SSP]
    assert int(meta.oldest) > int(marker.offset)  # the checkpointed entry itself is gone
    shutil.rmtree(config.store_base_dir)
    caplog.set_level("INFO")
    assert TaskCycle(config).contents() == {"late": 5}
    assert "outside what changelog filelog.user-counts-changelog.0 holds" in caplog.text
    assert f"checkpointed changelog offset {marker.offset}" in caplog.text
    assert changelog_view(config).get("late") == 5  # restored, and not tombstoned


def test_retain_existing_state_restores_the_whole_changelog_without_a_checkpoint(
    tmp_path: Path,
) -> None:
    """task.transactional.state.retain.existing.state: with no checkpointed changelog offset
    the changelog is restored instead of wiped (a migration to transactional state)."""

    def first_batch(config: Config) -> dict[str, int]:
        Systems(config).admin("filelog").create_stream(StreamSpec("user-counts-changelog", 1))
        producer = Systems(config).producer("filelog")
        producer.send("user-counts-changelog", 0, Record("", b"kept", (9).to_bytes(8, "big"), 0))
        producer.flush()
        cycle = TaskCycle(config)
        cycle.batch(commit=False, writes=[])  # no input, no checkpoint
        return cycle.contents()

    config = make(tmp_path, **{"task.transactional.state.retain.existing.state": "true"})
    assert first_batch(config) == {"kept": 9}
    assert changelog_view(config) == {"kept": 9}
    # without the setting the same changelog is trimmed: nothing was ever committed
    config2 = make(tmp_path / "b")
    assert first_batch(config2) == {}
    assert changelog_view(config2) == {}


def test_an_upload_that_raises_at_once_fails_fast_and_the_retry_commits(
    tmp_path: Path,
) -> None:
    """An upload that throws synchronously in a commit that waits for its uploads (a stop's):
    that commit fails naming the cause, and the retried commit does not wait for an upload
    that never started."""
    config = make_failing(
        tmp_path,
        "testing.copy.fail.sync.flag",
        **{"task.commit.max.delay.ms": "0", "task.commit.timeout.ms": "3000"},
    )
    cycle = TaskCycle(config)
    with pytest.raises(CommitError, match="OSError: injected synchronous upload failure"):
        cycle.batch(wait=True)
    retried = cycle.batch(wait=True)
    assert retried.outcome.started and len(retried.completed) == 1
    assert cycle.assert_committed_state_matches_its_offsets() == 1


def test_an_upload_that_raises_at_once_in_an_async_commit_fails_the_next_commit(
    tmp_path: Path,
) -> None:
    """TestTaskInstance.testCommitFailsIfPreviousAsyncUploadFailsSynchronously: with async
    commit the commit that started the upload returns, and the next commit fails naming it
    (issue 37: docs/samza-compatibility.md said the first one failed at once)."""
    config = make_failing(
        tmp_path,
        "testing.copy.fail.sync.flag",
        **{"task.commit.max.delay.ms": "0", "task.commit.timeout.ms": "3000"},
    )
    cycle = TaskCycle(config)
    first = cycle.batch()
    assert first.outcome.started and not first.completed
    with pytest.raises(CommitError, match="OSError: injected synchronous upload failure"):
        cycle.batch()
    assert CheckpointManager(config).read_all() == {}


class _FailsRightAfterTheCheck(TaskCommitManager):
    """Simulates an upload that fails between reading the records and acting on them."""

    def records(self) -> list[CommitRecord]:
        out = super().records()
        for r in out:
            if r.state == "uploading":
                failed = CommitRecord(**{**r.__dict__, "state": "failed", "error": "boom"})
                self._write(failed)
                _active.discard((self.task.name, r.checkpoint_id))
        return out


def test_an_upload_failing_during_the_check_is_reported_by_this_commit(tmp_path: Path) -> None:
    """TestTaskStorageCommitManager: the failed-upload and upload-in-flight checks are one;
    an upload failing between them is reported now, not a commit later."""
    from sparkpoint.storage.local import LocalTaskState

    task = TaskName("Partition 0")
    local = LocalTaskState(tmp_path, task)
    manager = _FailsRightAfterTheCheck(
        CommitScope(task, "run", local, {}, {}, {}),
        CommitSettings(max_delay_ms=0, timeout_ms=1000),
        committed=None,
    )
    cid = str(CheckpointId.create())
    import os
    import socket

    from sparkpoint.storage.commit import UPLOADING

    manager._write(CommitRecord("run", cid, UPLOADING, socket.gethostname(), os.getpid(), 0, {}))
    _active.add((task.name, cid))
    with pytest.raises(CommitError, match=f"commit {cid} failed: boom"):
        manager.commit({}, wait=False)


def dual_commit(tmp_path: Path, restore: str) -> Config:
    """A task whose store is backed up to the blob store and the changelog (restored from them
    in the order ``restore`` says), after 3 committed batches; its local state lost."""
    config = make(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": "blobstore,changelog",
            "stores.user-counts.restore.factories": restore,
        },
    )
    committed(config)
    shutil.rmtree(config.store_base_dir)
    return config


def test_restore_falls_back_to_the_next_backend_when_a_blob_is_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 11 (SEP-28 fallback): dual commit, restore prefers the blob store, a blob of the
    snapshot is gone: the changelog restores the store, with an ERROR saying so."""
    config = dual_commit(tmp_path, "blobstore,changelog")
    assert delete_data_blobs(config) > 0
    caplog.set_level("INFO")
    cycle = TaskCycle(config)
    assert cycle.contents() == state_after(3) and cycle.sources == {"changelog"}
    assert "restore from blobstore failed" in caplog.text
    assert "falling back to changelog" in caplog.text


def test_a_failed_replay_falls_back_even_when_its_store_cannot_be_flushed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changelog replay that fails half-way (RocksDB stopped by a background error: it can
    neither write nor flush) drops the store without flushing it, and the next backend
    restores it: a flush there raised again and hid the fallback."""
    from sparkpoint.storage.changelog.backend import ChangelogRestoreManager
    from sparkpoint.storage.kv.rocksdb import RocksDBEngine

    config = dual_commit(tmp_path, "changelog,blobstore")
    replay = ChangelogRestoreManager._replay

    def failing_replay(self: ChangelogRestoreManager, *args: object, **kwargs: object) -> object:
        replay(self, *args, **kwargs)  # the entries are loaded (unlogged), then it fails
        raise OSError("injected: RocksDB background error")

    def failing_flush(self: RocksDBEngine) -> None:
        if self._unlogged:
            raise OSError("injected: RocksDB background error (flush)")
        self._d().flush_wal(True)

    monkeypatch.setattr(ChangelogRestoreManager, "_replay", failing_replay)
    monkeypatch.setattr(RocksDBEngine, "flush", failing_flush)
    caplog.set_level("INFO")
    cycle = TaskCycle(config)
    cycle.batch(wait=True)
    assert "restore from changelog failed" in caplog.text, caplog.text[-3000:]
    assert "falling back to blobstore" in caplog.text
    assert cycle.sources == {"blobstore"}
    monkeypatch.undo()
    assert cycle.assert_committed_state_matches_its_offsets() == 4


def test_restore_stops_when_no_backend_can_restore_the_committed_state(tmp_path: Path) -> None:
    """Issue 11: a blob-store-only store whose snapshot is damaged stops the task with an error
    naming task, store, checkpoint and the fix; it never restarts empty."""
    config = make(tmp_path, **BLOB_ONLY)
    committed(config)
    written = CheckpointManager(config).read_all()
    assert delete_data_blobs(config) > 0
    shutil.rmtree(config.store_base_dir)
    cycle = TaskCycle(config)
    with pytest.raises(RestoreError) as err:
        cycle.batch(wait=True)
    text = str(err.value)
    assert "store user-counts" in text and "cannot restore checkpoint" in text
    assert "stores.user-counts.restore.factories" in text
    assert CheckpointManager(config).read_all() == written  # the checkpoint was not advanced
    assert not list(config.store_base_dir.rglob("*.restoring"))


def test_default_read_versions_restore_a_blob_store_store_after_a_lost_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 11, the new user's run: blob store backup and restore, every other key default;
    lose the local state; the next batch restores every count."""
    config = make(tmp_path, **BLOB_ONLY)
    assert config.get_list("task.checkpoint.read.versions") == ["2", "1"]  # the default
    cycle = committed(config)
    shutil.rmtree(config.store_base_dir)
    caplog.set_level("INFO")
    cycle.batch(wait=True)
    assert cycle.sources == {"blobstore"}
    assert re.search(r"restored from blobstore: \d+ files, \d+ bytes", caplog.text)
    assert cycle.assert_committed_state_matches_its_offsets() == 4


def test_v1_null_changelog_offset_is_written_and_read_as_samza_does() -> None:
    """TestCheckpointV1Serde / CheckpointedChangelogOffset: an empty changelog partition is
    ``<id>:null`` in a V1 checkpoint, both ways."""
    from sparkpoint.storage.changelog import ChangelogStateBackendFactory

    cid = CheckpointId.create()
    marker = ChangelogMarker(CHANGELOG_SSP, None)
    offsets = ChangelogStateBackendFactory().marker_offsets(Config({}), {"s": marker.dumps()})
    v1 = CheckpointV1.from_v2(CheckpointV2(cid, {}, {}), offsets)
    assert v1.input_offsets[CHANGELOG_SSP] == f"{cid}:null"
    assert marker.v1_offset(cid) == f"{cid}:null"
    assert ChangelogMarker.from_v1(CHANGELOG_SSP, f"{cid}:null").offset is None
    assert ChangelogMarker.from_v1(CHANGELOG_SSP, f"{cid}:").offset is None
    assert ChangelogMarker.from_v1(CHANGELOG_SSP, f"{cid}:42").offset == "42"


def test_a_local_checkpoint_that_differs_from_its_snapshot_is_not_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Samza's BlobStoreRestoreManager: the local checkpoint is compared with the snapshot its
    checkpoint names before it is used; a damaged one is replaced by a download."""
    config = make(tmp_path, **BLOB_ONLY)
    committed(config)
    damaged = 0
    for task_dir in config.store_base_dir.iterdir():
        for ckpt in (task_dir / "user-counts.checkpoints").iterdir():
            sst = sorted(ckpt.glob("*.sst"))
            if sst:
                with open(sst[0], "ab") as f:
                    f.write(b"garbage")  # another size: the disk lost or damaged the file
                damaged += 1
        (task_dir / "STATE").unlink()  # the task must establish its state again
    assert damaged > 0
    caplog.set_level("INFO")
    cycle = TaskCycle(config)
    assert cycle.contents() == state_after(3)
    assert "differs from snapshot" in caplog.text and "not using it" in caplog.text
    assert "restored from blobstore" in caplog.text


def test_committed_state_is_readable_offline_from_the_changelog(tmp_path: Path) -> None:
    """Issue 11: after the local state is lost, `state dump` replays the changelog up to each
    checkpointed offset into a scratch store, and writes nothing to the changelog."""
    config = make(tmp_path)
    cycle = committed(config, 1)
    cycle.batch(commit=False)  # the changelog runs ahead
    shutil.rmtree(config.store_base_dir)
    records = changelog_records(config)
    assert committed_counts(config) == state_after(1)
    assert changelog_records(config) == records  # reading trimmed nothing


def test_state_check_finds_a_corrupted_blob(tmp_path: Path) -> None:
    """Issue 11: `state check` downloads and verifies every blob (it said ok for a corrupt one)."""
    from sparkpoint.storage.blobstore.backend import load_index
    from sparkpoint.tools.state import check_blobs

    config = make(tmp_path, **BLOB_ONLY)
    committed(config)
    assert check_blobs(config) == []
    blobs = manager_from_config(config, f"file://{config.data_dir / 'blobs'}")
    checkpoint = CheckpointManager(config).read_all()[TaskName("Partition 0")]
    index_id = checkpoint.state_checkpoint_markers["blobstore"]["user-counts"]
    _, victim = max(
        load_index(blobs, index_id, "t").dir_index.all_files(), key=lambda x: x[1].metadata.size
    )
    path = config.data_dir / "blobs" / "blobs" / victim.blobs[0].blob_id
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one bit pattern changed
    path.write_bytes(bytes(data))
    problems = check_blobs(config)
    assert len(problems) == 1 and "is corrupt" in problems[0] and "Partition 0" in problems[0]
    assert check_blobs(config, checksums=False) == []  # existence alone cannot tell


def test_a_full_disk_during_a_commit_is_one_clear_error_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11 (simulated ENOSPC: this machine cannot mount a small tmpfs for the test): the
    commit fails naming the task and where it was writing; after space is freed the next batch
    restores the last checkpoint and the state is exact."""
    import errno

    import sparkpoint.storage.commit as commit_module

    config = make(tmp_path)
    real = commit_module.atomic_write
    cycle = TaskCycle(config)
    cycle.batch(wait=True)  # a checkpoint to come back to

    def full_disk(path: Path, data: bytes, *, durable: bool = True) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(commit_module, "atomic_write", full_disk)
    # whichever local write of the commit comes first (its record, the clean-up's marker)
    with pytest.raises(CommitError, match=r"task Partition 0: commit failed writing local state "):
        cycle.batch(wait=True)
    monkeypatch.setattr(commit_module, "atomic_write", real)  # space freed
    cycle.batch(wait=True)
    assert cycle.restored  # batch 2 again, from batch 1's checkpoint
    assert cycle.assert_committed_state_matches_its_offsets() == 2


def test_state_show_says_where_committed_state_is(tmp_path: Path) -> None:
    """Issue 11: `state show` lists every copy of each store's committed state, not only blobs."""
    from sparkpoint.tools.state import state_locations

    config = make(tmp_path, **{"stores.user-counts.backup.factories": "changelog,blobstore"})
    committed(config)
    rows = state_locations(config)
    assert {r["task"] for r in rows} == {"Partition 0"}
    for r in rows:
        assert r["local"] and r["changelog"]["ssp"] == "filelog.user-counts-changelog.0"
        assert r["blobstore"]["files"] > 0
    shutil.rmtree(config.store_base_dir)
    assert all(r["local"] is None for r in state_locations(config))


def test_a_deleted_store_directory_is_restored_even_when_the_marker_matches(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopped job leaves each task's marker naming its last checkpoint, so a restart keeps
    the live stores. If an operator (or a disk) lost a store's directory meanwhile, the marker
    must not vouch for it: the store is restored, never opened empty."""
    config = make(tmp_path)
    committed(config)
    for task_dir in config.store_base_dir.iterdir():
        assert (task_dir / "STATE").read_text().startswith('{"state-id": "ckpt:')
        shutil.rmtree(task_dir / "user-counts")
    caplog.set_level("WARNING")
    cycle = TaskCycle(config)
    assert cycle.contents() == state_after(3) and cycle.restored
    assert "store(s) user-counts are missing" in caplog.text


def delete_changelog(config: Config) -> None:
    shutil.rmtree(config.data_dir / "streams" / "filelog" / "user-counts-changelog")


def test_a_deleted_changelog_stops_the_restore_instead_of_starting_empty(tmp_path: Path) -> None:
    """Issue 37: a changelog deleted while the job was stopped, then local state lost: the
    restore started from nothing and reported success (1,388 of 2,000 counts gone)."""
    config = make(tmp_path)
    committed(config)
    written = CheckpointManager(config).read_all()
    delete_changelog(config)
    shutil.rmtree(config.store_base_dir)
    with pytest.raises(RestoreError) as caught:
        TaskCycle(config).batch(commit=False)
    text = str(caught.value)
    assert re.search(r"user-counts: changelog filelog.user-counts-changelog.0 is empty", text)
    assert "cannot be restored to its committed state" in text
    assert "--set stores.user-counts.changelog.restore.accept.loss=true" in text
    assert CheckpointManager(config).read_all() == written  # nothing moved on
    # the deliberate way on: restore what is there (nothing), and say so
    accept = {"stores.user-counts.changelog.restore.accept.loss": "true"}
    accepting = Config({**config.to_dict(), **accept})
    assert TaskCycle(accepting).contents() == {}

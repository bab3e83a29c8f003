"""Restore and commit edge cases from Samza's own unit tests, and restore that never loses state.

Each test names the Samza test class whose case it ports (issue 17) or the finding of issue 11
it proves fixed.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from sparkpoint.checkpoint.checkpoint import CheckpointV1, CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.errors import CommitError, RestoreError
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.storage.blobstore.manager import manager_from_config
from sparkpoint.storage.changelog.marker import ChangelogMarker
from sparkpoint.storage.commit import (
    CommitRecord,
    CommitScope,
    CommitSettings,
    TaskCommitManager,
    _active,
)
from sparkpoint.system.registry import Systems
from tests.helpers import (
    assert_committed_state_matches_its_offsets,
    changelog_view,
    committed_counts,
    counts_at_offsets,
    generate,
    live_counts,
)
from tests.storage.test_commit import batches, make_failing
from tests.storage.test_state_backends import make, run, uncommitted_tail

CHANGELOG_SSP = SystemStreamPartition("filelog", "user-counts-changelog", 0)


def checkpoint_offsets(config: Config) -> dict[SystemStreamPartition, str]:
    return {
        s: o
        for c in CheckpointManager(config).read_all().values()
        for s, o in c.input_offsets.items()
    }


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


def one_batch_without_commit(config: Config) -> None:
    again = JobCoordinator(config, InlineRunner())
    again.start()
    try:  # closed when its batch fails too: until then it holds the job, in this process too
        again.run_batch(
            {s: ts.resume[s] for ts in again.tasks.values() for s in ts.model.ssps}, commit=False
        )
    finally:
        again.close()


def test_restore_from_the_local_checkpoint_trims_the_changelog(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, log_system: dict[str, str]
) -> None:
    """TestTransactionalStateTaskRestoreManager: with a usable local checkpoint the changelog
    range after the checkpointed offset is still undone, so a restore on another host later
    cannot replay the crashed batch's writes."""
    config = make(tmp_path, log_system)
    generate(config, tmp_path / "a.yaml", 2000, seed=61)
    uncommitted_tail(config, lose_local_state=False)  # the local checkpoint is there
    at_checkpoint = dict(counts_at_offsets(config, checkpoint_offsets(config)))
    assert changelog_view(config) != at_checkpoint
    caplog.set_level("INFO")
    one_batch_without_commit(config)
    assert "restored from changelog" not in caplog.text  # the local checkpoint was used
    assert "trimmed" in caplog.text
    assert changelog_view(config) == at_checkpoint
    shutil.rmtree(config.store_base_dir)  # now another host restores from the changelog
    one_batch_without_commit(config)
    assert live_counts(config) == at_checkpoint


def test_checkpointed_changelog_offset_older_than_the_oldest_restores_what_is_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TestTransactionalStateTaskRestoreManager (checkpointed offset out of range): the
    changelog lost its head (retention); restore what it holds, say so, and never tombstone
    keys it could not read."""
    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 1200, seed=62, users=30)
    run(config, until_caught_up=True)
    marker = ChangelogMarker.loads(
        CheckpointManager(config)
        .read_all()[TaskName("Partition 0")]
        .state_checkpoint_markers["changelog"]["user-counts"]
    )
    assert marker.offset is not None
    admin = Systems(config).admin("filelog")
    upcoming = admin.get_metadata([CHANGELOG_SSP])[CHANGELOG_SSP].upcoming
    producer = Systems(config).producer("filelog")
    from sparkpoint.system.base import Record

    producer.send("user-counts-changelog", 0, Record("", b"late", (5).to_bytes(8, "big"), 0))
    producer.flush()
    # retention drops everything up to and past the checkpointed offset: only "late" is left
    assert admin.delete_records_before("user-counts-changelog", 0, upcoming) > 0
    meta = admin.get_metadata([CHANGELOG_SSP])[CHANGELOG_SSP]
    assert int(meta.oldest) > int(marker.offset)  # the checkpointed entry itself is gone
    shutil.rmtree(config.store_base_dir)
    caplog.set_level("INFO")
    one_batch_without_commit(config)
    assert "outside what changelog filelog.user-counts-changelog.0 holds" in caplog.text
    assert f"checkpointed changelog offset {marker.offset}" in caplog.text
    view = changelog_view(config)
    assert view.get("late") == 5  # what was there was restored and not tombstoned


def test_retain_existing_state_restores_the_whole_changelog_without_a_checkpoint(
    tmp_path: Path,
) -> None:
    """task.transactional.state.retain.existing.state: with no checkpointed changelog offset
    the changelog is restored instead of wiped (a migration to transactional state)."""
    config = make(tmp_path, **{"task.transactional.state.retain.existing.state": "true"})
    producer = Systems(config).producer("filelog")
    from sparkpoint.system.base import Record, StreamSpec

    Systems(config).admin("filelog").create_stream(StreamSpec("user-counts-changelog", 4))
    producer.send("user-counts-changelog", 0, Record("", b"kept", (9).to_bytes(8, "big"), 0))
    producer.flush()
    one_batch_without_commit(config)  # no input, no checkpoint
    assert changelog_view(config) == {"kept": 9}
    assert live_counts(config).get("kept") == 9
    # without the setting the same changelog is trimmed: nothing was ever committed
    config2 = make(tmp_path / "b")
    Systems(config2).admin("filelog").create_stream(StreamSpec("user-counts-changelog", 4))
    producer2 = Systems(config2).producer("filelog")
    producer2.send("user-counts-changelog", 0, Record("", b"kept", (9).to_bytes(8, "big"), 0))
    producer2.flush()
    one_batch_without_commit(config2)
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
    coordinator, end = batches(config)
    with pytest.raises(CommitError, match="OSError: injected synchronous upload failure"):
        coordinator.run_batch(end, commit=True, wait=True)
    coordinator.close()
    coordinator, end = batches(config)
    _, results = coordinator.run_batch(end, commit=True, wait=True)
    assert results[0].commit_started and len(results[0].completed_checkpoints) == 1
    coordinator.close()
    assert_committed_state_matches_its_offsets(config)


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
    coordinator, end = batches(config)
    _, first = coordinator.run_batch(end, commit=True)
    assert first[0].commit_started and not first[0].completed_checkpoints
    with pytest.raises(CommitError, match="OSError: injected synchronous upload failure"):
        coordinator.run_batch(end, commit=True)
    coordinator.close()
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


def ran_with_dual_commit(tmp_path: Path, restore: str, seed: int) -> tuple[Config, Counter[str]]:
    """A job whose store is backed up to the blob store and the changelog (restored from them
    in the order ``restore`` says), run over 800 views; its config and the counts."""
    config = make(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": "blobstore,changelog",
            "stores.user-counts.restore.factories": restore,
        },
    )
    expected = generate(config, tmp_path / "a.yaml", 800, seed=seed, users=20)
    run(config, until_caught_up=True)
    return config, expected


def test_restore_falls_back_to_the_next_backend_when_a_blob_is_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 11 (SEP-28 fallback): dual commit, restore prefers the blob store, a blob of the
    snapshot is gone: the changelog restores the store, with an ERROR saying so."""
    config, expected = ran_with_dual_commit(tmp_path, "blobstore,changelog", seed=63)
    assert delete_data_blobs(config) > 0
    shutil.rmtree(config.store_base_dir)
    caplog.set_level("INFO")
    run(config, until_caught_up=True)
    assert "restore from blobstore failed" in caplog.text
    assert "falling back to changelog" in caplog.text
    assert committed_counts(config) == dict(expected)


def test_a_failed_replay_falls_back_even_when_its_store_cannot_be_flushed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changelog replay that fails half-way (RocksDB stopped by a background error: it can
    neither write nor flush) drops the store without flushing it, and the next backend
    restores it: a flush there raised again and hid the fallback."""
    from sparkpoint.storage.changelog.backend import ChangelogRestoreManager
    from sparkpoint.storage.kv.rocksdb import RocksDBEngine

    config, expected = ran_with_dual_commit(tmp_path, "changelog,blobstore", seed=64)
    shutil.rmtree(config.store_base_dir)
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
    run(config, until_caught_up=True)
    assert "restore from changelog failed" in caplog.text, caplog.text[-3000:]
    assert "falling back to blobstore" in caplog.text
    monkeypatch.undo()
    assert committed_counts(config) == dict(expected)


def test_restore_stops_when_no_backend_can_restore_the_committed_state(tmp_path: Path) -> None:
    """Issue 11: a blob-store-only store whose snapshot is damaged stops the job with an error
    naming task, store, checkpoint and the fix; it never restarts empty."""
    config = make(
        tmp_path,
        **{
            "stores.user-counts.changelog": "",
            "stores.user-counts.backup.factories": "blobstore",
        },
    )
    generate(config, tmp_path / "a.yaml", 400, seed=64, users=10)
    run(config, until_caught_up=True)
    before = committed_counts(config)
    assert delete_data_blobs(config) > 0
    shutil.rmtree(config.store_base_dir)
    with pytest.raises(RestoreError) as err:
        run(config, until_caught_up=True)
    text = str(err.value)
    assert "store user-counts" in text and "cannot restore checkpoint" in text
    assert "stores.user-counts.restore.factories" in text
    offsets_after = checkpoint_offsets(config)
    assert sum(1 for _ in offsets_after) > 0 and before  # the checkpoint was not advanced
    assert not list(config.store_base_dir.rglob("*.restoring"))


def test_default_read_versions_restore_a_blob_store_store_after_a_lost_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 11, the new user's run: blob store backup and restore, every other key default;
    lose the local state; the restart restores every count."""
    config = make(
        tmp_path,
        **{"stores.user-counts.changelog": "", "stores.user-counts.backup.factories": "blobstore"},
    )
    assert config.get_list("task.checkpoint.read.versions") == ["2", "1"]  # the default
    expected = generate(config, tmp_path / "a.yaml", 600, seed=65, users=15)
    run(config, until_caught_up=True)
    shutil.rmtree(config.store_base_dir)
    expected += generate(config, tmp_path / "b.yaml", 100, seed=66, users=15)
    caplog.set_level("INFO")
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert re.search(r"restored from blobstore: \d+ files, \d+ bytes", caplog.text)


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


def test_a_store_moved_off_the_blob_store_has_its_snapshot_deleted(tmp_path: Path) -> None:
    """TestBlobStoreRestoreManager (delete unused stores): a store that no longer backs up to
    the blob store loses its remote snapshot at the next start, like a removed store."""
    config = make(tmp_path, **{"stores.user-counts.backup.factories": "blobstore,changelog"})
    generate(config, tmp_path / "a.yaml", 300, seed=67, users=10)
    run(config, until_caught_up=True)
    blob_dir = config.data_dir / "blobs"
    assert any(p.is_file() and p.stat().st_size > 200 for p in blob_dir.rglob("*"))
    moved = make(tmp_path, **{"stores.user-counts.backup.factories": "changelog"})
    run(moved, until_caught_up=True)
    assert not any(p.is_file() and p.stat().st_size > 200 for p in blob_dir.rglob("*"))
    assert committed_counts(moved)


def test_the_start_up_sweep_spares_a_checkpoint_whose_clean_up_never_ran(tmp_path: Path) -> None:
    """The driver dies right after writing a checkpoint: its new blobs still carry TTLs. The
    sweep at the next start adopts what the last checkpoints use before deleting expired
    uploads, so a restore from that checkpoint still finds every blob."""
    flag = tmp_path / "crash"
    flag.write_text("0")
    blob_only = {
        "stores.user-counts.changelog": "",
        "stores.user-counts.backup.factories": "blobstore",
        "blob.store.ttl.ms": "1",  # every upload expires at once unless adopted
    }
    crashing = make(
        tmp_path,
        **blob_only,
        **{"testing.crash.at": "after-checkpoint-write", "testing.crash.flag": str(flag)},
    )
    expected = generate(crashing, tmp_path / "a.yaml", 300, seed=68, users=10)
    from sparkpoint.failpoints import InjectedCrash

    with pytest.raises(InjectedCrash):
        run(crashing, until_caught_up=True)
    config = make(tmp_path, **blob_only)
    at_checkpoint = dict(counts_at_offsets(config, checkpoint_offsets(config)))
    assert at_checkpoint  # the crash came after a checkpoint with state
    shutil.rmtree(config.store_base_dir)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)


def test_clean_on_container_start_restores_from_the_backend_at_every_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """stores.<s>.clean.on.container.start: local state is dropped and restored each start."""
    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 600, seed=69, users=12)
    run(config, until_caught_up=True)
    cleaning = make(tmp_path, **{"stores.user-counts.clean.on.container.start": "true"})
    caplog.set_level("INFO")
    run(cleaning, until_caught_up=True)
    assert caplog.text.count("restored from changelog") == 4  # every task, no local checkpoint
    assert committed_counts(cleaning) == dict(expected)
    caplog.clear()
    run(config, until_caught_up=True)  # without the setting the local state is kept
    assert "restored from changelog" not in caplog.text


def test_a_local_checkpoint_that_differs_from_its_snapshot_is_not_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Samza's BlobStoreRestoreManager: the local checkpoint is compared with the snapshot its
    checkpoint names before it is used; a damaged one is replaced by a download."""
    config = make(
        tmp_path,
        **{"stores.user-counts.changelog": "", "stores.user-counts.backup.factories": "blobstore"},
    )
    expected = generate(config, tmp_path / "a.yaml", 400, seed=70, users=10)
    run(config, until_caught_up=True)
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
    run(config, until_caught_up=True)
    assert "differs from snapshot" in caplog.text and "not using it" in caplog.text
    assert "restored from blobstore" in caplog.text
    assert committed_counts(config) == dict(expected)


def test_committed_state_is_readable_offline_from_the_changelog(tmp_path: Path) -> None:
    """Issue 11: after the local state is lost, `state dump` replays the changelog up to each
    checkpointed offset into a scratch store, and writes nothing to the changelog."""
    from tests.storage.test_state_backends import changelog_records

    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 1000, seed=71, users=25)
    uncommitted_tail(config, lose_local_state=False)  # the changelog runs ahead
    at_checkpoint = dict(counts_at_offsets(config, checkpoint_offsets(config)))
    shutil.rmtree(config.store_base_dir)
    records = changelog_records(config)
    assert committed_counts(config) == at_checkpoint
    assert changelog_records(config) == records  # reading trimmed nothing


def test_state_check_finds_a_corrupted_blob(tmp_path: Path) -> None:
    """Issue 11: `state check` downloads and verifies every blob (it said ok for a corrupt one)."""
    from sparkpoint.storage.blobstore.backend import load_index
    from sparkpoint.tools.state import check_blobs

    config = make(
        tmp_path,
        **{"stores.user-counts.changelog": "", "stores.user-counts.backup.factories": "blobstore"},
    )
    generate(config, tmp_path / "a.yaml", 200, seed=72, users=10)
    run(config, until_caught_up=True)
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
    commit fails naming the task and where it was writing; after space is freed the restart
    restores the last checkpoint and the state is exact."""
    import errno

    import sparkpoint.storage.commit as commit_module

    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 600, seed=73, users=12)
    real = commit_module.atomic_write
    calls = {"n": 0}

    def full_disk(path: Path, data: bytes, *, durable: bool = True) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # the third commit record: after a couple of commits went through
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, durable=durable)

    monkeypatch.setattr(commit_module, "atomic_write", full_disk)
    with pytest.raises(CommitError, match=r"task Partition \d: commit failed writing local state "):
        run(config, until_caught_up=True)
    monkeypatch.setattr(commit_module, "atomic_write", real)  # space freed
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)


def test_state_show_says_where_committed_state_is(tmp_path: Path) -> None:
    """Issue 11: `state show` lists every copy of each store's committed state, not only blobs."""
    from sparkpoint.tools.state import state_locations

    config = make(tmp_path, **{"stores.user-counts.backup.factories": "changelog,blobstore"})
    generate(config, tmp_path / "a.yaml", 300, seed=74, users=10)
    run(config, until_caught_up=True)
    rows = state_locations(config)
    assert {r["task"] for r in rows} == {f"Partition {p}" for p in range(4)}
    for r in rows:
        assert r["local"] and r["changelog"]["ssp"].startswith("filelog.user-counts-changelog.")
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
    expected = generate(config, tmp_path / "a.yaml", 600, seed=91)
    run(config, until_caught_up=True)
    for task_dir in config.store_base_dir.iterdir():
        assert (task_dir / "STATE").read_text().startswith('{"state-id": "ckpt:')
        shutil.rmtree(task_dir / "user-counts")
    caplog.set_level("WARNING")
    run(config, until_caught_up=True)
    assert "store(s) user-counts are missing" in caplog.text
    assert live_counts(config) == dict(expected)
    assert committed_counts(config) == dict(expected)


def delete_changelog(config: Config) -> None:
    shutil.rmtree(config.data_dir / "streams" / "filelog" / "user-counts-changelog")


def test_a_deleted_changelog_stops_the_restore_instead_of_starting_empty(tmp_path: Path) -> None:
    """Issue 37: a changelog deleted while the job was stopped, then local state lost: the
    restore started from nothing and reported success (1,388 of 2,000 counts gone)."""
    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 1000, seed=63, users=30)
    run(config, until_caught_up=True)
    committed = checkpoint_offsets(config)
    delete_changelog(config)
    shutil.rmtree(config.store_base_dir)
    with pytest.raises(RestoreError) as caught:
        one_batch_without_commit(config)
    text = str(caught.value)
    assert re.search(r"user-counts: changelog filelog.user-counts-changelog.\d is empty", text)
    assert "cannot be restored to its committed state" in text
    assert "--set stores.user-counts.changelog.restore.accept.loss=true" in text
    assert checkpoint_offsets(config) == committed  # nothing moved on
    # the deliberate way on: restore what is there (nothing), and say so
    accept = {"stores.user-counts.changelog.restore.accept.loss": "true"}
    accepting = Config({**config.to_dict(), **accept})
    one_batch_without_commit(accepting)
    assert live_counts(accepting) == {}
    assert sum(expected.values()) == 1000


def test_a_deleted_changelog_is_rewritten_from_a_local_checkpoint(tmp_path: Path) -> None:
    """With the local checkpoint still there, the store is right but its changelog lost it: the
    store's contents are written to the changelog again, so a restore elsewhere later gives the
    committed state (the campaign's job went on, and would have lost it at the next move)."""
    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 1000, seed=64, users=30)
    run(config, until_caught_up=True)
    delete_changelog(config)
    one_batch_without_commit(config)  # restores from the local checkpoint, rewrites the changelog
    assert changelog_view(config) == dict(expected)
    more = generate(config, tmp_path / "b.yaml", 200, seed=65, users=30)
    run(config, until_caught_up=True)
    shutil.rmtree(config.store_base_dir)  # now another host restores from the changelog
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected + more)

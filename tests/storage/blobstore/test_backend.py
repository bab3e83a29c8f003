"""The blob store backend: one task's storage batch after batch, with no driver
(:class:`tests.storage.cycle.TaskCycle`), its state read back by the tools."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config, load_config
from sparkpoint.errors import CommitError
from sparkpoint.failpoints import InjectedCrash
from sparkpoint.storage.backend import backend_factory
from sparkpoint.storage.blobstore.backend import NAME, blob_manager
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import job_model
from sparkpoint.tools.state import blob_snapshots, check_blobs
from tests.conftest import pageviews_config
from tests.helpers import committed_counts
from tests.storage.cycle import TaskCycle, state_after


def make(tmp_path: Path, **overrides: str) -> Config:
    values = pageviews_config(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": "blobstore",
            "task.checkpoint.read.versions": "2",
            "task.commit.async.enabled": "false",
            **overrides,
        },
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 1))
    return config


def committed(config: Config, batches: int, *, wait: bool = True) -> TaskCycle:
    """A task that ran ``batches`` batches, each committed, then cleaned up after the last."""
    cycle = TaskCycle(config)
    for _ in range(batches):
        cycle.batch(wait=wait)
    cycle.clean_up()
    return cycle


def test_lost_host_restores_from_the_blob_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make(tmp_path, **{"task.commit.async.enabled": "true"})
    cycle = committed(config, 3, wait=False)
    cycle.batch(wait=True)
    assert check_blobs(config) == []
    snapshots = blob_snapshots(config)
    assert len(snapshots) == 1 and snapshots[0]["files"] > 0 and snapshots[0]["bytes"] > 0
    shutil.rmtree(config.store_base_dir)
    # the committed state can be read straight from the blob store, without the job
    assert committed_counts(config) == state_after(4)
    caplog.set_level("INFO")
    cycle.batch(wait=True)
    assert cycle.restored and cycle.sources == {NAME}
    assert "from the blob store" in caplog.text
    assert cycle.assert_committed_state_matches_its_offsets() == 5
    assert check_blobs(config) == []


def test_clean_up_keeps_only_what_the_last_snapshot_uses(tmp_path: Path) -> None:
    from sparkpoint.storage.blobstore.index import SnapshotIndex

    config = make(tmp_path)
    committed(config, 4)
    blobs = blob_manager(config)
    used = set()
    for row in blob_snapshots(config):
        used.add(row["snapshot-index"])
        index = SnapshotIndex.loads(blobs.get_bytes(row["snapshot-index"]))
        used |= set(index.blobs_used())
    stored = {p.rsplit("/", 1)[-1] for p in blobs.fs.ls(f"{blobs.root}/blobs", detail=False)}
    assert stored == used  # older indexes and replaced files were deleted
    assert not any(blobs.has_ttl(b) for b in used)  # and everything in use was adopted


def test_crash_during_upload_leaves_no_partial_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkpoint.storage.blobstore import manager as mgr

    config = make(tmp_path)
    cycle = TaskCycle(config)
    cycle.batch(wait=True)
    real = mgr.BlobStoreManager.put_bytes
    calls = {"n": 0}

    def dying(self: mgr.BlobStoreManager, data: bytes) -> str:  # the index upload never happens
        calls["n"] += 1
        raise InjectedCrash("worker died while uploading")

    monkeypatch.setattr(mgr.BlobStoreManager, "put_bytes", dying)
    with pytest.raises((InjectedCrash, CommitError)):
        cycle.batch(wait=True)
    monkeypatch.setattr(mgr.BlobStoreManager, "put_bytes", real)
    assert calls["n"] >= 1
    assert check_blobs(config) == []  # no checkpoint references the partial upload
    assert cycle.assert_committed_state_matches_its_offsets() == 1
    cycle.batch(wait=True)  # restores batch 1's snapshot, and commits batch 2 again
    cycle.batch(wait=True)
    cycle.clean_up()  # adopts what the last checkpoint uses
    assert cycle.restored is False and cycle.batches == 3
    orphans = blob_manager(config).sweep(now_ms=10**15)  # long after the crashed upload's TTL
    assert orphans  # the files uploaded before the crash expire, unreferenced
    assert check_blobs(config) == []
    assert committed_counts(config) == state_after(3)


def test_dual_commit_with_the_changelog_then_restore_from_either(tmp_path: Path) -> None:
    config = make(
        tmp_path,
        **{
            "stores.user-counts.changelog": "filelog.user-counts-changelog",
            "stores.user-counts.backup.factories": "blobstore,changelog",
        },
    )
    committed(config, 3)
    checkpoints = CheckpointManager(config).read_version(2)
    assert all(
        set(c.state_checkpoint_markers) == {"blobstore", "changelog"} for c in checkpoints.values()
    )
    for keep in ("blobstore", "changelog"):
        manager = CheckpointManager(config)
        for task, c in checkpoints.items():
            assert isinstance(c, CheckpointV2)
            only = {keep: dict(c.state_checkpoint_markers[keep])}
            manager.write_checkpoint(task, CheckpointV2(c.checkpoint_id, c.input_offsets, only))
        shutil.rmtree(config.store_base_dir)
        cycle = TaskCycle(config)
        assert cycle.contents() == state_after(3), keep
        assert cycle.restored and cycle.sources == {keep}


def test_upload_metrics_are_reported_with_each_commit(tmp_path: Path) -> None:
    config = make(tmp_path)
    cycle = TaskCycle(config)
    (first,) = cycle.batch(wait=True).completed
    assert first.metrics["files-uploaded"] > 0 and first.metrics["bytes-uploaded"] > 0
    assert first.metrics["upload-ms"] >= 0
    (second,) = cycle.batch(wait=True).completed
    # the second snapshot re-uses the first one's unchanged files
    assert second.metrics["bytes-retained"] > 0


def test_restore_reuses_identical_local_files_and_downloads_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make(tmp_path)
    committed(config, 3)
    # lose the live store and the committed local checkpoint, but keep an older local one
    for task_dir in config.store_base_dir.iterdir():
        shutil.rmtree(task_dir / "user-counts")
        checkpoints = sorted((task_dir / "user-counts.checkpoints").iterdir())
        assert len(checkpoints) == 1
        older = checkpoints[0].with_name("0-0")  # pretend it is an older checkpoint of the store
        checkpoints[0].rename(older)
    caplog.set_level("INFO")
    cycle = TaskCycle(config)
    assert cycle.contents() == state_after(3)
    assert cycle.sources == {NAME}
    assert "reused" in caplog.text and "restored 0 files" in caplog.text  # every file was local


def test_snapshot_of_a_removed_store_is_deleted(tmp_path: Path) -> None:
    """A store gone from the job: the backend's admin deletes its snapshots (the driver calls
    it at start, for every backend a checkpoint names)."""
    config = make(
        tmp_path, **{"stores.old.factory": "rocksdb", "stores.old.backup.factories": "blobstore"}
    )
    committed(config, 2)
    old_indexes = {r["snapshot-index"] for r in blob_snapshots(config) if r["store"] == "old"}
    assert len(old_indexes) == 1
    values = {k: v for k, v in config.to_dict().items() if not k.startswith("stores.old.")}
    without = load_config(None, values)
    systems = Systems(without)
    admin = backend_factory(NAME).admin(without, job_model(without, systems), systems)
    admin.delete_unused(CheckpointManager(without).read_all())
    committed(without, 1)  # the next commit names the store no more
    blobs = blob_manager(without)
    assert not any(blobs.exists(i) for i in old_indexes)
    assert {r["store"] for r in blob_snapshots(without)} == {"user-counts"}
    assert check_blobs(without) == []

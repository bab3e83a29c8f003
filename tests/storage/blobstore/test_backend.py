"""The blob store backend end to end on the inline runner."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config, load_config
from sparkpoint.errors import CommitError
from sparkpoint.failpoints import InjectedCrash
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.storage.blobstore.backend import blob_manager
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.state import blob_snapshots, check_blobs
from tests.conftest import pageviews_config
from tests.helpers import (
    assert_at_least_once,
    assert_committed_state_matches_its_offsets,
    committed_counts,
    emitted_counts,
    generate,
    live_counts,
)


def make(tmp_path: Path, **overrides: str) -> Config:
    values = pageviews_config(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": "blobstore",
            "task.checkpoint.read.versions": "2",
            "task.batch.max.messages": "150",
            "task.commit.ms": "0",
            **overrides,
        },
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    return config


def run(config: Config) -> None:
    coordinator = JobCoordinator(config, InlineRunner())
    try:
        coordinator.run(until_caught_up=True)
    finally:
        coordinator.close()


def test_lost_host_restores_from_the_blob_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 1500, seed=61)
    run(config)
    assert check_blobs(config) == []
    snapshots = blob_snapshots(config)
    assert len(snapshots) == 4 and all(s["files"] > 0 and s["bytes"] > 0 for s in snapshots)
    shutil.rmtree(config.store_base_dir)
    # the committed state can be read straight from the blob store, without the job
    assert committed_counts(config) == dict(expected)
    expected += generate(config, tmp_path / "b.yaml", 300, seed=62)
    caplog.set_level("INFO")
    run(config)
    assert "from the blob store" in caplog.text
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)
    assert check_blobs(config) == []


def test_clean_up_keeps_only_what_the_last_snapshot_uses(tmp_path: Path) -> None:
    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 1500, seed=63)
    run(config)
    blobs = blob_manager(config)
    used = set()
    from sparkpoint.storage.blobstore.index import SnapshotIndex

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
    config = make(tmp_path, **{"task.commit.async.enabled": "false"})
    expected = generate(config, tmp_path / "a.yaml", 1200, seed=64)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    end = coordinator.upcoming()
    coordinator.run_batch(end, commit=True)
    from sparkpoint.storage.blobstore import manager as mgr

    real = mgr.BlobStoreManager.put_bytes
    calls = {"n": 0}

    def dying(self: mgr.BlobStoreManager, data: bytes) -> str:  # the index upload never happens
        calls["n"] += 1
        raise InjectedCrash("worker died while uploading")

    monkeypatch.setattr(mgr.BlobStoreManager, "put_bytes", dying)
    with pytest.raises((InjectedCrash, CommitError)):
        coordinator.run_batch(end, commit=True)
    coordinator.close()
    monkeypatch.setattr(mgr.BlobStoreManager, "put_bytes", real)
    assert calls["n"] >= 1
    assert check_blobs(config) == []  # no checkpoint references the partial upload
    assert_committed_state_matches_its_offsets(config)
    run(config)  # the next commits succeed (and adopt what the last checkpoint uses)
    blobs = blob_manager(config)
    orphans = blobs.sweep(now_ms=10**15)  # long after the TTL of the crashed upload
    assert orphans  # the files uploaded before the crash expire, unreferenced
    assert check_blobs(config) == []
    assert committed_counts(config) == dict(expected)


def test_dual_commit_with_the_changelog_then_restore_from_either(tmp_path: Path) -> None:
    config = make(
        tmp_path,
        **{
            "stores.user-counts.changelog": "filelog.user-counts-changelog",
            "stores.user-counts.backup.factories": "blobstore,changelog",
        },
    )
    expected = generate(config, tmp_path / "a.yaml", 800, seed=65)
    run(config)
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
        coordinator = JobCoordinator(config, InlineRunner())
        coordinator.start()
        end = {s: ts.resume[s] for ts in coordinator.tasks.values() for s in ts.model.ssps}
        _, results = coordinator.run_batch(end, commit=False)
        coordinator.close()
        assert {i.source for r in results for i in r.restored} == {keep}
        assert live_counts(config) == dict(expected), keep


def test_upload_metrics_reach_the_driver(tmp_path: Path) -> None:
    config = make(tmp_path, **{"task.commit.async.enabled": "false"})
    generate(config, tmp_path / "a.yaml", 600, seed=66)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    end = coordinator.upcoming()
    first, _ = coordinator.run_batch(end, commit=True)
    assert first.uploads["files-uploaded"] > 0 and first.uploads["bytes-uploaded"] > 0
    assert first.uploads["upload-ms"] >= 0
    second, _ = coordinator.run_batch(end, commit=True)
    # the second snapshot re-uses the first one's unchanged files
    assert second.uploads["bytes-retained"] > 0
    coordinator.close()


def test_restore_reuses_identical_local_files_and_downloads_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make(tmp_path, **{"task.commit.async.enabled": "false"})
    expected = generate(config, tmp_path / "a.yaml", 900, seed=67)
    run(config)
    # lose the live store and the committed local checkpoint, but keep an older local one
    for task_dir in config.store_base_dir.iterdir():
        shutil.rmtree(task_dir / "user-counts")
        checkpoints = sorted((task_dir / "user-counts.checkpoints").iterdir())
        assert len(checkpoints) == 1
        older = checkpoints[0].with_name("0-0")  # pretend it is an older checkpoint of the store
        checkpoints[0].rename(older)
    caplog.set_level("INFO")
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    end = {s: ts.resume[s] for ts in coordinator.tasks.values() for s in ts.model.ssps}
    _, results = coordinator.run_batch(end, commit=False)
    coordinator.close()
    assert {i.source for r in results for i in r.restored} == {"blobstore"}
    assert "reused" in caplog.text and "restored 0 files" in caplog.text  # every file was local
    assert live_counts(config) == dict(expected)


def test_snapshot_of_a_removed_store_is_deleted(tmp_path: Path) -> None:
    config = make(
        tmp_path,
        **{"stores.old.factory": "rocksdb", "stores.old.backup.factories": "blobstore"},
    )
    generate(config, tmp_path / "a.yaml", 300, seed=68)
    run(config)
    old_indexes = {r["snapshot-index"] for r in blob_snapshots(config) if r["store"] == "old"}
    assert len(old_indexes) == 4
    values = {k: v for k, v in config.to_dict().items() if not k.startswith("stores.old.")}
    without = load_config(None, values)
    generate(without, tmp_path / "b.yaml", 50, seed=69)
    run(without)
    blobs = blob_manager(without)
    assert not any(blobs.exists(i) for i in old_indexes)
    assert {r["store"] for r in blob_snapshots(without)} == {"user-counts"}
    assert check_blobs(without) == []


def test_a_run_to_the_end_commits_its_last_batch_once_its_uploads_are_done(
    tmp_path: Path,
) -> None:
    """A run to the end of its input commits its last batch, waiting for the batch's uploads,
    as the commit after the last batch did: an upload still running then would leave the
    tasks uncommitted, and the driver would snapshot and upload once more."""
    config = make(tmp_path, **{"task.batch.max.messages": "1000", "task.commit.ms": "600000"})
    expected = generate(config, tmp_path / "a.yaml", 1200, seed=64)
    coordinator = JobCoordinator(config, InlineRunner())
    try:
        summary = coordinator.run(until_caught_up=True)
    finally:
        coordinator.close()
    assert (summary.batches, summary.commits) == (1, 1), summary
    assert committed_counts(config) == dict(expected)

"""The driver's start (:mod:`sparkpoint.runtime.driver.startup`): what it checks and prepares of
the state backends before the first batch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from tests.helpers import (
    assert_committed_state_matches_its_offsets,
    changelog_job,
    changelog_records,
    changelog_view,
    committed_counts,
    counts_at_offsets,
    generate,
)
from tests.helpers import run_job as run

make = changelog_job


def test_unknown_backend_is_an_error_at_start(tmp_path: Path) -> None:
    config = make(tmp_path, **{"stores.user-counts.backup.factories": "tape"})
    generate(config, tmp_path / "a.yaml", 10, seed=46)
    with pytest.raises(
        ConfigError,
        match="store user-counts lists unknown backend 'tape'; known: blobstore, changelog",
    ):
        JobCoordinator(config, InlineRunner()).start()


def test_changelogs_are_compacted_up_to_the_checkpoints_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make(tmp_path, **{"stores.user-counts.write.batch.size": "1"})  # log every write
    expected = generate(config, tmp_path / "a.yaml", 3000, seed=44, users=20)
    run(config, until_caught_up=True)
    written = changelog_records(config)
    assert written >= 3000  # one entry per view
    caplog.set_level("INFO")
    run(config, until_caught_up=True)  # nothing new: the start compacts
    assert "compacted changelog filelog.user-counts-changelog." in caplog.text
    assert changelog_records(config) <= 20 + 4 * 4  # about one entry per user is left
    assert changelog_view(config) == dict(expected)
    shutil.rmtree(config.store_base_dir)  # restore from the compacted changelog
    expected += generate(config, tmp_path / "b.yaml", 500, seed=45, users=20)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_committed_state_matches_its_offsets(config)


def test_a_changelog_with_fewer_partitions_than_tasks_stops_the_job(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    config = make(tmp_path, log_system)
    Systems(config).admin("log").create_stream(StreamSpec("user-counts-changelog", 2))
    with pytest.raises(
        ConfigError,
        match=r"store user-counts: changelog log\.user-counts-changelog has 2 partitions but "
        r"the job's tasks need 4",
    ):
        run(config, until_caught_up=True)


def test_a_bad_delete_retention_stops_the_job_at_its_start(tmp_path: Path) -> None:
    bad = make(tmp_path, **{"streams.user-counts-changelog.delete.retention.ms": "soon"})
    with pytest.raises(ConfigError, match=r"streams.user-counts-changelog.delete.retention.ms"):
        run(bad, until_caught_up=True)  # at its start, before any compaction


def checkpoint_offsets(config: Config) -> dict[SystemStreamPartition, str]:
    return {
        s: o
        for c in CheckpointManager(config).read_all().values()
        for s, o in c.input_offsets.items()
    }


def one_batch_without_commit(config: Config) -> None:
    again = JobCoordinator(config, InlineRunner())
    again.start()
    try:  # closed when its batch fails too: until then it holds the job, in this process too
        again.run_batch(
            {s: ts.resume[s] for ts in again.tasks.values() for s in ts.model.ssps}, commit=False
        )
    finally:
        again.close()


def delete_changelog(config: Config) -> None:
    shutil.rmtree(config.data_dir / "streams" / "filelog" / "user-counts-changelog")


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


def test_an_avro_input_without_a_registry_stops_the_job_at_its_start(tmp_path: Path) -> None:
    """A Schema Registry serde that cannot work is refused before any batch, naming the key to
    set (not by every task of the first batch)."""
    config = make(tmp_path, **{"streams.pageviews.samza.msg.serde": "avro"})
    generate(config, tmp_path / "a.yaml", 10, seed=1)
    with pytest.raises(ConfigError, match=r"needs a Schema Registry: set systems\.filelog\.schema"):
        run(config, until_caught_up=True)
    assert CheckpointManager(config).read_all() == {}  # no batch ran

"""State backends: changelog restore, trim, dual commit, V1 checkpoints, write batching.

One task's storage batch after batch, with no driver (:class:`tests.storage.cycle.TaskCycle`);
each runs on the embedded log and on Kafka (``log_system``). What the driver does with the
backends at start and beside the batches (checks, compaction), and crashes at every step of
the commit, are tested with the driver: tests/runtime/driver/test_startup.py,
test_maintenance.py and test_commits.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.testing.backends import NAME as COPY
from tests.helpers import changelog_job, changelog_records, changelog_view
from tests.storage.cycle import TaskCycle, state_after


def make(tmp_path: Path, log: dict[str, str] | None = None, **overrides: str) -> Config:
    """The example with a changelog and one task (see :func:`tests.helpers.changelog_job`)."""
    return changelog_job(tmp_path, log, 1, **overrides)


def test_lost_host_restores_from_the_changelog(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, log_system: dict[str, str]
) -> None:
    config = make(tmp_path, log_system)
    cycle = TaskCycle(config)
    for _ in range(3):
        cycle.batch()
    cycle.batch(wait=True)
    shutil.rmtree(config.store_base_dir)  # the executor's disk is gone
    caplog.set_level("INFO")
    cycle.batch(wait=True)
    assert cycle.restored and cycle.sources == {"changelog"}
    assert "restored from changelog" in caplog.text
    assert cycle.assert_committed_state_matches_its_offsets() == 5


def uncommitted_tail(config: Config) -> None:
    """Commit after one batch, then run a second batch without committing, and 'crash',
    losing the local state with it."""
    cycle = TaskCycle(config)
    cycle.batch(wait=True)
    cycle.batch(commit=False)
    shutil.rmtree(config.store_base_dir)


def test_transactional_restore_trims_what_came_after_the_checkpoint(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    config = make(tmp_path, log_system)
    uncommitted_tail(config)
    assert changelog_view(config) == state_after(2)  # the changelog ran ahead of the checkpoint
    again = TaskCycle(config, run_id="run-2")
    assert again.contents() == state_after(1)  # exactly the checkpoint's state
    assert again.restored
    assert changelog_view(config) == state_after(1)  # later entries were undone in the changelog


def test_non_transactional_restore_goes_to_the_newest_changelog_entry(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    config = make(tmp_path, log_system, **{"task.transactional.state.checkpoint.enabled": "false"})
    uncommitted_tail(config)
    again = TaskCycle(config, run_id="run-2")
    # the state is ahead of its offsets: the uncommitted batch's writes are in it, and will be
    # made again when that input is re-read; this is what transactional mode prevents
    assert again.contents() == state_after(2)
    assert again.restored and again.offset_of(again.last) == 1  # type: ignore[arg-type]


def test_dual_commit_then_restore_from_each_backend_alone(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    config = make(
        tmp_path,
        log_system,
        **{
            "stores.user-counts.backup.factories": f"changelog,{COPY}",
            "testing.copy.dir": str(tmp_path / "copies"),
        },
    )
    cycle = TaskCycle(config)
    for _ in range(3):
        cycle.batch(wait=True)
    checkpoints = CheckpointManager(config).read_version(2)
    assert len(checkpoints) == 1
    for c in checkpoints.values():
        assert set(c.state_checkpoint_markers) == {"changelog", COPY}
    for keep, prefer in (("changelog", f"{COPY},changelog"), (COPY, f"changelog,{COPY}")):
        # a checkpoint that names only one backend; the preferred one is the other (fallback)
        v2 = load_config(
            None,
            {
                **config.to_dict(),
                "task.checkpoint.read.versions": "2",
                "task.checkpoint.write.versions": "2",
                "stores.user-counts.restore.factories": prefer,
            },
        )
        manager = CheckpointManager(v2)
        for task, c in checkpoints.items():
            assert isinstance(c, CheckpointV2)
            markers = {keep: dict(c.state_checkpoint_markers[keep])}
            manager.write_checkpoint(task, CheckpointV2(c.checkpoint_id, c.input_offsets, markers))
        shutil.rmtree(config.store_base_dir)
        again = TaskCycle(v2)
        assert again.contents() == state_after(3), keep
        assert again.sources == {keep}


def test_v1_checkpoints_carry_changelog_offsets(tmp_path: Path) -> None:
    config = make(tmp_path)
    cycle = TaskCycle(config)
    for _ in range(2):
        cycle.batch(wait=True)
    v1 = CheckpointManager(config).read_version(1)
    assert len(v1) == 1
    for c in v1.values():
        changelog = [s for s in c.input_offsets if s.stream == "user-counts-changelog"]
        assert len(changelog) == 1
        cid, _, offset = c.input_offsets[changelog[0]].rpartition(":")
        assert cid == str(c.checkpoint_id) and int(offset) >= 0
    shutil.rmtree(config.store_base_dir)
    # restores from the V1 form (read first by default, 2,1, it was not read here before)
    v1_only = load_config(None, {**config.to_dict(), "task.checkpoint.read.versions": "1"})
    again = TaskCycle(v1_only)
    assert again.last is not None and not isinstance(again.last, CheckpointV2)
    assert again.contents() == state_after(2) and again.sources == {"changelog"}


def test_a_v1_checkpoint_cannot_restore_a_blob_store_backed_store(tmp_path: Path) -> None:
    """Issue 11: with only V1 read, a blob-store store used to restore EMPTY and keep its
    offsets; now the restore stops and names the fix."""
    from sparkpoint.checkpoint.checkpoint import CheckpointV1
    from sparkpoint.checkpoint.id import CheckpointId
    from sparkpoint.errors import RestoreError
    from sparkpoint.model import TaskModel, TaskName
    from sparkpoint.storage.restore import restore_candidates

    config = make(tmp_path, **{"stores.user-counts.backup.factories": "blobstore"})
    ssp = SystemStreamPartition("filelog", "pageviews", 0)
    task = TaskModel(TaskName.for_partition(0), frozenset({ssp}), 0)
    v1 = CheckpointV1(CheckpointId.create(), {ssp: "41"})
    with pytest.raises(RestoreError) as err:
        restore_candidates(config, "user-counts", task, v1)
    assert "store user-counts" in str(err.value) and str(v1.checkpoint_id) in str(err.value)
    assert "task.checkpoint.read.versions=2,1" in str(err.value)
    assert restore_candidates(config, "user-counts", task, None) == ["blobstore"]
    # a V2 checkpoint naming the store under a backend no longer listed for restore
    v2 = CheckpointV2(CheckpointId.create(), {ssp: "41"}, {"changelog": {"user-counts": "m"}})
    with pytest.raises(RestoreError, match="stores.user-counts.restore.factories"):
        restore_candidates(config, "user-counts", task, v2)
    # a V2 checkpoint without the store at all: the store is new, it starts fresh
    assert restore_candidates(
        config, "user-counts", task, CheckpointV2(v2.checkpoint_id, {}, {})
    ) == ["blobstore"]


def test_a_key_written_many_times_between_commits_is_logged_once(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    """Samza's CachedStore write batching: the changelog gets the newest value of each key once
    per commit, and restores exactly."""
    config = make(tmp_path, log_system)
    cycle = TaskCycle(config)
    for batch in range(1, 4):  # each batch writes each of 12 keys 25 times
        cycle.batch(writes=[(f"user-{k}", batch * 100 + n) for n in range(25) for k in range(12)])
    cycle.batch(wait=True, writes=[])
    assert changelog_records(config) == 12 * 3  # once per key and batch, not 300 a batch
    final = {f"user-{k}": 324 for k in range(12)}
    assert changelog_view(config) == final
    shutil.rmtree(config.store_base_dir)  # restore from the deduplicated changelog
    assert TaskCycle(config).contents() == final


def test_logged_writes_wait_for_a_drain_or_the_batch_size() -> None:
    from sparkpoint.storage.changelog.logged import LoggedEngine
    from sparkpoint.storage.kv.memory import InMemoryEngine
    from sparkpoint.system.base import Record, SystemProducer

    class Sent(SystemProducer):
        def __init__(self) -> None:
            self.records: list[tuple[bytes | None, bytes | None]] = []

        def send(self, stream: str, partition: int, record: Record) -> None:
            self.records.append((record.key, record.value))

        def flush(self) -> None:
            pass

    sent = Sent()
    ssp = SystemStreamPartition("filelog", "cl", 0)
    logged = LoggedEngine(InMemoryEngine("s"), sent, ssp, batch_size=3)
    logged.put(b"a", b"1")
    logged.put(b"a", b"2")
    logged.delete(b"a")
    logged.write_batch([(b"b", b"1"), (b"a", b"3")])
    assert sent.records == [] and logged.get(b"a") == b"3"  # in the store at once
    logged.put(b"c", b"1")  # the third distinct key: drained
    assert sent.records == [(b"a", b"3"), (b"b", b"1"), (b"c", b"1")]
    logged.delete(b"b")
    logged.drain()
    logged.drain()
    assert sent.records[3:] == [(b"b", None)]
    logged.write_bulk([(b"d", b"1"), (b"a", None)])  # a tool's bulk writes are logged too
    assert logged.get(b"d") == b"1" and logged.get(b"a") is None
    logged.drain()
    assert sent.records[4:] == [(b"d", b"1"), (b"a", None)]


def test_delete_retention_ms_is_a_day_by_default_and_minus_one_keeps_tombstones(
    tmp_path: Path,
) -> None:
    from sparkpoint.model import SystemStream
    from sparkpoint.storage.changelog.backend import delete_retention_ms

    changelog = SystemStream("filelog", "user-counts-changelog")
    assert delete_retention_ms(make(tmp_path / "a"), changelog) == 86_400_000
    forever = make(tmp_path / "b", **{"streams.user-counts-changelog.delete.retention.ms": "-1"})
    assert delete_retention_ms(forever, changelog) is None
    every = make(tmp_path / "c", **{"systems.filelog.default.stream.delete.retention.ms": "0"})
    assert delete_retention_ms(every, changelog) == 0
    bad = make(tmp_path / "d", **{"streams.user-counts-changelog.delete.retention.ms": "soon"})
    with pytest.raises(ConfigError, match=r"streams.user-counts-changelog.delete.retention.ms"):
        delete_retention_ms(bad, changelog)

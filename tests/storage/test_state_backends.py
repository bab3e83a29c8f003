"""State backends end to end on the inline runner: changelog restore, trim, dual commit, crashes."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config, load_config
from sparkpoint.errors import CommitError, ConfigError
from sparkpoint.failpoints import POINTS, InjectedCrash
from sparkpoint.model import SystemStreamPartition
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.testing.backends import NAME as COPY
from tests.conftest import pageviews_config
from tests.helpers import (
    assert_at_least_once,
    assert_committed_state_matches_its_offsets,
    changelog_view,
    committed_counts,
    counts_at_offsets,
    emitted_counts,
    generate,
    live_counts,
)


def make(tmp_path: Path, log: dict[str, str] | None = None, **overrides: str) -> Config:
    """The example with a changelog, on filelog, or with every stream on ``log`` (the
    ``log_system`` fixture's system)."""
    system = "filelog" if log is None else "log"
    values = pageviews_config(
        tmp_path,
        log,
        **{
            "stores.user-counts.changelog": f"{system}.user-counts-changelog",
            "task.batch.max.messages": "100",
            "task.commit.ms": "0",
            **overrides,
        },
    )
    config = load_config(None, values)
    Systems(config).admin(system).create_stream(StreamSpec("pageviews", 4))
    return config


def run(config: Config, **kwargs: object) -> JobCoordinator:
    coordinator = JobCoordinator(config, InlineRunner())
    try:
        coordinator.run(**kwargs)  # type: ignore[arg-type]
    finally:
        coordinator.close()
    return coordinator


def test_lost_host_restores_from_the_changelog(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, log_system: dict[str, str]
) -> None:
    config = make(tmp_path, log_system)
    expected = generate(config, tmp_path / "a.yaml", 1200, seed=41)
    run(config, until_caught_up=True)
    shutil.rmtree(config.store_base_dir)  # the executor's disk is gone
    expected += generate(config, tmp_path / "b.yaml", 300, seed=42)
    caplog.set_level("INFO")
    run(config, until_caught_up=True)
    assert "restored from changelog" in caplog.text
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)


def uncommitted_tail(config: Config, *, lose_local_state: bool = True) -> JobCoordinator:
    """Commit after one batch, then process a second batch without committing, and 'crash'."""
    first = JobCoordinator(config, InlineRunner())
    first.start()
    meta = first.partition_metadata(first.all_ssps())
    end = {s: m.upcoming for s, m in meta.items()}
    first.run_batch(end, commit=True)
    first.run_batch(end, commit=False)
    first.close()
    if lose_local_state:
        shutil.rmtree(config.store_base_dir)  # and the local state is lost with the crash
    return first


def test_transactional_restore_trims_what_came_after_the_checkpoint(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    config = make(tmp_path, log_system)
    generate(config, tmp_path / "a.yaml", 2000, seed=43)
    uncommitted_tail(config)
    offsets = {
        s: o
        for c in CheckpointManager(config).read_all().values()
        for s, o in c.input_offsets.items()
    }
    at_checkpoint = dict(counts_at_offsets(config, offsets))
    assert changelog_view(config) != at_checkpoint  # the changelog ran ahead of the checkpoint
    second = JobCoordinator(config, InlineRunner())
    second.start()
    second.run_batch(
        {s: ts.resume[s] for ts in second.tasks.values() for s in ts.model.ssps}, commit=False
    )
    second.close()
    assert live_counts(config) == at_checkpoint  # exactly the checkpoint's state
    assert changelog_view(config) == at_checkpoint  # later entries were undone in the changelog


def test_non_transactional_restore_goes_to_the_newest_changelog_entry(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    config = make(tmp_path, log_system, **{"task.transactional.state.checkpoint.enabled": "false"})
    generate(config, tmp_path / "a.yaml", 2000, seed=43)
    uncommitted_tail(config)
    offsets = {
        s: o
        for c in CheckpointManager(config).read_all().values()
        for s, o in c.input_offsets.items()
    }
    at_checkpoint = dict(counts_at_offsets(config, offsets))
    newest = changelog_view(config)
    second = JobCoordinator(config, InlineRunner())
    second.start()
    second.run_batch(
        {s: ts.resume[s] for ts in second.tasks.values() for s in ts.model.ssps}, commit=False
    )
    second.close()
    # the state is ahead of its offsets: the uncommitted batch's views are counted, and will be
    # counted again when that input is re-read; this is what transactional mode prevents
    assert live_counts(config) == newest
    assert sum(newest.values()) == sum(at_checkpoint.values()) + 400


def test_dual_commit_then_restore_from_each_backend_alone(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    copy_dir = str(tmp_path / "copies")
    config = make(
        tmp_path,
        log_system,
        **{
            "stores.user-counts.backup.factories": f"changelog,{COPY}",
            "testing.copy.dir": copy_dir,
        },
    )
    expected = generate(config, tmp_path / "a.yaml", 1000, seed=44)
    run(config, until_caught_up=True)
    checkpoints = CheckpointManager(config).read_version(2)
    assert len(checkpoints) == 4
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
        coordinator = JobCoordinator(v2, InlineRunner())
        coordinator.start()
        coordinator.run_batch(
            {s: ts.resume[s] for ts in coordinator.tasks.values() for s in ts.model.ssps},
            commit=False,
        )
        coordinator.close()
        assert live_counts(config) == dict(expected), keep


@pytest.mark.parametrize("point", POINTS)
def test_crash_at_every_step_keeps_state_and_offsets_together(tmp_path: Path, point: str) -> None:
    flag = tmp_path / "crash.flag"
    flag.write_text("0" if point == "during-cleanup" else "4")
    config = make(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": f"changelog,{COPY}",
            "testing.copy.dir": str(tmp_path / "copies"),
            "testing.crash.at": point,
            "testing.crash.flag": str(flag),
        },
    )
    expected = generate(config, tmp_path / "a.yaml", 1500, seed=45)
    first = JobCoordinator(config, InlineRunner())
    first.start()
    meta = first.partition_metadata(first.all_ssps())
    end = {s: m.upcoming for s, m in meta.items()}
    first.run_batch(end, commit=True)
    if point == "during-restore":
        shutil.rmtree(config.store_base_dir)  # the next start must restore from a backend
        first.close()
        with pytest.raises(InjectedCrash):
            run(config, until_caught_up=True)
    else:
        # at an asynchronous step the worker "dies" in the upload thread: the next commit
        # reports the lost upload, naming task and checkpoint
        with pytest.raises((InjectedCrash, CommitError)):
            for _ in range(5):
                first.run_batch(end, commit=True)
        first.close()
    assert not flag.exists(), f"the crash point {point} was never reached"
    assert_committed_state_matches_its_offsets(config)
    run(config, until_caught_up=True)
    assert_committed_state_matches_its_offsets(config)
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)


def test_unknown_backend_is_an_error_at_start(tmp_path: Path) -> None:
    config = make(tmp_path, **{"stores.user-counts.backup.factories": "tape"})
    generate(config, tmp_path / "a.yaml", 10, seed=46)
    with pytest.raises(
        ConfigError,
        match="store user-counts lists unknown backend 'tape'; known: blobstore, changelog",
    ):
        JobCoordinator(config, InlineRunner()).start()


def test_v1_checkpoints_carry_changelog_offsets(tmp_path: Path) -> None:
    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 400, seed=47)
    run(config, until_caught_up=True)
    v1 = CheckpointManager(config).read_version(1)
    for c in v1.values():
        changelog = [s for s in c.input_offsets if s.stream == "user-counts-changelog"]
        assert len(changelog) == 1
        cid, _, offset = c.input_offsets[changelog[0]].rpartition(":")
        assert cid == str(c.checkpoint_id) and int(offset) >= 0
    shutil.rmtree(config.store_base_dir)
    run(config, until_caught_up=True)  # restores from the V1 form (the default read version)
    assert json.dumps(committed_counts(config), sort_keys=True)
    assert_committed_state_matches_its_offsets(config)


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


def changelog_records(config: Config) -> int:
    from sparkpoint.storage.changelog.backend import changelog_ssp

    systems = Systems(config)
    ssps = [changelog_ssp(config, "user-counts", p) for p in range(4)]
    return sum(len(systems.consumer(s.system).read(s, "0", "10000000")) for s in ssps)


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


def test_changelogs_are_compacted_during_a_long_run_as_they_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded log has no broker to compact changelogs: a long run compacts each one up to
    its checkpoint after commits, once it grew by as many records as the last compaction kept
    (10,000 at least; 40 here), so its disk stays bounded by the state, not the writes."""
    from sparkpoint.storage.changelog import backend as changelog

    monkeypatch.setattr(changelog, "COMPACT_MIN_GROWTH", 40)
    config = make(
        tmp_path,
        **{"stores.user-counts.write.batch.size": "1", "job.retention.check.ms": "0"},
    )
    expected = generate(config, tmp_path / "a.yaml", 3000, seed=46, users=20)
    run(config, until_caught_up=True)  # one run: 8 batches of 100 views per task
    assert changelog_records(config) < 3000 / 3  # compacted during the run
    assert changelog_view(config) == dict(expected)
    shutil.rmtree(config.store_base_dir)  # restore from the changelog compacted mid-run
    expected += generate(config, tmp_path / "b.yaml", 400, seed=47, users=20)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_committed_state_matches_its_offsets(config)


def test_a_compaction_pass_that_fails_beside_the_batches_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changelogs are compacted beside the batches (a thread of the driver): a pass that finds
    a damaged record is not lost in that thread; the run stops with its error."""
    from sparkpoint.errors import CorruptRecordError
    from sparkpoint.storage.changelog import backend as changelog

    monkeypatch.setattr(changelog, "COMPACT_MIN_GROWTH", 40)
    original = changelog.ChangelogAdmin.compact
    passes: list[str] = []

    def failing(self: changelog.ChangelogAdmin, checkpoints: object, **kw: bool) -> None:
        if kw.get("during_run"):
            passes.append(threading.current_thread().name)
            raise CorruptRecordError("filelog.user-counts-changelog partition 0 at offset 7: x")
        original(self, checkpoints, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(changelog.ChangelogAdmin, "compact", failing)
    config = make(
        tmp_path,
        **{"stores.user-counts.write.batch.size": "1", "job.retention.check.ms": "0"},
    )
    generate(config, tmp_path / "a.yaml", 3000, seed=46, users=20)
    with pytest.raises(CorruptRecordError, match="at offset 7"):
        run(config, until_caught_up=True)
    assert passes and set(passes) == {"sparkpoint-changelog-compaction"}


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


def test_a_key_written_many_times_between_commits_is_logged_once(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    """Samza's CachedStore write batching: the changelog gets the newest value of each key once
    per commit, and restores exactly."""
    config = make(tmp_path, log_system, **{"task.batch.max.messages": "400"})
    expected = generate(config, tmp_path / "a.yaml", 3000, seed=48, users=12)
    coordinator = JobCoordinator(config, InlineRunner())
    batches = coordinator.run(until_caught_up=True).batches
    coordinator.close()
    assert changelog_records(config) <= 12 * batches < 3000  # each batch commits each task
    assert changelog_view(config) == dict(expected)
    shutil.rmtree(config.store_base_dir)  # restore from the deduplicated changelog
    run(config, until_caught_up=True)
    assert live_counts(config) == dict(expected)


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
    with pytest.raises(ConfigError, match=r"streams.user-counts-changelog.delete.retention.ms"):
        run(bad, until_caught_up=True)  # at its start, before any compaction

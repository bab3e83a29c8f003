"""The driver's part in standby copies (:mod:`sparkpoint.runtime.driver.standby`) as a job
runs: in local mode none can be placed, a start removes the copies an earlier run kept once
standbys are off, and a copy behind tombstones the start compacted away is seeded again."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.model import TaskModel
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.storage.kv.rocksdb import RocksDBEngine
from sparkpoint.storage.local import LocalTaskState, StandbyCopy
from sparkpoint.storage.standby import catch_up
from sparkpoint.system.registry import Systems
from tests.helpers import changelog_job as make
from tests.helpers import generate
from tests.storage.test_standby import EXECUTOR, STANDBYS


class LocalMode(InlineRunner):
    """A runner that says what SparkRunner says in local mode: one executor, none to list."""

    places_tasks = True

    def executors(self) -> None:
        return None


def commit_all(config: Config) -> tuple[dict[str, TaskModel], dict[str, Checkpoint]]:
    """Run the job over everything there is, committing; its tasks and checkpoints."""
    coordinator = JobCoordinator(config, InlineRunner())
    try:
        coordinator.run(until_caught_up=True)
        tasks = {n: ts.model for n, ts in coordinator.tasks.items()}
    finally:
        coordinator.close()
    return tasks, {t.name: c for t, c in CheckpointManager(config).read_all().items()}


def test_standbys_in_local_mode_say_they_cannot_be_placed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make(tmp_path, **{"job.standbytasks.replication.factor": "2"})
    generate(config, tmp_path / "a.yaml", 300, seed=100)
    coordinator = JobCoordinator(config, LocalMode())
    try:
        coordinator.run(until_caught_up=True)
    finally:
        coordinator.close()
    assert "job.standbytasks.replication.factor=2: no standby can be placed" in caplog.text
    assert not (config.store_base_dir / ".standby").exists()


def test_copies_an_earlier_run_kept_go_when_standbys_are_off(tmp_path: Path) -> None:
    config = make(tmp_path, **STANDBYS)
    generate(config, tmp_path / "a.yaml", 300, seed=101)
    tasks, first = commit_all(config)
    for name, task in tasks.items():
        catch_up(config, Systems(config), task, EXECUTOR, first[name], None)
    off = make(tmp_path)  # the default: no standby
    generate(off, tmp_path / "b.yaml", 100, seed=102)
    held_name, held_task = sorted(tasks.items())[0]
    held = StandbyCopy(config.store_base_dir, EXECUTOR, held_task.name)
    with held.lock(0) as mine:  # a catch-up still running: its copy and lock are left
        assert mine
        commit_all(off)
    kept = held_name.replace(" ", "_")
    assert sorted(p.name for p in (off.store_base_dir / ".standby" / EXECUTOR).iterdir()) == [
        kept,
        f"{kept}.lock",
    ]
    commit_all(off)  # and go at the next start
    assert list((off.store_base_dir / ".standby" / EXECUTOR).iterdir()) == []


def test_a_copy_behind_tombstones_compaction_dropped_is_seeded_again(tmp_path: Path) -> None:
    """A windows job deletes every window it closes. With ``delete.retention.ms`` 0 the job's
    start compacts those tombstones away; a copy at an earlier checkpoint still holds the
    windows they deleted, and replaying the tail would keep them. So the copy is seeded
    again (the changelog says how far tombstones went), and equals the live state."""
    from sparkpoint.model import SystemStreamPartition
    from sparkpoint.storage.changelog.backend import changelog_stream
    from tests.runtime.executor.test_windows import job, send, views

    config = job(
        tmp_path,
        **STANDBYS,
        **{"systems.filelog.default.stream.delete.retention.ms": "0"},
    )
    systems = Systems(config)
    send(config, views(300, seed=31, start_ms=0))
    tasks, first = commit_all(config)
    for name, task in tasks.items():
        assert catch_up(config, systems, task, EXECUTOR, first[name], None).seeded
    send(config, views(300, seed=32, start_ms=900_000))  # closes the first views' windows
    tasks, second = commit_all(config)
    commit_all(config)  # its start compacts up to the second checkpoints: tombstones go
    stores = ("minute-counts", "sessions", "timers")
    dropped = [
        systems.admin("filelog").tombstones_dropped_through(
            SystemStreamPartition(
                "filelog", changelog_stream(config, s).stream, t.changelog_partition
            )
        )
        for s in stores
        for t in tasks.values()
    ]
    assert any(d is not None for d in dropped)
    for name, task in tasks.items():
        caught = catch_up(
            config, systems, task, EXECUTOR, second[name], str(first[name].checkpoint_id)
        )
        assert caught.seeded, name  # not the tail: the tombstones it needs are gone
        copy = StandbyCopy(config.store_base_dir, EXECUTOR, task.name)
        live = LocalTaskState(config.store_base_dir, task.name)
        for store in stores:
            held = [RocksDBEngine(store, d.store_dir(store), read_only=True) for d in (copy, live)]
            try:
                assert list(held[0].all()) == list(held[1].all()), (name, store)
            finally:
                for engine in held:
                    engine.close()

"""Standby copies (issue 35): caught up to the last written checkpoint and never past it, then
promoted by a restore that replays only the changelog after the copy's checkpoint and trims
what came after the checkpoint, as a changelog restore does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.model import TaskModel
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.storage.kv.rocksdb import RocksDBEngine
from sparkpoint.storage.local import LocalTaskState, StandbyCopy
from sparkpoint.storage.restore import PROMOTED
from sparkpoint.storage.standby import catch_up, replication_factor
from sparkpoint.storage.state_id import EMPTY
from sparkpoint.storage.task_storage import TaskStorage
from sparkpoint.system.registry import Systems
from tests.helpers import changelog_view, counts_at_offsets, generate, live_counts
from tests.storage.test_state_backends import make

EXECUTOR = "7"
#: the jobs here keep standbys (those run by the tests' inline runner place none themselves)
STANDBYS = {"job.standbytasks.replication.factor": "2"}


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


def uncommitted_batch(config: Config) -> None:
    """A batch whose writes reach the changelog but no checkpoint (then the driver dies)."""
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    meta = coordinator.partition_metadata(
        [s for t in coordinator.tasks.values() for s in t.model.ssps]
    )
    coordinator.run_batch({s: m.upcoming for s, m in meta.items()}, commit=False)
    coordinator.close()


def copy_counts(config: Config, task: TaskModel, *, live: bool = False) -> dict[str, int]:
    """The counts in the task's standby copy (``live``: in its live store)."""
    copy = StandbyCopy(config.store_base_dir, EXECUTOR, task.name)
    local = LocalTaskState(config.store_base_dir, task.name) if live else copy
    engine = RocksDBEngine("user-counts", local.store_dir("user-counts"))
    try:
        return {k.decode(): int.from_bytes(v, "big", signed=True) for k, v in engine.all()}
    finally:
        engine.close()


def at(config: Config, checkpoints: dict[str, Checkpoint], task: str) -> dict[str, int]:
    """The task's committed counts, counted from the input up to its checkpoint."""
    return dict(counts_at_offsets(config, dict(checkpoints[task].input_offsets)))


def seeded_then_behind(
    tmp_path: Path, seeds: tuple[int, int]
) -> tuple[Config, Systems, str, TaskModel, Checkpoint, Checkpoint, StandbyCopy]:
    """A job's first task with a standby copy seeded at its first checkpoint, then a second
    checkpoint the copy has not caught up to: the config, systems, the task's name and
    model, both checkpoints, and the copy."""
    config = make(tmp_path, **STANDBYS)
    systems = Systems(config)
    generate(config, tmp_path / "a.yaml", 600, seed=seeds[0])
    tasks, first = commit_all(config)
    name, task = sorted(tasks.items())[0]
    catch_up(config, systems, task, EXECUTOR, first[name], None)
    generate(config, tmp_path / "b.yaml", 300, seed=seeds[1])
    _tasks, second = commit_all(config)
    copy = StandbyCopy(config.store_base_dir, EXECUTOR, task.name)
    return config, systems, name, task, first[name], second[name], copy


def test_a_standby_catches_up_to_the_checkpoint_and_is_promoted_with_only_the_tail(
    tmp_path: Path,
) -> None:
    config = make(tmp_path, **STANDBYS)
    systems = Systems(config)
    generate(config, tmp_path / "a.yaml", 1500, seed=91)
    tasks, first = commit_all(config)
    seeded = {n: catch_up(config, systems, t, EXECUTOR, first[n], None) for n, t in tasks.items()}
    assert all(s.seeded and s.source == "changelog" for s in seeded.values())
    for name, task in tasks.items():
        assert copy_counts(config, task) == at(config, first, name)

    generate(config, tmp_path / "b.yaml", 900, seed=92)
    tasks, second = commit_all(config)
    caught = {
        n: catch_up(config, systems, t, EXECUTOR, second[n], str(first[n].checkpoint_id))
        for n, t in tasks.items()
    }
    assert not any(c.seeded for c in caught.values())
    assert sum(c.records for c in caught.values()) > 0  # only the tail since the first
    for name, task in tasks.items():
        assert copy_counts(config, task) == at(config, second, name)

    # the job goes on: a third checkpoint the copies never see, then writes no checkpoint
    # covers (in the changelog only); then the executor with the live state is lost
    generate(config, tmp_path / "c.yaml", 600, seed=93)
    tasks, third = commit_all(config)
    generate(config, tmp_path / "d.yaml", 600, seed=94)
    uncommitted_batch(config)
    committed = {n: at(config, third, n) for n in tasks}
    assert changelog_view(config) != {k: v for c in committed.values() for k, v in c.items()}
    for name in tasks:
        shutil.rmtree(config.store_base_dir / name.replace(" ", "_"))

    promoted = []
    for name, task in tasks.items():
        storage = TaskStorage(config, systems, task, run_id="r2", last_checkpoint=third[name])
        assert not storage.open(EMPTY, [(EXECUTOR, str(second[name].checkpoint_id))])
        promoted += [(name, s) for s in storage.restored]
        storage.close(EMPTY)
    assert {s.source for _, s in promoted} == {PROMOTED}
    assert sum(s.entries for _, s in promoted) > 0  # the third checkpoint's tail, no more
    everything = {k: v for c in committed.values() for k, v in c.items()}
    assert live_counts(config) == everything  # exactly the committed state
    assert changelog_view(config) == everything  # the uncommitted writes were trimmed
    for task in tasks.values():  # each copy was taken by its task
        assert not StandbyCopy(config.store_base_dir, EXECUTOR, task.name).dir.exists()


def test_a_copy_at_another_checkpoint_than_offered_is_not_promoted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make(tmp_path, **STANDBYS)
    systems = Systems(config)
    generate(config, tmp_path / "a.yaml", 800, seed=95)
    tasks, first = commit_all(config)
    name, task = sorted(tasks.items())[0]
    catch_up(config, systems, task, EXECUTOR, first[name], None)
    shutil.rmtree(config.store_base_dir / name.replace(" ", "_"))
    storage = TaskStorage(config, systems, task, run_id="r2", last_checkpoint=first[name])
    assert not storage.open(EMPTY, [(EXECUTOR, "1-2-3-4")])  # the driver saw another position
    storage.close(EMPTY)
    assert [s.source for s in storage.restored] == ["changelog"]
    assert "not 1-2-3-4 as the driver saw" in caplog.text
    assert copy_counts(config, task, live=True) == at(config, first, name)


def test_a_copy_past_the_checkpoint_is_seeded_again(tmp_path: Path) -> None:
    """A copy whose position is past the checkpoint it is asked to reach (a checkpoint set
    back by a tool) would serve state the checkpoint does not hold: it is seeded again."""
    config = make(tmp_path, **STANDBYS)
    systems = Systems(config)
    generate(config, tmp_path / "a.yaml", 800, seed=96)
    tasks, first = commit_all(config)
    generate(config, tmp_path / "b.yaml", 400, seed=97)
    tasks, second = commit_all(config)
    name, task = sorted(tasks.items())[0]
    catch_up(config, systems, task, EXECUTOR, second[name], None)
    later = str(second[name].checkpoint_id)
    done = catch_up(config, systems, task, EXECUTOR, first[name], later)
    assert done.seeded
    assert copy_counts(config, task) == at(config, first, name)


def test_a_new_copy_is_seeded_from_the_blob_store_and_then_tails_the_changelog(
    tmp_path: Path,
) -> None:
    config = make(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": "blobstore,changelog",
            "stores.user-counts.restore.factories": "blobstore,changelog",
            **STANDBYS,
        },
    )
    systems = Systems(config)
    generate(config, tmp_path / "a.yaml", 800, seed=98)
    tasks, first = commit_all(config)
    name, task = sorted(tasks.items())[0]
    seeded = catch_up(config, systems, task, EXECUTOR, first[name], None)
    assert (seeded.seeded, seeded.source) == (True, "blobstore")
    generate(config, tmp_path / "b.yaml", 400, seed=99)
    tasks, second = commit_all(config)
    caught = catch_up(config, systems, task, EXECUTOR, second[name], seeded.checkpoint)
    assert (caught.seeded, caught.source) == (False, "changelog")
    assert caught.records > 0
    assert copy_counts(config, task) == at(config, second, name)


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


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"job.standbytasks.replication.factor": "0"}, "counts the active copy"),
        (
            {
                "job.standbytasks.replication.factor": "2",
                "task.transactional.state.checkpoint.enabled": "false",
            },
            "needs task.transactional.state.checkpoint.enabled=true",
        ),
        (
            {"job.standbytasks.replication.factor": "2", "job.host-affinity.enabled": "false"},
            "needs job.host-affinity.enabled=true",
        ),
    ],
)
def test_standbys_that_cannot_be_exact_are_refused(
    tmp_path: Path, settings: dict[str, str], message: str
) -> None:
    config = make(tmp_path, **settings) if "0" not in settings.values() else None
    if config is None:
        with pytest.raises(ConfigError, match="job.standbytasks.replication.factor"):
            make(tmp_path, **settings)
        return
    with pytest.raises(ConfigError, match=message):
        replication_factor(config)


def test_an_executors_catch_up_deletes_what_it_no_longer_keeps_and_goes_on_past_a_failure(
    tmp_path: Path,
) -> None:
    from sparkpoint.checkpoint.checkpoint import CheckpointV2
    from sparkpoint.checkpoint.id import CheckpointId
    from sparkpoint.metadata.locality import Executor
    from sparkpoint.runtime.executor.standby import run_standby
    from sparkpoint.runtime.plan import StandbyPlan, StandbyTarget
    from sparkpoint.storage.local import standby_tasks

    config = make(tmp_path, **STANDBYS)
    systems = Systems(config)
    generate(config, tmp_path / "a.yaml", 400, seed=103)
    tasks, cps = commit_all(config)
    first, second, third = sorted(tasks)[:3]
    for executor in (EXECUTOR, "8", "9"):  # one state directory shared by three executors
        for name in (first, second):
            catch_up(config, systems, tasks[name], executor, cps[name], None)
    # a checkpoint whose changelog marker names another task's partition: its seed fails
    foreign = cps[first].state_checkpoint_markers["changelog"]
    broken = CheckpointV2(CheckpointId.create(), {}, {"changelog": dict(foreign)})
    plan = StandbyPlan(
        config.to_dict(),
        Executor(EXECUTOR, "h"),
        [
            StandbyTarget(tasks[third], broken.dumps(), None),
            StandbyTarget(tasks[first], cps[first].dumps(), None),
        ],
        live=[EXECUTOR, "8"],  # 9 is gone
        keep=(first, third),
    )
    failed, done = run_standby(plan)
    assert failed.error is not None and "changelog" in failed.error and not failed.busy
    assert done.error is None and done.seeded
    dirs = [p.name for p in standby_tasks(config.store_base_dir, EXECUTOR)]
    assert dirs == [first.replace(" ", "_")]  # its copy of second went; third's failed seed too
    assert len(standby_tasks(config.store_base_dir, "8")) == 2  # a live executor's stay
    assert standby_tasks(config.store_base_dir, "9") == []  # a gone executor's go
    assert copy_counts(config, tasks[first]) == at(config, cps, first)


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


def test_a_catch_up_whose_copy_was_promoted_meanwhile_writes_no_copy_of_the_tail_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catch-up that outlives its failed Spark job can find its copy's store gone: promoted
    (renamed into the task's live state) after it checked the copy was there. It must not
    create the store afresh and replay the tail into it (a copy that then says it is at the
    checkpoint, with only the tail's keys): it fails, and the driver seeds the copy again."""
    from sparkpoint.errors import StoreError

    config, systems, name, task, first, second, copy = seeded_then_behind(tmp_path, (98, 99))
    promoted_to = tmp_path / "promoted"
    present = StandbyCopy.store_present

    def then_promoted(self: StandbyCopy, store: str) -> bool:
        there = present(self, store)
        if there:  # the promotion renames it away right after this check
            shutil.move(str(self.store_dir(store)), str(promoted_to))
        return there

    monkeypatch.setattr(StandbyCopy, "store_present", then_promoted)
    with pytest.raises(StoreError, match="no database at"):
        catch_up(config, systems, task, EXECUTOR, second, str(first.checkpoint_id))
    monkeypatch.undo()
    assert not copy.store_present("user-counts")  # no store made of the tail alone
    assert copy.position() is None  # nor a position the driver could promote
    # the next catch-up (the driver seeds a copy it cannot vouch for) gives the whole state
    assert catch_up(config, systems, task, EXECUTOR, second, None).seeded
    assert copy_counts(config, task) == at(config, {name: second}, name)


def test_a_copy_held_by_another_process_is_neither_caught_up_nor_promoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A catch-up and a promotion of one copy take its lock: while another process holds it
    (a catch-up that outlived its failed job), a catch-up leaves the copy as it is, and the
    task restores from its backends instead of taking the copy, with the same state."""
    from dataclasses import replace

    from sparkpoint.metadata.locality import Executor
    from sparkpoint.runtime.executor.standby import run_standby
    from sparkpoint.runtime.plan import StandbyPlan, StandbyTarget
    from sparkpoint.storage import restore, standby
    from sparkpoint.storage.standby import StandbyCopyInUse

    monkeypatch.setattr(restore, "PROMOTE_WAIT_S", 0.2)
    monkeypatch.setattr(standby, "CATCH_UP_WAIT_S", 0.2)
    config, systems, name, task, first, second, copy = seeded_then_behind(tmp_path, (104, 105))
    position = copy.position()
    with copy.lock(0) as held:  # a separate open of the lock file: as another process
        assert held
        with pytest.raises(StandbyCopyInUse, match="is in use by another process"):
            catch_up(config, systems, task, EXECUTOR, second, str(first.checkpoint_id))
        assert copy.position() == position and copy.store_present("user-counts")  # untouched
        # through the executor's catch-up: a busy result (not a failure of the copy), kept
        target = StandbyTarget(task, second.dumps(), str(first.checkpoint_id))
        plan = StandbyPlan(config.to_dict(), Executor(EXECUTOR, "h"), [target], [EXECUTOR])
        [result] = run_standby(replace(plan, keep=(name,)))
        assert result.busy and result.error is not None and "in use" in result.error
        # nor deleted while held: as a copy the executor no longer keeps, or a gone executor's
        assert run_standby(replace(plan, copies=[])) == []
        assert run_standby(replace(plan, copies=[], live=["8"])) == []
        assert copy.position() == position and copy.store_present("user-counts")
        shutil.rmtree(config.store_base_dir / name.replace(" ", "_"))  # its executor is lost
        storage = TaskStorage(config, systems, task, run_id="r2", last_checkpoint=second)
        assert not storage.open(EMPTY, [(EXECUTOR, str(first.checkpoint_id))])
        storage.close(EMPTY)
    assert [s.source for s in storage.restored] == ["changelog"]  # not promoted
    assert "standby copy on executor 7 is in use by another process" in caplog.text
    assert copy_counts(config, task, live=True) == at(config, {name: second}, name)
    assert copy.position() == position  # the copy is still there, for a later promotion
    run_standby(replace(plan, copies=[], live=["8"]))  # no longer held: a gone executor's go
    assert copy.position() is None and not copy.dir.parent.exists()


def test_a_lock_its_holder_unlinked_is_taken_on_the_new_file_by_one_process_at_a_time(
    tmp_path: Path,
) -> None:
    """Removing copies with standbys off unlinks each copy's lock file while holding it. A
    catch-up that opened the old file and waited must not hold a lock on a file no one else
    can see: it locks the file at the path, so a third comer waits for it."""
    import threading
    import time

    from sparkpoint.model import TaskName

    copy = StandbyCopy(tmp_path, EXECUTOR, TaskName("Partition 0"))
    lock_file = copy.dir.with_name(copy.dir.name + ".lock")
    got: dict[str, bool] = {}
    b_holds = threading.Event()

    def waiting_catch_up() -> None:
        with copy.lock(5) as mine:
            got["waiting"] = mine
            b_holds.set()
            time.sleep(0.5)

    with copy.lock(0) as mine:
        assert mine
        waiter = threading.Thread(target=waiting_catch_up)
        waiter.start()
        time.sleep(0.2)  # it has opened the file and waits on it
        lock_file.unlink()  # as remove_standby_copies does, holding the lock
    assert b_holds.wait(5)
    with copy.lock(0) as third:
        got["third"] = third
    waiter.join()
    assert got == {"waiting": True, "third": False}


def test_a_gone_executors_copies_go_but_a_held_one_and_what_is_not_its_own_stay(
    tmp_path: Path,
) -> None:
    """A gone executor's directory: its copies and their locks go, also a lock whose copy was
    deleted before and a stray file or link (not the link's target); a copy another process
    holds stays with its lock until it is let go, then the directory goes."""
    from sparkpoint.model import TaskName
    from sparkpoint.storage.local import STANDBY_DIR, remove_standby_executor

    root = tmp_path / STANDBY_DIR / "9"
    (root / "Partition_0" / "user-counts").mkdir(parents=True)
    (root / "Partition_0.lock").touch()
    (root / "Partition_1.lock").touch()  # its copy was deleted before
    (root / "stray.tmp").write_text("x")
    (root / ".lock").touch()
    outside = tmp_path / "elsewhere"
    (outside / "keep").mkdir(parents=True)
    (root / "link").symlink_to(outside)
    held = StandbyCopy(tmp_path, "9", TaskName("Partition 2"))
    held.store_dir("user-counts").mkdir(parents=True)
    with held.lock(0) as mine:
        assert mine
        remove_standby_executor(tmp_path, "9")
        assert sorted(p.name for p in root.iterdir()) == ["Partition_2", "Partition_2.lock"]
        assert held.store_dir("user-counts").is_dir()
    assert (outside / "keep").is_dir()  # a link's target is not the executor's
    remove_standby_executor(tmp_path, "9")
    assert not root.exists()


def _clean_gone_executor(base: str, start: object, errors: object) -> None:
    from sparkpoint.storage.local import remove_standby_executor

    start.wait()  # type: ignore[attr-defined]
    try:
        remove_standby_executor(Path(base), "9")
    except Exception as exc:
        import traceback

        errors.put("".join(traceback.format_exception(exc)[-4:]))  # type: ignore[attr-defined]


def test_workers_that_clean_one_gone_executor_at_once_never_fail(tmp_path: Path) -> None:
    """An executor's catch-up runs in a partition per core, and each cleans the copies of
    executors that are gone: one removing the directory between another's making it and
    opening a lock file there failed that catch-up (FileNotFoundError; 167 of 300 rounds of 8
    processes in the reviewer's script)."""
    import multiprocessing

    from sparkpoint.storage.local import STANDBY_DIR, remove_standby_executor

    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for round_ in range(25):
        base = tmp_path / f"r{round_}"
        for i in range(3):
            (base / STANDBY_DIR / "9" / f"T{i}" / "s").mkdir(parents=True)
            (base / STANDBY_DIR / "9" / f"T{i}.lock").touch()
        start = ctx.Barrier(6)
        workers = [
            ctx.Process(target=_clean_gone_executor, args=(str(base), start, errors))
            for _ in range(6)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        assert [w.exitcode for w in workers] == [0] * 6
        remove_standby_executor(base, "9")  # whatever a late worker made again goes now
        assert not (base / STANDBY_DIR / "9").exists()
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []

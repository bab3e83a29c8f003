"""Standby copies (issue 35): caught up to the last written checkpoint and never past it, then
promoted by a restore that replays only the changelog after the copy's checkpoint and trims
what came after the checkpoint, as a changelog restore does.

One task's storage batch after batch, with no driver (:class:`tests.storage.cycle.TaskCycle`);
where the driver places copies and what its start removes is tests/runtime/driver/
test_standby*.py, an executor's catch-up of its copies tests/runtime/executor/test_standby.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.model import TaskModel
from sparkpoint.storage.kv.rocksdb import RocksDBEngine
from sparkpoint.storage.local import LocalTaskState, StandbyCopy
from sparkpoint.storage.restore import PROMOTED
from sparkpoint.storage.standby import catch_up, replication_factor
from sparkpoint.storage.state_id import EMPTY
from sparkpoint.storage.task_storage import TaskStorage
from sparkpoint.system.registry import Systems
from tests.helpers import changelog_job, changelog_view, live_counts
from tests.storage.cycle import TaskCycle, state_after

EXECUTOR = "7"
#: the jobs here keep standbys
STANDBYS = {"job.standbytasks.replication.factor": "2"}


def make(tmp_path: Path, **overrides: str) -> Config:
    """The example with a changelog, standbys and one task."""
    return changelog_job(tmp_path, None, 1, **{**STANDBYS, **overrides})


def commit(cycle: TaskCycle, batches: int) -> Checkpoint:
    """``batches`` more batches of the task, each committed; the last checkpoint."""
    for _ in range(batches):
        cycle.batch(wait=True)
    assert cycle.last is not None
    return cycle.last


def copy_counts(config: Config, task: TaskModel, *, live: bool = False) -> dict[str, int]:
    """The counts in the task's standby copy (``live``: in its live store)."""
    copy = StandbyCopy(config.store_base_dir, EXECUTOR, task.name)
    local = LocalTaskState(config.store_base_dir, task.name) if live else copy
    engine = RocksDBEngine("user-counts", local.store_dir("user-counts"))
    try:
        return {k.decode(): int.from_bytes(v, "big", signed=True) for k, v in engine.all()}
    finally:
        engine.close()


def seeded_then_behind(
    tmp_path: Path,
) -> tuple[Config, Systems, TaskModel, Checkpoint, Checkpoint, StandbyCopy]:
    """A task with a standby copy seeded at its checkpoint after 2 batches, then a checkpoint
    after 4 the copy has not caught up to: the config, systems, the task's model, both
    checkpoints, and the copy."""
    config = make(tmp_path)
    systems = Systems(config)
    cycle = TaskCycle(config)
    first = commit(cycle, 2)
    catch_up(config, systems, cycle.model, EXECUTOR, first, None)
    second = commit(cycle, 2)
    copy = StandbyCopy(config.store_base_dir, EXECUTOR, cycle.model.name)
    return config, systems, cycle.model, first, second, copy


def test_a_standby_catches_up_to_the_checkpoint_and_is_promoted_with_only_the_tail(
    tmp_path: Path,
) -> None:
    config = make(tmp_path)
    systems = Systems(config)
    cycle = TaskCycle(config)
    task = cycle.model
    first = commit(cycle, 2)
    seeded = catch_up(config, systems, task, EXECUTOR, first, None)
    assert seeded.seeded and seeded.source == "changelog"
    assert copy_counts(config, task) == state_after(2)

    second = commit(cycle, 2)
    caught = catch_up(config, systems, task, EXECUTOR, second, str(first.checkpoint_id))
    assert not caught.seeded
    assert caught.records > 0  # only the tail since the first
    assert copy_counts(config, task) == state_after(4)

    # the task goes on: a third checkpoint the copy never sees, then writes no checkpoint
    # covers (in the changelog only); then the executor with the live state is lost
    third = commit(cycle, 1)
    cycle.batch(commit=False)
    assert changelog_view(config) == state_after(6)
    shutil.rmtree(config.store_base_dir / task.name.name.replace(" ", "_"))

    storage = TaskStorage(config, systems, task, run_id="r2", last_checkpoint=third)
    assert not storage.open(EMPTY, [(EXECUTOR, str(second.checkpoint_id))])
    promoted = list(storage.restored)
    storage.close(EMPTY)
    assert {s.source for s in promoted} == {PROMOTED}
    assert sum(s.entries for s in promoted) > 0  # the third checkpoint's tail, no more
    assert live_counts(config) == state_after(5)  # exactly the committed state
    assert changelog_view(config) == state_after(5)  # the uncommitted writes were trimmed
    assert not StandbyCopy(config.store_base_dir, EXECUTOR, task.name).dir.exists()  # taken


def test_a_copy_at_another_checkpoint_than_offered_is_not_promoted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make(tmp_path)
    systems = Systems(config)
    cycle = TaskCycle(config)
    task = cycle.model
    first = commit(cycle, 2)
    catch_up(config, systems, task, EXECUTOR, first, None)
    shutil.rmtree(config.store_base_dir / task.name.name.replace(" ", "_"))
    storage = TaskStorage(config, systems, task, run_id="r2", last_checkpoint=first)
    assert not storage.open(EMPTY, [(EXECUTOR, "1-2-3-4")])  # the driver saw another position
    storage.close(EMPTY)
    assert [s.source for s in storage.restored] == ["changelog"]
    assert "not 1-2-3-4 as the driver saw" in caplog.text
    assert copy_counts(config, task, live=True) == state_after(2)


def test_a_copy_past_the_checkpoint_is_seeded_again(tmp_path: Path) -> None:
    """A copy whose position is past the checkpoint it is asked to reach (a checkpoint set
    back by a tool) would serve state the checkpoint does not hold: it is seeded again."""
    config = make(tmp_path)
    systems = Systems(config)
    cycle = TaskCycle(config)
    first = commit(cycle, 2)
    second = commit(cycle, 2)
    catch_up(config, systems, cycle.model, EXECUTOR, second, None)
    done = catch_up(config, systems, cycle.model, EXECUTOR, first, str(second.checkpoint_id))
    assert done.seeded
    assert copy_counts(config, cycle.model) == state_after(2)


def test_a_new_copy_is_seeded_from_the_blob_store_and_then_tails_the_changelog(
    tmp_path: Path,
) -> None:
    config = make(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": "blobstore,changelog",
            "stores.user-counts.restore.factories": "blobstore,changelog",
        },
    )
    systems = Systems(config)
    cycle = TaskCycle(config)
    first = commit(cycle, 2)
    seeded = catch_up(config, systems, cycle.model, EXECUTOR, first, None)
    assert (seeded.seeded, seeded.source) == (True, "blobstore")
    second = commit(cycle, 2)
    caught = catch_up(config, systems, cycle.model, EXECUTOR, second, seeded.checkpoint)
    assert (caught.seeded, caught.source) == (False, "changelog")
    assert caught.records > 0
    assert copy_counts(config, cycle.model) == state_after(4)


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


def test_a_catch_up_whose_copy_was_promoted_meanwhile_writes_no_copy_of_the_tail_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catch-up that outlives its failed Spark job can find its copy's store gone: promoted
    (renamed into the task's live state) after it checked the copy was there. It must not
    create the store afresh and replay the tail into it (a copy that then says it is at the
    checkpoint, with only the tail's keys): it fails, and the driver seeds the copy again."""
    from sparkpoint.errors import StoreError

    config, systems, task, first, second, copy = seeded_then_behind(tmp_path)
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
    assert copy_counts(config, task) == state_after(4)


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

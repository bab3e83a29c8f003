"""An executor's catch-up of the standby copies it keeps
(:mod:`sparkpoint.runtime.executor.standby`): what it deletes, and what it leaves to another
process; the tasks' storage is run batch after batch without a driver
(:class:`tests.storage.cycle.TaskCycle`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkpoint.storage.standby import catch_up
from sparkpoint.storage.state_id import EMPTY
from sparkpoint.storage.task_storage import TaskStorage
from sparkpoint.system.registry import Systems
from tests.helpers import changelog_job
from tests.storage.cycle import TaskCycle, state_after
from tests.storage.test_standby import EXECUTOR, STANDBYS, copy_counts, seeded_then_behind


def test_an_executors_catch_up_deletes_what_it_no_longer_keeps_and_goes_on_past_a_failure(
    tmp_path: Path,
) -> None:
    from sparkpoint.checkpoint.checkpoint import CheckpointV2
    from sparkpoint.checkpoint.id import CheckpointId
    from sparkpoint.metadata.locality import Executor
    from sparkpoint.runtime.executor.standby import run_standby
    from sparkpoint.runtime.plan import StandbyPlan, StandbyTarget
    from sparkpoint.storage.local import standby_tasks

    config = changelog_job(tmp_path, None, 4, **STANDBYS)
    systems = Systems(config)
    cycles = [TaskCycle(config, f"Partition {p}") for p in range(4)]
    for cycle in cycles:
        cycle.batch(wait=True)
    tasks = {c.model.name.name: c.model for c in cycles}
    cps = {c.model.name.name: c.last for c in cycles if c.last is not None}
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
    assert copy_counts(config, tasks[first]) == state_after(1)


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
    config, systems, task, first, second, copy = seeded_then_behind(tmp_path)
    name = task.name.name
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
    assert copy_counts(config, task, live=True) == state_after(4)
    assert copy.position() == position  # the copy is still there, for a later promotion
    run_standby(replace(plan, copies=[], live=["8"]))  # no longer held: a gone executor's go
    assert copy.position() is None and not copy.dir.parent.exists()

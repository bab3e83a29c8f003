"""Where standby copies are kept and which one a task is promoted on (no Spark): the driver's
rules of :mod:`sparkpoint.runtime.driver.standby` and host affinity's promotion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import Config, load_config
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.locality import Executor, task_standbys
from sparkpoint.model import TaskModel, TaskName
from sparkpoint.runtime.driver.placement import PROMOTED, Placement
from sparkpoint.runtime.driver.standby import Standbys, records_behind
from sparkpoint.runtime.plan import StandbyResult
from sparkpoint.storage.changelog.backend import changelog_ssp
from sparkpoint.storage.changelog.marker import ChangelogMarker
from tests.conftest import pageviews_config

A1, A2 = Executor("0", "host-a"), Executor("3", "host-a")
B, C = Executor("1", "host-b"), Executor("2", "host-c")
TASKS = [f"Partition {i}" for i in range(4)]


def config_of(tmp_path: Path, factor: int = 2) -> Config:
    return load_config(
        None,
        base=pageviews_config(
            tmp_path,
            **{
                "stores.user-counts.changelog": "filelog.user-counts-changelog",
                "job.standbytasks.replication.factor": str(factor),
            },
        ),
    )


def standbys_of(config: Config) -> Standbys:
    tasks = {t: TaskModel(TaskName(t), frozenset(), i) for i, t in enumerate(TASKS)}
    return Standbys(config, CoordinatorStreamStore(config), tasks)


def done(task: str, checkpoint_id: str) -> StandbyResult:
    """A copy on executor B seeded to ``checkpoint_id``."""
    return StandbyResult(task, checkpoint_id, True, "changelog", executor=B.id)


def checkpoint(config: Config, task: int, offset: int) -> CheckpointV2:
    ssp = changelog_ssp(config, "user-counts", task)
    marker = ChangelogMarker(ssp, str(offset)).dumps()
    return CheckpointV2(CheckpointId.create(), {}, {"changelog": {"user-counts": marker}})


def test_copies_go_to_other_hosts_first_and_are_spread(tmp_path: Path) -> None:
    s = standbys_of(config_of(tmp_path))
    assignment = {"Partition 0": A1, "Partition 1": A1, "Partition 2": B, "Partition 3": C}
    s.place([A1, A2, B, C], assignment)
    for task, own in assignment.items():
        (copy,) = s.copies[task]
        assert copy.executor != own and copy.executor.host != own.host
    assert s.copies["Partition 0"][0].executor != s.copies["Partition 1"][0].executor


def test_a_copy_on_its_task_s_host_moves_when_another_host_can_keep_it(tmp_path: Path) -> None:
    """A copy placed on its task's host while no other host existed, or whose task moved onto
    its host, goes to another host once one can keep it: one host's loss must not take a
    task's state and its only copy together."""
    s = standbys_of(config_of(tmp_path))
    s.place([A1, A2], dict.fromkeys(TASKS, A1))
    assert all(c.executor == A2 for copies in s.copies.values() for c in copies)  # the best
    s.place([A1, A2, B], dict.fromkeys(TASKS, A1))  # host-b joins
    assert all([c.executor for c in s.copies[t]] == [B] for t in TASKS)
    moved = dict.fromkeys(TASKS, Executor("4", "host-b"))  # the tasks move onto host-b
    s.place([A1, B, moved[TASKS[0]]], moved)
    assert all([c.executor.host for c in s.copies[t]] == ["host-a"] for t in TASKS)


def test_one_executor_cannot_keep_standbys_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = standbys_of(config_of(tmp_path))
    s.place([A1], dict.fromkeys(TASKS, A1))
    assert all(not c for c in s.copies.values())
    assert "1 live executor(s) can keep only 0 standby(s) per task, not 1" in caplog.text
    assert "cannot be placed" in caplog.text


def test_a_lost_executor_promotes_its_tasks_on_their_most_current_copy(tmp_path: Path) -> None:
    config = config_of(tmp_path, factor=3)
    s = standbys_of(config)
    placement = Placement({t: A1 for t in TASKS})
    s.place([A1, B, C], placement.assignment)
    # every copy on B reached the checkpoint; those on C are one checkpoint behind
    older = {t: checkpoint(config, i, 10) for i, t in enumerate(TASKS)}
    cps = {t: checkpoint(config, i, 40 + i) for i, t in enumerate(TASKS)}
    results = [
        StandbyResult(
            t, str((cps if e == B else older)[t].checkpoint_id), False, "x", executor=e.id
        )
        for t in TASKS
        for e in (B, C)
    ]
    for r in results:
        r.offsets = {"user-counts": "10" if r.executor == C.id else str(40 + TASKS.index(r.task))}
    s.caught_up(results, cps)
    assert s.lags() == dict.fromkeys(TASKS, 0)
    assert {t: [c.lag for c in s.copies[t]] for t in TASKS} == {
        t: [0, 30 + i] for i, t in enumerate(TASKS)
    }
    live = [B, C]  # A1 is lost
    moves = placement.place(TASKS, live, standbys=s.promotion(live))
    assert {m.new for m in moves} == {B}
    assert all(PROMOTED in m.reason for m in moves)
    offers = s.offers()
    assert offers["Partition 0"][0] == (B.id, str(cps["Partition 0"].checkpoint_id))
    s.place(live, placement.assignment)  # the copies on B were taken by their tasks
    assert {t: [c.executor for c in s.copies[t]] for t in TASKS} == {t: [C] for t in TASKS}
    shown = task_standbys(s.store)
    assert shown["Partition 1"][0]["lag"] == 0


def test_a_copy_run_elsewhere_or_in_a_failed_job_is_seeded_again(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    s = standbys_of(config)
    s.place([A1, B], dict.fromkeys(TASKS, A1))
    cps = {t: checkpoint(config, i, 5) for i, t in enumerate(TASKS)}
    plans = s.plans(config.to_dict(), cps, [A1, B])
    assert [p.executor for p in plans] == [B]
    assert all(t.at is None for t in plans[0].copies)
    ran = [done(t, str(cps[t].checkpoint_id)) for t in TASKS]
    ran[0].ran_on = A1  # Spark ran the catch-up elsewhere
    s.caught_up(ran, cps)
    assert [c.at for c in s.copies["Partition 0"]] == [None]
    assert s.copies["Partition 1"][0].at == str(cps["Partition 1"].checkpoint_id)
    again = s.plans(config.to_dict(), cps, [A1, B])
    assert [(t.task.name.name, t.at) for t in again[0].copies] == [("Partition 0", None)]
    assert again[0].keep == tuple(TASKS)  # B keeps the others' copies: not deleted there
    assert [len(p.copies) for p in plans[0].split(3)] == [2, 1, 1]  # a partition per core
    known = {t: [c.at for c in s.copies[t]] for t in TASKS}
    s.failed(again, "ExecutorLost")  # each copy's POSITION says if it changed: kept as known
    assert {t: [c.at for c in s.copies[t]] for t in TASKS} == known
    s.failed(again, "ExecutorLost")
    s.failed(again, "ExecutorLost")  # the third in a row: no more standbys in this run
    assert not s.enabled and all(not c for c in s.copies.values())


def test_a_copy_that_keeps_failing_is_given_up_with_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_of(tmp_path)
    s = standbys_of(config)
    s.place([A1, B], dict.fromkeys(TASKS, A1))
    cps = {t: checkpoint(config, i, 5) for i, t in enumerate(TASKS)}
    for attempt in range(3):
        results = [done(t, str(cps[t].checkpoint_id)) for t in TASKS]
        results[0] = StandbyResult("Partition 0", "", False, "", executor=B.id, error="x")
        s.caught_up(results, cps)
        s.place([A1, B], dict.fromkeys(TASKS, A1))
        assert bool(s.copies["Partition 0"]) == (attempt < 2)
    assert "failed 3 catch-ups in a row (last: x)" in caplog.text
    assert s.given_up == {"Partition 0"} and s.copies["Partition 1"][0].at is not None


def test_a_copy_another_process_held_is_kept_and_counted_apart_from_failures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A catch-up that found its copy's lock held (a task taking it, a stray catch-up) left
    the copy as it is: the driver keeps what it knew (checkpoint, offsets, checked), and it
    counts neither as a failure nor resets them; only a holder that never lets go (3 in a
    row) gives the task's standbys up, with an ERROR naming the lock."""
    config = config_of(tmp_path)
    s = standbys_of(config)
    s.place([A1, B], dict.fromkeys(TASKS, A1))
    cps = {t: checkpoint(config, i, 5) for i, t in enumerate(TASKS)}
    ok = done("Partition 0", str(cps["Partition 0"].checkpoint_id))
    ok.offsets = {"user-counts": "5"}
    s.caught_up([ok], cps)
    in_use = "StandbyCopyInUse: in use by another process"
    busy = StandbyResult("Partition 0", "", False, "", executor=B.id, error=in_use, busy=True)
    failed = StandbyResult("Partition 0", "", False, "", executor=B.id, error="x")
    s.caught_up([busy], cps)
    [copy] = s.copies["Partition 0"]
    assert (copy.at, copy.offsets, copy.checked) == (ok.checkpoint, ok.offsets, True)
    assert (copy.failures, copy.busy) == (0, 1)
    for result in (busy, failed, busy, busy, failed):  # never 3 of either in a row
        s.caught_up([result], cps)
        s.place([A1, B], dict.fromkeys(TASKS, A1))
    [copy] = s.copies["Partition 0"]
    assert s.given_up == set() and (copy.failures, copy.busy) == (2, 0)
    assert "was in use by another process" in caplog.text
    s.caught_up([ok], cps)  # caught up: both counts start again
    assert (s.copies["Partition 0"][0].failures, s.copies["Partition 0"][0].busy) == (0, 0)
    for _ in range(3):
        s.caught_up([busy], cps)
    assert s.given_up == {"Partition 0"} and s.copies["Partition 0"] == []
    assert "in use by another process in 3 catch-ups in a row" in caplog.text
    assert ".lock file" in caplog.text


def test_a_promoted_copy_is_no_longer_kept(tmp_path: Path) -> None:
    config = config_of(tmp_path, factor=3)
    s = standbys_of(config)
    s.place([A1, B, C], dict.fromkeys(TASKS, A1))
    s.taken("Partition 2", C.id)  # its restore took the copy kept for C (a shared directory)
    assert [c.executor for c in s.copies["Partition 2"]] == [B]


def test_with_state_per_host_a_lost_executor_stays_on_its_host(tmp_path: Path) -> None:
    placement = Placement({t: A1 for t in TASKS})
    standby = dict.fromkeys(TASKS, B)
    moves = placement.place(TASKS, [A2, B], standbys=standby, state_per_host=True)
    assert {m.new for m in moves} == {A2}  # its live state is on host-a's shared directory
    placement = Placement({t: A1 for t in TASKS})
    moves = placement.place(TASKS, [A2, B], standbys=standby)
    assert {m.new for m in moves} == {B}  # a directory per executor: promoted on its standby


def test_records_behind_counts_changelog_offsets() -> None:
    assert records_behind({"a": "10", "b": None}, {"a": "4", "b": None}) == 6
    assert records_behind({"a": "3"}, {"a": None}) == 4  # a copy with nothing yet
    assert records_behind({"a": "x"}, {"a": "1"}) is None


def test_a_rebalance_onto_a_copy_takes_it_and_places_a_new_one(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    s = standbys_of(config)
    placement = Placement({t: A1 for t in TASKS})
    s.place([A1, B], placement.assignment)
    cps = {t: checkpoint(config, i, 7) for i, t in enumerate(TASKS)}
    s.caught_up([done(t, str(cps[t].checkpoint_id)) for t in TASKS], cps)
    moves = placement.place(TASKS, [A1, B, C], rebalance=True)  # C joined
    moved = {m.task: m.new for m in moves}
    assert moved and set(moved.values()) <= {B, C}
    offers = s.offers()
    for task, new in moved.items():
        if new == B:  # its copy is there: its restore there promotes it
            assert offers[task] == ((B.id, str(cps[task].checkpoint_id)),)
    s.place([A1, B, C], placement.assignment)
    for task in TASKS:
        (copy,) = s.copies[task]
        assert copy.executor != placement.assignment[task]


def test_a_restarted_driver_keeps_the_copies_at_their_tasks_checkpoints_once_checked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The last run's copies at their tasks' current checkpoints are kept, not seeded again:
    the first catch-up checks each on its executor (at the checkpoint: nothing to replay), and
    only then may it be promoted. Copies at another checkpoint, or of a task with none, go."""
    config = config_of(tmp_path)
    first = standbys_of(config)
    first.place([A1, B], dict.fromkeys(TASKS, A1))
    cps = {t: checkpoint(config, i, 5) for i, t in enumerate(TASKS)}
    first.caught_up([done(t, str(cps[t].checkpoint_id)) for t in TASKS], cps)
    assert all(c.at for t in TASKS for c in first.copies[t])
    first.store.close()

    now = {**cps, "Partition 2": checkpoint(config, 2, 9), "Partition 3": None}
    tasks = {t: TaskModel(TaskName(t), frozenset(), i) for i, t in enumerate(TASKS)}
    caplog.set_level("INFO")
    second = Standbys(config, CoordinatorStreamStore(config), tasks, now)
    assert "2 copies of the last run kept at their tasks' checkpoints" in caplog.text
    assert "2 to seed again" in caplog.text
    kept = {t: [(c.executor, c.at, c.checked) for c in second.copies[t]] for t in TASKS}
    assert kept == {
        "Partition 0": [(B, str(cps["Partition 0"].checkpoint_id), False)],
        "Partition 1": [(B, str(cps["Partition 1"].checkpoint_id), False)],
        "Partition 2": [],
        "Partition 3": [],
    }
    shown = task_standbys(second.store)["Partition 0"][0]  # job show: no lag until checked
    assert (shown["executor"], shown["lag"]) == (B.id, None)
    assert second.lags() == {}
    assert second.offers() == {} and second.promotion([B]) == {}  # not before it is checked
    assert second.plans(config.to_dict(), now, []) == []  # executors not known yet: no judge
    second.place([A1, B], dict.fromkeys(TASKS, A1))  # the same executor ids and hosts live
    (plan,) = second.plans(config.to_dict(), now, [A1, B])
    targets = {t.task.name.name: t.at for t in plan.copies}
    assert targets == {
        "Partition 0": str(cps["Partition 0"].checkpoint_id),  # checked at its checkpoint
        "Partition 1": str(cps["Partition 1"].checkpoint_id),
        "Partition 2": None,  # seeded
    }
    ran = [
        StandbyResult(t, str(now[t].checkpoint_id), t == "Partition 2", "changelog", executor=B.id)
        for t in targets
    ]
    for r in ran:  # each copy's changelog offset: its checkpoint's
        r.offsets = {"user-counts": "9" if r.task == "Partition 2" else "5"}
    second.caught_up(ran, now)
    assert set(second.offers()) == {"Partition 0", "Partition 1", "Partition 2"}
    assert second.plans(config.to_dict(), now, [A1, B]) == []  # all at their checkpoints
    assert second.lags()["Partition 0"] == 0
    elsewhere = Standbys(config, CoordinatorStreamStore(config), tasks, now)
    assert elsewhere.copies["Partition 0"]  # kept, for B (id 1 on host-b)
    moved = Executor(B.id, "host-z")  # the next application's executor 1 runs elsewhere
    elsewhere.place([A1, moved], dict.fromkeys(TASKS, A1))
    assert all([c.executor for c in elsewhere.copies[t]] == [moved] for t in TASKS)
    assert all(c.at is None for t in TASKS for c in elsewhere.copies[t])  # all seeded


def test_a_damaged_record_of_the_last_runs_copies_is_skipped(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    store = CoordinatorStreamStore(config)
    cps = {t: checkpoint(config, i, 5) for i, t in enumerate(TASKS)}
    at = str(cps["Partition 0"].checkpoint_id)
    store.put_all(
        "task-standbys",
        {
            "Partition 0": json.dumps(["not a copy", {"checkpoint": at}, {"executor": "1"}]),
            "Partition 1": json.dumps([{"executor": 1, "host": "h", "checkpoint": at}]),
        },
    )
    store.flush()
    tasks = {t: TaskModel(TaskName(t), frozenset(), i) for i, t in enumerate(TASKS)}
    s = Standbys(config, store, tasks, cps)
    assert all(not c for c in s.copies.values())


def test_a_task_whose_changelog_was_lost_keeps_none_of_the_last_runs_copies(
    tmp_path: Path,
) -> None:
    """A task that restores from scratch at a start (its changelog ends before its
    checkpoint) cannot vouch for a copy by its checkpoint: the copy's changelog offsets belong
    to the lost changelog. Its copies are seeded again; the other tasks keep theirs."""
    from sparkpoint.checkpoint.manager import CheckpointManager
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.runtime.driver.inline import InlineRunner
    from sparkpoint.system.base import StreamSpec
    from sparkpoint.system.registry import Systems
    from tests.helpers import generate

    config = config_of(tmp_path)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(config, tmp_path / "job.yaml", 400, seed=5)
    first = JobCoordinator(config, InlineRunner())
    first.run(until_caught_up=True)
    first.close()
    cps = {t.name: c for t, c in CheckpointManager(config).read_all().items()}
    store = CoordinatorStreamStore(config)
    copies = {
        t: [{"executor": B.id, "host": B.host, "checkpoint": str(c.checkpoint_id)}]
        for t, c in cps.items()
    }
    store.put_all("task-standbys", {t: json.dumps(c) for t, c in copies.items()})
    store.flush()
    store.close()
    lost = changelog_ssp(config, "user-counts", 2)
    partition = Path(config.require("systems.filelog.path")) / lost.stream / "2"
    assert list(partition.glob("*.log"))
    for f in partition.glob("*"):  # Partition 2's changelog: emptied while the job stopped
        if f.name != "CURRENT":
            f.write_bytes(b"")

    second = JobCoordinator(config, InlineRunner())
    second.start()
    assert second.standbys is not None
    kept = {t: [c.executor for c in second.standbys.copies[t]] for t in TASKS}
    second.close()
    assert kept == {"Partition 0": [B], "Partition 1": [B], "Partition 2": [], "Partition 3": [B]}


def test_the_catch_up_after_a_batch_that_lost_an_executor_leaves_that_executor_out(
    tmp_path: Path,
) -> None:
    """An executor lost while a batch ran (its tasks done already): the catch-up after the
    batch is planned on the executors alive then. Planned on those of the batch's start, its
    Spark job held a partition for the lost executor for spark.locality.wait (30 s)."""
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.runtime.driver.inline import InlineRunner
    from sparkpoint.runtime.plan import StandbyPlan, TaskBatchPlan, TaskBatchResult
    from sparkpoint.system.base import StreamSpec
    from sparkpoint.system.registry import Systems
    from tests.helpers import generate

    class Runner(InlineRunner):
        places_tasks = True

        def __init__(self) -> None:
            self.live = [A1, B, C]
            self.planned: list[set[Executor]] = []

        def executors(self) -> list[Executor]:
            return list(self.live)

        def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
            results = super().__call__(batch, plans)
            self.live = [A1, B]  # C is lost while the batch runs
            return results

        def catch_up(self, plans: list[StandbyPlan]) -> list[StandbyResult]:
            self.planned.append({p.executor for p in plans})
            return []

    config = config_of(tmp_path)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(config, tmp_path / "job.yaml", 400, seed=7)
    runner = Runner()
    job = JobCoordinator(config, runner)
    job.start()
    try:
        meta = job.partition_metadata(job.all_ssps())
        job.run_batch({s: m.upcoming for s, m in meta.items()}, commit=True)
    finally:
        job.close()
    assert runner.planned and all(C not in executors for executors in runner.planned)
    assert job.standbys is not None
    assert all(c.executor != C for copies in job.standbys.copies.values() for c in copies)

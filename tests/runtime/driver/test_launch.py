"""Starting a job while Spark starts: the driver restores every task's state ahead of the first
batch in local mode, and the first batch keeps it (no Spark here: a stand-in session)."""

from __future__ import annotations

import os
import shutil
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.config import Config, load_config
from sparkpoint.model import TaskName
from sparkpoint.runtime.driver import launch
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner, LocalPoolRunner, ThreadPoolRunner
from sparkpoint.runtime.plan import TaskBatchPlan, TaskBatchResult
from sparkpoint.storage.local import LocalTaskState
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from tests.conftest import pageviews_config
from tests.helpers import committed_counts, generate

CHANGELOG = {"stores.user-counts.changelog": "filelog.user-counts-changelog"}


class Recording:
    """The job's runner: the executor code in this process, keeping every batch's results."""

    def __init__(self) -> None:
        self.batches: list[list[TaskBatchResult]] = []
        self.ids: list[int] = []

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        self.ids.append(batch)
        results = InlineRunner()(batch, plans)
        self.batches.append(results)
        return results

    def restored_tasks(self) -> set[str]:
        return {r.task for results in self.batches for r in results if r.restored}


class Session:
    """Stands in for a Spark session: released by the test, stopped at most once."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1


def ran_to_the_end(config: Config, tmp_path: Path, seed: int) -> Counter[str]:
    """1,500 views in 4 partitions, run to the end in this process; the counts they make."""
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    expected = generate(config, tmp_path / "job.yaml", 1500, seed=seed)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.run(until_caught_up=True)
    coordinator.close()
    return expected


def assert_the_next_run_keeps_the_state(config: Config, expected: Counter[str]) -> None:
    """A run after the restore ahead restores nothing (it keeps that state) and counts right."""
    runner = Recording()
    coordinator = JobCoordinator(config, runner)
    coordinator.run(until_caught_up=True)
    coordinator.close()
    assert runner.restored_tasks() == set()
    assert committed_counts(config) == dict(expected)


def lost_host(tmp_path: Path, **overrides: str) -> tuple[Config, dict[str, int]]:
    """A job that ran to its end, then lost its state directory, with 500 more views waiting;
    the counts it must end with."""
    config = load_config(None, pageviews_config(tmp_path, **CHANGELOG, **overrides))
    expected = ran_to_the_end(config, tmp_path, seed=5)
    shutil.rmtree(config.store_base_dir)
    expected += generate(config, tmp_path / "job.yaml", 500, seed=6)
    return config, dict(expected)


def test_state_restored_ahead_is_kept_by_the_first_batch(tmp_path: Path) -> None:
    config, expected = lost_host(tmp_path)
    runner = Recording()
    coordinator = JobCoordinator(config, runner)
    report = coordinator.restore_ahead(InlineRunner())
    assert report is not None
    assert {task for task, _ in report.restored} == set(coordinator.tasks)
    assert all(stats.source == "changelog" for _, stats in report.restored)
    assert runner.batches == []
    coordinator.run(until_caught_up=True)
    coordinator.close()
    assert runner.restored_tasks() == set()
    assert runner.ids[0] == 1  # the pass ahead takes no batch id: errors still name batch 1
    assert committed_counts(config) == expected


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Session:
    fake = Session()

    def spark_session(config: Config, master: str | None = None) -> Session:
        assert fake.ready.wait(30), "the test never released the session"
        return fake

    monkeypatch.setattr(launch, "spark_session", spark_session)
    return fake


def test_a_local_job_restores_before_spark_has_started(tmp_path: Path, session: Session) -> None:
    config, expected = lost_host(tmp_path)
    runner = Recording()
    made: list[Any] = []

    def make(spark: Any) -> Recording:
        made.append(spark)
        return runner

    coordinator, start = launch.start_job(config, "local[2]", make)
    assert made == []  # the session is still starting: the state was restored without it
    restored = {p.parent.name for p in config.store_base_dir.glob("*/user-counts")}
    assert len(restored) == 4
    session.ready.set()
    coordinator.run(until_caught_up=True)
    coordinator.close()
    start.stop()
    assert made == [session]
    assert session.stopped == 1
    assert runner.restored_tasks() == set()  # no batch restored: the state was current
    assert committed_counts(config) == expected


@pytest.mark.parametrize(
    ("master", "overrides"),
    [
        ("spark://127.0.0.1:7077", {}),  # a cluster: the state belongs on the executors
        ("local[2]", {"job.restore.while.spark.starts": "false"}),
    ],
)
def test_the_executors_restore_on_a_cluster_or_when_turned_off(
    tmp_path: Path, session: Session, master: str, overrides: dict[str, str]
) -> None:
    config, expected = lost_host(tmp_path, **overrides)
    runner = Recording()
    session.ready.set()
    coordinator, start = launch.start_job(config, master, lambda _spark: runner)
    assert not list(config.store_base_dir.glob("*/user-counts"))
    coordinator.run(until_caught_up=True)
    coordinator.close()
    start.stop()
    assert len(runner.restored_tasks()) == 4
    assert committed_counts(config) == expected


@pytest.mark.parametrize(("master", "in_driver"), [("local[2]", True), ("spark://h:7077", False)])
def test_the_last_pass_runs_in_the_driver_in_local_mode_only(
    tmp_path: Path,
    session: Session,
    master: str,
    in_driver: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, expected = lost_host(tmp_path)
    runner = Recording()
    driver = Recording()  # what start_job runs in the driver's process
    monkeypatch.setattr(launch, "InlineRunner", lambda: driver)
    session.ready.set()
    coordinator, start = launch.start_job(config, master, lambda _spark: runner)
    coordinator.run(until_caught_up=True)
    coordinator.close()
    start.stop()
    last = runner.batches[-1]
    only_clean_up = all(r.processed == 0 and not r.commit_started for r in last)
    assert only_clean_up is not in_driver  # in local mode Spark's last batch is one that read
    after_spark = [b for b in driver.ids if b > max(runner.ids)]
    assert after_spark == ([max(runner.ids) + 1] if in_driver else [])
    assert any(r.processed for results in runner.batches for r in results)
    assert committed_counts(config) == expected
    # the pass cleaned up after the final checkpoint wherever it ran: one local checkpoint
    for task_dir in config.store_base_dir.iterdir():
        checkpoints = list((task_dir / "user-counts.checkpoints").iterdir())
        assert len(checkpoints) == 1, checkpoints


def test_a_spark_that_fails_to_start_fails_the_first_batch_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = lost_host(tmp_path)

    def spark_session(config: Config, master: str | None = None) -> Any:
        raise RuntimeError("JAVA_HOME is not set")

    monkeypatch.setattr(launch, "spark_session", spark_session)
    coordinator, start = launch.start_job(config, "local[2]", lambda _spark: InlineRunner())
    with pytest.raises(RuntimeError, match="JAVA_HOME is not set"):
        coordinator.run(until_caught_up=True)
    coordinator.close()
    start.stop()  # nothing to stop, and no second error


class SlowStop:
    """A session whose stop takes a while (as pyspark's does, up to a second)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.stopped = threading.Event()

    def stop(self) -> None:
        assert self.release.wait(30)
        self.stopped.set()


def test_a_stop_without_waiting_returns_at_once_and_still_stops_the_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow = SlowStop()
    monkeypatch.setattr(launch, "spark_session", lambda config, master=None: slow)
    start = launch.SparkStart(Config({"job.name": "j"}), "local[2]")
    start.session()
    start.stop(wait=False)
    assert not slow.stopped.is_set()  # returned while the session was still stopping
    slow.release.set()
    assert slow.stopped.wait(30)


def test_a_stop_waits_for_the_session_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    slow = SlowStop()
    monkeypatch.setattr(launch, "spark_session", lambda config, master=None: slow)
    start = launch.SparkStart(Config({"job.name": "j"}), "local[2]")
    threading.Timer(0.2, slow.release.set).start()
    start.stop()
    assert slow.stopped.is_set()


@pytest.mark.parametrize(
    ("master", "cores"),
    [("local[3]", 3), ("local", 1), ("local[*]", os.cpu_count() or 1), ("local[2,4]", 2)],
)
def test_the_driver_restores_with_as_many_processes_as_local_spark_has_cores(
    master: str, cores: int, session: Session, tmp_path: Path
) -> None:
    session.ready.set()
    config = load_config(None, pageviews_config(tmp_path))
    assert launch.SparkStart(config, master).local_cores == cores


def test_a_pool_of_processes_restores_what_the_tasks_would_restore_in_process(
    tmp_path: Path,
) -> None:
    config, expected = lost_host(tmp_path)
    runner = Recording()
    coordinator = JobCoordinator(config, runner)
    report = coordinator.restore_ahead(LocalPoolRunner(2))
    assert report is not None
    restored = sorted((task, stats.source, stats.entries) for task, stats in report.restored)
    assert [t for t, _s, _e in restored] == sorted(coordinator.tasks)
    assert {s for _t, s, _e in restored} == {"changelog"}
    assert all(entries > 0 for _t, _s, entries in restored)
    coordinator.run(until_caught_up=True)
    coordinator.close()
    assert runner.restored_tasks() == set()  # the state the pool restored was kept
    assert committed_counts(config) == expected


class Keeping:
    """Keeps the results the restore ahead's runner returns."""

    def __init__(self, runner: launch.RestoreRunner) -> None:
        self.runner = runner
        self.results: list[TaskBatchResult] = []

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        self.results = self.runner(batch, plans)
        return self.results


def test_only_the_tasks_that_lost_their_state_restore_in_other_processes(tmp_path: Path) -> None:
    config = load_config(None, pageviews_config(tmp_path, **CHANGELOG))
    expected = ran_to_the_end(config, tmp_path, seed=7)
    lost = {"Partition 0", "Partition 2"}
    for task in lost:
        shutil.rmtree(LocalTaskState(config.store_base_dir, TaskName(task)).dir)
    coordinator = JobCoordinator(config, Recording())
    keeping = Keeping(launch.RestoreRunner(2))
    coordinator.restore_ahead(keeping)
    coordinator.close()
    here = f":{os.getpid()}"
    assert {r.task for r in keeping.results if not r.executor.endswith(here)} == lost
    assert {r.task for r in keeping.results if r.restored} == lost
    assert committed_counts(config) == dict(expected)


def test_a_restart_on_the_same_host_relinks_its_checkpoints_in_this_process(
    tmp_path: Path,
) -> None:
    """A SIGKILL after batches no checkpoint covers: the live stores are not the checkpoint's,
    but every store's local copy of it is on disk. Linking it back fetches nothing, so no
    process is spawned for it; the tasks that lost their directories still restore in one."""
    config = load_config(None, pageviews_config(tmp_path, **CHANGELOG))
    expected = ran_to_the_end(config, tmp_path, seed=8)
    tasks = [LocalTaskState(config.store_base_dir, TaskName(f"Partition {p}")) for p in range(4)]
    for task in tasks:
        task.clear_marker()  # the live stores moved on past the checkpoint, as a batch does
    for lost in tasks[2:]:  # two: the pool runs a single plan in this process
        shutil.rmtree(lost.dir)
    expected += generate(config, tmp_path / "job.yaml", 300, seed=9)
    coordinator = JobCoordinator(config, Recording())
    keeping = Keeping(launch.RestoreRunner(2))
    coordinator.restore_ahead(keeping)
    coordinator.close()
    here = f":{os.getpid()}"
    in_driver = {r.task for r in keeping.results if r.executor.endswith(here)}
    assert in_driver == {"Partition 0", "Partition 1"}
    sources = {r.task: {s.source for s in r.restored} for r in keeping.results}
    assert sources == {
        "Partition 0": {"local-checkpoint"},
        "Partition 1": {"local-checkpoint"},
        "Partition 2": {"changelog"},
        "Partition 3": {"changelog"},
    }
    assert_the_next_run_keeps_the_state(config, expected)


BLOBSTORE = {
    "stores.user-counts.changelog": "",
    "stores.user-counts.backup.factories": "blobstore",
}


DUAL = {**CHANGELOG, "stores.user-counts.backup.factories": "blobstore,changelog"}


@pytest.mark.parametrize(
    ("overrides", "on", "source"),
    [
        (BLOBSTORE, "threads", "blobstore"),
        (CHANGELOG, "processes", "changelog"),
        # may fall back to the changelog: processes, though the blob store restores it
        (DUAL, "processes", "blobstore"),
    ],
)
def test_blob_store_restores_run_on_threads_changelog_ones_in_processes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, str],
    on: str,
    source: str,
) -> None:
    """A blob store restore is file transfers, with the GIL released: the lost tasks restore
    on threads of the driver, sparing a process spawn each. A changelog restore decodes
    records in Python, so a task that may restore from one keeps its process."""
    config = load_config(None, pageviews_config(tmp_path, **overrides))
    expected = ran_to_the_end(config, tmp_path, seed=7)
    shutil.rmtree(config.store_base_dir)
    used: dict[str, list[str]] = {"threads": [], "processes": []}

    def recording(kind: str, real: Any) -> Any:
        def make(workers: int) -> Any:
            def run(batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
                used[kind] += [p.task.name.name for p in plans]
                return real(workers)(batch, plans)

            return run

        return make

    monkeypatch.setattr(launch, "ThreadPoolRunner", recording("threads", ThreadPoolRunner))
    monkeypatch.setattr(launch, "LocalPoolRunner", recording("processes", LocalPoolRunner))
    coordinator = JobCoordinator(config, Recording())
    keeping = Keeping(launch.RestoreRunner(2))
    coordinator.restore_ahead(keeping)
    coordinator.close()
    assert sorted(used[on]) == sorted(coordinator.tasks)
    assert [t for kind, tasks in used.items() if kind != on for t in tasks] == []
    in_driver = {r.task for r in keeping.results if r.executor.endswith(f":{os.getpid()}")}
    assert in_driver == (set(coordinator.tasks) if on == "threads" else set())
    assert {s.source for r in keeping.results for s in r.restored} == {source}
    assert_the_next_run_keeps_the_state(config, expected)


def test_a_new_job_creates_its_stores_in_this_process(tmp_path: Path) -> None:
    """No checkpoint, nothing to fetch: no process is spawned (each would import the job and
    sparkpoint again while the JVM starts), and the first batch keeps the stores made here."""
    config = load_config(None, pageviews_config(tmp_path, **CHANGELOG))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    expected = generate(config, tmp_path / "job.yaml", 400, seed=5)
    runner = Recording()
    coordinator = JobCoordinator(config, runner)
    keeping = Keeping(launch.RestoreRunner(2))
    coordinator.restore_ahead(keeping)
    here = f":{os.getpid()}"
    assert len(keeping.results) == 4
    assert all(r.executor.endswith(here) for r in keeping.results)
    coordinator.run(until_caught_up=True)
    coordinator.close()
    assert runner.restored_tasks() == set()
    assert committed_counts(config) == dict(expected)


@pytest.mark.parametrize(
    ("sql", "master", "started"),
    [
        (True, "local[2]", "session"),
        (False, "local[2]", "context"),
        (False, "spark://127.0.0.1:7077", "session"),  # its executors register meanwhile
    ],
)
def test_a_local_task_job_starts_the_spark_context_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sql: bool, master: str, started: str
) -> None:
    """A task API job (``sql=False``) in local mode runs on the SparkContext; only a pipeline
    needs the SQL session, which takes a second or more to start. On a cluster that second
    lets the executors register before the first batch places the tasks."""
    calls: list[str] = []

    def start(what: str) -> Any:
        def started_one(config: Config, master: str | None = None) -> Session:
            calls.append(what)
            return Session()

        return started_one

    monkeypatch.setattr(launch, "spark_session", start("session"))
    monkeypatch.setattr(launch, "spark_context", start("context"))
    config, expected = lost_host(tmp_path)
    made: list[Any] = []

    def make(spark: Any) -> Recording:
        made.append(spark)
        return Recording()

    coordinator, spark = launch.start_job(config, master, make, sql=sql)
    coordinator.run(until_caught_up=True)
    coordinator.close()
    spark.stop()
    assert calls == [started]
    assert made == [spark.session()]
    assert committed_counts(config) == expected


def test_a_restore_process_that_dies_is_run_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37: a restore process that died at start ended the run with BrokenProcessPool."""
    flag = tmp_path / "crash-once"
    flag.write_text("0")
    config, expected = lost_host(tmp_path)
    crashing = {
        "testing.crash.at": "during-restore",
        "testing.crash.mode": "exit",  # os._exit, as a killed process
        "testing.crash.flag": str(flag),
    }
    runner = Recording()
    coordinator = JobCoordinator(Config({**config.to_dict(), **crashing}), runner)
    keeping = Keeping(launch.RestoreRunner(2))
    with caplog.at_level("WARNING"):
        coordinator.restore_ahead(keeping)
    assert not flag.exists()  # a process did die at the failpoint
    assert "died" in caplog.text and "running them again" in caplog.text
    # every task ran again; one whose restore had ended in the other process before the death
    # finds its state current and keeps it, so not all of them restore the second time
    assert {r.task for r in keeping.results} == set(coordinator.tasks)
    assert any(r.restored for r in keeping.results)
    coordinator.run(until_caught_up=True)
    assert runner.restored_tasks() == set()  # every task's state was established ahead
    coordinator.close()
    assert committed_counts(config) == expected


def test_a_restore_process_that_keeps_dying_leaves_the_restore_to_spark(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from sparkpoint.runtime.driver import inline

    class DyingPool(ThreadPoolExecutor):
        def map(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
            raise BrokenProcessPool("a child process terminated abruptly")

    monkeypatch.setattr(inline.LocalPoolRunner, "_pool", lambda self, workers: DyingPool(1))
    config, expected = lost_host(tmp_path)
    runner = Recording()
    coordinator = JobCoordinator(config, runner)
    with caplog.at_level("WARNING"):
        coordinator.restore_ahead(launch.RestoreRunner(2))
    assert "died 2 times" in caplog.text and "first batch on Spark restores" in caplog.text
    coordinator.run(until_caught_up=True)
    coordinator.close()
    assert runner.restored_tasks() == set(coordinator.tasks)  # the job's runner restored them
    assert committed_counts(config) == expected


def test_restore_counts_agree_between_the_restore_ahead_and_the_run(tmp_path: Path) -> None:
    """Issue 37: a fresh job printed "4 restored (0 bytes)" then "0 task restores"; a restore
    ahead's restores were missing from the run's summary."""
    fresh = load_config(None, pageviews_config(tmp_path / "fresh", **CHANGELOG))
    Systems(fresh).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(fresh, tmp_path / "fresh.yaml", 200, seed=11)
    coordinator = JobCoordinator(fresh, Recording())
    report = coordinator.restore_ahead(launch.RestoreRunner(2))
    assert report is not None and report.restored_tasks == 0  # every task started empty
    summary = coordinator.run(until_caught_up=True)
    coordinator.close()
    assert summary.restores == 0 and summary.restore_bytes == 0
    config, _ = lost_host(tmp_path / "lost")
    coordinator = JobCoordinator(config, Recording())
    report = coordinator.restore_ahead(launch.RestoreRunner(2))
    assert report is not None and report.restored_tasks == 4
    summary = coordinator.run(until_caught_up=True)
    coordinator.close()
    assert summary.restores == 4 and summary.restore_bytes > 0  # the restore ahead's, counted


def test_a_local_checkpoint_restore_reports_what_it_linked(tmp_path: Path) -> None:
    """Issue 37: after a crash a relinked local checkpoint reported "0 entries, 0 bytes"."""
    config = load_config(None, pageviews_config(tmp_path, **CHANGELOG))
    ran_to_the_end(config, tmp_path, seed=12)
    for task in ("Partition 0", "Partition 1", "Partition 2", "Partition 3"):
        (LocalTaskState(config.store_base_dir, TaskName(task)).dir / "STATE").unlink()
    coordinator = JobCoordinator(config, Recording())
    report = coordinator.restore_ahead(launch.RestoreRunner(2))
    coordinator.close()
    assert report is not None
    local = [i for _t, i in report.restored if i.source == "local-checkpoint"]
    assert len(local) == 4
    assert all(i.entries > 0 and i.bytes > 0 and i.unit == "files" for i in local)
    assert report.restore_cost()[0] == 0  # hard links: nothing was fetched

"""Standby tasks on a Spark standalone cluster (issue 35): with
``job.standbytasks.replication.factor=2`` on three one-core workers with private state
directories, a worker lost between two batches has its tasks promoted on their standbys'
executors (no restore from any backend: only the changelog after each copy's checkpoint is
replayed), the copies it kept are seeded again elsewhere, no batch waits for it, and the state
is exact, in both APIs. A worker lost in the middle of a batch has its tasks run again by
Spark on the executors left, promoted where a copy is and restored elsewhere, with the state
as exact."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest

from sparkpoint.config import Config
from sparkpoint.testing.spark_cluster import StandaloneCluster
from tests.e2e.cli import JOB, locality_wait, popen, slowest_batch, sp
from tests.e2e.test_cluster import prepared
from tests.e2e.test_host_affinity import (
    affinity_sets,
    restores_after_first_batch,
    summary,
    wait_for_line,
)
from tests.helpers import assert_at_least_once, changelog_view, committed_counts, emitted_counts

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

#: state committed to the changelog and uploaded to the blob store (under job.data.dir)
DUAL = "stores.user-counts.backup.factories=changelog,blobstore"


def wait_for(path: Path, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path}: " + log.read_text()[-3000:]
        time.sleep(0.1)


class Run(NamedTuple):
    """The example running on three one-core workers with a standby copy per task, paused at
    ``pause_at`` while the file ``pause`` exists."""

    config: Config
    set_args: list[str]
    expected: Counter[str]
    log: Path
    driver: subprocess.Popen[bytes]
    pause: Path


def run_with_standbys(
    c: StandaloneCluster,
    tmp_path: Path,
    pause_at: str,
    seed: int,
    job: str = str(JOB),
    views: int = 4_000,
    *extra: str,
) -> Run:
    """:class:`Run` of ``job`` (the example's, or its DataFrame pipeline) started, once every
    task's copy was seeded and caught up again by the changelog alone at a later commit."""
    c.add_worker()  # three workers of one core (the module fixture keeps two for the next)
    pause = tmp_path / "pause"
    sets = [
        *affinity_sets(tmp_path, cores=3),
        "job.standbytasks.replication.factor=2",
        "spark.scheduler.minRegisteredResourcesRatio=1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime=120s",
        f"testing.pause.at={pause_at}",
        f"testing.pause.file={pause}",
        *extra,
    ]
    config, set_args, expected = prepared(tmp_path, sets, views, seed)
    log = tmp_path / "run.log"
    run = ["run", job, "--until-caught-up", "--master", c.master_url, *set_args]
    driver = popen(*run, log=log)
    wait_for_line(log, r"standbys: 4 seeded", driver)
    wait_for_line(log, r"standbys: 0 seeded, 4 caught up \([1-9]", driver)
    return Run(config, set_args, expected, log, driver, pause)


@pytest.mark.parametrize(
    ("job", "views", "extra"),
    # a DataFrame batch on the cluster takes 2-4 s: fewer views, as many commits. Its state
    # is also uploaded to the blob store (dual commit): still nothing restored from either
    [
        (str(JOB), 4_000, []),
        ("pageviews_pipeline:job", 2_000, [DUAL]),
    ],
    ids=["task", "dataframe-dual"],
)
def test_a_lost_worker_promotes_its_tasks_on_their_standbys(
    tmp_path: Path, cluster: StandaloneCluster, job: str, views: int, extra: list[str]
) -> None:
    c = cluster
    config, set_args, expected, log, driver, pause = run_with_standbys(
        c, tmp_path, "before-batch", 37, job, views, *extra
    )
    pause.touch()
    wait_for(Path(f"{pause}.paused"), log)  # the driver is between two batches
    shown = json.loads(sp("job", "show", str(JOB), "--json", *set_args).stdout)["tasks"]
    assert all(len(t["standbys"]) == 1 for t in shown), shown
    assert all(t["standbys"][0]["executor"] != t["executor"] for t in shown), shown
    assert len({t["executor"] for t in shown}) == 3, shown  # spread over every executor
    assert all(t["state-current"] and t["state-bytes"]["user-counts"] > 0 for t in shown)
    # a lost host: its executor, its tasks' state and its copies are gone
    c.kill_worker(worker_of(c, shown[0]["executor"]))
    wait_for_line(log, r"Lost executor", driver)  # the driver's Spark context saw it go
    before = log.read_text()
    pause.unlink()
    assert driver.wait(300) == 0, log.read_text()[-4000:]
    text = log.read_text()
    after = text[len(before) :]
    promoted = re.findall(
        r"host affinity: task (Partition \d) from executor (\S+) .*promoted", after
    )
    lost = {old for _, old in promoted}
    assert len(lost) == 1, after[-4000:]  # the tasks of the lost executor, and only those
    held = {t["task"] for t in shown if t["executor"] in lost}
    assert {task for task, _ in promoted} == held, after[-4000:]
    for task in held:
        assert re.search(rf"promote {task} store user-counts: its standby copy", after), after
    _, restores, _ = summary(text)
    assert restores == 0, text[-4000:]  # nothing restored from any backend, at any batch
    assert restores_after_first_batch(text) == []
    assert re.search(r"\d promoted \(replayed [\d,]+ changelog records", after), after[-3000:]
    # the copies the lost worker kept, and new ones for the promoted tasks, are seeded again
    assert re.search(r"standbys: [1-9]\d* seeded", after), after[-4000:]
    assert slowest_batch(after) < locality_wait(), text[
        -4000:
    ]  # no batch waited for the lost executor
    final = json.loads(sp("job", "show", str(JOB), "--json", *set_args).stdout)["tasks"]
    for t in final:  # one copy each again, none on the lost executor nor the task's own
        assert [c["executor"] for c in t["standbys"]] not in ([], list(lost), [t["executor"]])
        assert t["standbys"][0]["lag"] == 0, final
    assert changelog_view(config) == dict(expected)
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)


def worker_of(c: StandaloneCluster, executor: str) -> int:
    """The index of the worker running ``executor`` of the cluster's newest application."""
    newest = max(p.name for p in c.work_dir.glob("worker-*/app-*"))
    (found,) = c.work_dir.glob(f"worker-*/{newest}/{executor}")
    return int(found.parent.parent.name.removeprefix("worker-"))


def slowest_catch_up(text: str) -> float:
    """The longest standby catch-up of a run's progress lines, in seconds."""
    return max(float(s) for s in re.findall(r"standbys: .*? records, ([\d.]+)s\)", text))


def test_a_worker_lost_mid_batch_has_its_tasks_rerun_where_state_is_exact(
    tmp_path: Path, cluster: StandaloneCluster
) -> None:
    """The worker dies while a task of a batch is under way on it (held after processing its
    input, before its commit). Spark runs it again on the executors left: promoted where its
    standby copy is, restored elsewhere. Either way the state is exact, neither the batch nor
    the standby catch-up after it waits for the lost executor, and every task has a caught-up
    copy again."""
    c = cluster
    config, set_args, expected, log, driver, pause = run_with_standbys(
        c, tmp_path, "in-task", 43, str(JOB), 2_400
    )
    pause.touch()
    paused = Path(f"{pause}.paused")
    wait_for(paused, log)  # a batch is under way, its tasks held
    time.sleep(1)  # the other executors' tasks reach the pause too
    held = set(paused.read_text().split("\n")) - {""}
    shown = json.loads(sp("job", "show", str(JOB), "--json", *set_args).stdout)["tasks"]
    lost = next(t["executor"] for t in shown if t["task"] in held)
    before = log.read_text()
    c.kill_worker(worker_of(c, lost))  # with a task of this batch under way on it
    pause.unlink()
    assert driver.wait(300) == 0, log.read_text()[-4000:]
    text = log.read_text()
    after = text[len(before) :]
    assert slowest_batch(text) < locality_wait(), text[
        -4000:
    ]  # no batch waited for the lost executor
    assert slowest_catch_up(text) < 10, text[-4000:]  # nor a catch-up
    moved = {t["task"] for t in shown if t["executor"] == lost}
    assert moved & held, (shown, held)
    for task in moved:  # each lost task was promoted on its copy or restored, once
        how = re.findall(rf"^(promote|restore) {task} store user-counts: ", after, re.M)
        assert len(how) == 1, after[-4000:]
    final = json.loads(sp("job", "show", str(JOB), "--json", *set_args).stdout)["tasks"]
    assert lost not in {t["executor"] for t in final}, final
    for t in final:  # one caught-up copy each again, none on the lost executor nor its own
        assert [c["executor"] for c in t["standbys"]] not in ([], [lost], [t["executor"]])
        assert t["standbys"][0]["lag"] == 0, final
    assert changelog_view(config) == dict(expected)
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)

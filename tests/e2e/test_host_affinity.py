"""Host affinity on a Spark standalone cluster (a master and workers on loopback): each task
runs where its state is, so a steady run of a new job restores nothing (its first batch opens
empty stores, which restores no state) and never restores later; a lost worker moves only its
tasks, which restore; an added one takes none unless asked."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from sparkpoint.config import Config
from sparkpoint.testing.spark_cluster import StandaloneCluster
from sparkpoint.tools.jobs import job_overview
from tests.e2e.cli import JOB, locality_wait, popen, slowest_batch, sp, wait_for_checkpoints
from tests.e2e.test_cluster import cluster_sets, prepared
from tests.helpers import (
    assert_at_least_once,
    changelog_view,
    committed_counts,
    emitted_counts,
    generate,
)

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

TASKS = 4


BACKENDS = {
    "changelog": "stores.user-counts.changelog=filelog.user-counts-changelog",
    "blobstore": "stores.user-counts.backup.factories=blobstore",  # under job.data.dir
}


def affinity_sets(
    tmp_path: Path, *extra: str, backend: str = "changelog", cores: int | None = 2
) -> list[str]:
    """Private store directories per executor, state backed up to ``backend``, small batches
    (so a run has many). ``cores`` is spark.cores.max: the first batch waits until that many
    cores have registered (so the first placement is balanced); ``None`` takes every core the
    cluster has or gets later (a worker added mid-run)."""
    sets = cluster_sets(
        tmp_path,
        BACKENDS[backend],
        "job.logged.store.base.dir={cwd}/state",
        "task.batch.max.messages=80",
        *extra,
    )
    sets = [s for s in sets if not s.startswith("spark.cores.max")]
    return sets if cores is None else [*sets, f"spark.cores.max={cores}"]


def summary(text: str) -> tuple[int, int, int]:
    """(batches, task restores, tasks away from their state) from a run's final line."""
    m = re.search(r"done \(.*?\): (\d+) batches.*?; (\d+) task restores .*?, (\d+) ran away", text)
    assert m, text[-3000:]
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def restores_after_first_batch(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"batch ([2-9]|\d\d+):.*restored", line)]


@pytest.mark.parametrize(
    ("api", "backend", "views", "tasks"),
    # The task API's 8 tasks on 2 executors of 1 core run in 2 Spark partitions per executor
    # (SparkRunner): grouped tasks keep their executor too. A DataFrame pipeline's steady run
    # on the cluster, with its state uploaded to the blob store, is
    # tests/e2e/test_standby.py's (no task restored at any batch, state on every executor)
    [("task", "changelog", 3_200, 8)],
)
def test_a_steady_run_restores_each_task_once(
    tmp_path: Path, cluster: StandaloneCluster, api: str, backend: str, views: int, tasks: int
) -> None:
    sets = affinity_sets(tmp_path, backend=backend)
    config, set_args, expected = prepared(tmp_path, sets, views, 31, tasks)
    job = str(JOB) if api == "task" else "pageviews_pipeline:job"
    run = ["run", job, "--until-caught-up", "--master", cluster.master_url, "-v"]
    result = sp(*run, *set_args)
    batches, restores, away = summary(result.stderr)
    assert batches >= views // (80 * tasks)  # 80 views per task per batch
    assert restores == 0, result.stderr[-4000:]  # a new job: no task ever restored state
    assert away == 0
    assert restores_after_first_batch(result.stderr) == []
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)
    shown = json.loads(sp("job", "show", str(JOB), "--json", *set_args).stdout)
    executors = {t["executor"] for t in shown["tasks"]}
    assert len(executors) == 2, shown  # balanced over both executors
    assert all(t["state-current"] and t["state-bytes"]["user-counts"] > 0 for t in shown["tasks"])
    if tasks > 4:
        assert f"{tasks} tasks run in 4 Spark partitions" in result.stderr, result.stderr[-4000:]
        # shown by job show: the last batch's 4 partitions, its tasks dealt among them by
        # what each had to read (task_groups)
        groups = {tuple(sorted(t["group"])) for t in shown["tasks"]}
        assert all(t["task"] in t["group"] for t in shown["tasks"]), shown
        assert len(groups) == 4 and sum(map(len, groups)) == tasks, shown


def wait_for_line(
    log: Path, pattern: str, driver: subprocess.Popen[bytes], timeout: float = 120
) -> None:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, log.read_text()):
        assert driver.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {pattern!r} in: " + log.read_text()[-3000:]
        time.sleep(0.2)


def run_on_cluster(
    c: StandaloneCluster, tmp_path: Path, events: int, seed: int, *flags: str
) -> tuple[Config, Counter[str], Path, subprocess.Popen[bytes]]:
    """The example on ``c`` in the background, once every task has a checkpoint."""
    # every core the cluster has or gets (the added worker's too), and the first batch waits
    # for the first two executors (2 of those 3 cores) so that the first placement uses both.
    # A fixed wait of 8 s was not always enough on a loaded 2-core machine: an executor that
    # registered later was taken for the added one
    sets = [
        *affinity_sets(tmp_path, cores=3),
        "spark.scheduler.minRegisteredResourcesRatio=0.6",
        "spark.scheduler.maxRegisteredResourcesWaitingTime=120s",
    ]
    config, set_args, expected = prepared(tmp_path, sets, events, seed)
    log = tmp_path / "run.log"
    driver = popen(
        "run", str(JOB), "--until-caught-up", "--master", c.master_url, *flags, *set_args, log=log
    )
    wait_for_checkpoints(config, driver, log, TASKS)
    return config, expected, log, driver


def test_a_restarted_driver_places_tasks_back_and_restores_nothing(
    tmp_path: Path, cluster: StandaloneCluster
) -> None:
    """State in a per-host directory (kept across applications): the new driver reads the
    assignment from the coordinator stream and every task resumes from its local state; each
    task's standby copy, at the task's checkpoint when the last run ended, is kept (checked on
    its executor at the first catch-up), not seeded again."""
    sets = affinity_sets(tmp_path, "job.standbytasks.replication.factor=2")
    sets = [s for s in sets if not s.startswith("job.logged.store.base.dir")]
    sets.append(f"job.logged.store.base.dir={tmp_path / 'host-state'}")
    config, set_args, expected = prepared(tmp_path, sets, 1_200, 34)
    first = sp("run", str(JOB), "--until-caught-up", "--master", cluster.master_url, *set_args)
    assert summary(first.stderr)[1] == 0  # a new job: nothing to restore
    assert re.search(r"standbys: 4 seeded", first.stderr), first.stderr[-4000:]
    before = job_overview(config)["tasks"]
    assert all(len(t["standbys"]) == 1 for t in before), before
    more = generate(config, tmp_path / "job.yaml", 1_000, seed=35, users=100)
    second = sp("run", str(JOB), "--until-caught-up", "--master", cluster.master_url, *set_args)
    _, restores, away = summary(second.stderr)
    assert (restores, away) == (0, 0), second.stderr[-4000:]
    assert re.search(r"standbys: 0 seeded, 4 caught up", second.stderr), second.stderr[-4000:]
    assert not re.search(r"standbys: [1-9]\d* seeded", second.stderr), second.stderr[-4000:]
    after = job_overview(config)["tasks"]
    assert [t["host"] for t in after] == [t["host"] for t in before]
    assert all(t["standbys"][0]["lag"] == 0 for t in after), after
    assert changelog_view(config) == dict(expected + more)


def test_an_added_worker_takes_nothing_and_a_lost_one_moves_only_its_tasks(
    tmp_path: Path, cluster: StandaloneCluster
) -> None:
    """On the module's cluster, after the tests that keep it as it is: this one adds a worker
    and kills one, the next one adds another."""
    c = cluster
    config, expected, log, driver = run_on_cluster(c, tmp_path, 12_000, 32)
    c.add_worker()
    wait_for_line(log, r"host affinity: executor \S+ on \S+ joined", driver)
    before = job_overview(config)["tasks"]
    assert driver.poll() is None, "the run ended before the worker was lost: give it more input"
    c.kill_worker(0)  # a lost host: its executor and its private state are gone
    assert driver.wait(300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    joined = re.search(r"host affinity: executor \S+ on \S+ joined", text)
    assert joined is not None
    assert "host affinity: task" not in text[: joined.start()]  # nothing moved to the new one
    # moved off the lost executor: placed elsewhere by the driver, or re-run elsewhere by Spark
    # when the executor died mid-batch (then re-assigned where it ran)
    moved = re.findall(r"host affinity: task (Partition \d) from executor (\S+) ", text)
    assert len({old for _, old in moved}) == 1, moved  # all from the lost one
    lost = moved[0][1]
    held = {t["task"] for t in before if t["executor"] == lost}
    assert 0 < len(held) < TASKS, before  # the others had state elsewhere and kept running
    assert {task for task, _ in moved} == held, text[-4000:]
    _, restores, _ = summary(text)
    assert restores == len(held), text[-4000:]  # only the moved tasks restored their state
    # no batch waited for the lost executor (spark.locality.wait, 30 s on a cluster: one
    # batch took 31 s when every task was in one Spark job; SparkRunner's docstring)
    assert slowest_batch(text) < locality_wait(), text[-4000:]
    assert re.search(r"lost executor \S+ on \S+ \(its tasks: Partition", text), text[-4000:]
    assert changelog_view(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)


def test_a_rebalance_moves_tasks_to_an_added_worker(
    tmp_path: Path, cluster: StandaloneCluster
) -> None:
    c = cluster  # two live workers (the test before killed one of three)
    config, expected, log, driver = run_on_cluster(c, tmp_path, 10_000, 33, "--rebalance")
    c.add_worker()
    assert driver.poll() is None, "the run ended before the worker joined: give it more input"
    assert driver.wait(300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    _, restores, away = summary(text)
    joins = re.findall(r"host affinity: (executor \S+ on \S+) joined", text)
    assert joins, text[-4000:]
    # without spark.cores.max the run may start before the second executor has registered:
    # the rebalance then moves tasks onto it as well (its join comes first); every move is one
    # restore. The added worker's executor is the last to join.
    moved = re.findall(r"host affinity: task (Partition \d) from .* to (.*): rebalance", text)
    to_new = [t for t, new in moved if new == joins[-1]]
    assert len(to_new) == 1, text[-4000:]  # 2+2+0 -> 2+1+1
    # every move after the first commit restores state; one made before it (onto an executor
    # that registered late) moves empty stores, which restores nothing
    assert len(to_new) <= restores <= len(moved) and away == 0, text[-4000:]
    assert changelog_view(config) == dict(expected)


def test_a_dataframe_batch_does_not_wait_for_an_executor_lost_mid_batch(
    tmp_path: Path, cluster: StandaloneCluster
) -> None:
    """A DataFrame batch is several Spark jobs over every task. Before, the batch during which
    a host died (its worker and executor killed together) took 34.6 s: Spark held the lost
    executor's tasks for spark.locality.wait, as other tasks of the job preferred live
    executors. The driver now cancels the batch's jobs and starts every task again from its
    last checkpoint."""
    sets = affinity_sets(tmp_path, "task.batch.max.messages=500")
    config, set_args, expected = prepared(tmp_path, sets, 16_000, 41)
    log = tmp_path / "run.log"
    run = ["run", "pageviews_pipeline:job", "--until-caught-up", "--master", cluster.master_url]
    driver = popen(*run, *set_args, log=log)
    wait_for_checkpoints(config, driver, log, TASKS)
    wait_for_line(log, r"(?m)^batch 3: ", driver)
    time.sleep(0.4)  # inside batch 4
    # a lost host: a worker running one of the job's executors (earlier tests of the module
    # killed and added workers), with its executor
    hosts = [i for i, p in enumerate(cluster.worker_procs) if p.poll() is None]
    running = [i for i in hosts if cluster.executor_pids(i)]
    assert running, hosts
    cluster.kill_worker(running[0], executors=True)
    assert driver.wait(300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "done (caught up)" in text
    after = text[text.index("batch 3: ") :]
    assert slowest_batch(after) < locality_wait(), text[
        -4000:
    ]  # no batch waited for the lost executor
    assert re.search(r"was lost while the batch ran on it", text), text[-4000:]
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)

"""The example job on a Spark standalone cluster (a master and 2 workers on loopback).

Private store directories with a changelog, for both APIs, are in test_host_affinity.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.config import Config, load_config, parse_overrides
from sparkpoint.testing.spark_cluster import StandaloneCluster
from tests.e2e.cli import JOB, sp
from tests.helpers import (
    assert_at_least_once,
    committed_counts,
    emitted_counts,
    generate,
)

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def cluster_sets(tmp_path: Path, *extra: str) -> list[str]:
    return [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=300",
        "task.batch.max.messages=1000",
        "spark.executor.memory=512m",
        "spark.cores.max=2",
        *extra,
    ]


def prepared(
    tmp_path: Path, sets: list[str], events: int, seed: int, tasks: int = 4
) -> tuple[Config, list[str], Counter[str]]:
    """The job's config and --set arguments, with ``events`` page views generated in
    ``tasks`` partitions."""
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", str(tasks), *set_args)
    return config, set_args, generate(config, tmp_path / "job.yaml", events, seed=seed, users=100)


def test_shared_store_dir_gives_exact_state(tmp_path: Path, cluster: StandaloneCluster) -> None:
    # without a state backend both workers keep state on one path of this machine
    sets = cluster_sets(tmp_path)
    config, set_args, expected = prepared(tmp_path, sets, 6_000, 21)
    result = sp("run", str(JOB), "--until-caught-up", "--master", cluster.master_url, *set_args)
    assert "done (caught up)" in result.stderr, result.stderr
    assert cluster.alive_workers() == 2
    apps = cluster.status().get("completedapps", []) + cluster.status().get("activeapps", [])
    assert any("sparkpoint-pageviews" in a.get("name", "") for a in apps)
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)


def test_worker_killed_mid_run_with_blob_store_in_azurite(
    tmp_path: Path, cluster: StandaloneCluster
) -> None:
    """It kills a worker of the module's cluster (the fixture starts it again)."""
    from sparkpoint.testing.services import AzuriteBlob
    from tests.e2e.cli import locality_wait, popen, slowest_batch, wait_for_checkpoints

    c2 = cluster
    with AzuriteBlob(tmp_path / "azurite") as azurite:
        blob = azurite.config("state")
        sets = cluster_sets(
            tmp_path,
            "stores.user-counts.backup.factories=blobstore",
            "job.logged.store.base.dir={cwd}/state",
            "task.checkpoint.read.versions=2",
            "task.batch.max.messages=500",
            *(f"{k}={v}" for k, v in blob.items()),
        )
        config, set_args, expected = prepared(tmp_path, sets, 14_000, 23)  # 7 batches
        log = tmp_path / "run.log"
        driver = popen(
            "run", str(JOB), "--until-caught-up", "--master", c2.master_url, *set_args, log=log
        )
        wait_for_checkpoints(config, driver, log, 4)
        c2.kill_worker(0)  # a lost host: its executor and its private state are gone
        assert driver.wait(300) == 0, log.read_text()[-3000:]
        assert "done (caught up)" in log.read_text()
        assert slowest_batch(log.read_text()) < locality_wait()  # none waited for the lost executor
        assert c2.alive_workers() == 1
        # the committed state, read from the snapshots in Azurite (no local copy here)
        assert committed_counts(config) == dict(expected)
        assert_at_least_once(emitted_counts(config), expected)
        assert sp("state", "check", str(JOB), *set_args).stdout.startswith("ok")


def test_a_worker_lost_mid_run_leaves_each_table_row_once(
    tmp_path: Path, cluster: StandaloneCluster, postgres: Any
) -> None:
    """Issue 67: the tables example (Delta, Iceberg and PostgreSQL outputs, a global table)
    exactly-once on the cluster, a worker killed once every task has a checkpoint: its tasks
    run again on the executor left, and every table holds each row once (read back by each
    table's own client). The module's last test: it kills a worker of the module's cluster."""
    from tests.e2e.cli import popen, wait_for_checkpoints
    from tests.e2e.test_tables_crash import JOB as TABLES_JOB
    from tests.e2e.test_tables_crash import prepared_tables
    from tests.system.tables.test_jobs import assert_tables_exact

    sets = cluster_sets(
        tmp_path,
        f"systems.pg.postgres.dsn={postgres.new_database('cluster_kill')}",
        "task.batch.max.messages=500",
    )
    config, set_args, expected = prepared_tables(tmp_path, sets, 12_000, seed=27, users=60)
    log = tmp_path / "run.log"
    driver = popen(
        "run",
        str(TABLES_JOB),
        "--until-caught-up",
        "--master",
        cluster.master_url,
        *set_args,
        log=log,
    )
    wait_for_checkpoints(config, driver, log, 4)
    cluster.kill_worker(0)  # its executor, mid-run: staged parts of its attempts left behind
    assert driver.wait(300) == 0, log.read_text()[-3000:]
    assert "done (caught up)" in log.read_text()
    assert cluster.alive_workers() == 1
    assert_tables_exact(config, expected)

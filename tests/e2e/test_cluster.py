"""The example job on a Spark standalone cluster (a master and 2 workers on loopback).

Until a state backend exists, both workers keep store directories on one path of this machine
(job.logged.store.base.dir is shared), which is what lets tasks move between them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.config import load_config, parse_overrides
from sparkpoint.testing.spark_cluster import StandaloneCluster
from tests.e2e.cli import JOB, sp
from tests.runtime.helpers import assert_at_least_once, committed_counts, emitted_counts, generate

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_example_on_standalone_cluster_gives_exact_state(tmp_path: Path) -> None:
    with StandaloneCluster(tmp_path / "cluster", workers=2, cores=1, memory="1g") as cluster:
        sets = [
            f"job.data.dir={tmp_path / 'data'}",
            "task.commit.ms=500",
            "task.batch.max.messages=2000",
            "spark.executor.memory=512m",
            "spark.cores.max=2",
        ]
        set_args = [a for s in sets for a in ("--set", s)]
        config = load_config(JOB, parse_overrides(sets))
        sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *set_args)
        expected = generate(config, tmp_path / "job.yaml", 30_000, seed=21, users=100)
        result = sp("run", str(JOB), "--until-caught-up", "--master", cluster.master_url, *set_args)
        assert "done (caught up)" in result.stderr, result.stderr
        assert cluster.alive_workers() == 2
        apps = cluster.status().get("completedapps", []) + cluster.status().get("activeapps", [])
        assert any("sparkpoint-pageviews" in a.get("name", "") for a in apps)
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)

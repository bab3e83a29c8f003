"""Fixtures of the end-to-end tests: one standalone cluster (a master and two workers of one
core each, on loopback) shared by the modules that run jobs on a cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sparkpoint.testing.spark_cluster import StandaloneCluster


@pytest.fixture(scope="session")
def _shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with StandaloneCluster(tmp_path_factory.mktemp("cluster"), workers=2, cores=1) as c:
        yield c


@pytest.fixture(scope="module")
def cluster(_shared_cluster: StandaloneCluster) -> StandaloneCluster:
    """The shared cluster with exactly its first two workers alive, whatever an earlier
    module did: those it killed are started again (on their work directories), those it
    added are stopped. Starting a cluster took about 13 s here, so the modules share one."""
    c = _shared_cluster
    for index, proc in enumerate(c.worker_procs):
        if index >= 2 and proc.poll() is None:
            c.kill_worker(index)
    for index in (0, 1):
        if c.worker_procs[index].poll() is not None:
            c.restart_worker(index)
    return c

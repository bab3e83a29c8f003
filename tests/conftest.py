"""Shared fixtures: one Spark session per test run, and job configs in temporary directories."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_DIR = ROOT / "examples" / "pageviews"
WINDOWS_DIR = ROOT / "examples" / "windows"
REKEY_DIR = ROOT / "examples" / "rekey"
TABLES_DIR = ROOT / "examples" / "tables"

# Python workers started by Spark must import the examples' tasks and the test jobs.
_EXTRA = [
    str(d) for d in (EXAMPLE_DIR, WINDOWS_DIR, REKEY_DIR, TABLES_DIR, ROOT / "tests" / "jobs")
]
for extra in _EXTRA:
    if extra not in sys.path:
        sys.path.insert(0, extra)
os.environ["PYTHONPATH"] = os.pathsep.join([*_EXTRA, os.environ.get("PYTHONPATH", "")])
# reading a config key nobody declared is an error in the suite (and in the workers and CLI runs
# it starts): a key's default lives in sparkpoint.config.KEYS, never at a call site
os.environ["SPARKPOINT_STRICT_KEYS"] = "1"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


#: the modules whose tests run on a standalone cluster (marked ``cluster``). ``make test`` runs
#: three workers (pytest-xdist, ``-n 3``); these run on one worker, in their order: they share
#: one cluster (tests/e2e/conftest.py) whose workers some of them add or kill, and two clusters
#: at once would starve a 2-core machine. Being the largest unit of work, they start first.
CLUSTER_MODULES = frozenset(
    {
        "tests/e2e/test_cluster.py",
        "tests/e2e/test_host_affinity.py",
        "tests/e2e/test_install.py",
        "tests/e2e/test_standby.py",
    }
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's load scheduling, with :data:`CLUSTER_MODULES` as one unit of work.
    (Its ``xdist_group`` marker does not group under pytest 9.2: xdist 3.8 renames the
    items through an attribute pytest no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ClusterTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "cluster" if nodeid.split("::", 1)[0] in CLUSTER_MODULES else nodeid

    return ClusterTestsTogether(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``cluster`` outside :data:`CLUSTER_MODULES` would run beside them."""
    stray = sorted(
        {
            i.nodeid.split("::", 1)[0]
            for i in items
            if i.get_closest_marker("cluster") and i.nodeid.split("::", 1)[0] not in CLUSTER_MODULES
        }
    )
    if stray:
        raise pytest.UsageError(
            f"cluster tests outside CLUSTER_MODULES (tests/conftest.py): {stray}"
        )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one local Spark session of this test run."""
    from sparkpoint.config import Config
    from sparkpoint.runtime.spark.session import spark_session

    session = spark_session(Config({"job.name": "tests"}), "local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A PostgreSQL server for this test worker: the OS package's, on a free loopback port
    (``new_database`` gives each test its own database)."""
    from sparkpoint.testing.services import PostgresServer

    with PostgresServer(tmp_path_factory.mktemp("postgres")) as server:
        yield server


@pytest.fixture(params=["filelog", pytest.param("kafka", marks=pytest.mark.kafka)])
def log_system(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Config of a system named ``log``, run once per kind: the embedded filelog (under the
    job's data directory), and Kafka on a Tansu broker started for this test (memory-only: no
    topic is shared between tests)."""
    if request.param == "filelog":
        yield {"systems.log.factory": "filelog"}
        return
    from sparkpoint.testing.services import TansuKafka

    with TansuKafka(tmp_path / "tansu") as broker:
        yield broker.config("log")


def pageviews_config(
    tmp_path: Path,
    system: dict[str, str] | None = None,
    *,
    job: Path = EXAMPLE_DIR / "job.yaml",
    **overrides: str,
) -> dict[str, str]:
    """The example job's config (or ``job``'s), with its data under ``tmp_path``; with
    ``system`` (the config of a system named ``log``, see ``log_system``), every stream on that
    system."""
    from sparkpoint.config import read_job_file

    values = read_job_file(job)
    values["job.data.dir"] = str(tmp_path / "data")
    if system is not None:
        values = {
            k: "log." + v.removeprefix("filelog.") if v.startswith("filelog.") else v
            for k, v in values.items()
            if not k.startswith("systems.filelog.")
        }
        values.update({**system, "task.inputs": "log.pageviews"})
    values.update(overrides)
    return values

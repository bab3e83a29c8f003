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

# Python workers started by Spark must import the examples' tasks and the test jobs.
_EXTRA = [str(EXAMPLE_DIR), str(WINDOWS_DIR), str(REKEY_DIR), str(ROOT / "tests" / "jobs")]
for extra in _EXTRA:
    if extra not in sys.path:
        sys.path.insert(0, extra)
os.environ["PYTHONPATH"] = os.pathsep.join([*_EXTRA, os.environ.get("PYTHONPATH", "")])
# reading a config key nobody declared is an error in the suite (and in the workers and CLI runs
# it starts): a key's default lives in sparkpoint.config.KEYS, never at a call site
os.environ["SPARKPOINT_STRICT_KEYS"] = "1"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``make test`` runs on both cores (pytest-xdist, ``-n 2 --dist loadgroup``). The tests on
    a standalone cluster run on one worker, in their order: they share one cluster
    (tests/e2e/conftest.py) whose workers some of them add or kill, and two clusters at once
    would starve a 2-core machine. Being the largest group, they start first."""
    for item in items:
        if item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.xdist_group("cluster"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one local Spark session of this test run."""
    from sparkpoint.config import Config
    from sparkpoint.runtime.spark.session import spark_session

    session = spark_session(Config({"job.name": "tests"}), "local[2]")
    yield session
    session.stop()


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

"""The tables example (examples/tables) through the CLI on local Spark, exactly-once: its driver
killed with SIGKILL mid-run (3,000 of 12,000 views checkpointed) and run again, then a Python
worker killed right after its publish's table commit and retried; every view is once in the
Delta and the Iceberg table with its page's title from the global table, and each user's count
in PostgreSQL is exact (issue 67). Read back by each table's own client."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from sparkpoint.config import Config, load_config, parse_overrides
from sparkpoint.testing.services import PostgresServer
from tests.conftest import TABLES_DIR
from tests.e2e.cli import popen, sp, wait_for_checkpoints
from tests.helpers import generate
from tests.system.tables.test_jobs import assert_tables_exact, catalogue

pytestmark = pytest.mark.slow

JOB = TABLES_DIR / "job.yaml"


def prepared_tables(
    tmp_path: Path, sets: list[str], events: int, seed: int, users: int
) -> tuple[Config, list[str], Counter[str]]:
    """The tables example's config and --set arguments, its page catalogue written, and
    ``events`` page views generated in its four input partitions."""
    from catalogue import write_catalogue

    args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    write_catalogue(catalogue(config))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *args)
    return config, args, generate(config, tmp_path / "gen.yaml", events, seed=seed, users=users)


def test_kill_9_of_the_driver_then_of_a_worker_writes_each_row_once(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        f"systems.pg.postgres.dsn={postgres.new_database('kill9')}",
        "task.commit.ms=300",
        "task.batch.max.messages=1500",
    ]
    config, args, expected = prepared_tables(tmp_path, sets, 12_000, seed=31, users=40)
    log = tmp_path / "run1.log"
    driver = popen("run", str(JOB), "--until-caught-up", *args, log=log)
    wait_for_checkpoints(config, driver, log, 4, 180, progress=3_000)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    flag = tmp_path / "crash"
    flag.write_text("2")  # the third publish dies after its table commit (os._exit)
    expected += generate(config, tmp_path / "b.yaml", 3_000, seed=32, users=40)
    crash = ["testing.crash.at=publish-after-append", f"testing.crash.flag={flag}"]
    crash_args = [a for s in [*crash, "testing.crash.mode=exit"] for a in ("--set", s)]
    result = sp("run", str(JOB), "--until-caught-up", *args, *crash_args, timeout=400)
    assert "done (caught up)" in result.stderr
    assert not flag.exists(), "the worker was never killed"
    assert_tables_exact(config, expected)

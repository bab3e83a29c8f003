"""The example's DataFrame pipeline writing tables (examples/tables/tables_pipeline.py) under
exactly-once on local Spark: every view, joined with the global table ``pages`` through
``batch.table``, lands in Delta and Iceberg once, written as Arrow batches, and each user's
count in PostgreSQL is exact, whether the driver crashes in a publish or a Python worker dies
after its output (issue 67). Read back by each table's own client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tables_pipeline import job as tables_pipeline

from sparkpoint.failpoints import InjectedCrash
from sparkpoint.runtime.dataframe.runner import DataFrameRunner
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.testing.services import PostgresServer
from tests.helpers import generate, run_until_caught_up
from tests.system.tables.test_jobs import assert_tables_exact, tables_job

pytestmark = pytest.mark.slow


def run(spark: Any, config: Any) -> None:
    run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, tables_pipeline, config)))


@pytest.mark.parametrize(
    ("point", "mode"), [("publish-after-intent", "raise"), ("after-output-flush", "exit")]
)
def test_a_pipeline_writes_each_row_once_through_a_crash(
    tmp_path: Path, spark: Any, postgres: PostgresServer, point: str, mode: str
) -> None:
    flag = tmp_path / "crash.flag"
    flag.write_text("1")
    crash = {"testing.crash.at": point, "testing.crash.flag": str(flag), "testing.crash.mode": mode}
    config = tables_job(tmp_path, postgres, **{"task.batch.max.messages": "400", **crash})
    expected = generate(config, tmp_path / "a.yaml", 1600, seed=21, users=12)
    with pytest.raises(Exception) as crashed:
        run(spark, config)
    assert not flag.exists(), f"the crash point was never reached: {crashed.value!r}"
    if mode == "raise":
        assert crashed.type is InjectedCrash
    run(spark, config)
    assert_tables_exact(config, expected, counted=False)

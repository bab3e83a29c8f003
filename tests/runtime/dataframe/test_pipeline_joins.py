"""Joins in a DataFrame pipeline. ``batch.join_table``: the task API's stream-table join
(``tests/runtime/executor/test_tables.py``) run as a pipeline gives the same enriched views, a
job moves between the APIs keeping its table, and a crash in the batch changes no view's
enrichment. ``batch.join_window``: the task API's windowed join
(``tests/runtime/executor/test_stream_join.py``) gives the reference's pairs, bounded buffers,
keeps the task API's buffers, and stays exact across a crash. Both joins run on filelog and on
Kafka (Tansu)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import stream_join
from table_join import build

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.dataframe.pipeline import Batch, Pipeline
from sparkpoint.runtime.dataframe.runner import DataFrameRunner
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from tests.runtime.executor import test_stream_join as joins
from tests.runtime.executor.test_tables import (
    Profiles,
    enriched,
    expected,
    job,
    run_job,
    send_views,
    set_profiles,
    two_rounds,
)


def frame_run(spark: Any, fn: Any = build) -> Any:
    def run(config: Config) -> None:
        pipeline = Pipeline(fn, config=config.to_dict(), value_schema="user STRING, ts LONG")
        coordinator = JobCoordinator(config, DataFrameRunner(spark, pipeline, config))
        try:
            coordinator.run(until_caught_up=True)
        finally:
            coordinator.close()

    return run


def test_the_pipeline_joins_as_the_task_does(
    tmp_path: Path, spark: Any, log_system: dict[str, str]
) -> None:
    two_rounds(job(tmp_path, log_system), frame_run(spark))


def test_a_job_moves_from_the_task_api_to_the_pipeline_keeping_its_table(
    tmp_path: Path, spark: Any
) -> None:
    config = job(tmp_path)
    table: Profiles = {}
    set_profiles(config, table, seed=11, n=100)
    views = send_views(config, seed=12, n=100, start=0)
    run_job(config)
    more = send_views(config, seed=13, n=100, start=1000)  # the table as the task left it
    frame_run(spark)(config)
    assert set(enriched(config)) == expected(views + more, table)


def test_a_crash_in_the_batch_changes_no_enrichment(tmp_path: Path, spark: Any) -> None:
    flag = tmp_path / "crash.flag"
    point = "during-stateful-step"
    config = job(tmp_path, **{"testing.crash.at": point, "testing.crash.flag": str(flag)})
    table: Profiles = {}
    set_profiles(config, table, seed=14, n=100)
    views = send_views(config, seed=15, n=100, start=0)
    run = frame_run(spark)
    run(config)
    first = expected(views, table)
    set_profiles(config, table, seed=16, n=80)
    more = send_views(config, seed=17, n=100, start=1000)
    flag.write_text("0")
    with pytest.raises(Exception, match="injected crash"):
        run(config)
    assert not flag.exists(), f"the crash point {point} was never reached"
    run(config)
    assert set(enriched(config)) == first | expected(more, table)


def _not_a_table(batch: Batch) -> Any:
    views = batch.df.select("task", "value.user")
    return batch.to_stream(batch.join_table(views, "pageviews", key="user"), "log.x")


def test_joining_a_store_that_is_not_a_table_names_the_fix(tmp_path: Path, spark: Any) -> None:
    config = job(tmp_path)
    send_views(config, seed=18, n=5, start=0)
    with pytest.raises(
        ConfigError, match=r"store 'pageviews' is not a table: set stores.pageviews"
    ):
        frame_run(spark, _not_a_table)(config)


def test_the_pipeline_joins_streams_as_the_task_does(
    tmp_path: Path, spark: Any, log_system: dict[str, str]
) -> None:
    """Round one in the task API, round two in the pipeline on the buffers it left."""
    apis = ("task", "frame")
    config = joins.job(tmp_path, log_system)
    sent: joins.Events = []
    for round_, api in enumerate(apis):
        more = joins.events(seed=70 + round_, n=400, start=sent[-1][2] if sent else 0)
        joins.send(config, more)
        sent += more
        if api == "frame":
            frame_run(spark, stream_join.build)(config)
        else:
            run_job(config)
        joins.check(config, sent, once=True)


def test_a_crash_in_the_batch_leaves_the_pairs_exact(tmp_path: Path, spark: Any) -> None:
    flag = tmp_path / "crash.flag"
    point = "during-stateful-step"
    config = joins.job(tmp_path, **{"testing.crash.at": point, "testing.crash.flag": str(flag)})
    run = frame_run(spark, stream_join.build)
    sent = joins.events(seed=80, n=300, start=0)
    joins.send(config, sent)
    run(config)
    more = joins.events(seed=81, n=300, start=sent[-1][2])
    joins.send(config, more)
    sent += more
    flag.write_text("0")
    with pytest.raises(Exception, match="injected crash"):
        run(config)
    assert not flag.exists(), f"the crash point {point} was never reached"
    run(config)
    joins.check(config, sent, once=False)

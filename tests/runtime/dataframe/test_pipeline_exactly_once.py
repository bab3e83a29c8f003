"""Exactly-once output of a DataFrame pipeline (issue 34): the batch is the unit. The example
pipeline's stream output and its Parquet sink become visible only once every task's checkpoint
covers their batch, and a crash at the driver's and the publish's failpoints (and in a Python
worker) leaves each user's counts 1..N once on the stream and each view once in Parquet."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from generate import events
from pageviews_pipeline import job as example_pipeline

from sparkpoint import Batch, Output, Pipeline
from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError
from sparkpoint.failpoints import PUBLISH_POINTS, InjectedCrash
from sparkpoint.model import SystemStream
from sparkpoint.runtime.dataframe.runner import DataFrameRunner
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.reports import Transactions
from sparkpoint.storage.outputs import batch_owner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.streams import read_staged_json_lines
from tests.conftest import pageviews_config
from tests.helpers import (
    assert_at_least_once,
    assert_exactly_once,
    committed_counts,
    emitted_counts,
    generate,
    run_until_caught_up,
)

OUT = SystemStream("filelog", "user-counts")


def _config(tmp_path: Path, **overrides: str) -> Config:
    values = pageviews_config(
        tmp_path,
        **{
            "task.batch.max.messages": "300",
            "task.commit.ms": "0",
            "job.processing.guarantee": "exactly-once",
            **overrides,
        },
    )
    config = load_config(None, values)
    admin = Systems(config).admin("filelog")
    if "pageviews" not in admin.list_streams():
        admin.create_stream(StreamSpec("pageviews", 4))
    return config


def _coordinator(spark: Any, config: Config, pipeline: Pipeline = example_pipeline) -> Any:
    return JobCoordinator(config, DataFrameRunner(spark, pipeline, config))


def _run(spark: Any, config: Config) -> None:
    run_until_caught_up(_coordinator(spark, config))


def _sink_dir(config: Config) -> Path:
    return Path(config.require("job.data.dir")) / "enriched-views"


def _views(config: Config) -> Counter[tuple[str, int]]:
    """The (user, ts) of every view a reader of the Parquet sink sees."""
    batches = sorted(_sink_dir(config).glob("batch_id=*"))
    out: Counter[tuple[str, int]] = Counter()
    for b in batches:
        table = pq.read_table(b)
        users, stamps = table.column("user").to_pylist(), table.column("ts").to_pylist()
        out.update(zip(users, stamps, strict=True))
    return out


def _staged(config: Config) -> int:
    staging = Systems(config).admin("filelog").output_staging()
    assert staging is not None
    if OUT.stream not in Systems(config).admin("filelog").list_streams():
        return 0
    return len(staging.staged(OUT.stream))


def _crashed_in_batch_2(tmp_path: Path, spark: Any, seed: int) -> Counter[str]:
    """The example pipeline on 2,400 views of 20 users, crashed in the driver after its 6th
    checkpoint write (batch 2 covered by some tasks' checkpoints only); the views per user."""
    flag = tmp_path / "crash.flag"
    flag.write_text("5")
    crash = {"testing.crash.at": "after-checkpoint-write", "testing.crash.flag": str(flag)}
    config = _config(tmp_path, **crash)
    expected = generate(config, tmp_path / "a.yaml", 2400, seed=seed, users=20)
    with pytest.raises(InjectedCrash):
        _run(spark, config)
    return expected


def _want(n: int, seed: int, users: int) -> Counter[tuple[str, int]]:
    return Counter((str(e["user"]), int(str(e["ts"]))) for e in events(n, seed, users))


def test_a_batch_is_visible_only_once_its_checkpoints_are_written(
    tmp_path: Path, spark: Any
) -> None:
    config = _config(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 600, seed=81, users=12)
    coordinator = _coordinator(spark, config)
    coordinator.start()
    ssps = [s for t in coordinator.tasks.values() for s in t.model.ssps]
    end = {s: m.upcoming for s, m in coordinator.partition_metadata(ssps).items()}
    try:
        report, _ = coordinator.run_batch(end, commit=False)
        batch = report.batch
        assert emitted_counts(config) == {} and _views(config) == Counter()
        assert _staged(config) > 0  # staged, named in the batch log, nobody reads them
        staged = list(read_staged_json_lines(config, Systems(config), OUT))
        assert {r["owner"] for r in staged} == {batch_owner(config)}
        assert coordinator.batch_log is not None
        assert batch in coordinator.batch_log.outputs
        assert list((_sink_dir(config) / "_sparkpoint" / "staged").iterdir())
        assert report.transactions == Transactions(open=1)  # the batch's output: one
        report, _ = coordinator.run_batch(end, commit=True, wait=True)  # checkpoints cover it
        assert batch not in coordinator.batch_log.entries
        # both published at this batch's end: batch 1's, and this one's (no input, but its
        # parquet sink staged an empty batch)
        assert report.transactions == Transactions(committed=2, open=0)
    finally:
        coordinator.close()
    assert_exactly_once(config, expected)
    assert _views(config) == _want(600, 81, 12)
    assert _staged(config) == 0
    more = generate(config, tmp_path / "b.yaml", 900, seed=82, users=12)
    _run(spark, config)
    assert committed_counts(config) == dict(expected + more)
    assert_exactly_once(config, expected + more)
    assert _views(config) == _want(600, 81, 12) + _want(900, 82, 12)
    assert not list((_sink_dir(config) / "_sparkpoint" / "staged").iterdir())
    _run(spark, config)  # a start after a clean stop: nothing new, nothing again
    assert_exactly_once(config, expected + more)
    assert _views(config) == _want(600, 81, 12) + _want(900, 82, 12)


#: what the restart after a crash at each point must do (after-checkpoint-write: the 5th
#: write is the first of batch 2, so batch 2 is covered by one task's checkpoint only, and
#: only its first run's output holds that task's rows: the replay's would miss them)
AFTER_CRASH = {
    "after-checkpoint-write": "replaying batches",
    # the next publisher finishes it (publish-after-append is the same path, tested on its own
    # in tests/system/filelog/test_staging.py)
    "publish-after-intent": "stopped half-way",
    "after-snapshot": "replaying batches",  # in the finish, on the executor
    "after-output-flush": "replaying batches",  # a Python worker exits after staging its part
}


@pytest.mark.parametrize("point", sorted(AFTER_CRASH))
def test_a_crash_at_a_failpoint_publishes_each_batch_once(
    tmp_path: Path, spark: Any, point: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The driver crashes (an injected exception stops the coordinator as a kill would, with
    nothing after it run), or a Python worker exits (the test session's Spark does not retry
    a task, so the batch fails), in batch 2; the restart replays the batches no checkpoint
    covers and publishes the ones every checkpoint covers, each once."""
    caplog.set_level(logging.INFO, logger="sparkpoint")
    flag = tmp_path / "crash.flag"
    flag.write_text("5")  # in batch 2: some tasks' checkpoints cover it, some do not
    crash = {"testing.crash.at": point, "testing.crash.flag": str(flag)}
    if point == "after-output-flush":
        crash["testing.crash.mode"] = "exit"
    config = _config(tmp_path, **crash)
    expected = generate(config, tmp_path / "a.yaml", 2400, seed=83, users=20)
    with pytest.raises(Exception) as crashed:
        _run(spark, config)
    if point in PUBLISH_POINTS or point == "after-checkpoint-write":  # in the driver
        assert crashed.type is InjectedCrash
    elif point == "after-output-flush":  # the Python worker exited: the Spark job fails
        assert "Python worker exited unexpectedly" in str(crashed.value)
    else:  # raised on an executor: the Spark job fails with it
        assert "InjectedCrash" in str(crashed.value)
    assert not flag.exists(), "the crash point was never reached"
    caplog.clear()
    _run(spark, config)
    assert AFTER_CRASH[point] in caplog.text, caplog.text[-3000:]
    assert committed_counts(config) == dict(expected)
    assert_exactly_once(config, expected)
    assert _views(config) == _want(2400, 83, 20)
    assert _staged(config) == 0


def _to_function_sink(batch: Batch) -> Output:
    return batch.to_sink(batch.df.select("task"), lambda df, batch_id: None)


def test_a_sink_that_cannot_stage_is_refused_by_name(tmp_path: Path, spark: Any) -> None:
    config = _config(tmp_path)
    generate(config, tmp_path / "a.yaml", 50, seed=84, users=3)
    pipeline = Pipeline(_to_function_sink, config=config.to_dict())
    with pytest.raises(ConfigError, match="a function sink cannot stage its output"):
        run_until_caught_up(_coordinator(spark, config, pipeline))


def test_a_switch_to_at_least_once_after_a_crash_loses_nothing(
    tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Exactly-once, crashed with batch 2 covered by one task's checkpoint only; restarted
    at-least-once: batch 2's recorded output (with that task's rows, which its replay lacks)
    goes out at the start, and the Parquet sink holds each view once."""
    caplog.set_level(logging.INFO, logger="sparkpoint")
    expected = _crashed_in_batch_2(tmp_path, spark, seed=85)
    config = _config(tmp_path)
    caplog.clear()
    _run(spark, _config(tmp_path, **{"job.processing.guarantee": "at-least-once"}))
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)
    assert _views(config) == _want(2400, 85, 20)
    assert not list((_sink_dir(config) / "_sparkpoint" / "staged").iterdir())
    assert "the job now runs at-least-once: batch 2's staged output is published" in caplog.text


def _to_log(batch: Batch) -> Output:
    return batch.to_stream(batch.df.select("task", "key"), "log.out", key="key")


def test_output_to_a_system_that_cannot_stage_is_refused_naming_it(
    tmp_path: Path, spark: Any
) -> None:
    config = _config(
        tmp_path,
        **{
            "systems.log.factory": "tests.runtime.driver.test_exactly_once:NoStaging",
            "systems.log.path": str(tmp_path / "log"),
        },
    )
    generate(config, tmp_path / "a.yaml", 50, seed=86, users=3)
    pipeline = Pipeline(_to_log, config=config.to_dict())
    with pytest.raises(ConfigError, match=r"system 'log' cannot stage output"):
        run_until_caught_up(_coordinator(spark, config, pipeline))
    assert committed_counts(config) == {}  # nothing committed


@pytest.mark.kafka
def test_on_kafka_a_driver_crash_publishes_each_batch_once(
    tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The example pipeline with every stream on Kafka (a Tansu broker): the batch's stream
    output is staged in ``__sparkpoint-staged.user-counts`` and published in a Kafka
    transaction once every task's checkpoint covers the batch; the driver crashes between two
    tasks' checkpoint writes of batch 2, and the restart replays it and publishes once."""
    from sparkpoint.testing.services import TansuKafka

    caplog.set_level(logging.INFO, logger="sparkpoint")
    with TansuKafka(tmp_path / "tansu") as broker:
        flag = tmp_path / "crash.flag"
        flag.write_text("5")
        values = pageviews_config(
            tmp_path,
            broker.config("log"),
            **{
                "task.batch.max.messages": "300",
                "task.commit.ms": "0",
                "job.processing.guarantee": "exactly-once",
                "testing.crash.at": "after-checkpoint-write",
                "testing.crash.flag": str(flag),
            },
        )
        config = load_config(None, values)
        Systems(config).admin("log").create_stream(StreamSpec("pageviews", 4))
        expected = generate(config, tmp_path / "a.yaml", 2400, seed=84, users=20)
        with pytest.raises(InjectedCrash):
            _run(spark, config)
        caplog.clear()
        _run(spark, config)
        assert "replaying batches" in caplog.text
        assert committed_counts(config) == dict(expected)
        assert_exactly_once(config, expected)
        assert _views(config) == _want(2400, 84, 20)
        staging = Systems(config).admin("log").output_staging()
        assert staging is not None and staging.staged("user-counts") == []


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_after_a_job_reset_a_parquet_sink_refuses_the_earlier_run_s_batches(
    tmp_path: Path, spark: Any, guarantee: str
) -> None:
    """A reset starts batch ids at 1 again; the sink skipped every id its last-batch record
    covered, so the new run's output was never written, silently (a reviewer's 599 of 600
    views missing). The sink keeps the batch log's epoch with its record and refuses another
    epoch's, naming the directory; moved away, the new run's views are all written."""
    from sparkpoint.errors import SparkpointError
    from sparkpoint.tools.reset import reset_job

    config = _config(tmp_path, **{"job.processing.guarantee": guarantee})
    generate(config, tmp_path / "a.yaml", 600, seed=81, users=12)
    _run(spark, config)
    assert _views(config) == _want(600, 81, 12)
    reset_job(config, keep_input=False)
    config = _config(tmp_path, **{"job.processing.guarantee": guarantee})  # input again
    generate(config, tmp_path / "b.yaml", 600, seed=99, users=12)
    with pytest.raises(SparkpointError, match=r"parquet sink .*enriched-views holds batches"):
        _run(spark, config)
    _sink_dir(config).rename(tmp_path / "earlier-run")
    _run(spark, config)
    assert _views(config) == _want(600, 99, 12)


def test_an_apply_now_request_waits_for_the_replay_and_no_batch_id_is_given_twice(
    tmp_path: Path, spark: Any
) -> None:
    """A start that replays a batch while an apply-now request is pending (left by
    ``startpoint set --apply-now`` on a job that crashed): the request's commit batch took the
    id after the log's last, the replay went back to its own, and the next batch got the
    commit batch's id again: the sink skipped it as written (350 views missing, found by a
    reviewer). The request now waits for the replay, and a new batch's id is past every
    logged one."""
    from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
    from sparkpoint.startpoint.manager import StartpointManager

    expected = _crashed_in_batch_2(tmp_path, spark, seed=83)
    config = _config(tmp_path)
    store = CoordinatorStreamStore(config, source="test")
    try:
        StartpointManager(store).request_apply_now()
    finally:
        store.close()
    _run(spark, config)
    assert committed_counts(config) == dict(expected)
    assert _views(config) == _want(2400, 83, 20)
    assert_exactly_once(config, expected)

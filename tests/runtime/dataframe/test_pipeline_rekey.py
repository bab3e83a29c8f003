"""Re-keying in a DataFrame pipeline (issue 33, ``examples/rekey/rekey_pipeline.py``): stage 1
sends the batch's views to the intermediate stream keyed by user, stage 2 counts what earlier
batches re-keyed. The job runs at-least-once; only the intermediate stream is staged, and a
batch's part of it is published once every task's checkpoint covers the batch, so a crash at
the driver's and the publish's failpoints (and in a Python worker) never counts a view twice."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from rekey_pipeline import count_views
from rekey_pipeline import job as rekey_pipeline

from sparkpoint import Batch, Output, Pipeline
from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError
from sparkpoint.failpoints import InjectedCrash
from sparkpoint.runtime.dataframe.runner import DataFrameRunner
from sparkpoint.runtime.dataframe.sinks import ParquetSink
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.tools.jobs import job_overview
from tests.helpers import committed_counts, emitted_counts, run_until_caught_up
from tests.runtime.driver.test_intermediate import per_user, re_keyed, rekey_job, views


def _run(spark: Any, config: Config) -> None:
    run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, rekey_pipeline, config)))


def test_views_are_counted_per_user_and_other_output_is_not_staged(
    tmp_path: Path, spark: Any
) -> None:
    config = rekey_job(tmp_path, **{"task.batch.max.messages": "300"})
    written = views(config, tmp_path, 1200, seed=101)
    coordinator = JobCoordinator(config, DataFrameRunner(spark, rekey_pipeline, config))
    coordinator.start()
    ssps = [s for t in coordinator.tasks.values() for s in t.model.ssps]
    end = {s: m.upcoming for s, m in coordinator.partition_metadata(ssps).items()}
    try:
        coordinator.run_batch(end, commit=False)
        assert not re_keyed(config)  # staged: the batch's checkpoints are not written yet
        stage_2 = job_overview(config)["stages"][1]
        assert stage_2["staged"] == 300 * 4 > 0  # the batch read 300 a partition
        coordinator.run_batch(end, commit=True, wait=True)
        assert re_keyed(config)  # published with them
        coordinator.run_batch(_ends(coordinator), commit=False)  # stage 2 reads them
        assert emitted_counts(config)  # stage 2's output: at-least-once, sent as it goes
    finally:
        coordinator.close()
    _run(spark, config)
    assert committed_counts(config) == per_user(written)
    assert re_keyed(config) == written


def _ends(coordinator: Any) -> dict[Any, str]:
    ssps = [s for t in coordinator.tasks.values() for s in t.model.ssps]
    return {s: m.upcoming for s, m in coordinator.partition_metadata(ssps).items()}


#: what the restart after a crash must do: one point in the driver, one in a Python worker
#: (test_pipeline_exactly_once runs the same publish path through every point)
AFTER_CRASH = {
    "after-checkpoint-write": "replaying batches",
    "after-output-flush": "replaying batches",
}


@pytest.mark.parametrize("point", sorted(AFTER_CRASH))
def test_a_crash_at_a_failpoint_counts_each_view_once(
    tmp_path: Path, spark: Any, point: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="sparkpoint")
    flag = tmp_path / "crash.flag"
    # the driver's 5th checkpoint write is in batch 2 (some tasks' checkpoints cover it, some do
    # not); a worker's 5th output flush is in batch 1 or 2 (8 writers a batch: 2 outputs by 4)
    flag.write_text("5")
    crash = {"testing.crash.at": point, "testing.crash.flag": str(flag)}
    if point == "after-output-flush":
        crash["testing.crash.mode"] = "exit"
    config = rekey_job(tmp_path, **{"task.batch.max.messages": "300", **crash})
    written = views(config, tmp_path, 2400, seed=102)
    with pytest.raises(Exception) as crashed:
        _run(spark, config)
    if point == "after-checkpoint-write":  # in the driver
        assert crashed.type is InjectedCrash
    assert not flag.exists(), "the crash point was never reached"
    caplog.clear()
    _run(spark, config)
    assert AFTER_CRASH[point] in caplog.text, caplog.text[-3000:]
    assert committed_counts(config) == per_user(written)
    assert re_keyed(config) == written  # each view re-keyed once: none twice, none lost


def crashed_at_a_checkpoint_write(
    tmp_path: Path, spark: Any, flag_count: str
) -> tuple[Config, Counter[Any]]:
    """The re-key job on 2,400 views, crashed in the driver after checkpoint write number
    ``flag_count`` + 1 (``testing.crash.flag``): its config (crash keys included: the flag
    is used up) and the views written."""
    flag = tmp_path / "crash.flag"
    flag.write_text(flag_count)
    crash = {"testing.crash.at": "after-checkpoint-write", "testing.crash.flag": str(flag)}
    config = rekey_job(tmp_path, **{"task.batch.max.messages": "300", **crash})
    written = views(config, tmp_path, 2400, seed=102)
    with pytest.raises(InjectedCrash):
        _run(spark, config)
    return config, written


def test_a_startpoint_set_after_such_a_crash_waits_for_the_replay_and_loses_no_view(
    tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash between a batch's checkpoints, then a startpoint set before the restart. The
    tasks whose checkpoints cover the batch do not read its input again, so the rows they
    re-keyed in it come only from its replay: the start used to skip the replay (startpoints
    apply) and drop those rows (24 views never counted, found by a reviewer). Now the
    startpoint waits for the replay and then applies in the same run."""
    from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
    from sparkpoint.model import SystemStream
    from sparkpoint.startpoint.manager import NAMESPACE
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.startpoints import make_startpoint, set_startpoints
    from sparkpoint.tools.streams import committed_read_offsets

    caplog.set_level("INFO", logger="sparkpoint")
    # the driver's 5th checkpoint write: in batch 2, as above
    config, written = crashed_at_a_checkpoint_write(tmp_path, spark, "5")
    by_page = SystemStream("filelog", "pageviews-by-page")
    resume = committed_read_offsets(config, Systems(config), by_page)
    first = min(resume)
    # where its checkpoint resumes anyway: a startpoint that must change no count
    set_startpoints(
        config, str(by_page), make_startpoint(offset=resume[first]), partitions=[first.partition]
    )
    caplog.clear()
    _run(spark, config)
    assert "startpoints wait until batches 2-2" in caplog.text, caplog.text[-3000:]
    assert "from startpoint" in caplog.text and "(applied now)" in caplog.text
    assert committed_counts(config) == per_user(written)
    assert re_keyed(config) == written  # each view re-keyed once: none twice, none lost
    store = CoordinatorStreamStore(config, source="test")
    try:  # fanned out in this run: none waits for the next start
        assert store.all(NAMESPACE) == {}
    finally:
        store.close()


def test_a_rewinding_startpoint_after_every_checkpoint_of_a_batch_loses_none_of_its_rows(
    tmp_path: Path, spark: Any
) -> None:
    """A crash after the last checkpoint of batch 2, before its re-keyed rows were published,
    then a startpoint that rewinds one partition to its oldest offset. The rewound offsets made
    batch 2 look unread, so its re-keyed rows were dropped, though only the rewound task reads
    it again (599 of 2,400 views never counted, found by a reviewer). Coverage is judged by the
    written checkpoints alone: batch 2 is published whole, and the rewind re-keys its
    partition's views once more, as a rewind does."""
    from sparkpoint.model import SystemStream
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.startpoints import make_startpoint, set_startpoints
    from sparkpoint.tools.streams import committed_read_offsets

    # the driver's 8th checkpoint write: batch 2's last task's
    config, written = crashed_at_a_checkpoint_write(tmp_path, spark, "7")
    by_page = SystemStream("filelog", "pageviews-by-page")
    first = min(committed_read_offsets(config, Systems(config), by_page))
    oldest = make_startpoint(oldest=True)
    set_startpoints(config, str(by_page), oldest, partitions=[first.partition])
    _run(spark, config)
    got = re_keyed(config)
    assert {v: n for v, n in written.items() if got[v] < n} == {}  # none lost
    assert sum(got.values()) > sum(written.values())  # the rewound partition's, twice


@pytest.mark.parametrize("flag", ["0", "2"])
def test_a_rewind_then_a_crash_between_the_next_batch_s_checkpoints_re_keys_once_more(
    tmp_path: Path, spark: Any, flag: str
) -> None:
    """A rewinding startpoint applied, then a crash between the checkpoints of the first
    batches after it (the rewound task's not written), then a plain restart. The fan-out the
    first start applied (pinned to its offset) counted as a new startpoint: the restart
    deferred it, replayed the rewound task from its old checkpoint, published the logged
    batch with its rows, and applied the fan-out again: 300 views re-keyed three times (a
    reviewer's script). An earlier start's fan-out now applies at the start, as it did then,
    and the batches logged since count as read from it: each view of the rewound partition
    is re-keyed once more, none twice more, none lost."""
    from sparkpoint.model import SystemStream
    from sparkpoint.tools.startpoints import make_startpoint, set_startpoints

    config = rekey_job(tmp_path, **{"task.batch.max.messages": "300"})
    first = views(config, tmp_path, 1200, seed=201)
    _run(spark, config)
    second = views(config, tmp_path, 1200, seed=202)
    by_page = SystemStream("filelog", "pageviews-by-page")
    set_startpoints(config, str(by_page), make_startpoint(oldest=True), partitions=[3])
    counter = tmp_path / "crash.flag"
    counter.write_text(flag)
    crash = {"testing.crash.at": "after-checkpoint-write", "testing.crash.flag": str(counter)}
    with pytest.raises(InjectedCrash):
        _run(spark, rekey_job(tmp_path, **{"task.batch.max.messages": "300", **crash}))
    _run(spark, config)
    got, written = re_keyed(config), first + second
    extra = Counter(got[v] - written[v] for v in set(got) | set(written))
    assert set(extra) <= {0, 1} and extra[1] > 0, dict(extra)  # the rewound ones once more


def test_batch_input_names_an_input(tmp_path: Path, spark: Any) -> None:
    config = rekey_job(tmp_path)
    views(config, tmp_path, 10, seed=103)

    def build(batch: Any) -> list[Any]:
        batch.input("no-such-stream")
        return []

    from sparkpoint import Pipeline

    pipeline = Pipeline(build, config=config.to_dict(), value_schema="user STRING")
    with pytest.raises(ConfigError, match=r"batch.input\('no-such-stream'\): not an input"):
        run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, pipeline, config)))


def test_a_key_column_the_stream_s_serde_cannot_take_names_the_column(
    tmp_path: Path, spark: Any
) -> None:
    """Re-keyed by a LONG column into a stream of string keys: the error names the column and
    the two fixes, and nothing is staged or published (it named neither)."""
    from sparkpoint.errors import SparkpointError

    config = rekey_job(tmp_path)
    views(config, tmp_path, 20, seed=104)

    def build(batch: Batch) -> list[Output]:
        by_page = batch.input("pageviews-by-page").select("value.user", "value.ts")
        return [batch.to_stream(by_page, "filelog.pageviews-by-user", key="ts")]

    pipeline = Pipeline(build, config={}, value_schema="user STRING, page STRING, ts LONG")
    error = (
        r"cannot encode message for filelog.pageviews-by-user: .* \(the key column 'ts', the "
        r"whole row as value: cast them .* streams.pageviews-by-user.samza.key.serde"
    )
    with pytest.raises(SparkpointError, match=error):
        run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, pipeline, config)))
    assert not re_keyed(config)
    assert job_overview(config)["stages"][1]["staged"] == 0


def _with_sink(out: Path) -> Pipeline:
    """The re-key pipeline, also writing the views it re-keys to Parquet."""
    sink = ParquetSink(out)

    def build(batch: Batch) -> list[Output]:
        by_page = batch.input("pageviews-by-page").select("value.user", "value.page", "value.ts")
        views = batch.input("pageviews-by-user").select("task", F.col("value.user").alias("user"))
        counts = batch.stateful(
            views, count_views, "user STRING, count LONG", stores=["user-counts"]
        )
        return [
            batch.to_stream(by_page, "filelog.pageviews-by-user", key="user"),
            batch.to_sink(by_page, sink),
            batch.to_stream(counts, "filelog.user-counts", key="user"),
        ]

    return Pipeline(build, config={}, value_schema="user STRING, page STRING, ts LONG")


def test_a_switch_to_at_least_once_after_a_crash_loses_no_sink_row_nor_counts_twice(
    tmp_path: Path, spark: Any
) -> None:
    """Exactly-once crashes with batch 2 covered by some tasks' checkpoints only; the restart
    at-least-once publishes the recorded sink output (the replay's sink write of that batch
    would miss the covered tasks' rows) but keeps the recorded re-keyed rows for the replay."""
    flag = tmp_path / "crash.flag"
    flag.write_text("5")
    crash = {"testing.crash.at": "after-checkpoint-write", "testing.crash.flag": str(flag)}
    config = rekey_job(
        tmp_path,
        **{"task.batch.max.messages": "300", "job.processing.guarantee": "exactly-once", **crash},
    )
    written = views(config, tmp_path, 2400, seed=104)
    pipeline = _with_sink(tmp_path / "sink")
    with pytest.raises(InjectedCrash):
        run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, pipeline, config)))
    assert not flag.exists()
    alo = load_config(None, {**dict(config.items()), "job.processing.guarantee": "at-least-once"})
    run_until_caught_up(JobCoordinator(alo, DataFrameRunner(spark, pipeline, alo)))
    assert committed_counts(alo) == per_user(written)
    assert re_keyed(alo) == written
    assert spark.read.parquet(str(tmp_path / "sink")).count() == 2400


def test_a_pipeline_commits_at_its_intervals_while_re_keyed_records_are_left(
    tmp_path: Path, spark: Any
) -> None:
    """With long commit intervals a run to the end commits to drain what stage 1 re-keyed,
    and at its last batch: not at every batch that reads the intermediate stream. The driver
    bounds a pipeline's reads itself (exact batches), so a run's last batch is the one whose
    intermediate partitions hold no more than one batch reads, not the one its bound ends."""
    long = {"task.commit.ms": "600000", "task.commit.intermediate.ms": "600000"}
    config = rekey_job(tmp_path, **long)  # 100 messages a partition per batch
    written = views(config, tmp_path, 1600, seed=104)
    coordinator = JobCoordinator(config, DataFrameRunner(spark, rekey_pipeline, config))
    try:
        summary = coordinator.run(until_caught_up=True)
    finally:
        coordinator.close()
    assert committed_counts(config) == per_user(written)
    assert summary.commits <= 4 < summary.batches, summary

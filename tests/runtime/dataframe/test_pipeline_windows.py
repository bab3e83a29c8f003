"""Windows in the DataFrame API (``batch.window``): the windows example as a pipeline
(``examples/windows/windows_pipeline.py``) emits exactly the plain Python reference's closed
windows, as the task API does; a job that moves from the task API to the pipeline mid-way keeps
its open windows (the same state layout); bad windows name the fix."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from windows_pipeline import build
from windows_task import UserWindows

from sparkpoint import count, hopping_window, session_window, tumbling_window
from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.dataframe.pipeline import Batch, Pipeline
from sparkpoint.runtime.dataframe.runner import DataFrameRunner
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.testing import JobTestDriver
from tests.runtime.executor.test_windows import (
    BAD,
    HOP_SIZE,
    HOP_SLIDE,
    MINUTE,
    SESSION,
    Views,
    _triggered,
    check,
    check_hops,
    emitted,
    job,
    run_rounds,
    send,
    views,
)


def run(
    config: Config, spark: Any | None, pipeline_of: Any = build, *, final_watermark: bool = False
) -> None:
    if spark is None:
        runner: Any = InlineRunner()
    else:
        pipeline = Pipeline(
            pipeline_of, config=config.to_dict(), value_schema="user STRING, page STRING, ts LONG"
        )
        runner = DataFrameRunner(spark, pipeline, config)
    coordinator = JobCoordinator(config, runner)
    try:
        coordinator.run(until_caught_up=True, final_watermark=final_watermark)
    finally:
        coordinator.close()


@pytest.mark.parametrize("api", ["task", "frame"])
def test_a_final_watermark_closes_every_window_once(tmp_path: Path, spark: Any, api: str) -> None:
    """Issue 72: a bounded run left its still-open windows and sessions unemitted; with
    --final-watermark every one goes out once, in both APIs, and none is left in state."""
    config = job(tmp_path)
    sent = views(300, seed=97, start_ms=0)
    send(config, sent)
    run(config, spark if api == "frame" else None)
    check(config, sent, once=True)
    run(config, spark if api == "frame" else None, final_watermark=True)
    check(config, sent, once=True, at_end=True)


@pytest.mark.parametrize("apis", [("frame", "frame"), ("task", "frame")])
def test_the_pipeline_closes_the_reference_s_windows_and_keeps_the_task_api_s(
    tmp_path: Path,
    spark: Any,
    apis: tuple[str, str],
    log_system: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = job(tmp_path, log_system)
    sent: Views = []
    for round_, api in enumerate(apis):
        batch = views(400, seed=90 + round_, start_ms=sent[-1][1] if sent else 0)
        send(config, batch)
        sent += batch
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="sparkpoint.runtime.dataframe.runner"):
            run(config, spark if api == "frame" else None)
        check(config, sent, once=True)
        if api == "frame":  # the window step sends both streams itself, reading its input
            lines = [r.getMessage() for r in caplog.records if "outputs written" in r.getMessage()]
            assert lines and all(
                "(2 fused with their step, 2 of them reading their own input)" in line
                for line in lines
            ), lines
    assert not emitted(config, "late-views", ("key",))


def test_late_rows_go_to_the_late_stream(tmp_path: Path, spark: Any) -> None:
    config = job(tmp_path)
    first = views(300, seed=95, start_ms=0)
    send(config, first)
    run(config, spark)
    send(config, [("user-01", 0)])  # its minute and its session closed long ago
    run(config, spark)
    assert [r[0] for r in emitted(config, "late-views", ("key",))] == ["user-01"]
    assert emitted(config, "late-views", ("key",))[("user-01",)] == 2  # both windows refused it
    assert len(emitted(config, "user-minute-counts", MINUTE)) > 0
    assert len(emitted(config, "user-sessions", SESSION)) > 0


class _WithoutLateStream(UserWindows):
    """The windows example's task with no late stream: a late add goes nowhere."""

    def init(self, context: Any) -> None:
        super().init(context)
        for store in (self.minutes, self.sessions):
            store.late_stream = None


def _without_late_stream(batch: Batch) -> Any:
    windows = [
        tumbling_window("minute-counts", size_ms=60_000),
        session_window("sessions", gap_ms=30_000),
    ]
    views = batch.df.select("task", "value.user", "event_time")
    return [batch.to_stream(batch.window(views, key="user", windows=windows), "filelog.out")]


@pytest.mark.parametrize(
    ("api", "late_stream"), [("task", False), ("frame", True), ("frame", False)]
)
def test_late_adds_are_counted_with_a_late_stream_or_without(
    tmp_path: Path, spark: Any, api: str, late_stream: bool
) -> None:
    """A window add refused as late is counted (``task_window_late_records``, and an INFO line
    naming the store), whether it goes to a late stream or, without one, nowhere: nothing a
    window store refuses goes uncounted (it was counted only when sent to a late stream)."""
    from sparkpoint.runtime.driver.metrics import JobMetrics

    overrides = {} if late_stream else {"task.class": f"{__name__}:_WithoutLateStream"}
    config = job(tmp_path, **overrides)
    pipeline_of = build if late_stream else _without_late_stream
    send(config, views(300, seed=95, start_ms=0))
    run(config, spark if api == "frame" else None, pipeline_of)
    send(config, [("user-01", 0), ("user-02", 0)])  # their windows closed long ago
    runner: Any = InlineRunner()
    if api == "frame":
        pipeline = Pipeline(
            pipeline_of, config=config.to_dict(), value_schema="user STRING, page STRING, ts LONG"
        )
        runner = DataFrameRunner(spark, pipeline, config)
    coordinator = JobCoordinator(config, runner)
    coordinator.start()
    try:
        end = {
            s: m.upcoming for s, m in coordinator.partition_metadata(coordinator.all_ssps()).items()
        }
        report, results = coordinator.run_batch(end, commit=True)
    finally:
        coordinator.close()
    # each view refused by its minute and by its session
    assert sum(r.window_late for r in results) == 4, results
    metrics = JobMetrics("j")
    metrics.record(report)
    counted = {g: v.get("task_window_late_records_total", 0) for g, v in metrics.snapshot().items()}
    assert sum(counted.values()) == 4, counted
    late = sorted(k[0] for k in emitted(config, "late-views", ("key",)))
    assert late == (["user-01", "user-02"] if late_stream else [])


@pytest.mark.parametrize(
    "point", [None, "during-stateful-step", "after-snapshot", "after-checkpoint-write"]
)
def test_exactly_once_stages_late_rows_with_the_batch(
    tmp_path: Path, spark: Any, point: str | None
) -> None:
    """Exactly-once: a step's late rows are staged as parts of the batch and published with
    its commit, as its other output (issue 72: refused before); a crash anywhere in the
    batch leaves every late row and every window once."""
    flag = tmp_path / "crash.flag"
    crash = {} if point is None else {"testing.crash.at": point, "testing.crash.flag": str(flag)}
    config = job(tmp_path, **{"job.processing.guarantee": "exactly-once", **crash})
    sent = views(300, seed=97, start_ms=0)
    send(config, sent)
    run(config, spark)
    more = views(100, seed=99, start_ms=sent[-1][1])
    send(config, [("user-01", 0), ("user-02", 0), *more])  # their windows closed long ago
    if point is not None:
        flag.write_text("0")
        with pytest.raises(Exception, match="injected crash"):  # however a worker shows it
            run(config, spark)
        assert not flag.exists(), f"the crash point {point} was never reached"
    run(config, spark)
    # each late view refused by its minute and by its session: two late rows, not four
    assert emitted(config, "late-views", ("key",)) == {("user-01",): 2, ("user-02",): 2}
    check(config, sent + more, once=True)


def _two_steps(batch: Batch) -> Any:
    views = batch.df.select("task", "value.user", "event_time")
    batch.window(views, key="user", windows=tumbling_window("minute-counts", size_ms=60_000))
    batch.window(views, key="user", windows=session_window("sessions", gap_ms=1), name="other")
    return []


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: tumbling_window("w", size_ms=0), "a window's size must be a positive integer"),
        (lambda: session_window("w", gap_ms=-1), "a session's gap must be a positive integer"),
        (
            lambda: [tumbling_window("w", size_ms=1, aggregate=count())] * 2,
            r"two windows keep their state in one store",
        ),
    ],
)
def test_bad_windows_name_the_fix(tmp_path: Path, spark: Any, make: Any, error: str) -> None:
    config = job(tmp_path)
    send(config, views(10, seed=96, start_ms=0))

    def build_bad(batch: Batch) -> Any:
        views_ = batch.df.select("task", "value.user", "event_time")
        return [batch.to_stream(batch.window(views_, key="user", windows=make()), "filelog.out")]

    for bad in (build_bad, _two_steps):
        pipeline = Pipeline(
            bad, config=config.to_dict(), value_schema="user STRING, page STRING, ts LONG"
        )
        coordinator = JobCoordinator(config, DataFrameRunner(spark, pipeline, config))
        try:
            with pytest.raises(
                ConfigError, match=error if bad is build_bad else "both have timers"
            ):
                coordinator.run(until_caught_up=True)
        finally:
            coordinator.close()


@pytest.mark.parametrize("point", ["during-stateful-step", "after-output-flush"])
def test_a_crash_in_the_batch_leaves_the_windows_exact(
    tmp_path: Path, spark: Any, point: str
) -> None:
    flag = tmp_path / "crash.flag"
    config = job(tmp_path, **{"testing.crash.at": point, "testing.crash.flag": str(flag)})
    sent = views(300, seed=97, start_ms=0)
    send(config, sent)
    run(config, spark)
    more = views(300, seed=98, start_ms=sent[-1][1])
    send(config, more)
    sent += more
    flag.write_text("0")
    with pytest.raises(Exception, match="injected crash"):  # in a Spark worker, however it shows
        run(config, spark)
    assert not flag.exists(), f"the crash point {point} was never reached"
    run(config, spark)  # the restart: from the last checkpoint
    check(config, sent, once=False)  # a window may go out again, always with its one value


def _with_triggers(batch: Batch) -> Any:
    early, lateness = batch.config.get("testing.triggers", "on-time,0").split(",")
    closed = batch.window(
        batch.df.select("task", "key", "event_time"),
        key="key",
        windows=tumbling_window(
            "w",
            size_ms=1000,
            late_stream="log.late",
            early=early == "early",
            allowed_lateness_ms=int(lateness),
        ),
    )
    out = closed.select(
        F.col("window_start").alias("start"), F.col("value").alias("count"), "emission", "key"
    )
    return batch.to_stream(out, "log.out", key="key")


def test_triggers_emit_as_the_task_api_does(tmp_path: Path, spark: Any) -> None:
    """Early emissions and an allowed lateness at once (the task API's tests take each
    alone), the same in both APIs."""
    triggers = "early,2000"
    rounds = [[100, 200], [1500], [500], [700, 3500], [600]]
    config = {**BAD, "testing.triggers": triggers}
    pipeline = Pipeline(_with_triggers, config=config, value_type="LONG")
    with JobTestDriver(pipeline, tmp_path / "frame", spark=spark) as kit:
        frame = run_rounds(kit, rounds, "count")
    assert frame == _triggered(tmp_path / "task", triggers, rounds)


def _hops(batch: Batch) -> Any:
    """The task API's ``_Hops`` as a pipeline: views per user in hopping windows."""
    system = batch.config.inputs[0].system
    views = batch.df.select("task", "value.user", "event_time")
    window = hopping_window("minute-counts", size_ms=HOP_SIZE, slide_ms=HOP_SLIDE)
    closed = batch.window(views, key="user", windows=window)
    out = closed.select(
        F.col("key").alias("user"), "window_start", "window_end", F.col("value").alias("count")
    )
    return [batch.to_stream(out, f"{system}.user-minute-counts", key="user")]


def test_hopping_windows_move_between_the_apis_and_stay_exact_across_a_crash(
    tmp_path: Path, spark: Any, log_system: dict[str, str]
) -> None:
    """Hopping windows opened by the task API go on in the pipeline (the same layout), which
    a crash in its window step leaves exact."""
    flag = tmp_path / "crash.flag"
    config = job(
        tmp_path,
        log_system,
        **{
            "task.class": "tests.runtime.executor.test_windows:_Hops",
            "testing.crash.at": "during-stateful-step",
            "testing.crash.flag": str(flag),
        },
    )
    sent = views(300, seed=86, start_ms=0)
    send(config, sent)
    run(config, None)  # the task API
    check_hops(config, sent)
    more = views(300, seed=87, start_ms=sent[-1][1])
    send(config, more)
    sent += more
    flag.write_text("0")
    with pytest.raises(Exception, match="injected crash"):
        run(config, spark, _hops)
    assert not flag.exists(), "the crash point was never reached"
    run(config, spark, _hops)
    check_hops(config, sent)

"""Timers and event time in the DataFrame API: a stateful step with ``on_timer`` does what the
task API's ``on_timer`` does, with the same results on the same input and clock (the test
pipeline ``timer_pipeline`` is the task ``timer_task:IdleUsers``, step for step); the fake clock
of the driver reaches Spark's workers through the batch plan; timers fire once in committed
state across a crash in the step; bad use names the fix."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from timer_pipeline import pipeline
from timer_task import IDLE_MS

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, SparkpointError
from sparkpoint.model import SystemStream
from sparkpoint.model.clock import use_clock
from sparkpoint.runtime.dataframe.pipeline import Batch, Output, Pipeline
from sparkpoint.runtime.dataframe.runner import DataFrameRunner
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.registry import Systems
from sparkpoint.tools.streams import Message, send_messages
from tests.helpers import committed_counts, generate
from tests.runtime.executor.test_timers import T0, Clock, idle, rows, timer_job


@pytest.fixture
def clock() -> Iterator[type[Clock]]:
    Clock.now = T0
    with use_clock(lambda: Clock.now):
        yield Clock


def run(config: Config, spark: Any | None) -> list[Any]:
    """Run the job until caught up, on the DataFrame API (``spark``) or the task API; the
    results of its last batch."""
    runner = InlineRunner() if spark is None else DataFrameRunner(spark, pipeline(config), config)
    coordinator = JobCoordinator(config, runner)
    try:
        coordinator.start()
        end = {
            s: m.upcoming for s, m in coordinator.partition_metadata(coordinator.all_ssps()).items()
        }
        _report, results = coordinator.run_batch(end, commit=True)
        coordinator.run(until_caught_up=True)
        return list(results)
    finally:
        coordinator.close()


def test_idle_timers_fire_once_as_in_the_task_api(
    tmp_path: Path, spark: Any, clock: type[Clock]
) -> None:
    """(Timers on Kafka: tests/runtime/executor/test_timers.py; the store and the system are
    the same for both APIs.)"""
    seen: dict[str, tuple[list[tuple[str, int]], dict[str, int]]] = {}
    for api in ("task", "frame"):
        clock.now = T0
        (tmp_path / api).mkdir()
        config = timer_job(tmp_path / api)
        on = spark if api == "frame" else None
        a = generate(config, tmp_path / api / "a.yaml", 300, seed=81, users=12)
        run(config, on)
        assert idle(config) == [] and committed_counts(config) == dict(a)
        clock.now += IDLE_MS - 1
        generate(config, tmp_path / api / "b.yaml", 5, seed=82, users=2)
        run(config, on)
        assert idle(config) == []  # 1 ms early: nothing is due
        clock.now += 1
        generate(config, tmp_path / api / "c.yaml", 3, seed=83, users=1)
        results = run(config, on)
        assert sum(r.timers_fired for r in results) == len(idle(config)) > 0
        seen[api] = (idle(config), committed_counts(config))
    assert seen["frame"] == seen["task"]
    fired, left = seen["frame"]
    assert {u for u, _ in fired}.isdisjoint(left) and len(fired) + len(left) == 12


def test_event_time_timers_and_late_rows_as_in_the_task_api(
    tmp_path: Path, spark: Any, clock: type[Clock]
) -> None:
    out: dict[str, dict[str, Counter[tuple[Any, ...]]]] = {}
    for api in ("task", "frame"):
        config = timer_job(tmp_path / api, **{"testing.timers.event": "true"})
        on = spark if api == "frame" else None
        generate(config, tmp_path / api / "a.yaml", 200, seed=94, users=10)
        run(config, on)
        generate(config, tmp_path / api / "b.yaml", 200, seed=94, users=10)  # late now
        results = run(config, on)
        late = rows(config, "late")
        assert sum(r.late for r in results) == len(late) > 0
        out[api] = {
            s: Counter(tuple(sorted(r["value"].items())) for r in rows(config, s))
            for s in ("due", "late")
        }
    assert out["frame"] == out["task"]
    assert sum(out["frame"]["due"].values()) > 0


def test_the_test_clock_reaches_the_workers_and_due_while_down_fires_at_start(
    tmp_path: Path, spark: Any, clock: type[Clock]
) -> None:
    config = timer_job(tmp_path)
    a = generate(config, tmp_path / "a.yaml", 100, seed=85, users=5)
    run(config, spark)
    shutil.rmtree(config.store_base_dir)  # and the host is lost while the job is down
    clock.now += 24 * 3600 * 1000  # a day in the driver's clock only: the workers follow it
    run(config, spark)
    assert idle(config) == sorted(a.items())
    assert committed_counts(config) == {}


@pytest.mark.parametrize("point", ["during-stateful-step", "after-output-flush"])
def test_a_crash_in_the_batch_never_fires_a_timer_twice_in_committed_state(
    tmp_path: Path, spark: Any, clock: type[Clock], point: str
) -> None:
    flag = tmp_path / "crash.flag"
    config = timer_job(tmp_path, **{"testing.crash.at": point, "testing.crash.flag": str(flag)})
    a = generate(config, tmp_path / "a.yaml", 200, seed=88, users=8)
    run(config, spark)
    clock.now += IDLE_MS
    generate(config, tmp_path / "b.yaml", 2, seed=89, users=1)
    flag.write_text("0")
    with pytest.raises(Exception, match="injected crash"):  # in a Spark worker, however it shows
        run(config, spark)
    assert not flag.exists(), f"the crash point {point} was never reached"
    run(config, spark)  # the restart: from the last checkpoint
    fired = Counter(u for u, _ in idle(config))
    assert set(fired) == set(a) - {"user-00000"}  # at least once each
    assert set(committed_counts(config)) == {"user-00000"}
    clock.now += IDLE_MS // 2  # nothing new is due; a refire would show up here
    generate(config, tmp_path / "d.yaml", 1, seed=91, users=1)
    run(config, spark)
    assert Counter(u for u, _ in idle(config)) == fired


def _plain(batch: Batch) -> Output:
    views = batch.df.select("task", "value.user")
    out = batch.stateful(views, lambda state, chunks: iter(()), "user STRING")
    return batch.to_stream(out, "filelog.out", key="user")


def _with_timer(batch: Batch) -> Output:
    views = batch.df.select("task", "value.user")
    out = batch.stateful(
        views, lambda state, chunks: iter(()), "user STRING", on_timer=lambda s, e: iter(())
    )
    return batch.to_stream(out, "filelog.out", key="user")


def _touching_timers(batch: Batch) -> Output:
    def step(state: Any, chunks: Any) -> Iterator[Any]:
        state.timers.register("a", 1)
        yield from ()

    out = batch.stateful(batch.df.select("task", "value.user"), step, "user STRING")
    return batch.to_stream(out, "filelog.out", key="user")


@pytest.mark.parametrize(
    ("build", "overrides", "error"),
    [
        (_with_timer, {"task.timers.store": ""}, "on_timer needs a store to keep the timers"),
        (_plain, {}, "task.timers.store='timers' is set, but no stateful step has on_timer"),
        (_touching_timers, {}, "has no timers: pass on_timer=... to batch.stateful"),
        (
            _with_timer,
            {"stores.timers.rocksdb.ttl.ms": "1000"},
            "timers would expire without firing",
        ),
        (
            _with_timer,
            {"streams.pageviews.event.time.field": "when"},
            "event.time.field='when': a DataFrame pipeline reads the event time from its "
            "value_schema; add 'when LONG' to it",
        ),
    ],
)
def test_bad_use_of_timers_names_the_fix(
    tmp_path: Path,
    spark: Any,
    clock: type[Clock],
    build: Any,
    overrides: dict[str, str],
    error: str,
) -> None:
    config = timer_job(tmp_path, **overrides)
    if build is _touching_timers:
        config = timer_job(tmp_path, **{"task.timers.store": "", **overrides})
    generate(config, tmp_path / "a.yaml", 20, seed=96, users=2)
    job = Pipeline(build, config=config.to_dict(), value_schema="user STRING, page STRING, ts LONG")
    coordinator = JobCoordinator(config, DataFrameRunner(spark, job, config))
    try:
        with pytest.raises((ConfigError, SparkpointError), match=error):
            coordinator.run(until_caught_up=True)
    finally:
        coordinator.close()


def test_a_message_without_its_event_time_names_the_offset(
    tmp_path: Path, spark: Any, clock: type[Clock]
) -> None:
    config = timer_job(tmp_path, **{"streams.pageviews.event.time.field": "ts"})
    generate(config, tmp_path / "a.yaml", 20, seed=97, users=2)

    systems = Systems(config)
    views = SystemStream("filelog", "pageviews")
    send_messages(config, systems, views, [Message({"user": "x", "page": "/"}, key="x")])
    systems.close()
    with pytest.raises(SparkpointError, match=r"offset \d+ has no event time: streams\.pageviews"):
        run(config, spark)

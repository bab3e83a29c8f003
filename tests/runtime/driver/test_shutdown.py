"""``task.shutdown.ms`` (issue 72: it was declared and read nowhere): a stop asked from outside
(SIGTERM, Ctrl-C) lets the running batch finish and commit, for that long at most; then the
batch's Spark jobs are cancelled, the run ends with one line naming the key, nothing the batch
did is committed, and the next start counts its input once."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sparkpoint.config import Config, load_config
from sparkpoint.errors import ShutdownOverdue
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.shutdown import ShutdownWatch
from sparkpoint.runtime.spark.session import SparkRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from tests.conftest import pageviews_config
from tests.helpers import add_input, committed_counts, generate


def _job(tmp_path: Path, **overrides: str) -> Config:
    values = pageviews_config(
        tmp_path,
        **{
            "task.class": "faulty_task:BlockingCounter",
            "test.block.started": str(tmp_path / "started"),
            "test.block.flag": str(tmp_path / "block.flag"),
            "task.commit.ms": "0",
            **overrides,
        },
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    return config


def _running(config: Config, spark: Any) -> tuple[JobCoordinator, threading.Thread, list[Any]]:
    """The job running in a thread, its batch held by the view of user ``block``."""
    coordinator = JobCoordinator(config, SparkRunner(spark.sparkContext))
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(coordinator.run(until_caught_up=True))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started = Path(config.require("test.block.started"))
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.05)
    assert started.exists(), outcome
    return coordinator, thread, outcome


def test_a_batch_past_the_shutdown_time_is_cancelled_and_read_again(
    tmp_path: Path, spark: Any
) -> None:
    config = _job(tmp_path, **{"task.shutdown.ms": "500"})
    expected = generate(config, tmp_path / "a.yaml", 200, seed=61, users=8)
    add_input(config, json.dumps({"user": "block", "page": "/"}).encode(), user="block")
    flag = Path(config.require("test.block.flag"))
    flag.touch()
    coordinator, thread, outcome = _running(config, spark)
    asked = time.monotonic()
    coordinator.stop("signal SIGTERM", bounded=True)
    thread.join(120)
    waited = time.monotonic() - asked
    flag.unlink()  # the cancelled task's Python worker may finish now
    coordinator.close()
    assert not thread.is_alive()
    [error] = outcome
    assert isinstance(error, ShutdownOverdue), error
    assert "did not finish within task.shutdown.ms=500 after signal SIGTERM" in str(error)
    assert waited < 60, waited  # not the task's minute: the batch was cancelled
    assert committed_counts(config) == {}  # nothing of the cancelled batch committed
    rerun = JobCoordinator(config, SparkRunner(spark.sparkContext))
    rerun.run(until_caught_up=True)
    rerun.close()
    assert committed_counts(config) == dict(
        expected + Counter({"block": 1})
    )  # once, from the start


def test_a_batch_within_the_shutdown_time_finishes_and_commits(tmp_path: Path, spark: Any) -> None:
    config = _job(tmp_path)  # the default: 30 s
    expected = generate(config, tmp_path / "a.yaml", 200, seed=62, users=8)
    add_input(config, json.dumps({"user": "block", "page": "/"}).encode(), user="block")
    flag = Path(config.require("test.block.flag"))
    flag.touch()
    coordinator, thread, outcome = _running(config, spark)
    coordinator.stop("signal SIGTERM", bounded=True)
    time.sleep(0.5)  # the batch is still held: the stop waits for it
    assert thread.is_alive()
    flag.unlink()
    thread.join(120)
    coordinator.close()
    assert not isinstance(outcome[0], Exception), outcome
    assert committed_counts(config) == dict(expected + Counter({"block": 1}))


def test_the_watch_cancels_once_its_time_is_up_and_not_after_the_run_ended(
    tmp_path: Path,
) -> None:
    config = _job(tmp_path, **{"task.shutdown.ms": "1"})
    cancelled = threading.Event()
    watch = ShutdownWatch(config, cancelled.set)
    watch.arm("x")
    assert cancelled.wait(10) and watch.overdue
    assert "task.shutdown.ms=1 after x, so it was cancelled" in str(watch.error())
    calm = threading.Event()
    ended = ShutdownWatch(config.with_overrides({"task.shutdown.ms": "200"}), calm.set)
    ended.arm("y")
    ended.disarm()  # the run ended first
    assert not calm.wait(0.5) and not ended.overdue

"""``sparkpoint.run`` on a Spark session the caller holds (the test run's session): a task API
job whose module lives only next to its job file (so the workers import it from what ``run``
shipped), run twice in one process; a DataFrame ``Pipeline`` object; Ctrl-C in the middle of
a run that would go on for ever commits and returns; a session without a SparkContext is
refused in one line."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from counts_pipeline import build

import sparkpoint
from sparkpoint.errors import UserError
from sparkpoint.runtime.driver.callers_session import session_context
from sparkpoint.tools.streams import Message
from tests.helpers import committed_counts

TASK = """
from sparkpoint import StreamTask


class Counts(StreamTask):
    def init(self, context):
        self.counts = context.get_store("counts")

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)
"""


def job_dir(tmp_path: Path) -> tuple[Path, str]:
    """A job file and its task module (named uniquely: no worker has imported it before)."""
    module = f"shipped_{uuid.uuid4().hex[:8]}"
    directory = tmp_path / "job"
    directory.mkdir()
    (directory / f"{module}.py").write_text(TASK)
    config = {
        "job.name": "shipped",
        "job.data.dir": str(tmp_path / "data"),
        "systems.filelog.factory": "filelog",
        "task.class": f"{module}:Counts",
        "task.inputs": "filelog.views",
        "streams.views.partitions": "2",
        "stores.counts.factory": "rocksdb",
        "stores.counts.changelog": "filelog.counts-changelog",
        "stores.counts.msg.serde": "json",
    }
    job = directory / "job.json"
    job.write_text(json.dumps(config))  # JSON is YAML
    return job, module


def send(job: Path, users: list[str]) -> None:
    from sparkpoint.config import load_config
    from sparkpoint.model import SystemStream
    from sparkpoint.system.registry import Systems
    from sparkpoint.system.streams import ensure_stream
    from sparkpoint.tools.streams import send_messages

    config = load_config(job)
    systems = Systems(config)
    try:
        stream = SystemStream("filelog", "views")
        ensure_stream(config, systems, stream)
        send_messages(config, systems, stream, [Message(1, key=u) for u in users])
    finally:
        systems.close()


def counts(job: Path) -> dict[str, int]:
    from sparkpoint.config import load_config
    from sparkpoint.tools.state import committed_entries

    return {k: v for _t, k, v in committed_entries(load_config(job), "counts")}


def test_a_task_job_runs_twice_on_the_caller_s_session(tmp_path: Path, spark: Any) -> None:
    job, _module = job_dir(tmp_path)
    first = [f"u{i % 7}" for i in range(200)]
    send(job, first)
    summary = sparkpoint.run(str(job), spark=spark, until_caught_up=True)
    assert summary.processed == 200
    assert counts(job) == dict(Counter(first))
    more = [f"u{i % 5}" for i in range(100)]
    send(job, more)
    sparkpoint.run(job, spark=spark, until_caught_up=True)  # a notebook's second run
    assert counts(job) == dict(Counter(first + more))
    assert not spark.sparkContext._jsc.sc().isStopped()  # the caller's session runs on


def test_a_pipeline_object_runs_on_the_caller_s_session(tmp_path: Path, spark: Any) -> None:
    from tests.helpers import changelog_job as make
    from tests.helpers import generate

    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 300, seed=3)
    pipeline = sparkpoint.Pipeline(
        build, config=config.to_dict(), value_schema="user STRING, page STRING, ts LONG"
    )
    summary = sparkpoint.run(pipeline, spark=spark, until_caught_up=True)
    assert summary.processed == 300
    assert committed_counts(config) == dict(expected)


def test_ctrl_c_finishes_the_batch_commits_and_returns(tmp_path: Path, spark: Any) -> None:
    job, _module = job_dir(tmp_path)
    users = [f"u{i % 3}" for i in range(50)]
    send(job, users)
    timer = threading.Timer(6.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        summary = sparkpoint.run(job, spark=spark)  # no end of its own: Ctrl-C ends it
    finally:
        timer.cancel()
    assert summary.stopped_by == "interrupted"
    assert counts(job) == dict(Counter(users))
    assert signal.getsignal(signal.SIGINT) is not None  # the previous handler is back


def test_a_session_without_a_spark_context_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="it has no SparkContext .a Spark Connect session"):
        session_context(object())

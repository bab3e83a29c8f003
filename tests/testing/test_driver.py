"""sparkpoint.testing.JobTestDriver: a task class defined in a test, in-memory and RocksDB
stores, keyed input, a restart from the last commit, and a DataFrame pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkpoint import OutgoingMessageEnvelope, StreamTask, SystemStream
from sparkpoint.errors import UserError
from sparkpoint.testing import JobTestDriver, Message

CONFIG = {
    "job.name": "words",
    "systems.log.factory": "filelog",
    "task.inputs": "log.words",
    "streams.words.partitions": "3",
    "stores.seen.factory": "in-memory",
    "stores.seen.key.serde": "string",
    "stores.seen.msg.serde": "integer",
}


def test_a_task_class_defined_in_a_test_runs_on_keyed_messages(tmp_path: Path) -> None:
    class FirstSeen(StreamTask):
        def init(self, context: Any) -> None:
            self.seen = context.get_store("seen")
            self.task = context.task_name.name

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            word = envelope.key
            if self.seen.get(word) is None:
                self.seen.put(word, int(envelope.offset))
                out = SystemStream("log", "firsts")
                collector.send(OutgoingMessageEnvelope(out, word, {"task": self.task}))

    with JobTestDriver(CONFIG, tmp_path, task=FirstSeen) as job:
        sent = job.send("words", [Message(None, key=w) for w in ["a", "b", "a", "c", "b"]])
        assert sent == 5
        job.run()
        assert set(job.store("seen")) == {"a", "b", "c"}
        firsts = job.output("log.firsts")
        assert sorted(m.key for m in firsts) == ["a", "b", "c"]
        # keyed messages land where the system's partitioner puts them, as a job's output would
        by_key = {m.key: m.partition for m in job.output("words")}
        from sparkpoint.system.filelog import FileLogSystemFactory

        admin = FileLogSystemFactory().get_admin("log", job.config)
        assert by_key == {k: admin.partition_for_key(k.encode(), 3) for k in by_key}
        job.send("words", [Message(None, key="d", partition=2)])
        job.run(commit=False)
        assert "d" in job.store("seen")  # in-memory: the live store
        job.restart()  # a crash: "d" was not committed, and the in-memory store dies with it
        job.run()  # no backend: the store starts empty (a WARNING); only "d" is read again
        d_offset = next(int(m.offset) for m in job.output("words") if m.key == "d")
        assert job.store("seen") == {"d": d_offset}


def test_bad_arguments_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a subclass of sparkpoint StreamTask"):
        JobTestDriver(CONFIG, tmp_path, task=dict)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="no task.inputs"):
        JobTestDriver({"job.name": "x", "systems.log.factory": "filelog"}, tmp_path)


def test_a_dataframe_pipeline_runs_on_the_shared_spark_session(tmp_path: Path, spark: Any) -> None:
    from pageviews_pipeline import job as pipeline

    views = [Message({"user": u, "page": "/", "ts": 1}, key=u) for u in ["ann", "bob", "ann"]]
    with JobTestDriver(pipeline, tmp_path, spark=spark) as job:
        job.send("pageviews", views)
        job.run()
        assert job.store("user-counts") == {"ann": 2, "bob": 1}
        counts = sorted((m.value["user"], m.value["count"]) for m in job.output("user-counts"))
        assert counts == [("ann", 1), ("ann", 2), ("bob", 1)]


def test_time_moves_only_when_the_test_moves_it(tmp_path: Path) -> None:
    """The test kit's clock: a timer fires and a TTL entry expires after advance_time, with no
    sleep (issue 31)."""

    class Reminder(StreamTask):
        def init(self, context: Any) -> None:
            self.timers = context.timers
            self.seen = context.get_store("seen")

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            self.seen.put(envelope.key, 1)
            self.timers.register(envelope.key, self.timers.now_ms() + 60_000)

        def on_timer(self, key: Any, timestamp_ms: int, collector: Any, coordinator: Any) -> None:
            collector.send(
                OutgoingMessageEnvelope(SystemStream("log", "reminders"), key, {"at": timestamp_ms})
            )

    config = {
        **CONFIG,
        "stores.seen.factory": "rocksdb",
        "stores.seen.rocksdb.ttl.ms": "30000",
        "stores.timers.factory": "rocksdb",
        "task.timers.store": "timers",
    }
    with JobTestDriver(config, tmp_path, task=Reminder, clock_ms=1_000_000) as job:
        job.send("words", [Message(None, key="a")])
        job.run()
        assert job.output("log.reminders") == [] and job.store("seen") == {"a": 1}
        job.advance_time(30_000)
        assert job.store("seen") == {}  # past its TTL
        job.advance_time(29_999)
        job.run()
        assert job.output("log.reminders") == []
        job.advance_time(1)
        job.run()
        assert [m.value for m in job.output("log.reminders")] == [{"at": 1_060_000}]
        with pytest.raises(UserError, match="processing time never goes back"):
            job.advance_time(-1)


def test_a_pipeline_s_timers_follow_the_test_clock(tmp_path: Path, spark: Any) -> None:
    """The driver's fake clock reaches the pipeline's steps in Spark's workers: an idle timer
    fires only once advance_time passed it, and its firing cleared the user's count."""
    from timer_pipeline import pipeline
    from timer_task import IDLE_MS

    config = {
        "job.name": "idle",
        "systems.log.factory": "filelog",
        "task.inputs": "log.pageviews",
        "streams.pageviews.partitions": "2",
        "stores.user-counts.factory": "rocksdb",
        "stores.user-counts.key.serde": "string",
        "stores.user-counts.msg.serde": "integer",
        "stores.timers.factory": "rocksdb",
        "task.timers.store": "timers",
    }
    views = [Message({"user": u, "page": "/", "ts": 1}, key=u) for u in ["ann", "bob", "ann"]]
    with JobTestDriver(pipeline(config), tmp_path, spark=spark, clock_ms=0) as job:
        job.send("pageviews", views)
        job.run()
        assert job.store("user-counts") == {"ann": 2, "bob": 1} and job.output("idle") == []
        job.advance_time(IDLE_MS - 1)
        job.send("pageviews", [Message({"user": "bob", "page": "/", "ts": 2}, key="bob")])
        job.run()
        assert job.output("idle") == []
        job.advance_time(1)
        job.run()
        assert [m.value for m in job.output("idle")] == [{"user": "ann", "count": 2}]
        assert job.store("user-counts") == {"bob": 2}


def test_each_run_reads_what_was_sent_since_the_last(tmp_path: Path) -> None:
    class Seen(StreamTask):
        def init(self, context: Any) -> None:
            self.seen = context.get_store("seen")

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            self.seen.put(envelope.key, 1)

    with JobTestDriver(CONFIG, tmp_path, task=Seen) as job:
        for word in ["a", "b", "c"]:
            job.send("words", [Message(None, key=word)])
            assert job.run().processed == 1
        assert job.store("seen") == {"a": 1, "b": 1, "c": 1}

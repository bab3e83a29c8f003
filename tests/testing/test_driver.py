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

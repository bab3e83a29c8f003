"""How to test a sparkpoint job: run it in this process on a few messages, then look at its
stores and outputs (``sparkpoint.testing.JobTestDriver``). Run with ``pytest examples``.

The driver runs the job with the runtime's own batches, commits and restores, on the embedded
log in a temporary directory: no Spark for a task class, no broker even for ``job-kafka.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from sparkpoint.testing import JobTestDriver, Message

HERE = Path(__file__).resolve().parent


def views(*users: str) -> list[Message]:
    return [Message({"user": u, "page": "/", "ts": i}, key=u) for i, u in enumerate(users)]


def test_counts_views_per_user_and_emits_each_count(tmp_path: Path) -> None:
    with JobTestDriver(HERE / "job.yaml", tmp_path) as job:
        job.send("pageviews", views("ann", "bob", "ann"))
        job.run()
        assert job.store("user-counts") == {"ann": 2, "bob": 1}
        emitted = sorted((m.value["user"], m.value["count"]) for m in job.output("user-counts"))
        assert emitted == [("ann", 1), ("ann", 2), ("bob", 1)]


def test_a_crash_before_the_commit_counts_nothing_twice(tmp_path: Path) -> None:
    changelog = {"stores.user-counts.changelog": "filelog.user-counts-changelog"}
    with JobTestDriver(HERE / "job.yaml", tmp_path, config=changelog) as job:
        job.send("pageviews", views("ann", "bob"))
        job.run()  # processed and committed
        job.send("pageviews", views("ann", "ann"))
        job.run(commit=False)  # processed, then the job dies before committing
        job.restart(lose_local_state=True)  # and comes back on another host
        assert job.store("user-counts") == {"ann": 1, "bob": 1}  # the last commit
        job.run()  # the uncommitted views are read again, and counted once
        assert job.store("user-counts") == {"ann": 3, "bob": 1}


def test_the_kafka_job_runs_here_without_a_broker(tmp_path: Path) -> None:
    with JobTestDriver(HERE / "job-kafka.yaml", tmp_path) as job:
        job.send("pageviews", views("cy", "cy"))
        job.run()
        assert job.store("user-counts") == {"cy": 2}

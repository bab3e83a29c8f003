"""How to test windowed jobs: send views with their times, run, and read what closed. A window
goes out only once the watermark (the largest event time seen, minus 5 s) passes its end."""

from __future__ import annotations

from pathlib import Path

from sparkpoint.testing import JobTestDriver, Message

HERE = Path(__file__).resolve().parent


def view(user: str, at_ms: int) -> Message:
    return Message({"user": user, "page": "/", "ts": at_ms}, key=user, timestamp=at_ms)


def test_a_minute_closes_once_the_watermark_passes_its_end(tmp_path: Path) -> None:
    with JobTestDriver(
        HERE / "job.yaml", tmp_path, config={"streams.pageviews.partitions": "1"}
    ) as job:
        job.send("pageviews", [view("ann", 1_000), view("ann", 59_999), view("bob", 30_000)])
        job.run()
        assert job.output("user-minute-counts") == []  # the watermark is 54,999: still open
        job.send("pageviews", [view("ann", 64_999)])  # the watermark reaches 59,999
        job.run()
        assert job.output("user-minute-counts") == []
        job.send("pageviews", [view("bob", 65_000)])  # and 60,000: the first minute closes
        job.run()
        minutes = sorted(
            (m.value["user"], m.value["window_start"], m.value["count"])
            for m in job.output("user-minute-counts")
        )
        assert minutes == [("ann", 0, 2), ("bob", 0, 1)]
        job.send("pageviews", [view("ann", 30_000)])  # for a minute that went out: late
        job.run()
        assert [m.value["key"] for m in job.output("late-views")] == ["ann"]


def test_a_session_ends_after_30_seconds_without_a_view(tmp_path: Path) -> None:
    with JobTestDriver(
        HERE / "job.yaml", tmp_path, config={"streams.pageviews.partitions": "1"}
    ) as job:
        job.send("pageviews", [view("ann", t) for t in (0, 20_000, 45_000)])  # one session
        job.send("pageviews", [view("ann", 80_000)])  # 35 s later: a new one
        job.send("pageviews", [view("bob", 200_000)])  # the watermark goes to 195,000
        job.run()
        sessions = [m.value for m in job.output("user-sessions")]
        assert sessions == [
            {"user": "ann", "session_start": 0, "session_end": 45_000, "views": 3},
            {"user": "ann", "session_start": 80_000, "session_end": 80_000, "views": 1},
        ]

"""How to test a re-keying job: send views keyed by page, run, and read the counts per user
that stage 2 made from the intermediate stream."""

from __future__ import annotations

from pathlib import Path

from sparkpoint.testing import JobTestDriver, Message

HERE = Path(__file__).resolve().parent


def view(user: str, page: str) -> Message:
    return Message({"user": user, "page": page, "ts": 0}, key=page)


def test_views_by_page_are_counted_per_user(tmp_path: Path) -> None:
    with JobTestDriver(HERE / "job.yaml", tmp_path) as job:
        job.send("pageviews-by-page", [view("ann", "/"), view("bob", "/"), view("ann", "/docs")])
        job.run()
        assert sorted((m.value["user"], m.value["count"]) for m in job.output("user-counts")) == [
            ("ann", 1),
            ("ann", 2),
            ("bob", 1),
        ]
        assert job.store("user-counts") == {"ann": 2, "bob": 1}

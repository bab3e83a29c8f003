"""The example's task, writing to tables: every view, with its page's title and section from
the global table ``pages`` (every task sees all of it), appended to a Delta and an Iceberg
table, and each user's count upserted into PostgreSQL. A message sent to a table is a row: a
dict of column values."""

from __future__ import annotations

from typing import Any

from sparkpoint import (
    GlobalTable,
    IncomingMessageEnvelope,
    KeyValueStore,
    MessageCollector,
    OutgoingMessageEnvelope,
    StreamTask,
    SystemStream,
    TaskContext,
    TaskCoordinator,
)

VIEWS = (SystemStream("lake", "views"), SystemStream("ice", "views"))
COUNTS = SystemStream("pg", "user_counts")


class TableWriter(StreamTask):
    """Counts views per user in the ``user-counts`` store; writes each view and each count."""

    counts: KeyValueStore[str, int]
    pages: GlobalTable

    def init(self, context: TaskContext) -> None:
        self.counts = context.get_store("user-counts")
        self.pages = context.get_table("pages")

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        view: Any = envelope.message
        user = str(view["user"])
        count = (self.counts.get(user) or 0) + 1
        self.counts.put(user, count)
        page = self.pages.get(view["page"]) or {}
        row = {
            "user": user,
            "page": view["page"],
            "title": page.get("title"),
            "section": page.get("section"),
            "ts": view["ts"],
            "n": count,
        }
        for table in VIEWS:
            collector.send(OutgoingMessageEnvelope(table, user, row))
        collector.send(OutgoingMessageEnvelope(COUNTS, user, {"user": user, "views": count}))

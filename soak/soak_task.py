"""The soak's second job: the example's counter plus a per-page count in a second store."""

from __future__ import annotations

from typing import Any

from pageviews_task import PageViewCounter

from sparkpoint.runtime.taskapi.api import MessageCollector, TaskContext, TaskCoordinator
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.system.base import IncomingMessageEnvelope


class TwoStoreCounter(PageViewCounter):
    """``user-counts`` as the example, plus ``page -> views`` in ``page-counts``."""

    pages: KeyValueStore[str, int]

    def init(self, context: TaskContext) -> None:
        super().init(context)
        self.pages = context.get_store("page-counts")

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        super().process(envelope, collector, coordinator)
        view: Any = envelope.message
        page = str(view["page"])
        self.pages.put(page, (self.pages.get(page) or 0) + 1)


#: the event-time span one timer closes (each user's views are summed per bucket)
BUCKET_MS = 60_000


class TimedCounter(PageViewCounter):
    """The example's counter with time in its state: ``last-page`` (a store with a TTL) keeps
    each user's latest page, and views are summed per user and event-time minute in
    ``pending`` until an event-time timer at the minute's end moves the sum to ``closed``. Any
    state lost or resurrected across a kill shows up in ``closed + pending`` (which must equal
    the views of each user and minute), whichever batch fired which timer."""

    def init(self, context: TaskContext) -> None:
        super().init(context)
        self.last_page: KeyValueStore[str, str] = context.get_store("last-page")
        self.pending: KeyValueStore[str, int] = context.get_store("pending")
        self.closed: KeyValueStore[str, int] = context.get_store("closed")
        self.timers = context.timers

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        super().process(envelope, collector, coordinator)
        view: Any = envelope.message
        user = str(view["user"])
        self.last_page.put(user, str(view["page"]))
        assert envelope.event_time is not None
        bucket = envelope.event_time // BUCKET_MS
        key = f"{user}|{bucket}"
        self.pending.put(key, (self.pending.get(key) or 0) + 1)
        self.timers.register(key, (bucket + 1) * BUCKET_MS, "event")

    def on_timer(
        self, key: Any, timestamp_ms: int, collector: MessageCollector, coordinator: TaskCoordinator
    ) -> None:
        n = self.pending.get(key)
        if n:
            self.closed.put(key, (self.closed.get(key) or 0) + n)
            self.pending.delete(key)

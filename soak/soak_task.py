"""The soak's task classes: the example's counter plus a per-page count in a second store
(``dual``), the counter with time in its state (``time``), and both joins (``joins``)."""

from __future__ import annotations

from typing import Any

from pageviews_task import PageViewCounter

from sparkpoint import OutgoingMessageEnvelope, StreamTask
from sparkpoint.model import SystemStream
from sparkpoint.runtime.api.task import MessageCollector, TaskContext, TaskCoordinator
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


#: the ``joins`` variant: views of these pages are the left side of the windowed join, the
#: others the right side; a left and a right view of one user at most JOIN_MS apart make a pair
LEFT_PAGES = frozenset({"/", "/pricing", "/docs", "/blog"})
JOIN_MS = 2_000
ENRICHED = SystemStream("filelog", "enriched-views")
PAIRS = SystemStream("filelog", "joined-views")


class JoiningViews(StreamTask):
    """Both joins on the page views: each view looks its user up in the table ``profiles``
    (a compacted stream, read before the views: bootstrap) and goes out with the user's
    country to ``enriched-views``; and views of one user on a left and a right page at most
    :data:`JOIN_MS` apart in event time go out as a pair to ``joined-views`` (both sides
    buffered in ``left-buffer`` and ``right-buffer`` until the watermark passes them)."""

    def init(self, context: TaskContext) -> None:
        self.profiles: KeyValueStore[str, Any] = context.get_store("profiles")
        self.join = context.windows.join(
            "left-buffer", "right-buffer", within_ms=JOIN_MS, emit=self.emit
        )

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        view: Any = envelope.message
        user = str(view["user"])
        profile = self.profiles.get(user)
        enriched = {**view, "country": None if profile is None else profile["country"]}
        collector.send(OutgoingMessageEnvelope(ENRICHED, user, enriched))
        side = self.join.left if view["page"] in LEFT_PAGES else self.join.right
        assert envelope.event_time is not None  # the record's timestamp
        side(user, envelope.event_time, None, collector)

    def emit(self, pair: Any, collector: MessageCollector) -> None:
        value = {"user": pair.key, "left_ts": pair.left_time, "right_ts": pair.right_time}
        collector.send(OutgoingMessageEnvelope(PAIRS, pair.key, value))

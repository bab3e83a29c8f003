"""A test task with timers: counts views per user; a user idle for ``IDLE_MS`` of processing
time gets ``{user, count}`` on the ``idle`` stream and is forgotten (an idle-session timeout).
With ``testing.timers.event`` set, it also emits ``{user, at}`` on the ``due`` stream when the
watermark passes each view's event time + 1000 (an event-time timer per view), and records
every late view on the ``late`` stream."""

from __future__ import annotations

from typing import Any

from sparkpoint.model import SystemStream
from sparkpoint.runtime.api.task import (
    MessageCollector,
    StreamTask,
    TaskContext,
    TaskCoordinator,
)
from sparkpoint.system.base import IncomingMessageEnvelope, OutgoingMessageEnvelope

IDLE_MS = 10_000


class IdleUsers(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.counts = context.get_store("user-counts")
        self.timers = context.timers
        self.event = bool(context.config.get("testing.timers.event"))
        self.system = next(iter(context.ssps)).system

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        view: Any = envelope.message
        user = str(view["user"])
        system = self.system
        for key, at, kind in self.timers.list(user, "processing"):
            self.timers.delete(key, at, kind)
        self.timers.register(user, self.timers.now_ms() + IDLE_MS)
        self.counts.put(user, (self.counts.get(user) or 0) + 1)
        if self.event:
            assert envelope.event_time is not None
            self.timers.register(
                f"{user}@{envelope.event_time}", envelope.event_time + 1000, "event"
            )
            if envelope.late:
                record = {"user": user, "at": envelope.event_time}
                collector.send(OutgoingMessageEnvelope(SystemStream(system, "late"), user, record))

    def on_timer(
        self, key: Any, timestamp_ms: int, collector: MessageCollector, coordinator: TaskCoordinator
    ) -> None:
        if "@" in str(key):
            user, at = str(key).split("@")
            record: dict[str, Any] = {"user": user, "at": int(at), "due": timestamp_ms}
            collector.send(OutgoingMessageEnvelope(SystemStream(self.system, "due"), user, record))
            return
        count = self.counts.get(key)
        self.counts.delete(key)
        record = {"user": key, "count": count}
        collector.send(OutgoingMessageEnvelope(SystemStream(self.system, "idle"), key, record))

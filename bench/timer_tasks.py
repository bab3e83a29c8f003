"""The tasks of ``bench/timers.py``: a count per user, with and without timers. Each counts
the timers it fired in the ``fired`` store (one key per task), so the run can check them."""

from __future__ import annotations

from typing import Any

from sparkpoint import (
    IncomingMessageEnvelope,
    MessageCollector,
    StreamTask,
    TaskContext,
    TaskCoordinator,
)


class Count(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.counts = context.get_store("user-counts")
        self.fired = context.get_store("fired")
        self.timers = context.timers
        self.task = context.task_name.name

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        view: Any = envelope.message
        user = str(view["user"])
        self.counts.put(user, (self.counts.get(user) or 0) + 1)

    def on_timer(
        self, key: Any, timestamp_ms: int, collector: MessageCollector, coordinator: TaskCoordinator
    ) -> None:
        self.fired.put(self.task, (self.fired.get(self.task) or 0) + 1)


class CountAndFire(Count):
    """And a timer per view, due at once: it fires at the end of the batch."""

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        super().process(envelope, collector, coordinator)
        self.timers.register(f"{envelope.ssp.partition}@{envelope.offset}", envelope.timestamp)


class CountAndIdle(Count):
    """And an idle timer per user, moved on every view (an hour ahead: none fires)."""

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        super().process(envelope, collector, coordinator)
        user = str(envelope.message["user"])  # type: ignore[index]
        for key, at, kind in self.timers.list(user):
            self.timers.delete(key, at, kind)
        self.timers.register(user, self.timers.now_ms() + 3_600_000)


class CountAndReplace(Count):
    """The idle timer of :class:`CountAndIdle` moved with one call (``timers.replace``)."""

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        super().process(envelope, collector, coordinator)
        user = str(envelope.message["user"])  # type: ignore[index]
        self.timers.replace(user, self.timers.now_ms() + 3_600_000)

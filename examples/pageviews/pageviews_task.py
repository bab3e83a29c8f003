"""The example task: count page views per user and emit each new count."""

from __future__ import annotations

from typing import Any

from sparkpoint import (
    IncomingMessageEnvelope,
    KeyValueStore,
    MessageCollector,
    OutgoingMessageEnvelope,
    StreamTask,
    SystemStream,
    TaskContext,
    TaskCoordinator,
)

OUTPUT = "user-counts"  # in the input's system: filelog by default, Kafka by config


class PageViewCounter(StreamTask):
    """Keeps ``user -> views`` in the ``user-counts`` store; sends ``{user, count}`` per view."""

    counts: KeyValueStore[str, int]

    def init(self, context: TaskContext) -> None:
        self.counts = context.get_store("user-counts")

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
        output = SystemStream(envelope.ssp.system, OUTPUT)
        collector.send(OutgoingMessageEnvelope(output, user, {"user": user, "count": count}))

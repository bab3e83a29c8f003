"""Test tasks that exercise the task coordinator and window()."""

from __future__ import annotations

from typing import Any

from sparkpoint.model import SystemStream
from sparkpoint.runtime.api.task import (
    MessageCollector,
    StreamTask,
    TaskContext,
    TaskCoordinator,
)
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.system.base import IncomingMessageEnvelope, OutgoingMessageEnvelope


class ShutdownAfter(StreamTask):
    """Counts messages; asks for shutdown when it sees the value ``{"stop": true}``."""

    store: KeyValueStore[str, int]

    def init(self, context: TaskContext) -> None:
        self.store = context.get_store("user-counts")

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        self.store.put("seen", (self.store.get("seen") or 0) + 1)
        message: Any = envelope.message
        if message.get("stop"):
            coordinator.shutdown()

    def window(self, collector: MessageCollector, coordinator: TaskCoordinator) -> None:
        self.store.put("windows", (self.store.get("windows") or 0) + 1)
        collector.send(OutgoingMessageEnvelope(SystemStream("filelog", "windows"), "w", {"w": 1}))

"""A test task that records every (task, SSP, offset) it consumes to the ``consumed`` stream of
the input's system."""

from __future__ import annotations

from sparkpoint.model import SystemStream
from sparkpoint.runtime.api.task import (
    MessageCollector,
    StreamTask,
    TaskContext,
    TaskCoordinator,
)
from sparkpoint.system.base import IncomingMessageEnvelope, OutgoingMessageEnvelope


class Recorder(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.task = context.task_name.name

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        record = {"task": self.task, "ssp": str(envelope.ssp), "offset": int(envelope.offset)}
        consumed = SystemStream(envelope.ssp.system, "consumed")
        collector.send(OutgoingMessageEnvelope(consumed, self.task, record, partition=0))

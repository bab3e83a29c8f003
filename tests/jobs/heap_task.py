"""A test task that reports, per message, whether its process froze its imports
(:mod:`sparkpoint.runtime.executor.worker_heap`), how many objects are frozen there, and the
collector's thresholds while it processes.

Its ``init`` marks the process unfrozen, as a new worker is: the batch freezes after ``init``,
so a message reports frozen only if this batch froze, not because Spark reused a worker that an
earlier batch or test froze."""

from __future__ import annotations

import gc

from sparkpoint.model import SystemStream
from sparkpoint.runtime.api.task import (
    MessageCollector,
    StreamTask,
    TaskContext,
    TaskCoordinator,
)
from sparkpoint.runtime.executor import worker_heap
from sparkpoint.system.base import IncomingMessageEnvelope, OutgoingMessageEnvelope


class HeapReporter(StreamTask):
    def init(self, context: TaskContext) -> None:
        worker_heap.FROZEN.done = False

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        report = {
            "frozen": worker_heap.FROZEN.done,
            "freeze_count": gc.get_freeze_count(),
            "threshold": list(gc.get_threshold()),
        }
        heap = SystemStream(envelope.ssp.system, "heap")
        collector.send(OutgoingMessageEnvelope(heap, None, report, partition=0))

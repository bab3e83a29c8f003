"""A test task that reports, per message, whether its process froze its imports
(:mod:`sparkpoint.runtime.worker_heap`) and how many objects are frozen there."""

from __future__ import annotations

import gc

from sparkpoint.model import SystemStream
from sparkpoint.runtime import worker_heap
from sparkpoint.runtime.api import MessageCollector, StreamTask, TaskCoordinator
from sparkpoint.system.base import IncomingMessageEnvelope, OutgoingMessageEnvelope


class HeapReporter(StreamTask):
    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        report = {"frozen": worker_heap._frozen, "freeze_count": gc.get_freeze_count()}
        heap = SystemStream(envelope.ssp.system, "heap")
        collector.send(OutgoingMessageEnvelope(heap, None, report, partition=0))

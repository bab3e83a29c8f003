"""The example's page-view counter with ballast: a message ``{"fill": n}`` writes ``n`` random
values into the ``ballast`` store, so a task holds hundreds of MB of state (bench/host_affinity.py).
"""

from __future__ import annotations

import os
from typing import Any

from pageviews_task import PageViewCounter

from sparkpoint.runtime.api.task import MessageCollector, TaskContext, TaskCoordinator
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.system.base import IncomingMessageEnvelope

VALUE_BYTES = 10_000  # random, so RocksDB cannot compress the ballast away


class BallastCounter(PageViewCounter):
    ballast: KeyValueStore[str, bytes]

    def init(self, context: TaskContext) -> None:
        super().init(context)
        self.ballast = context.get_store("ballast")

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        message: Any = envelope.message
        fill = int(message.get("fill", 0))
        if fill:
            self.ballast.put_all(
                [(f"{envelope.offset}-{i}", os.urandom(VALUE_BYTES)) for i in range(fill)]
            )
            return
        super().process(envelope, collector, coordinator)

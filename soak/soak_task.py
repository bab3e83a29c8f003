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

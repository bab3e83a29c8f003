"""The example's task, marking when it processes its first view, and the recovery workload's
task. The DataFrame step is in ``sparkpoint_steps.py``: a task API worker imports this module,
and only what a task needs (no Arrow, no pyspark.sql), as the example's own task module does."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Progress, mark_first
from pageviews_task import PageViewCounter

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


class MarkedCounter(PageViewCounter):
    def init(self, context: TaskContext) -> None:
        super().init(context)
        self.work = Path(context.config["bench.work"])

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        mark_first(self.work)
        super().process(envelope, collector, coordinator)


class LastViewCounter(StreamTask):
    """The recovery workload: per user, the count and the last view (with its ~1 KB ``pad``) in
    the ``user-views`` store; the views of the input added after the state was lost
    (``"phase": 2``) go to :class:`Progress`."""

    views: KeyValueStore[str, dict[str, Any]]

    def init(self, context: TaskContext) -> None:
        self.views = context.get_store("user-views")
        self.progress = Progress(Path(context.config["bench.work"]))

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        view: Any = envelope.message
        user = str(view["user"])
        old = self.views.get(user)
        count = (int(old["count"]) if old else 0) + 1
        self.views.put(user, {"count": count, "last": view})
        if view.get("phase") == 2:
            self.progress(user, count)
        output = SystemStream(envelope.ssp.system, "user-counts")
        collector.send(OutgoingMessageEnvelope(output, user, {"user": user, "count": count}))

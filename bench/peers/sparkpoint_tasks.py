"""The example's task and DataFrame step, marking when they process their first view."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Progress, mark_first
from pageviews_pipeline import count_views
from pageviews_task import PageViewCounter

from sparkpoint import (
    Batch,
    IncomingMessageEnvelope,
    KeyValueStore,
    MessageCollector,
    OutgoingMessageEnvelope,
    Output,
    StepState,
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


def marked_count_views(state: StepState, chunks: Iterator[pa.RecordBatch]) -> Iterator[Any]:
    work = Path(state.config.require("bench.work"))
    for out in count_views(state, chunks):
        mark_first(work)
        yield out


def per_view(batch: Batch) -> Output:
    from pyspark.sql import functions as F

    views = batch.df.select("task", F.col("value.user").alias("user"))
    counts = batch.stateful(views, marked_count_views, "user STRING, count LONG")
    return batch.to_stream(counts, "filelog.user-counts", key="user")


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

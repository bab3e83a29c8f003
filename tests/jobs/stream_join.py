"""A windowed stream-stream join in both APIs: each click (stream ``clicks``) and each view
(stream ``views``) of one user at most ``WITHIN_MS`` apart in event time (the record
timestamps) make one message of ``clicked-views``: ``{"user", "click_ts", "view_ts"}``. Both
sides are buffered in stores (``click-buffer``, ``view-buffer``) until the watermark passes
them by ``WITHIN_MS``."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from sparkpoint import Batch, OutgoingMessageEnvelope, Output, StreamTask
from sparkpoint.model import SystemStream

WITHIN_MS = 2_000


def config(system: str = "log") -> dict[str, str]:
    return {
        "job.name": "stream-join",
        "task.class": "stream_join:ClicksWithViews",
        "task.inputs": f"{system}.clicks,{system}.views",
        "stores.click-buffer.factory": "rocksdb",
        "stores.click-buffer.changelog": f"{system}.click-buffer-changelog",
        "stores.view-buffer.factory": "rocksdb",
        "stores.view-buffer.changelog": f"{system}.view-buffer-changelog",
        "stores.timers.factory": "rocksdb",
        "stores.timers.changelog": f"{system}.timers-changelog",
        "task.timers.store": "timers",
        "task.watermark.lateness.ms": "1000",
        "task.commit.ms": "0",
    }


class ClicksWithViews(StreamTask):
    def init(self, context: Any) -> None:
        self.join = context.windows.join(
            "click-buffer",
            "view-buffer",
            within_ms=WITHIN_MS,
            emit=self.emit,
            late_stream="log.late-clicks-views",
        )

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        side = self.join.left if envelope.ssp.stream == "clicks" else self.join.right
        side(envelope.key, envelope.event_time, envelope.message, collector)

    def emit(self, pair: Any, collector: Any) -> None:
        value = {"user": pair.key, "click_ts": pair.left_time, "view_ts": pair.right_time}
        out = SystemStream("log", "clicked-views")
        collector.send(OutgoingMessageEnvelope(out, pair.key, value))


def build(batch: Batch) -> Output:
    pairs = batch.join_window(
        batch.df.select("task", "stream", "value.user", "event_time"),
        key="user",
        within_ms=WITHIN_MS,
        left="clicks",
        right="views",
        left_store="click-buffer",
        right_store="view-buffer",
        late_stream="log.late-clicks-views",
    )
    out = pairs.select(
        F.col("key").alias("user"),
        F.col("left_time").alias("click_ts"),
        F.col("right_time").alias("view_ts"),
    )
    return batch.to_stream(out, "log.clicked-views", key="user")

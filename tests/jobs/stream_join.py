"""A windowed stream-stream join in both APIs: each click (stream ``clicks``) and each view
(stream ``views``) of one user at most ``WITHIN_MS`` apart in event time (the record
timestamps) make one message of ``clicked-views``: ``{"user", "click_ts", "view_ts"}``. Both
sides are buffered in stores (``click-buffer``, ``view-buffer``) until the watermark passes
them by ``WITHIN_MS``."""

from __future__ import annotations

from typing import Any

from sparkpoint import OutgoingMessageEnvelope, StreamTask
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

"""Page views per user and minute, and per session, from ``context.windows``.

Each view (key = user, value ``{user, page, ts}``, event time = the record's timestamp) goes
into the user's 1-minute tumbling window and into the user's session (a 30 s gap). A window
closes when the task's watermark passes its end (a session: its last view + 30 s), and its
result goes out once: ``user-minute-counts`` gets ``{user, window_start, window_end, count}``
and ``user-sessions`` ``{user, session_start, session_end, views}``. Views for windows that
closed already go to ``late-views``.
"""

from __future__ import annotations

from typing import Any

from sparkpoint import (
    IncomingMessageEnvelope,
    MessageCollector,
    OutgoingMessageEnvelope,
    StreamTask,
    SystemStream,
    TaskContext,
    TaskCoordinator,
    Window,
    count,
)

MINUTE_MS = 60_000
SESSION_GAP_MS = 30_000


class UserWindows(StreamTask):
    def init(self, context: TaskContext) -> None:
        system = next(iter(context.ssps)).system
        self.minutes_out = SystemStream(system, "user-minute-counts")
        self.sessions_out = SystemStream(system, "user-sessions")
        late = f"{system}.late-views"
        self.minutes = context.windows.tumbling(
            "minute-counts",
            size_ms=MINUTE_MS,
            aggregate=count(),
            emit=self.minute,
            late_stream=late,
        )
        self.sessions = context.windows.session(
            "sessions",
            gap_ms=SESSION_GAP_MS,
            aggregate=count(),
            emit=self.session,
            late_stream=late,
        )

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        view: Any = envelope.message
        user = str(view["user"])
        self.minutes.add(user, envelope.event_time, late_to=collector)
        self.sessions.add(user, envelope.event_time, late_to=collector)

    def minute(self, window: Window, collector: MessageCollector) -> None:
        value = {
            "user": window.key,
            "window_start": window.start,
            "window_end": window.end,
            "count": window.value,
        }
        collector.send(OutgoingMessageEnvelope(self.minutes_out, window.key, value))

    def session(self, window: Window, collector: MessageCollector) -> None:
        value = {
            "user": window.key,
            "session_start": window.start,
            "session_end": window.end,
            "views": window.value,
        }
        collector.send(OutgoingMessageEnvelope(self.sessions_out, window.key, value))

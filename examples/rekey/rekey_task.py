"""The re-key example's task: two stages in one job, told apart by the stream a message is on.

Stage 1 reads ``pageviews-by-page`` (keyed by page) and sends each view on to the intermediate
stream ``pageviews-by-user``, keyed by user, so that every view of a user reaches one partition.
Stage 2 reads that stream and counts views per user in the ``user-counts`` store, sending
``{user, count}`` to ``user-counts``. Task ``Partition n`` runs both stages for partition ``n``
of each stream (Samza's grouping by partition); the state is only stage 2's, keyed by user.
"""

from __future__ import annotations

from typing import Any

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

BY_PAGE = "pageviews-by-page"
BY_USER = "pageviews-by-user"  # intermediate: streams.pageviews-by-user.samza.intermediate
OUTPUT = "user-counts"


class RekeyAndCount(StreamTask):
    """Stage 1 re-keys views by user; stage 2 counts them per user."""

    counts: KeyValueStore[str, int]

    def init(self, context: TaskContext) -> None:
        self.counts = context.get_store("user-counts")

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        view: Any = envelope.message
        user = str(view["user"])
        system = envelope.ssp.system
        if envelope.ssp.stream == BY_PAGE:  # stage 1: re-key (the view as it arrived)
            collector.forward(envelope, SystemStream(system, BY_USER), user)
            return
        count = (self.counts.get(user) or 0) + 1  # stage 2: count, by user
        self.counts.put(user, count)
        output = SystemStream(system, OUTPUT)
        collector.send(OutgoingMessageEnvelope(output, user, {"user": user, "count": count}))

"""A test task: the example's counter, failing once at a configured offset to simulate a crash.

``test.fail.at`` = ``<partition>:<offset>``; the failure happens only while the file named by
``test.fail.flag`` exists, and the task deletes the file as it fails (so a retry succeeds).
"""

from __future__ import annotations

import os
import time

from pageviews_task import PageViewCounter

from sparkpoint.runtime.api.task import MessageCollector, TaskContext, TaskCoordinator
from sparkpoint.system.base import IncomingMessageEnvelope


class FailingCounter(PageViewCounter):
    def init(self, context: TaskContext) -> None:
        super().init(context)
        part, _, offset = context.config.get("test.fail.at", "-1:-1").partition(":")
        self.fail_partition, self.fail_offset = int(part), offset
        self.flag = context.config.get("test.fail.flag", "")

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        super().process(envelope, collector, coordinator)
        if (
            envelope.ssp.partition == self.fail_partition
            and envelope.offset == self.fail_offset
            and self.flag
            and os.path.exists(self.flag)
        ):
            os.unlink(self.flag)
            raise RuntimeError(f"injected failure at {envelope.ssp} offset {envelope.offset}")


class DyingTask(PageViewCounter):
    """Kills its Python worker on every message: Spark retries, then gives up."""

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        os._exit(3)


class PoisonCounter(PageViewCounter):
    """Raises ValueError on every view of the user ``poison`` (a message that always fails)."""

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        view = envelope.message
        if isinstance(view, dict) and view.get("user") == "poison":
            raise ValueError("cannot count the poison user")
        super().process(envelope, collector, coordinator)


class BlockingCounter(PageViewCounter):
    """The example's counter that, on a view of user ``block``, writes the file named by
    ``test.block.started`` and waits while the file ``test.block.flag`` exists (at most a
    minute): a batch that does not end until the test lets it."""

    def init(self, context: TaskContext) -> None:
        super().init(context)
        self.started = context.config.get("test.block.started", "")
        self.flag = context.config.get("test.block.flag", "")

    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        super().process(envelope, collector, coordinator)
        if envelope.key == "block" and self.flag:
            with open(self.started, "w"):
                pass
            deadline = time.monotonic() + 60
            while os.path.exists(self.flag) and time.monotonic() < deadline:
                time.sleep(0.05)

"""The low-level task API (Samza's StreamTask), which user jobs implement.

A task class has ``init(context)`` and ``process(envelope, collector, coordinator)``, and may have
``window(collector, coordinator)`` (called every ``task.window.ms``) and
``on_timer(key, timestamp_ms, collector, coordinator)`` (each due timer of ``context.timers``).
Lifecycle on Spark: a task instance is created, initialised and closed around every micro-batch
of its task, possibly in a different Python worker each time, so **keep state in the context's
stores** (and timers in ``context.timers``), not in attributes of the task object; ``init`` must
be cheap and side-effect free.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.system.base import IncomingMessageEnvelope, OutgoingMessageEnvelope

if TYPE_CHECKING:
    from sparkpoint.runtime.taskapi.timers import TaskTimers
    from sparkpoint.runtime.taskapi.windows import TaskWindows


class MessageCollector(Protocol):
    """Sends output; messages become durable at the end of the batch, before any commit."""

    def send(self, envelope: OutgoingMessageEnvelope) -> None: ...

    def forward(self, envelope: IncomingMessageEnvelope, stream: SystemStream, key: Any) -> None:
        """Send the message ``envelope`` brought on to ``stream`` under ``key`` (a re-key),
        as it arrived: its bytes as read when both streams' message serdes are the same (no
        decode and encode again; a change made to ``envelope.message`` is not sent). An
        envelope other than the one being processed, or another serde, sends
        ``envelope.message`` encoded for ``stream``. Timestamped when sent, as :meth:`send`
        does (an event time in a message field, ``streams.<s>.event.time.field``, travels
        with the bytes)."""
        ...


class TaskCoordinator(Protocol):
    """Lets a task ask for a commit or for the job to shut down after the current batch."""

    def commit(self) -> None:
        """Commit this task at the end of the current batch, even before task.commit.ms."""

    def shutdown(self) -> None:
        """Commit and stop the whole job after the current batch."""


class TaskContext(Protocol):
    """What a task can reach: its name, SSPs, config and stores."""

    @property
    def task_name(self) -> TaskName: ...

    @property
    def ssps(self) -> frozenset[SystemStreamPartition]: ...

    @property
    def config(self) -> Mapping[str, str]: ...

    def get_store(self, name: str) -> KeyValueStore[Any, Any]:
        """The store configured as ``stores.<name>``; error naming the known stores if absent."""
        ...

    @property
    def timers(self) -> TaskTimers:
        """The task's timers (``task.timers.store`` keeps them); see ``StreamTask.on_timer``."""
        ...

    @property
    def windows(self) -> TaskWindows:
        """Opens the task's window stores (tumbling, hopping, session); see
        :mod:`sparkpoint.runtime.taskapi.windows`."""
        ...


class StreamTask(ABC):
    """Base class of low-level tasks."""

    def init(self, context: TaskContext) -> None:  # noqa: B027 - optional hook
        """Called before the first message of each batch; look up stores here."""

    @abstractmethod
    def process(
        self,
        envelope: IncomingMessageEnvelope,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        """Handle one message. Raising fails the batch; the task restarts from its checkpoint."""

    def window(self, collector: MessageCollector, coordinator: TaskCoordinator) -> None:  # noqa: B027
        """Called at the end of a batch when task.window.ms has passed."""

    def on_timer(
        self,
        key: Any,
        timestamp_ms: int,
        collector: MessageCollector,
        coordinator: TaskCoordinator,
    ) -> None:
        """Called once for each due timer of ``context.timers`` (Samza's
        ``CallbackScheduler``): at the end of a batch, after ``process`` and before ``window``,
        in time order. The timer is gone when this runs; register it again to repeat."""
        raise NotImplementedError(
            f"{type(self).__name__} registers timers but has no on_timer method"
        )

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called after each batch."""

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
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.storage.joins import Joined
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.storage.windows import Window
from sparkpoint.system.base import IncomingMessageEnvelope, OutgoingMessageEnvelope
from sparkpoint.system.tables.global_tables import GlobalTable


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


class Timers(Protocol):
    """A task's timers (``context.timers``; ``task.timers.store`` keeps them): each fires
    ``StreamTask.on_timer(key, timestamp_ms, ...)`` once its time is reached, in processing
    time or, for ``kind="event"``, in event time (the watermark)."""

    def now_ms(self) -> int:
        """Processing time now (what processing-time timers are due by)."""
        ...

    def register(self, key: object, timestamp_ms: int, kind: str = "processing") -> None:
        """Fire ``on_timer(key, timestamp_ms, ...)`` once ``timestamp_ms`` is reached.
        Registering it again is one timer."""
        ...

    def replace(self, key: object, timestamp_ms: int, kind: str = "processing") -> None:
        """Make this the key's one timer of ``kind`` (its others of that kind are deleted)."""
        ...

    def register_all(
        self, keys: Iterable[object], timestamps_ms: Iterable[int], kind: str = "processing"
    ) -> None:
        """:meth:`register` for each key and time, pairwise (lists, Arrow or pandas columns)."""
        ...

    def delete(self, key: object, timestamp_ms: int, kind: str = "processing") -> None:
        """Forget a registered timer; no error when there is none."""
        ...

    def list(self, key: object = None, kind: str | None = None) -> list[tuple[Any, int, str]]:
        """Registered timers, ``(key, timestamp_ms, kind)`` in firing order per kind; only
        those of ``key`` (and of ``kind``) when given."""
        ...


#: a window store's ``emit``: called with each closed (or early, or late) window
Emit = Callable[[Window, "MessageCollector"], None]
#: a windowed join's ``emit``: called once per joined pair
EmitPair = Callable[[Joined, "MessageCollector"], None]


class WindowStore(Protocol):
    """Windows over one of the job's stores (``context.windows.tumbling(...)`` and the like)."""

    def add(
        self,
        key: Any,
        time_ms: int | None,
        value: Any = None,
        *,
        late_to: MessageCollector | None = None,
        collector: MessageCollector | None = None,
    ) -> bool:
        """Fold ``value`` into ``key``'s windows at ``time_ms`` (event time; ``None`` for a
        processing-time store: now). ``False`` when the record is late (its windows closed)."""
        ...

    def windows(self, key: Any) -> list[Window]:
        """``key``'s open windows, by start, with their current values."""
        ...


class WindowJoin(Protocol):
    """A windowed stream-stream join (``context.windows.join(...)``)."""

    def left(self, key: Any, time_ms: int, value: Any, collector: MessageCollector) -> bool:
        """A record of the left side; ``False`` when it is late."""
        ...

    def right(self, key: Any, time_ms: int, value: Any, collector: MessageCollector) -> bool:
        """A record of the right side; ``False`` when it is late."""
        ...


class Windows(Protocol):
    """Opens the task's window stores and joins (``context.windows``); the options are
    documented in docs/windows.md and docs/joins.md."""

    def tumbling(self, store: str, *, size_ms: int, **options: Any) -> WindowStore:
        """Windows ``[n*size, (n+1)*size)``, one per record."""
        ...

    def hopping(self, store: str, *, size_ms: int, slide_ms: int, **options: Any) -> WindowStore:
        """Windows of ``size_ms`` starting every ``slide_ms``: a record is in size/slide."""
        ...

    def session(self, store: str, *, gap_ms: int, **options: Any) -> WindowStore:
        """A key's records at most ``gap_ms`` apart, from its first to its last record."""
        ...

    def join(
        self,
        left_store: str,
        right_store: str,
        *,
        within_ms: int,
        emit: EmitPair,
        late_stream: str | None = None,
    ) -> WindowJoin:
        """Records of one key at most ``within_ms`` apart in event time, one from each side,
        go to ``emit`` once per pair."""
        ...


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

    def get_table(self, name: str) -> GlobalTable:
        """The global table configured as ``tables.<name>``, at the version this batch sees:
        every row of it, whatever the task's partition (``.get(key)`` looks one up by
        ``tables.<name>.key``); error naming the known tables if absent."""
        ...

    @property
    def timers(self) -> Timers:
        """The task's timers (``task.timers.store`` keeps them); see ``StreamTask.on_timer``."""
        ...

    @property
    def windows(self) -> Windows:
        """Opens the task's window stores (tumbling, hopping, session); see
        :class:`Windows`."""
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

"""Windowed stream-stream joins for the task API: ``context.windows.join``.

A task opens the join in ``init`` with two stores, one buffer per side, and hands each record
to its side in ``process``; every pair of records of one key whose event times are at most
``within_ms`` apart goes to the ``emit`` function the task gave, once, when the pair's second
record arrives::

    class ClicksWithViews(StreamTask):
        def init(self, context):
            self.join = context.windows.join(
                "click-buffer", "view-buffer", within_ms=10_000, emit=self.emit)

        def process(self, envelope, collector, coordinator):
            side = self.join.left if envelope.stream == "clicks" else self.join.right
            side(envelope.key, envelope.event_time, envelope.message, collector)

        def emit(self, pair, collector):   # a Joined: key, left_time, left, right_time, right
            collector.send(OutgoingMessageEnvelope(OUT, pair.key, {...}))

The buffers are stores of the job (rocksdb, with a changelog or a blob store backup) kept for
this join alone (layout: :mod:`sparkpoint.storage.joins`); a buffered record is deleted by its
timer (in the task's timer store) once the watermark passes its time + ``within_ms``, so the
buffers hold what can still match. A record behind the watermark is *late*: some records it
would match may be gone, so it is not joined (the side returns ``False``) and goes to
``late_stream`` when there is one (``{"key", "time", "value", "side"}``). Event time only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.model import SystemStream, TaskName
from sparkpoint.runtime.api.task import EmitPair
from sparkpoint.storage.joins import JoinBuffer, Joined
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.storage.kv.store import SerializedKeyValueStore
from sparkpoint.storage.kv.ttl import ttl_of
from sparkpoint.storage.timers import TimeKind
from sparkpoint.storage.windows import entry_key
from sparkpoint.system.base import OutgoingMessageEnvelope

if TYPE_CHECKING:
    from sparkpoint.runtime.api.task import MessageCollector
    from sparkpoint.runtime.executor.timers import TaskTimers

#: what a windowed join calls with each matching pair


class WindowedJoin:
    """A windowed stream-stream join of a task in one batch (made by
    ``context.windows.join``)."""

    def __init__(
        self,
        stores: tuple[SerializedKeyValueStore[Any, Any], SerializedKeyValueStore[Any, Any]],
        names: tuple[str, str],
        timers: TaskTimers,
        within_ms: int,
        emit: EmitPair,
        late_stream: SystemStream | None,
    ) -> None:
        self.keys = stores[0].key_serde
        self.buffers = (
            JoinBuffer(stores[0].engine, names[0]),
            JoinBuffer(stores[1].engine, names[1]),
        )
        self.names = names
        self.timers = timers
        self.within_ms = within_ms
        self.emit = emit
        self.late_stream = late_stream
        for buffer in self.buffers:
            timers.own(buffer.name, buffer_expiry(buffer), _nothing_held)

    def left(self, key: Any, time_ms: int, value: Any, collector: MessageCollector) -> bool:
        """A record of the left side: emits its pairs with the buffered right records, and
        buffers it; ``False`` (nothing changes) when it is late."""
        return self._add(0, key, time_ms, value, collector)

    def right(self, key: Any, time_ms: int, value: Any, collector: MessageCollector) -> bool:
        """A record of the right side (as :meth:`left`)."""
        return self._add(1, key, time_ms, value, collector)

    def _add(
        self, side: int, key: Any, time_ms: int, value: Any, collector: MessageCollector
    ) -> bool:
        if isinstance(time_ms, bool) or not isinstance(time_ms, int) or time_ms < 0:
            raise ValueError(
                f"join {self.names[0]!r}/{self.names[1]!r}: a record's event time must be "
                f"ms >= 0, not {time_ms!r}"
            )
        watermark = self.timers.watermark_ms
        if watermark is not None and time_ms < watermark:
            if self.late_stream is not None:
                record = {
                    "key": key,
                    "time": time_ms,
                    "value": value,
                    "side": ("left", "right")[side],
                }
                collector.send(OutgoingMessageEnvelope(self.late_stream, key, record))
            return False
        raw = self.keys.to_bytes(key)
        other = self.buffers[1 - side]
        for at, match in other.between(raw, time_ms - self.within_ms, time_ms + self.within_ms):
            pair = (
                Joined(key, time_ms, value, at, match)
                if side == 0
                else Joined(key, at, match, time_ms, value)
            )
            self.emit(pair, collector)
        buffer = self.buffers[side]
        if buffer.add(raw, time_ms, value):
            expires = time_ms + self.within_ms + 1
            self.timers.register_owned(
                buffer.name, TimeKind.EVENT, expires, entry_key(raw, time_ms)
            )
        return True


def _nothing_held() -> bool:
    """A join writes through at once: nothing waits for the end of the batch."""
    return False


def buffer_expiry(buffer: JoinBuffer) -> Callable[[bytes, int, Any], None]:
    """The owned-timer handler of ``buffer``: a due timer deletes its entry."""

    def expire(raw: bytes, _timestamp_ms: int, _collector: Any) -> None:
        buffer.drop(raw)

    return expire


def open_join(
    task: TaskName,
    config: Config,
    stores: Mapping[str, KeyValueStore[Any, Any]],
    timers: TaskTimers,
    names: tuple[str, str],
    *,
    within_ms: int,
    emit: EmitPair,
    late_stream: str | None = None,
) -> WindowedJoin:
    """A windowed join over the job's stores ``names`` (left, right); see the module
    docstring. A bad store or window is a :class:`ConfigError` naming it and the fix."""
    if isinstance(within_ms, bool) or not isinstance(within_ms, int) or within_ms < 0:
        raise ConfigError(
            f"join {names[0]!r}/{names[1]!r}: within_ms must be ms >= 0, not {within_ms!r}"
        )
    if names[0] == names[1]:
        raise ConfigError(
            f"join: the left and right sides both buffer in store {names[0]!r}; give each its own"
        )
    opened = []
    for name in names:
        kept = stores.get(name)
        if not isinstance(kept, SerializedKeyValueStore):
            known = ", ".join(sorted(stores)) or "none"
            raise ConfigError(
                f"task {task}: join buffer {name!r}: the job has no such store (configure "
                f"stores.{name}.factory=rocksdb with a changelog; stores: {known})"
            )
        if ttl_of(config, name) or name in config.side_inputs.values():
            raise ConfigError(
                f"join buffer {name!r} has a TTL or is a table: its own timers delete what can "
                "no longer match; keep the buffer in a plain store of its own"
            )
        opened.append(kept)
    late = None if late_stream is None else SystemStream.parse(late_stream)
    return WindowedJoin((opened[0], opened[1]), names, timers, within_ms, emit, late)


__all__ = ["WindowedJoin", "open_join"]

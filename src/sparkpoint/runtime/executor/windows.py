"""Keyed windows for the task API: ``context.windows``.

A task opens a window store in ``init`` and adds records to it in ``process``; each window
closes by itself (its timer, in the task's timer store, fires at the end of the batch whose
watermark, or processing time, reaches its close) and its result goes to the ``emit``
function the task gave, with the collector::

    class MinuteCounts(StreamTask):
        def init(self, context):
            self.minutes = context.windows.tumbling(
                "minute-counts", size_ms=60_000, aggregate=count(), emit=self.emit)

        def process(self, envelope, collector, coordinator):
            self.minutes.add(envelope.key, envelope.event_time, late_to=collector)

        def emit(self, window, collector):   # a Window: key, start, end, value
            collector.send(OutgoingMessageEnvelope(OUT, window.key, {...}))

The window store is a store of the job (``stores.<name>.factory=rocksdb``, with a changelog or
a blob store backup), kept for this window alone; its layout is
:mod:`sparkpoint.storage.windows`'. A record whose windows have all closed is *late*: ``add``
returns ``False`` and changes nothing; with ``late_stream`` set, the window store sends it
there (``{"key", "time", "value"}``) through the collector given to ``add``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, TaskError
from sparkpoint.model import SystemStream, TaskName
from sparkpoint.runtime.api.task import Emit, EmitPair
from sparkpoint.runtime.executor.joins import WindowedJoin, open_join
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.storage.kv.store import SerializedKeyValueStore
from sparkpoint.storage.kv.ttl import ttl_of
from sparkpoint.storage.timers import TimeKind
from sparkpoint.storage.windows import (
    Aggregate,
    Open,
    Window,
    WindowSpec,
    WindowState,
    entry_key,
    split_entry_key,
    timer_changes,
)
from sparkpoint.system.base import OutgoingMessageEnvelope

if TYPE_CHECKING:
    from sparkpoint.runtime.api.task import MessageCollector
    from sparkpoint.runtime.executor.timers import TaskTimers


@dataclass(frozen=True)
class Triggers:
    """When a window store's windows go out besides on time (once, when the watermark passes
    their end): ``early``, at the end of every batch that changed a window before then;
    ``allowed_lateness_ms``, a window stays after going out on time until the watermark passes
    its end by this much, and each batch whose late records change it sends it again
    (``emission="late"``); later records are late. Event-time tumbling and hopping windows
    only for the lateness (a late record could merge sessions that went out)."""

    early: bool = False
    allowed_lateness_ms: int = 0

    @property
    def updates(self) -> bool:
        return self.early or self.allowed_lateness_ms > 0

    def check(self, store: str, spec: WindowSpec, time: TimeKind) -> Triggers:
        lateness = self.allowed_lateness_ms
        if isinstance(lateness, bool) or not isinstance(lateness, int) or lateness < 0:
            raise ConfigError(
                f"window store {store!r}: allowed_lateness_ms must be ms >= 0, not {lateness!r}"
            )
        if lateness and (spec.is_session or time is not TimeKind.EVENT):
            raise ConfigError(
                f"window store {store!r}: allowed_lateness_ms is for event-time tumbling and "
                "hopping windows (a late record could merge sessions that went out already)"
            )
        return self


#: a window store writes its changed keys back at the end of the batch, or once this many
#: keys changed (memory stays bounded)
FLUSH_KEYS = 10_000

#: what a window store calls with each closed window


class WindowedStore:
    """One window store of a task in one batch (made by :class:`TaskWindows`)."""

    def __init__(
        self,
        name: str,
        store: SerializedKeyValueStore[Any, Any],
        timers: TaskTimers,
        spec: WindowSpec,
        aggregate: Aggregate,
        emit: Emit,
        time: TimeKind,
        late_stream: SystemStream | None,
        triggers: Triggers | None = None,
    ) -> None:
        self.name = name
        self.triggers = triggers or Triggers()
        self._collector: MessageCollector | None = None  # for early and late emissions
        self.state = WindowState(store.engine, spec, aggregate)
        self.keys = store.key_serde
        self.timers = timers
        self.spec = spec
        self.aggregate = aggregate
        self.emit = emit
        self.time = time
        self.late_stream = late_stream
        #: the batch's changed keys: their windows as stored, and as they are now
        self._pending: dict[bytes, tuple[list[Open], list[Open]]] = {}
        #: windows due at the end of the batch, out of the store and not fired yet
        #: (:meth:`hold_due`), by engine key
        self._held: dict[bytes, Open] = {}
        #: the windows gone out (and gone) while the timers fire: not made again by an add
        self._gone_now: set[bytes] = set()
        holder = None if self.triggers.updates else (time, self)
        timers.own(name, self._fire, self.flush, holder, lambda raw: split_entry_key(raw)[1])

    def _closed_upto(self) -> int | None:
        """Windows closing at or before this are closed for good (the watermark less the
        allowed lateness, or processing time)."""
        if self.time is TimeKind.EVENT:
            watermark = self.timers.watermark_ms
            if watermark is None:
                return None
            firing = self.timers.firing_ms
            if firing is not None:  # while timers go out in time order: those before this one
                watermark = min(watermark, firing - 1)
            return watermark - self.triggers.allowed_lateness_ms
        return self.timers.now_ms()

    def add(
        self,
        key: Any,
        time_ms: int | None,
        value: Any = None,
        *,
        late_to: MessageCollector | None = None,
        collector: MessageCollector | None = None,
    ) -> bool:
        """Fold ``value`` into ``key``'s windows at ``time_ms`` (event time, e.g.
        ``envelope.event_time``; ``None`` for a processing-time window store: now). ``False``
        when the record is late (its windows closed): nothing changes, and with a
        ``late_stream`` and ``late_to`` (the collector) it is sent there. A key's windows are
        read once per batch and written back at its end (:meth:`flush`). ``collector`` (or
        ``late_to``): where late records, and early and late emissions, go."""
        late_to = collector or late_to
        if late_to is not None:
            self._collector = late_to
        at = self.timers.now_ms() if time_ms is None else time_ms
        if isinstance(at, bool) or not isinstance(at, int) or at < 0:
            raise ValueError(
                f"window store {self.name!r}: a record's time must be ms >= 0, not {at!r}"
            )
        raw = self.keys.to_bytes(key)
        if self._held:  # a record added while due windows go out (on_timer)
            self.release()
        entry = self._pending.get(raw)
        if entry is None:
            stored = list(self.state.of(raw))
            entry = (stored, stored)
        try:
            after = self.state.fold(entry[1], at, value, self._closed_upto())
        except (TypeError, ValueError) as exc:
            raise TaskError(
                f"task {self.timers.task}: window store {self.name!r}: the {self.aggregate.name} "
                f"aggregate failed on key {key!r} at {at}: {type(exc).__name__}: {exc}"
            ) from exc
        if self._gone_now:  # (none but while the timers go out: no step per record)
            if self.timers.firing_ms is None:
                self._gone_now.clear()
            elif after is not None and not self.spec.is_session:
                after = self._not_again(raw, entry[1], after, at)
        if after is None:
            self.timers.refused[self.name] += 1
            if self.late_stream is not None and late_to is not None:
                record = {"key": key, "time": at, "value": value}
                late_to.send(OutgoingMessageEnvelope(self.late_stream, key, record))
            return False
        self._pending[raw] = (entry[0], after)
        if len(self._pending) >= FLUSH_KEYS:
            self.flush()
        return True

    def _not_again(
        self, raw: bytes, before: list[Open], after: list[Open], at: int
    ) -> list[Open] | None:
        """``after`` without the windows the record at ``at`` would make again that went out
        while the timers fire (closed, though not by the watermark yet: a rollup's own window
        that closed with its hour); None when it joins no other (open already, or new)."""
        known = {w.start for w in before}
        kept = [
            w for w in after if w.start in known or entry_key(raw, w.start) not in self._gone_now
        ]
        if len(kept) == len(after):
            return after
        targets = {start for start, _end in self.spec.windows_of(at)}
        return kept if any(w.start in targets for w in kept) else None

    def flush(self) -> bool:
        """Write the batch's changed windows back, and move their timers (a window's close
        that is new gets a timer; one that is no more loses its own); and delete the windows
        that closed. Whether any had changed (the deletions alone run no code)."""
        pending, self._pending = self._pending, {}
        if not pending:
            self.state.settle()
            return False
        self._write(pending, None)
        if self.triggers.updates:
            for raw, (before, after) in pending.items():
                self._updates(raw, before, after)
        return True

    def hold_due(self) -> list[tuple[int, bytes]]:
        """:meth:`flush` at the end of the batch, once the watermark has advanced: a window
        that closes by now is not written but taken out of the store with its timer, and held
        to go out from memory in its turn (:meth:`_fire`); each such window's ``(close, engine
        key)``. (Not with early or late triggers: those keep windows after they go out.)"""
        upto = self._closed_upto()
        pending, self._pending = self._pending, {}
        return self._write(pending, upto)

    def holds(self, raw: bytes) -> bool:
        return raw in self._held

    def release(self) -> None:
        """Write the held windows back (each with its timer, due now): they go out from the
        store (a user's timer goes out first, or the batch fired its most)."""
        if self._held:
            held, self._held = self._held, {}
            closes_at = self.spec.closes_at
            writes: list[tuple[bytes, bytes | None]] = [
                (raw, self.state.dump(window)) for raw, window in held.items()
            ]
            self.state.write_changes(writes)
            timers = [(True, closes_at(w.end), raw) for raw, w in held.items()]
            self.timers.change_owned(self.name, self.time, timers)

    def _write(
        self, pending: dict[bytes, tuple[list[Open], list[Open]]], upto: int | None
    ) -> list[tuple[int, bytes]]:
        """Write ``pending``'s windows and timers in a write batch each; with ``upto``, hold
        back the windows that close by then (:meth:`hold_due`)."""
        writes: list[tuple[bytes, bytes | None]] = []
        timers: list[tuple[bool, int, bytes]] = []  # (register, when, timer key)
        held: list[tuple[int, bytes]] = []
        closes_at = self.spec.closes_at
        for raw, (before, after) in pending.items():
            if upto is not None:
                due = [w for w in after if closes_at(w.end) <= upto]
                after = [w for w in after if closes_at(w.end) > upto] if due else after
                for window in due:
                    engine_key = entry_key(raw, window.start)
                    self._held[engine_key] = window
                    held.append((closes_at(window.end), engine_key))
            writes += self.state.changes(raw, before, after)
            opened, gone = timer_changes(before, after)
            timers += [(False, closes_at(w.end), entry_key(raw, w.start)) for w in gone]
            timers += [(True, closes_at(w.end), entry_key(raw, w.start)) for w in opened]
        self.state.write_changes(writes)
        self.timers.change_owned(self.name, self.time, timers)
        return held

    def _updates(self, raw: bytes, before: list[Open], after: list[Open]) -> None:
        """Early emissions (windows not closed yet) and late ones (closed, within the allowed
        lateness) of the windows this batch changed."""
        old = {(w.start, w.end): w.acc for w in before}
        key: Any = None
        for window in after:
            if (window.start, window.end) in old and old[(window.start, window.end)] == window.acc:
                continue
            if not window.fired and not self.triggers.early:
                continue
            if self._collector is None:
                raise TaskError(
                    f"task {self.timers.task}: window store {self.name!r} emits early or late "
                    "updates: pass the collector to add(..., collector=collector)"
                )
            key = self.keys.from_bytes(raw) if key is None else key
            value = self.aggregate.result(window.acc)
            emission = "late" if window.fired else "early"
            self.emit(Window(key, window.start, window.end, value, emission), self._collector)

    def windows(self, key: Any) -> list[Window]:
        """``key``'s open windows, by start, with their current values."""
        raw = self.keys.to_bytes(key)
        self.release()
        pending = self._pending.get(raw)
        open_ = pending[1] if pending is not None else list(self.state.of(raw))
        result = self.aggregate.result
        return [Window(key, w.start, w.end, result(w.acc)) for w in open_]

    def _fire(self, timer_key: bytes, timestamp_ms: int, collector: MessageCollector) -> None:
        raw, start = split_entry_key(timer_key)
        held = self._held.pop(timer_key, None)
        if held is not None:  # out of the store already (hold_due)
            self._gone_now.add(timer_key)
            self._emit(raw, held, collector)
            return
        if self._pending:  # none at the end of a batch: the timers flushed every window store
            self.flush()
        lateness = self.triggers.allowed_lateness_ms
        if lateness:
            kept = self.state.get(raw, start)
            if kept is not None and kept.fired:  # its allowed lateness is over: gone
                self.state.close(raw, start)
                self._gone_now.add(timer_key)
                return
            if kept is not None:  # on time: out, and kept for its allowed lateness
                self.state.mark_fired(raw, kept)
                when = self.spec.closes_at(kept.end) + lateness
                self.timers.register_owned(self.name, self.time, when, timer_key)
            window = kept
        else:
            window = self.state.take(raw, start)  # deleted with the others (flush)
            self._gone_now.add(timer_key)
        if window is None:
            raise TaskError(
                f"task {self.timers.task}: window store {self.name!r}: a window's timer "
                f"(start {start}, due {timestamp_ms}) fired, but the window is not in the "
                "store; the timer store and the window store disagree (were they restored "
                "from different checkpoints?)"
            )
        self._emit(raw, window, collector)

    def _emit(self, raw: bytes, window: Open, collector: MessageCollector) -> None:
        key = self.keys.from_bytes(raw)
        self.emit(
            Window(key, window.start, window.end, self.aggregate.result(window.acc)), collector
        )


class TaskWindows:
    """``context.windows``: opens a task's window stores."""

    def __init__(
        self,
        task: TaskName,
        config: Config,
        stores: Mapping[str, KeyValueStore[Any, Any]],
        timers: TaskTimers,
    ) -> None:
        self.task = task
        self.config = config
        self.stores = stores
        self.timers = timers

    def tumbling(self, store: str, *, size_ms: int, **options: Any) -> WindowedStore:
        """Windows ``[n*size, (n+1)*size)``, one per record."""
        return self.open(store, WindowSpec.tumbling(size_ms), **options)

    def hopping(self, store: str, *, size_ms: int, slide_ms: int, **options: Any) -> WindowedStore:
        """Windows of ``size_ms`` starting every ``slide_ms``: a record is in size/slide."""
        return self.open(store, WindowSpec.hopping(size_ms, slide_ms), **options)

    def session(self, store: str, *, gap_ms: int, **options: Any) -> WindowedStore:
        """A key's records at most ``gap_ms`` apart, from its first to its last record;
        closes once time passes its last record + the gap."""
        return self.open(store, WindowSpec.session(gap_ms), **options)

    def join(
        self,
        left_store: str,
        right_store: str,
        *,
        within_ms: int,
        emit: EmitPair,
        late_stream: str | None = None,
    ) -> WindowedJoin:
        """A windowed stream-stream join: records of one key at most ``within_ms`` apart in
        event time, one from each side, go to ``emit`` once per pair
        (:mod:`sparkpoint.runtime.executor.joins`)."""
        names = (left_store, right_store)
        return open_join(
            self.task,
            self.config,
            self.stores,
            self.timers,
            names,
            within_ms=within_ms,
            emit=emit,
            late_stream=late_stream,
        )

    def open(
        self,
        store: str,
        spec: WindowSpec,
        *,
        aggregate: Aggregate,
        emit: Emit,
        time: str = "event",
        late_stream: str | None = None,
        early: bool = False,
        allowed_lateness_ms: int = 0,
    ) -> WindowedStore:
        """A window store over the job's store ``store`` (see the module docstring);
        ``early`` and ``allowed_lateness_ms``: :class:`Triggers`."""
        kind = TimeKind.parse(time)
        triggers = Triggers(early, allowed_lateness_ms).check(store, spec, kind)
        kept = self.stores.get(store)
        if not isinstance(kept, SerializedKeyValueStore):
            known = ", ".join(sorted(self.stores)) or "none"
            raise ConfigError(
                f"task {self.task}: window store {store!r}: the job has no such store "
                f"(configure stores.{store}.factory=rocksdb with a changelog; stores: {known})"
            )
        if store in self.config.side_inputs.values():
            raise ConfigError(
                f"window store {store!r} is a table (stores.{store}.side.inputs): its stream "
                "would overwrite the windows; keep them in a store of their own"
            )
        if ttl_of(self.config, store):
            raise ConfigError(
                f"window store {store!r} has a TTL (stores.{store}.rocksdb.ttl.ms): its windows "
                "would expire before they close; a window store's state ends when its windows "
                "close, so it needs none"
            )
        if not isinstance(aggregate, Aggregate):
            raise ConfigError(
                f"window store {store!r}: aggregate must be count(), sum_of(), min_of(), "
                f"max_of(), reduce_with(fn) or collect(), not {aggregate!r}"
            )
        late = None if late_stream is None else SystemStream.parse(late_stream)
        return WindowedStore(store, kept, self.timers, spec, aggregate, emit, kind, late, triggers)


__all__ = ["TaskWindows", "Triggers", "WindowedStore"]

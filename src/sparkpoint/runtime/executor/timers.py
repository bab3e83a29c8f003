"""Per-key timers and event time for the task API: ``context.timers`` and ``on_timer``.

A task registers a timer for a key with :meth:`TaskTimers.register` (processing time, the
default, or event time) and gets ``on_timer(key, timestamp_ms, collector, coordinator)`` once
it is due: a processing-time timer at the end of the first batch at or after its time, an
event-time timer at the end of the batch whose watermark reaches it. A timer registered in the
past fires at the end of the current batch. Timers are kept in the store named by
``task.timers.store`` (:mod:`sparkpoint.storage.timers`), so they survive a restart and a lost
host, and a timer's firing is committed with the batch that fired it.

**Event time.** Each envelope carries ``event_time``: its record's timestamp, or the integer
field ``streams.<s>.event.time.field`` of its message. A task's watermark is the smallest,
over its input partitions that are not idle, of the largest event time seen, minus
``task.watermark.lateness.ms``; a partition with no record for ``task.watermark.idle.ms`` is
idle and holds nothing back. The watermark advances at the end of each batch, never moves back,
and is kept in the timer store (a restart does not move it back, refire or drop a timer). A
record whose event time is below the watermark at the start of its batch is *late*: it reaches
``process`` with ``envelope.late`` set, and is counted; nothing is dropped. A startpoint that
rewinds an input does not move the watermark back: the rewound records are late.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, TaskError
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.model.clock import now_ms
from sparkpoint.serde import Serde
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.storage.kv.store import SerializedKeyValueStore
from sparkpoint.storage.kv.ttl import ttl_of
from sparkpoint.storage.tables import Tables
from sparkpoint.storage.timers import OWNED, TimeKind, Timer, TimerStore, owned_key, split_owned

if TYPE_CHECKING:
    from sparkpoint.runtime.api.task import MessageCollector, StreamTask, TaskCoordinator

log = logging.getLogger(__name__)

#: timers fired per batch at most; the rest fire at the end of the next batch (so does a timer
#: that ``on_timer`` registers again for a time already due)
MAX_FIRED_PER_BATCH = 100_000
#: passes of :meth:`TaskTimers.flush_owned` before a cycle of updates is refused
MAX_FLUSH_PASSES = 100


class OwnedTimer(NamedTuple):
    """A due timer of a helper (``owner``, e.g. a window store) with its raw key."""

    owner: str
    raw: bytes


#: a helper's handler of its due timers: ``(raw key, timestamp_ms, collector)``
OwnedHandler = Callable[[bytes, int, "MessageCollector"], None]


class HoldsDue(Protocol):
    """A helper whose due timers can be held in memory at the end of a batch (a window
    store): what it changed in the batch and closes by now is never written, only handed to
    its handler (:meth:`TaskTimers.expire`)."""

    def hold_due(self) -> list[tuple[int, bytes]]:
        """Write what the batch changed, but hold back what is due by now (the watermark has
        advanced): ``(timestamp_ms, raw key)`` of each timer held, none in the store."""
        ...

    def holds(self, raw: bytes) -> bool:
        """Whether the timer of ``raw`` is held still (not fired, not written back)."""
        ...

    def release(self) -> None:
        """Write back what is held and not fired (with its timers, due now)."""
        ...


def _time(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer of milliseconds, not {value!r}")
    return value


def _values(column: Iterable[Any]) -> list[Any]:
    """A column's Python values (an Arrow array or a pandas series as a list)."""
    to_list = getattr(column, "to_pylist", None) or getattr(column, "tolist", None)
    return list(to_list() if to_list is not None else column)


class TaskTimers:
    """``context.timers`` of one task in one batch."""

    def __init__(
        self,
        task: TaskName,
        config: Config,
        store: SerializedKeyValueStore[Any, Any] | None,
        ssps: frozenset[SystemStreamPartition],
    ) -> None:
        self.task = task
        self.config = config
        self.ssps = ssps
        self._store = None if store is None else TimerStore(store.engine, unindexed=OWNED)
        self._keys: Serde[Any] | None = None if store is None else store.key_serde
        self.watermark_ms: int | None = None if self._store is None else self._store.watermark()
        self._seen: dict[SystemStreamPartition, int] = {}
        self._owners: dict[str, OwnedHandler] = {}
        self._flushes: dict[str, Callable[[], bool]] = {}
        self._holders: dict[str, tuple[TimeKind, HoldsDue]] = {}
        #: each window store's start of the window a timer key names (firing order)
        self._starts: dict[str, Callable[[bytes], int]] = {}
        #: the event time of the timer going out, while :meth:`expire` gives them out: a
        #: window store takes additions to its windows not closed by then (a rollup)
        self.firing_ms: int | None = None
        self.late = 0
        self.fired = 0
        #: the batch ends the input (``--final-watermark``): :meth:`advance` moves the
        #: watermark to the end of time
        self.end_of_input = False
        #: per window store, the adds it refused as late this batch (from ``process``,
        #: ``emit`` or ``on_timer``: every window they would join had closed)
        self.refused: Counter[str] = Counter()

    @classmethod
    def open(
        cls,
        task: TaskName,
        config: Config,
        stores: Mapping[str, KeyValueStore[Any, Any]],
        ssps: frozenset[SystemStreamPartition],
    ) -> TaskTimers:
        """The task's timers; ``ssps`` are its partitions (a table's stream does not hold
        the watermark: only the task's inputs do)."""
        ssps = Tables.of(config).main(ssps)
        name = config.get_str("task.timers.store")
        if name and name in config.side_inputs.values():
            raise ConfigError(
                f"task.timers.store={name!r} is a table (stores.{name}.side.inputs): its "
                "stream would overwrite the timers; keep the timers in a store of their own"
            )
        if not name:
            return cls(task, config, None, ssps)
        if ttl_of(config, name):
            raise ConfigError(
                f"task.timers.store={name!r} has a TTL (stores.{name}.rocksdb.ttl.ms): timers "
                "would expire without firing; keep the timers in a store without one"
            )
        store = stores.get(name)
        if not isinstance(store, SerializedKeyValueStore):
            raise ConfigError(
                f"task.timers.store={name!r}: the job has no such store (declare "
                f"stores.{name}.factory=rocksdb, with a changelog or a blob store backup)"
            )
        return cls(task, config, store, ssps)

    @property
    def tracking(self) -> bool:
        """Whether event time is tracked (a timer store is configured)."""
        return self._store is not None

    def _timers(self) -> TimerStore:
        if self._store is None:
            raise ConfigError(
                f"task {self.task}: timers need a store to keep them: set task.timers.store to "
                "one of the job's stores (stores.<name>.factory=rocksdb, with a changelog or a "
                "blob store backup so they survive a lost host)"
            )
        return self._store

    def _key(self, key: object) -> bytes:
        assert self._keys is not None
        try:
            return self._keys.to_bytes(key)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"a timer's key {key!r} cannot be serialized: {exc}") from exc

    # -- the task's calls
    def now_ms(self) -> int:
        """Processing time now (what processing-time timers are due by)."""
        return now_ms()

    def register(self, key: object, timestamp_ms: int, kind: str = "processing") -> None:
        """Fire ``on_timer(key, timestamp_ms, ...)`` once ``timestamp_ms`` is reached (in
        processing time, or in event time for ``kind="event"``). Registering it again is one
        timer."""
        store = self._timers()
        store.register(TimeKind.parse(kind), _time(timestamp_ms, "a timer's time"), self._key(key))

    def replace(self, key: object, timestamp_ms: int, kind: str = "processing") -> None:
        """Make this the key's one timer of ``kind``: its other timers of that kind are
        deleted (one read and one write: the idle-timeout pattern, a timer moved on every
        message of its key)."""
        store = self._timers()
        store.replace(TimeKind.parse(kind), _time(timestamp_ms, "a timer's time"), self._key(key))

    def register_all(
        self, keys: Iterable[object], timestamps_ms: Iterable[int], kind: str = "processing"
    ) -> None:
        """:meth:`register` for each key and time, pairwise (lists, or Arrow or pandas
        columns: what a DataFrame step holds)."""
        store, time_kind = self._timers(), TimeKind.parse(kind)
        for key, timestamp_ms in zip(_values(keys), _values(timestamps_ms), strict=True):
            store.register(time_kind, _time(timestamp_ms, "a timer's time"), self._key(key))

    def delete(self, key: object, timestamp_ms: int, kind: str = "processing") -> None:
        """Forget a registered timer; no error when there is none."""
        store = self._timers()
        store.delete(TimeKind.parse(kind), _time(timestamp_ms, "a timer's time"), self._key(key))

    def list(self, key: object = None, kind: str | None = None) -> list[tuple[Any, int, str]]:
        """Registered timers, ``(key, timestamp_ms, kind)`` in firing order per kind; only those
        of ``key`` (and of ``kind``) when given. A key's timers are one short scan of an index;
        all timers, a scan of them all."""
        store = self._timers()
        assert self._keys is not None
        kinds = list(TimeKind) if kind is None else [TimeKind.parse(kind)]
        if key is None:  # the user's: not the window stores'
            found = [t for k in kinds for t in store.timers(k) if not t.key.startswith(OWNED)]
        else:
            found = [t for t in store.timers_of(self._key(key)) if t.kind in kinds]
        return [(self._keys.from_bytes(t.key), t.timestamp_ms, t.kind.value) for t in found]

    # -- the runtime's own helpers (window stores)
    def own(
        self,
        owner: str,
        handler: OwnedHandler,
        flush: Callable[[], bool],
        holder: tuple[TimeKind, HoldsDue] | None = None,
        start_of: Callable[[bytes], int] | None = None,
    ) -> None:
        """Route ``owner``'s due timers to ``handler`` (not to ``on_timer``); ``flush`` writes
        what the owner keeps back, and says whether there was any (:meth:`flush_owned`:
        before a user's timer goes out, and at the end of the batch). ``holder``: the owner's
        timers of that kind can be held in memory when they are due by the end of the batch
        (:class:`HoldsDue`). ``start_of``: the start of the window a timer key of the owner
        names (a window store's), for the firing order (:meth:`_order`)."""
        self._timers()
        if owner in self._owners:  # two objects' changes and held windows under one name
            raise ConfigError(
                f"task {self.task}: store {owner!r} is opened twice in one batch as a window "
                "or join store: open it once (in init()) and keep the object"
            )
        self._owners[owner] = handler
        self._flushes[owner] = flush
        if holder is not None:
            self._holders[owner] = holder
        if start_of is not None:
            self._starts[owner] = start_of

    def _order(self, timer: Timer) -> tuple[int, int, int, bytes]:
        """A timer's place in firing order (its kind's): by time; at one time the window
        stores' windows first, those that started later first (so a minute that closes with
        its hour goes out before it, and its ``emit`` can add to it: a rollup), then the other
        helpers', then the user's, each in the timer store's key order."""
        owned = split_owned(timer.key)
        if owned is None:
            return timer.timestamp_ms, 2, 0, timer.key
        start_of = self._starts.get(owned[0])
        if start_of is None:
            return timer.timestamp_ms, 1, 0, timer.key
        return timer.timestamp_ms, 0, -start_of(owned[1]), timer.key

    def _in_order(self, timers: Iterator[Timer]) -> Iterator[Timer]:
        """``timers`` (in the timer store's order: by time, then key) in :meth:`_order`: each
        run of one time sorted."""
        run: list[Timer] = []
        for timer in timers:
            if run and timer.timestamp_ms != run[0].timestamp_ms:
                yield from sorted(run, key=self._order)
                run = []
            run.append(timer)
        yield from sorted(run, key=self._order)

    def window_late(self) -> int:
        """The window adds refused as late this batch, logged per store: each went to its
        store's ``late_stream``, or nowhere when it has none (``add`` returned ``False``)."""
        if self.refused:
            stores = ", ".join(f"{n} in {s!r}" for s, n in sorted(self.refused.items()))
            log.info(
                "task %s: window adds refused as late (their windows had closed; sent to the "
                "store's late_stream, or dropped without one): %s",
                self.task,
                stores,
            )
        return sum(self.refused.values())

    def flush_owned(self) -> None:
        """Each helper writes what it keeps back; again while a pass wrote something, as the
        code a write runs (a window store's early or late updates, whose ``emit`` may add to
        another window store: a rollup) can change a helper that wrote before it in the
        pass. A task whose ``emit`` functions keep changing window stores pass after pass
        (a store that adds its own updates to itself) is stopped, naming them."""
        for _ in range(MAX_FLUSH_PASSES):
            wrote = [owner for owner, flush in self._flushes.items() if flush()]
            if not wrote:
                return
        raise TaskError(
            f"task {self.task}: window stores {', '.join(sorted(wrote))} still had changes "
            f"after {MAX_FLUSH_PASSES} writes in a row: their emit functions add early or "
            "late updates to window stores that emit updates again (a cycle); send the "
            "updates to a store without early or late triggers"
        )

    def _hold_due(self) -> dict[TimeKind, deque[Timer]]:
        """Each helper writes what the batch changed; a holder holds back what is due by now
        (:class:`HoldsDue`): its timers, by kind, in firing order."""
        held: dict[TimeKind, list[Timer]] = {kind: [] for kind in TimeKind}
        for owner, flush in self._flushes.items():
            if owner not in self._holders:
                flush()
                continue
            kind, holder = self._holders[owner]
            held[kind] += [Timer(t, kind, owned_key(owner, raw)) for t, raw in holder.hold_due()]
        return {kind: deque(sorted(timers, key=self._order)) for kind, timers in held.items()}

    def _release_held(self) -> None:
        for _, holder in self._holders.values():
            holder.release()

    def register_owned(self, owner: str, kind: TimeKind, timestamp_ms: int, raw: bytes) -> None:
        self._timers().register(kind, timestamp_ms, owned_key(owner, raw))

    def delete_owned(self, owner: str, kind: TimeKind, timestamp_ms: int, raw: bytes) -> None:
        self._timers().delete(kind, timestamp_ms, owned_key(owner, raw))

    def change_owned(
        self, owner: str, kind: TimeKind, changes: Iterable[tuple[bool, int, bytes]]
    ) -> None:
        """:meth:`register_owned` (``True``) or :meth:`delete_owned` (``False``) for each
        ``(register, timestamp_ms, raw key)``, in order, in one write batch."""
        timers = [
            (register, Timer(when, kind, owned_key(owner, raw))) for register, when, raw in changes
        ]
        self._timers().change_many(timers)

    def fire_owned(self, timer: OwnedTimer, timestamp_ms: int, collector: MessageCollector) -> None:
        handler = self._owners.get(timer.owner)
        if handler is None:
            raise TaskError(
                f"task {self.task}: a timer of {timer.owner!r} is due, but the task did not open "
                f"it in this batch (open it in init(), e.g. context.windows...({timer.owner!r}, "
                "...), so that its windows close)"
            )
        handler(timer.raw, timestamp_ms, collector)

    # -- the executor's calls
    def event_time_of(self, stream: SystemStream) -> str | None:
        return self.config.get_str(f"streams.{stream.stream}.event.time.field")

    def seen(self, ssp: SystemStreamPartition, max_event_ms: int) -> None:
        """The largest event time of a chunk of ``ssp``'s records."""
        if max_event_ms > self._seen.get(ssp, -1):
            self._seen[ssp] = max_event_ms

    def advance(self) -> int | None:
        """Advance the watermark with the event times seen in this batch; the new watermark."""
        store = self._timers()
        if self.end_of_input:
            self.watermark_ms = store.end_input()
            return self.watermark_ms
        self.watermark_ms = store.advance_watermark(
            self.ssps,
            now_ms(),
            self.config.get_int("task.watermark.lateness.ms"),
            self.config.get_int("task.watermark.idle.ms"),
            seen=self._seen,
        )
        return self.watermark_ms

    def expire(self) -> Iterator[tuple[TimeKind, Any, int]]:
        """Every due timer, ``(kind, key, timestamp_ms)``: event time (by the watermark
        :meth:`advance` left), then processing time, each in time order and deleted before it
        is given out; at most :data:`MAX_FIRED_PER_BATCH` (the rest come in the next batch).
        A helper's timer comes as an :class:`OwnedTimer` key (:meth:`fire_owned`).

        First the helpers write what the batch changed, except what a holder closes by now
        (:meth:`_hold_due`): a window that opens and closes in one batch (most, when a batch
        spans more event time than a window) is never written to its store, nor its timer;
        it is held in memory and goes out in its turn. A user's timer, or code that reads or
        adds to its store, writes back what is held first (it then goes out in its turn, from
        the store); so does the per-batch limit (it goes out in the next batch)."""
        store = self._timers()
        held = self._hold_due()
        given: set[Timer] = set()  # each goes out once per call (one due again: the next)
        try:
            for kind, upto in (
                (TimeKind.EVENT, self.watermark_ms),
                (TimeKind.PROCESSING, now_ms()),
            ):
                if upto is None:
                    continue
                mine = held[kind]
                while True:  # until a pass finds nothing new (the code may register more)
                    before = len(given)
                    for timer in self._in_order(store.due(kind, upto)):
                        place = self._order(timer)
                        while mine and self._order(mine[0]) < place:
                            if self._limited():
                                return
                            yield from self._firing(
                                kind, self._fire_held(store, mine.popleft(), given)
                            )
                        if timer in given or store.gone(timer):  # (gone: by a held one's code)
                            continue
                        if self._limited():
                            return
                        yield from self._firing(kind, self._fire(store, timer, given))
                    while mine:
                        if self._limited():
                            return
                        yield from self._firing(kind, self._fire_held(store, mine.popleft(), given))
                    if len(given) == before:
                        break
                    # what the timers' code added (a rollup's window), with its timer: due now,
                    # it goes out in the next pass
                    self.flush_owned()
        finally:
            self.firing_ms = None
            store.settle()
            self._release_held()  # what the limit left: from the store in the next batch
            self.flush_owned()  # the window stores delete the windows that closed

    def _firing(
        self, kind: TimeKind, timers: Iterator[tuple[TimeKind, Any, int]]
    ) -> Iterator[tuple[TimeKind, Any, int]]:
        """``timers`` given out with :attr:`firing_ms` at each one's time (event time)."""
        for fired in timers:
            self.firing_ms = fired[2] if kind is TimeKind.EVENT else None
            yield fired

    def _fire(
        self, store: TimerStore, timer: Timer, given: set[Timer]
    ) -> Iterator[tuple[TimeKind, Any, int]]:
        """A timer of the store: deleted with the next ones in one write batch, before any use
        of the timers, and before a user's timer goes out (its code may stop there)."""
        assert self._keys is not None
        store.delete_later(timer)
        given.add(timer)
        self.fired += 1
        owned = split_owned(timer.key)
        if owned is not None:
            yield timer.kind, OwnedTimer(*owned), timer.timestamp_ms
            return
        store.settle()
        self._release_held()  # its code sees the windows not closed yet in the store
        self.flush_owned()  # and the closed ones gone
        yield timer.kind, self._keys.from_bytes(timer.key), timer.timestamp_ms

    def _fire_held(
        self, store: TimerStore, timer: Timer, given: set[Timer]
    ) -> Iterator[tuple[TimeKind, Any, int]]:
        """A held timer in its turn: from memory, or, when its holder wrote it back meanwhile
        (a user's timer went out before it, or code read or added to its window store), from
        the store, whose timer it deletes (unless that timer went out already)."""
        if timer in given:
            return
        owned = split_owned(timer.key)
        assert owned is not None
        if not self._holders[owned[0]][1].holds(owned[1]):
            store.delete_later(timer)
        given.add(timer)
        self.fired += 1
        yield timer.kind, OwnedTimer(*owned), timer.timestamp_ms

    def _limited(self) -> bool:
        """Whether this batch fired :data:`MAX_FIRED_PER_BATCH` timers (the caller stops)."""
        if self.fired < MAX_FIRED_PER_BATCH:
            return False
        log.warning(
            "task %s: %d timers fired in one batch; the rest fire in the next",
            self.task,
            self.fired,
        )
        return True

    def end_of_batch(
        self, task: StreamTask, collector: MessageCollector, coordinator: TaskCoordinator
    ) -> None:
        """Advance the watermark, then call ``on_timer`` for every due timer (:meth:`expire`)."""
        if self._store is None:
            return
        self.advance()
        for kind, key, timestamp_ms in self.expire():
            if isinstance(key, OwnedTimer):
                self.fire_owned(key, timestamp_ms, collector)
                continue
            try:
                task.on_timer(key, timestamp_ms, collector, coordinator)
            except Exception as exc:
                raise TaskError(
                    f"task {self.task}: on_timer({key!r}, {timestamp_ms}) for a "
                    f"{kind.value}-time timer failed: {type(exc).__name__}: {exc}"
                ) from exc


__all__ = [
    "MAX_FIRED_PER_BATCH",
    "OWNED",
    "HoldsDue",
    "OwnedHandler",
    "OwnedTimer",
    "TaskTimers",
]

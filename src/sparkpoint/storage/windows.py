"""Keyed windows kept in a store: tumbling, hopping and session windows with an aggregate.

A window store holds, for each key, its open windows and their accumulators; a window closes
(its result goes out, its entry is deleted) when its timer fires: an event-time timer at the
window's end (a session's: its last event + the gap) fires when the task's watermark reaches
it, a processing-time one when processing time does. State is therefore bounded by the windows
still open. This module holds the layout and the arithmetic, over a raw engine; the APIs'
helpers (:mod:`sparkpoint.runtime.executor.windows`) register the timers and send the results.

Layout (raw engine keys; the user's key as its store's key serde makes it)::

    <2-byte key length> <key bytes> <8-byte window start>  ->  JSON {"end": ms, "acc": value}

so a key's windows are one short range scan, in start order. The accumulator is JSON (an
aggregate's ``init``/``add``/``merge`` values must be JSON values). A window is ``[start,
end)``: a record at time ``t`` is in a tumbling or hopping window when ``start <= t < end``,
windows aligned to multiples of their slide since the epoch. A session's ``start`` and ``end``
are its first and last record's times; records at most ``gap`` apart are in one session (a
record that bridges two sessions merges them), as in Flink, Kafka Streams and Spark.

A record is *late* when every window it would join has closed (its end is at or below the
watermark; a session's end + gap below it), or when it would join a session that has closed
(whose timer has not fired yet): it changes nothing, and the caller routes it elsewhere.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from sparkpoint.errors import ConfigError, StoreError
from sparkpoint.serde import JsonSerde
from sparkpoint.storage.kv.base import KeyValueEngine

#: a window's entry: JSON (orjson where its bytes are the standard library's; any JSON reads)
_JSON = JsonSerde()
_SCALARS = (int, float, str, bool, type(None))
TIME = struct.Struct(">q")
KEY_LENGTH = struct.Struct(">H")


@dataclass(frozen=True)
class WindowSpec:
    """Which windows a record falls in: ``tumbling(size)``, ``hopping(size, slide)`` or
    ``session(gap)``; all in milliseconds."""

    kind: str
    size_ms: int = 0
    slide_ms: int = 0
    gap_ms: int = 0

    @classmethod
    def tumbling(cls, size_ms: int) -> WindowSpec:
        return cls("tumbling", _positive(size_ms, "a window's size"), size_ms)

    @classmethod
    def hopping(cls, size_ms: int, slide_ms: int) -> WindowSpec:
        size, slide = _positive(size_ms, "a window's size"), _positive(slide_ms, "its slide")
        if size % slide:
            raise ConfigError(
                f"a hopping window's size ({size} ms) must be a multiple of its slide "
                f"({slide} ms), so that every record is in size/slide windows"
            )
        return cls("hopping", size, slide)

    @classmethod
    def session(cls, gap_ms: int) -> WindowSpec:
        return cls("session", gap_ms=_positive(gap_ms, "a session's gap"))

    @property
    def is_session(self) -> bool:
        return self.kind == "session"

    def windows_of(self, time_ms: int) -> list[tuple[int, int]]:
        """The ``[start, end)`` windows a record at ``time_ms`` is in (not for sessions)."""
        last = time_ms - time_ms % self.slide_ms
        first = last - self.size_ms + self.slide_ms
        return [
            (start, start + self.size_ms)
            for start in range(max(first, 0), last + 1, self.slide_ms)
            if start <= time_ms < start + self.size_ms
        ]

    def closes_at(self, end_ms: int) -> int:
        """When a window ending at ``end_ms`` closes: a ``[start, end)`` window once time
        reaches its end; a session (``end_ms``: its last record) once time passes its last
        record + the gap (a record exactly a gap later still joins it)."""
        return end_ms + self.gap_ms + 1 if self.is_session else end_ms


def _positive(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{what} must be a positive integer of milliseconds, not {value!r}")
    return value


@dataclass(frozen=True)
class Aggregate:
    """How a window's records fold into its value: ``init()`` the empty accumulator,
    ``add(acc, value)``, ``merge(a, b)`` (sessions that merge), ``result(acc)``. Accumulators
    are JSON values (the store keeps them as JSON, the same in both APIs)."""

    name: str
    init: Callable[[], Any]
    add: Callable[[Any, Any], Any]
    merge: Callable[[Any, Any], Any]
    result: Callable[[Any], Any] = lambda acc: acc


def _min(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _max(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def count() -> Aggregate:
    """How many records (their values are ignored)."""
    return Aggregate("count", lambda: 0, lambda acc, _v: acc + 1, lambda a, b: a + b)


def sum_of() -> Aggregate:
    """The sum of the records' values (numbers)."""
    return Aggregate("sum", lambda: 0, lambda acc, v: acc + v, lambda a, b: a + b)


def min_of() -> Aggregate:
    """The smallest value (``None`` for none)."""
    return Aggregate("min", lambda: None, _min, _min)


def max_of() -> Aggregate:
    """The largest value (``None`` for none)."""
    return Aggregate("max", lambda: None, _max, _max)


def collect(limit: int = 10_000) -> Aggregate:
    """The values themselves, in arrival order (for small windows: at most ``limit``; more is
    an error naming the window, not a silent cut)."""

    def add(acc: list[Any], value: Any) -> list[Any]:
        if len(acc) >= limit:
            raise ValueError(f"collect(limit={limit}): the window has more values than that")
        return [*acc, value]

    def merge(a: list[Any], b: list[Any]) -> list[Any]:
        if len(a) + len(b) > limit:
            raise ValueError(f"collect(limit={limit}): the window has more values than that")
        return a + b

    return Aggregate("collect", list, add, merge)


def reduce_with(fn: Callable[[Any, Any], Any]) -> Aggregate:
    """``fn(a, b)`` over the values (associative: sessions merge with it too); ``None`` for
    none."""

    def add(acc: Any, value: Any) -> Any:
        return value if acc is None else fn(acc, value)

    def merge(a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else fn(a, b)

    return Aggregate("reduce", lambda: None, add, merge)


#: why a window goes out: ``on_time`` when the watermark passes its end (once); ``early``
#: before that, at the end of a batch that changed it (with ``early=True``); ``late`` after
#: it, at the end of a batch whose late records (within the allowed lateness) changed it
EMISSIONS = ("early", "on_time", "late")


@dataclass(frozen=True)
class Window:
    """A window that goes out: its key, ``[start, end)`` (a session: first and last record's
    time), its aggregate's result and why it goes out (:data:`EMISSIONS`)."""

    key: Any
    start: int
    end: int
    value: Any
    emission: str = "on_time"


class Open(NamedTuple):
    """An open window in the store; ``fired``: it went out on time already and stays for its
    allowed lateness. (A named tuple: a window store makes one per record.)"""

    start: int
    end: int
    acc: Any
    fired: bool = False


def timer_changes(before: list[Open], after: list[Open]) -> tuple[list[Open], list[Open]]:
    """Which windows' closes are new (``opened``: each needs a timer) and which are no more
    (``gone``: their timers go), from a key's windows ``before`` and ``after`` a change. A
    window's close is its (start, end): a session that grew closes later."""
    old = {(w.start, w.end) for w in before}
    new = {(w.start, w.end) for w in after}
    opened = [w for w in after if (w.start, w.end) not in old]
    gone = [w for w in before if (w.start, w.end) not in new]
    return opened, gone


def _prefix(key: bytes) -> bytes:
    if len(key) > 0xFFFF:
        raise ValueError(f"a window's key is {len(key)} bytes; at most 65,535")
    return KEY_LENGTH.pack(len(key)) + key


def entry_key(key: bytes, start: int) -> bytes:
    """The engine key of ``key``'s window starting at ``start`` (>= 0: the bytes of a start
    sort as the number does)."""
    if start < 0:
        raise ValueError(f"a window starting at {start} ms: windows start at times >= 0 ms")
    return _prefix(key) + TIME.pack(start)


def split_entry_key(raw: bytes) -> tuple[bytes, int]:
    (n,) = KEY_LENGTH.unpack_from(raw)
    return raw[2 : 2 + n], TIME.unpack_from(raw, 2 + n)[0]


class WindowState:
    """The open windows of one window store, over its engine."""

    def __init__(self, engine: KeyValueEngine, spec: WindowSpec, aggregate: Aggregate) -> None:
        self.engine = engine
        self.spec = spec
        self.aggregate = aggregate
        #: the engine keys of windows taken out (:meth:`take`) whose deletion waits for
        #: :meth:`settle` (one write batch); reads skip them, writes settle first
        self._taken: set[bytes] = set()

    def settle(self) -> None:
        """Delete the windows :meth:`take` took out."""
        if self._taken:
            taken, self._taken = self._taken, set()
            self.engine.write_batch([(raw, None) for raw in sorted(taken)])

    def _load(self, raw: bytes, value: bytes) -> Open:
        try:
            data = _JSON.from_bytes(value)
            fired = bool(data.get("fired", False))
            return Open(split_entry_key(raw)[1], int(data["end"]), data["acc"], fired)
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(
                f"store {self.engine.name}: an unreadable window entry {raw!r}: {exc}"
            ) from exc

    def dump(self, window: Open) -> bytes:
        """``window``'s entry as the store keeps it."""
        data = {"end": window.end, "acc": window.acc}
        if window.fired:
            data["fired"] = True
        if type(window.acc) in _SCALARS:  # count, sum, min, max: the serde's orjson path
            return _JSON.to_bytes(data)
        # anything else as the standard library writes it (the serde sorts keys, and an
        # accumulator's dict may have keys of mixed types; nor would it refuse what is not
        # JSON, as an Enum or a UUID)
        return json.dumps(data, separators=(",", ":")).encode()

    def get(self, key: bytes, start: int) -> Open | None:
        raw = entry_key(key, start)
        if raw in self._taken:
            return None
        value = self.engine.get(raw)
        return None if value is None else self._load(raw, value)

    def of(self, key: bytes) -> Iterator[Open]:
        """``key``'s open windows, by start."""
        prefix = _prefix(key)
        for raw, value in self.engine.range(prefix, prefix + b"\xff" * 9):
            if len(raw) == len(prefix) + TIME.size and raw not in self._taken:
                yield self._load(raw, value)

    def fold(
        self, windows: list[Open], time_ms: int, value: Any, closed_upto: int | None
    ) -> list[Open] | None:
        """A key's open ``windows`` (by start) with a record folded in, as a new list; ``None``
        when the record is late (every window it would join is closed by ``closed_upto``, the
        watermark or processing time, less any allowed lateness). Pure: the store is not
        touched."""
        spec, agg = self.spec, self.aggregate
        if spec.is_session:
            return self._fold_session(windows, time_ms, value, closed_upto)
        if spec.size_ms == spec.slide_ms:  # tumbling: the one window of the record, in place
            start = time_ms - time_ms % spec.size_ms
            end = start + spec.size_ms
            if closed_upto is not None and end <= closed_upto:
                return None  # closed: this window went out already
            out = list(windows)
            for i, w in enumerate(out):
                if w.start == start:
                    out[i] = Open(start, end, agg.add(w.acc, value), w.fired)
                    return out
                if w.start > start:
                    out.insert(i, Open(start, end, agg.add(agg.init(), value)))
                    return out
            out.append(Open(start, end, agg.add(agg.init(), value)))
            return out
        by_start = {w.start: w for w in windows}
        joined = False
        for start, end in self.spec.windows_of(time_ms):
            if closed_upto is not None and end <= closed_upto:
                continue  # closed: this window went out already
            now = by_start.get(start)
            if now is None:
                by_start[start] = Open(start, end, agg.add(agg.init(), value))
            else:
                by_start[start] = Open(start, end, agg.add(now.acc, value), now.fired)
            joined = True
        return [by_start[s] for s in sorted(by_start)] if joined else None

    def _fold_session(
        self, windows: list[Open], time_ms: int, value: Any, closed_upto: int | None
    ) -> list[Open] | None:
        gap, agg = self.spec.gap_ms, self.aggregate
        near: list[Open] = []  # the sessions the record joins (or bridges)
        rest: list[Open] = []  # the others, by start
        for w in windows:
            (near if w.start - gap <= time_ms <= w.end + gap else rest).append(w)
        if closed_upto is not None:
            closes_at = self.spec.closes_at
            if not near and closes_at(time_ms) <= closed_upto:
                return None  # its own session would have closed already
            if any(closes_at(w.end) <= closed_upto for w in near):
                return None  # it would join a session that closed (its timer not fired yet)
        acc = agg.add(agg.init(), value)
        start = end = time_ms
        for w in near:  # at most one before the record and one after it (or one around it)
            acc = agg.merge(w.acc, acc) if w.start <= time_ms else agg.merge(acc, w.acc)
            start, end = min(start, w.start), max(end, w.end)
        at = len(rest)
        while at and rest[at - 1].start > start:
            at -= 1
        rest.insert(at, Open(start, end, acc))
        return rest

    def changes(
        self, key: bytes, before: list[Open], after: list[Open]
    ) -> list[tuple[bytes, bytes | None]]:
        """The engine writes that store ``key``'s windows as ``after`` where they were
        ``before`` (:meth:`write_changes` writes them; many keys' in one batch)."""
        old = {w.start: w for w in before}
        starts = {w.start for w in after}
        writes: list[tuple[bytes, bytes | None]] = [
            (entry_key(key, s), None) for s in old if s not in starts
        ]
        writes += [(entry_key(key, w.start), self.dump(w)) for w in after if old.get(w.start) != w]
        return writes

    def write_changes(self, writes: list[tuple[bytes, bytes | None]]) -> None:
        self.settle()
        if writes:
            self.engine.write_batch(writes)

    def write(self, key: bytes, before: list[Open], after: list[Open]) -> None:
        """Store ``key``'s windows as ``after`` where they were ``before`` (one write batch)."""
        self.write_changes(self.changes(key, before, after))

    def add(
        self, key: bytes, time_ms: int, value: Any, closed_upto: int | None
    ) -> tuple[list[Open], list[Open]] | None:
        """Fold one record into the store (:meth:`fold`, then :meth:`write`): ``(opened,
        gone)`` (:func:`timer_changes`), or ``None`` for a late record."""
        before = list(self.of(key))
        after = self.fold(before, time_ms, value, closed_upto)
        if after is None:
            return None
        self.write(key, before, after)
        return timer_changes(before, after)

    def mark_fired(self, key: bytes, window: Open) -> None:
        """Keep ``window`` after its on-time emission, for its allowed lateness."""
        self.settle()
        self.engine.put(entry_key(key, window.start), self.dump(window._replace(fired=True)))

    def close(self, key: bytes, start: int) -> Open | None:
        """Take the window out of the store (``None``: not there, e.g. merged away)."""
        window = self.get(key, start)
        if window is not None:
            self.settle()
            self.engine.delete(entry_key(key, start))
        return window

    def take(self, key: bytes, start: int) -> Open | None:
        """:meth:`close`, with the deletion held for :meth:`settle` (many windows closed at
        once go in one write batch)."""
        window = self.get(key, start)
        if window is not None:
            self._taken.add(entry_key(key, start))
        return window


__all__ = [
    "EMISSIONS",
    "Aggregate",
    "Open",
    "Window",
    "WindowSpec",
    "WindowState",
    "collect",
    "count",
    "entry_key",
    "max_of",
    "min_of",
    "reduce_with",
    "split_entry_key",
    "sum_of",
    "timer_changes",
]

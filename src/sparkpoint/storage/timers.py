"""A task's durable timers and event-time watermarks, kept in one of its stores.

Timers are state: they live in the store named by ``task.timers.store`` (any store of the job,
kept for this alone), so they are logged to its changelog, uploaded in its blob snapshots and
restored with it, and a timer's firing (its deletion) is committed with the batch that fired
it. After a crash, a timer fires again only if its firing was not committed; it never fires
twice in committed state.

Layout (raw engine keys, in key order)::

    T p <8-byte time> <key bytes>     a processing-time timer, value empty
    T e <8-byte time> <key bytes>     an event-time timer, value empty
    K <key bytes>                     the key's timers: (p|e, 8-byte time) each, in order
                                      (one point read, never a scan over deleted timers);
                                      none for an unindexed key (below)
    W <ssp>                           an input partition's event time: JSON {"max", "active"}
    S                                 when the task first tracked event time (processing ms)
    M                                 the task's watermark (event ms; it never moves back)

Times are big-endian and non-negative (a timer at a negative time is refused), so a range scan
of ``T p`` or ``T e`` yields timers in firing order, and the bytes of a time sort as the number
does. A watermark may be negative (early event times, less the lateness): no timer is due then.
The user's key is the store's key serde's bytes.

*Unindexed* keys (those starting with the prefix the store is opened with: the runtime's own
helpers', e.g. a window store's, one timer per key at a time whose time the helper always
knows) have no ``K`` entry: registering or deleting one of their timers is one blind write,
with no read. A window store opens and closes a window with one timer write each, instead of
a read of the index and two writes. Timers of such keys registered by an earlier version,
under an index, lose their ``K`` entry with them (a blind delete, while any is left).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from itertools import islice
from typing import NamedTuple

from sparkpoint.errors import StoreError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.storage.kv.base import KeyValueEngine

TIME = struct.Struct(">q")
TIMER = b"T"
BY_KEY = b"K"
WATERMARK = b"W"
SINCE = b"S"
MARK = b"M"
MAX_TIME = 2**63 - 1
#: the watermark at the end of input (``--final-watermark``): every event-time timer is due
END_OF_TIME = MAX_TIME - 1
#: the start of the timer keys of the runtime's own helpers (window and join stores): then the
#: helper's store name, a zero byte, and the window's entry key in that store
#: (:func:`sparkpoint.storage.windows.entry_key`); a key the store's key serde makes never
#: starts with a zero byte then this name
OWNED = b"\x00sparkpoint.owned\x00"


def owned_key(owner: str, raw: bytes) -> bytes:
    """The timer key of helper ``owner``'s window entry key ``raw`` (see :data:`OWNED`)."""
    return OWNED + owner.encode() + b"\x00" + raw


def split_owned(key: bytes) -> tuple[str, bytes] | None:
    """``(owner, raw)`` of a helper's timer key; ``None`` for any other key (a user's)."""
    if not key.startswith(OWNED):
        return None
    owner, _, raw = key[len(OWNED) :].partition(b"\x00")
    return owner.decode(), raw


class TimeKind(Enum):
    PROCESSING = "processing"
    EVENT = "event"

    @property
    def tag(self) -> bytes:
        return b"p" if self is TimeKind.PROCESSING else b"e"

    @classmethod
    def parse(cls, text: str | TimeKind) -> TimeKind:
        if isinstance(text, TimeKind):
            return text
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"a timer's kind is 'processing' or 'event', not {text!r}") from None


class Timer(NamedTuple):
    """A registered timer: when (ms) it is due, its kind, and the key (serialized). (A named
    tuple: one is made per timer read or changed.)"""

    timestamp_ms: int
    kind: TimeKind
    key: bytes


def _timer_key(kind: TimeKind, timestamp_ms: int, key: bytes) -> bytes:
    if timestamp_ms < 0:  # its bytes would sort after every other time's
        raise ValueError(
            f"a {kind.value}-time timer at {timestamp_ms} ms: timers are at times >= 0 ms "
            "(milliseconds since the epoch)"
        )
    return TIMER + kind.tag + TIME.pack(timestamp_ms) + key


def _prefix(kind: TimeKind) -> bytes:
    return TIMER + kind.tag


def _index_key(key: bytes) -> bytes:
    return BY_KEY + key


def _decode_index(raw: bytes | None) -> list[tuple[bytes, int]]:
    if not raw:
        return []
    step = 1 + TIME.size
    return [(raw[i : i + 1], TIME.unpack_from(raw, i + 1)[0]) for i in range(0, len(raw), step)]


def _encode_index(entries: list[tuple[bytes, int]]) -> bytes | None:
    return b"".join(tag + TIME.pack(ts) for tag, ts in sorted(entries)) or None


@dataclass(frozen=True)
class PartitionTime:
    """An input partition's largest event time seen, and when (processing time) it last had a
    record."""

    max_event_ms: int
    active_ms: int


class TimerStore:
    """The timers and event-time state of one task, over its timer store's engine."""

    def __init__(self, engine: KeyValueEngine, unindexed: bytes | None = None) -> None:
        self.engine = engine
        #: keys starting with this have no index entry (see the module docstring)
        self._unindexed = unindexed
        #: whether an index entry of such a key is left from an earlier version (one seek)
        self._indexed_before = unindexed is not None and any(
            True for _ in islice(engine.range(BY_KEY + unindexed, BY_KEY + unindexed + b"\xff"), 1)
        )
        #: fired timers whose deletion waits (:meth:`delete_later`): written in one batch by
        #: :meth:`settle`, which every other use of the timers calls first
        self._later: list[Timer] = []
        #: the keys of timers deleted since :meth:`due` read its chunk, and not registered
        #: again: the timers of the chunk that are not there any more
        self._gone: set[bytes] = set()

    # -- timers
    def delete_later(self, timer: Timer) -> None:
        """Delete a fired timer with the next ones (:meth:`settle`): reads of the timers see
        it deleted."""
        self._later.append(timer)
        self._gone.add(_timer_key(timer.kind, timer.timestamp_ms, timer.key))

    def settle(self) -> None:
        """Write the deletions :meth:`delete_later` holds."""
        if self._later:
            later, self._later = self._later, []
            self.change_many([(False, timer) for timer in later])

    def _is_unindexed(self, key: bytes) -> bool:
        return self._unindexed is not None and key.startswith(self._unindexed)

    def register(self, kind: TimeKind, timestamp_ms: int, key: bytes) -> None:
        if self._is_unindexed(key):
            self.change_many([(True, Timer(timestamp_ms, kind, key))])
            return
        self.settle()
        self._gone.discard(_timer_key(kind, timestamp_ms, key))
        entries = _decode_index(self.engine.get(_index_key(key)))
        if (kind.tag, timestamp_ms) in entries:
            return
        entries.append((kind.tag, timestamp_ms))
        self.engine.write_batch(
            [(_timer_key(kind, timestamp_ms, key), b""), (_index_key(key), _encode_index(entries))]
        )

    def replace(self, kind: TimeKind, timestamp_ms: int, key: bytes) -> None:
        """Make this the key's one timer of ``kind`` (its others of ``kind`` are deleted): one
        read and one write, whatever the key had (not for an unindexed key)."""
        if self._is_unindexed(key):
            raise ValueError(f"replace() needs a key's index; {key!r} has none")
        self.settle()
        self._gone.discard(_timer_key(kind, timestamp_ms, key))
        entries = _decode_index(self.engine.get(_index_key(key)))
        tag = kind.tag
        writes: list[tuple[bytes, bytes | None]] = [
            (_timer_key(kind, when, key), None)
            for t, when in entries
            if t == tag and when != timestamp_ms
        ]
        self._gone.update(k for k, _ in writes)
        if (tag, timestamp_ms) not in entries:
            writes.append((_timer_key(kind, timestamp_ms, key), b""))
        if not writes:
            return
        kept = [(t, when) for t, when in entries if t != tag] + [(tag, timestamp_ms)]
        writes.append((_index_key(key), _encode_index(kept)))
        self.engine.write_batch(writes)

    def delete(self, kind: TimeKind, timestamp_ms: int, key: bytes) -> None:
        if self._is_unindexed(key):
            self.change_many([(False, Timer(timestamp_ms, kind, key))])
            return
        self.settle()
        entries = _decode_index(self.engine.get(_index_key(key)))
        if (kind.tag, timestamp_ms) not in entries:
            return
        self._gone.add(_timer_key(kind, timestamp_ms, key))
        entries.remove((kind.tag, timestamp_ms))
        self.engine.write_batch(
            [(_timer_key(kind, timestamp_ms, key), None), (_index_key(key), _encode_index(entries))]
        )

    def change_many(self, changes: Sequence[tuple[bool, Timer]]) -> None:
        """Register (``True``) or delete (``False``) each timer, in order: what
        :meth:`register` and :meth:`delete` do one by one, with one read of the keys' indexes
        and one write batch for them all."""
        if not changes:
            return
        self.settle()  # (a no-op when called by it: it empties its list first)
        writes: dict[bytes, bytes | None] = {}
        if self._unindexed is not None:
            changes = self._change_unindexed(changes, writes)
        keys = list(dict.fromkeys(timer.key for _, timer in changes))
        found = self.engine.get_many([_index_key(k) for k in keys]) if keys else []
        index = {k: _decode_index(raw) for k, raw in zip(keys, found, strict=True)}
        touched: set[bytes] = set()
        for register, timer in changes:
            entries, entry = index[timer.key], (timer.kind.tag, timer.timestamp_ms)
            if register == (entry in entries):
                continue  # registered already, or no such timer to delete
            timer_key = _timer_key(timer.kind, timer.timestamp_ms, timer.key)
            if register:
                entries.append(entry)
                self._gone.discard(timer_key)
            else:
                entries.remove(entry)
                self._gone.add(timer_key)
            writes[timer_key] = b"" if register else None
            touched.add(timer.key)
        for key in touched:
            writes[_index_key(key)] = _encode_index(index[key])
        if writes:
            self.engine.write_batch(list(writes.items()))

    def _change_unindexed(
        self, changes: Sequence[tuple[bool, Timer]], writes: dict[bytes, bytes | None]
    ) -> list[tuple[bool, Timer]]:
        """Put the writes of the changes of unindexed keys in ``writes`` (blind: a timer
        registered again is written again, one deleted that was not there leaves a
        tombstone); the other changes."""
        prefix, indexed_before, gone = self._unindexed or b"", self._indexed_before, self._gone
        rest: list[tuple[bool, Timer]] = []
        for register, timer in changes:
            key = timer.key
            if not key.startswith(prefix):
                rest.append((register, timer))
                continue
            timer_key = _timer_key(timer.kind, timer.timestamp_ms, key)
            if register:
                gone.discard(timer_key)
                writes[timer_key] = b""
            else:
                gone.add(timer_key)
                writes[timer_key] = None
                if indexed_before:
                    writes[_index_key(key)] = None
        return rest

    def gone(self, timer: Timer) -> bool:
        """Whether ``timer``, just given out by :meth:`due`, was deleted since (and not
        registered again)."""
        return _timer_key(timer.kind, timer.timestamp_ms, timer.key) in self._gone

    def timers_of(self, key: bytes) -> Iterator[Timer]:
        """The timers of ``key`` (event time first, then processing time, each by time): one
        point read of its index."""
        self.settle()
        for tag, when in _decode_index(self.engine.get(_index_key(key))):
            yield Timer(when, TimeKind.EVENT if tag == b"e" else TimeKind.PROCESSING, key)

    def timers(self, kind: TimeKind, upto_ms: int = MAX_TIME) -> Iterator[Timer]:
        """The timers of ``kind`` due at or before ``upto_ms``, in firing order."""
        for _, timer in self._scan(kind, upto_ms):
            yield timer

    def _scan(
        self, kind: TimeKind, upto_ms: int, after: bytes | None = None
    ) -> Iterator[tuple[bytes, Timer]]:
        """:meth:`timers` with their engine keys; only those after the engine key ``after``,
        when given (a scan that resumes skips the tombstones of the timers fired before it,
        which RocksDB would otherwise step over on every seek)."""
        self.settle()
        if upto_ms < 0:
            return  # nothing is due before time 0 (a negative watermark: early event times)
        prefix = _prefix(kind)
        start = prefix if after is None else after + b"\0"
        end = prefix + TIME.pack(upto_ms + 1) if upto_ms < MAX_TIME else prefix + b"\xff" * 9
        for raw, _ in self.engine.range(start, end):
            (when,) = TIME.unpack_from(raw, len(prefix))
            yield raw, Timer(when, kind, raw[len(prefix) + TIME.size :])

    def due(self, kind: TimeKind, upto_ms: int, chunk: int = 10_000) -> Iterator[Timer]:
        """Every timer of ``kind`` due by ``upto_ms``, in firing order, each once, *while the
        caller deletes them and registers or deletes others*: read in chunks, each checked to
        be there still before it is given out. After a pass, one more from the start finds
        timers registered behind it meanwhile; it ends when a whole pass finds none new (a
        timer given out and registered again comes in the next call). A timer of the chunk
        is there still unless it was deleted since the chunk was read and not registered
        again: no read per timer."""
        given: set[bytes] = set()  # their engine keys
        while True:
            new, after = False, None
            while found := list(islice(self._scan(kind, upto_ms, after), chunk)):
                self._gone = set()
                for raw, timer in found:
                    if raw not in given and raw not in self._gone:
                        given.add(raw)
                        new = True
                        yield timer
                after = found[-1][0]
            if not new:
                return

    # -- event time
    def partition_times(self) -> dict[SystemStreamPartition, PartitionTime]:
        out: dict[SystemStreamPartition, PartitionTime] = {}
        for raw, value in self.engine.range(WATERMARK, WATERMARK + b"\xff"):
            try:
                data = json.loads(value)
                ssp = SystemStreamPartition.parse(raw[len(WATERMARK) :].decode())
                out[ssp] = PartitionTime(int(data["max"]), int(data["active"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise StoreError(
                    f"store {self.engine.name}: an unreadable event-time entry {raw!r}: {exc}"
                ) from exc
        return out

    def set_partition_time(self, ssp: SystemStreamPartition, time: PartitionTime) -> None:
        value = {"max": time.max_event_ms, "active": time.active_ms}
        self.engine.put(WATERMARK + str(ssp).encode(), json.dumps(value).encode())

    def watermark(self) -> int | None:
        """The task's watermark as last advanced (it never moves back)."""
        raw = self.engine.get(MARK)
        return None if raw is None else int(TIME.unpack(raw)[0])

    def advance_watermark(
        self,
        ssps: frozenset[SystemStreamPartition],
        now_ms: int,
        lateness_ms: int,
        idle_ms: int,
        *,
        seen: Mapping[SystemStreamPartition, int] | None = None,
    ) -> int | None:
        """Advance the watermark: the smallest largest-event-time over the task's partitions
        that are not idle (a partition with no record for ``idle_ms``, or none yet once
        ``idle_ms`` passed since tracking began), minus ``lateness_ms``. With every partition
        idle, the largest event time seen. Never moves back; ``None`` before any record.
        ``seen``: the largest event time of each partition that had records since (those are
        busy now, and their largest event time grows to it)."""
        times = self.partition_times()
        for ssp, top in (seen or {}).items():
            old = times.get(ssp)
            times[ssp] = PartitionTime(top if old is None else max(old.max_event_ms, top), now_ms)
            self.set_partition_time(ssp, times[ssp])
        since = self.since(now_ms)
        active, waiting = [], False
        for ssp in ssps:
            known = times.get(ssp)
            if known is None:
                waiting |= now_ms - since < idle_ms
            elif now_ms - known.active_ms < idle_ms:
                active.append(known.max_event_ms)
        seen_max = [t.max_event_ms for t in times.values()]
        if waiting or not seen_max:
            return self.watermark()
        candidate = (min(active) if active else max(seen_max)) - lateness_ms
        before = self.watermark()
        if before is not None and before >= candidate:
            return before
        self.engine.put(MARK, TIME.pack(candidate))
        return candidate

    def end_input(self) -> int:
        """The input ended: the watermark moves to :data:`END_OF_TIME` (and stays: a record
        that comes later is late)."""
        self.engine.put(MARK, TIME.pack(END_OF_TIME))
        return END_OF_TIME

    def since(self, now_ms: int) -> int:
        """When this task first tracked event time (set to ``now_ms`` the first time)."""
        raw = self.engine.get(SINCE)
        if raw is None:
            self.engine.put(SINCE, TIME.pack(now_ms))
            return now_ms
        return int(TIME.unpack(raw)[0])


__all__ = ["OWNED", "PartitionTime", "TimeKind", "Timer", "TimerStore", "owned_key", "split_owned"]

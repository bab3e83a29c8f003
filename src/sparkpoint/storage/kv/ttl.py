"""Store TTL (``stores.<s>.rocksdb.ttl.ms``): entries older than the TTL are never read, and
are swept from the store.

**The write time travels with the value.** A TTL store keeps each value as eight bytes of its
write time (milliseconds since the epoch, big-endian) followed by the value's bytes, and one
reserved entry (:data:`FORMAT_KEY`) that says so. The encoding is applied above the backup
backends' wrappers, so the changelog carries the same bytes as RocksDB and a blob snapshot's
files hold them too: a store restored from any backend shows exactly what the live store
showed, and an entry replayed from the changelog keeps its old write time (it is not live
again). Reads (``get``, ``get_all``, ``range``, ``all``, the DataFrame API's store calls and
``sparkpoint state dump``) filter by that time, so an expired entry is invisible at once, long
before anything removes it (RocksDB's own TTL only drops entries at compaction).

**Expired entries are swept** by :meth:`TtlEngine.sweep` at a commit, at most every quarter of
the TTL per store and worker: they are deleted through the backup wrappers (a tombstone in the
changelog, which its compaction then drops) before the commit's snapshot, so later blob
snapshots and restores never carry them; RocksDB's own compaction then gives the disk
back.

**Changing the TTL at a restart** (the store's format entry records the TTL its entries were
written under, so a start knows what changed). What the old TTL expired stays expired: it is
swept first, whatever comes next. Then a changed TTL applies to every live entry by its write
time (a shorter one hides older entries at once; a longer one lets live entries stay longer).
Adding a TTL to a store that holds data rewrites it once (every entry stamped "now", so it
expires one TTL after the restart); removing it rewrites the live entries without their time.
These rewrites go through the changelog like any write and are committed with the batch, so a
crash in the middle restores the last checkpoint and the next start does them again.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice

from sparkpoint.config import Config
from sparkpoint.errors import StoreError
from sparkpoint.model.clock import now_ms
from sparkpoint.storage.kv.base import KeyValueEngine

#: the reserved entry of a TTL store (never returned by a read; sorts before any text key)
FORMAT_KEY = b"\x00\x00sparkpoint.store-format"
TTL_FORMAT = b"ttl-v1"
HEADER = struct.Struct(">q")
SWEEP_CHUNK = 10_000

Clock = Callable[[], int]


def ttl_of(config: Config, store: str) -> int | None:
    """``stores.<s>.rocksdb.ttl.ms``, or ``None`` when the store has no TTL."""
    key = f"stores.{store}.rocksdb.ttl.ms"
    return config.get_int(key) if config.get_str(key) else None


def stored_ttl(engine: KeyValueEngine) -> int | None:
    """The TTL a store's entries were last written under; ``None`` for a store without TTL
    entries."""
    raw = engine.get(FORMAT_KEY)
    if raw is None:
        return None
    kind, _, ttl = raw.partition(b" ")
    if kind != TTL_FORMAT or not ttl.isdigit():
        raise StoreError(
            f"store {engine.name}: its format entry is {raw[:40]!r}, which this version of "
            "sparkpoint does not know (written by a newer one?)"
        )
    return int(ttl)


def _format(ttl_ms: int) -> bytes:
    return TTL_FORMAT + b" " + str(ttl_ms).encode()


class TtlEngine(KeyValueEngine):
    """``inner`` with a write time before every value; entries older than ``ttl_ms`` (``None``:
    none expire) are filtered from every read."""

    def __init__(self, inner: KeyValueEngine, ttl_ms: int | None, clock: Clock = now_ms) -> None:
        self.name = inner.name
        self.inner = inner
        self.ttl_ms = ttl_ms
        self.clock = clock

    # -- decoding
    def _live_after(self) -> int:
        """Entries written at or before this time are expired."""
        return -(2**63) if self.ttl_ms is None else self.clock() - self.ttl_ms

    def _value(self, raw: bytes | None, after: int) -> bytes | None:
        if raw is None:
            return None
        if len(raw) < HEADER.size:
            raise StoreError(
                f"store {self.name}: a value of {len(raw)} bytes has no write time, but the "
                "store holds TTL entries: it was written around sparkpoint (restore the store)"
            )
        return raw[HEADER.size :] if HEADER.unpack_from(raw)[0] > after else None

    def _entries(self, raw: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        after = self._live_after()
        for key, data in raw:
            if key == FORMAT_KEY:
                continue
            value = self._value(data, after)
            if value is not None:
                yield key, value

    def expiring(self) -> Iterator[tuple[bytes, bytes, int | None]]:
        """Every live entry with the time it expires (ms; ``None``: no TTL), in key order."""
        after = self._live_after()
        for key, data in self.inner.all():
            if key == FORMAT_KEY:
                continue
            value = self._value(data, after)
            if value is not None:
                written = HEADER.unpack_from(data)[0]
                yield key, value, None if self.ttl_ms is None else written + self.ttl_ms

    def _stamped(self, value: bytes) -> bytes:
        return HEADER.pack(self.clock()) + value

    # -- KeyValueEngine
    def get(self, key: bytes) -> bytes | None:
        if key == FORMAT_KEY:
            return None
        return self._value(self.inner.get(key), self._live_after())

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        after = self._live_after()
        return [
            None if k == FORMAT_KEY else self._value(raw, after)
            for k, raw in zip(keys, self.inner.get_many(keys), strict=True)
        ]

    def put(self, key: bytes, value: bytes) -> None:
        self.inner.put(key, self._stamped(value))

    def delete(self, key: bytes) -> None:
        self.inner.delete(key)

    def write_batch(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        stamp = HEADER.pack(self.clock())
        self.inner.write_batch((k, None if v is None else stamp + v) for k, v in puts)

    def discard(self) -> None:
        self.inner.discard()

    def load(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        self.inner.load(puts)  # stored entries: stamped already

    def range(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._entries(self.inner.range(start, end))

    def all(self) -> Iterator[tuple[bytes, bytes]]:
        return self._entries(self.inner.all())

    def flush(self) -> None:
        self.inner.flush()

    @property
    def persistent(self) -> bool:
        return self.inner.persistent

    def close(self) -> None:
        self.inner.close()

    # -- expiry
    def sweep(self) -> int:
        """Delete every expired entry (in write batches of :data:`SWEEP_CHUNK`); how many."""
        if self.ttl_ms is None:
            return 0
        after = self._live_after()
        expired = (
            k
            for k, raw in self.inner.all()
            if k != FORMAT_KEY and len(raw) >= HEADER.size and HEADER.unpack_from(raw)[0] <= after
        )
        removed = 0
        while chunk := list(islice(expired, SWEEP_CHUNK)):
            self.inner.write_batch((k, None) for k in chunk)
            removed += len(chunk)
        return removed


def readable(engine: KeyValueEngine, ttl_ms: int | None, clock: Clock = now_ms) -> KeyValueEngine:
    """``engine`` as the state tools show it to a task configured with ``ttl_ms``: decoded, and
    filtered as :func:`prepare` would leave it, when it holds TTL entries; else as it is."""
    stored = stored_ttl(engine)
    if stored is None:
        return engine
    # what the stored TTL expired is swept at the next start, whatever the new TTL says
    return TtlEngine(engine, stored if ttl_ms is None else min(stored, ttl_ms), clock)


def prepare(engine: KeyValueEngine, ttl_ms: int | None, clock: Clock = now_ms) -> KeyValueEngine:
    """``engine`` (wrapped by its backup backends) as a task uses it with the configured TTL;
    when the TTL was added, changed or removed since the store was written, its entries are
    brought to the new one first (see the module docstring)."""
    stored = stored_ttl(engine)
    if stored == ttl_ms:
        return engine if ttl_ms is None else TtlEngine(engine, ttl_ms, clock)
    if stored is not None:  # what the old TTL expired stays expired, whatever comes next
        TtlEngine(engine, stored, clock).sweep()
    if ttl_ms is None:  # the TTL removed: the live entries lose their write time
        _rewrite(engine, TtlEngine(engine, None, clock).all())
        engine.delete(FORMAT_KEY)
        return engine
    ttl = TtlEngine(engine, ttl_ms, clock)
    if stored is None:  # a TTL added: every entry is written now
        _rewrite(engine, ((k, ttl._stamped(v)) for k, v in engine.all()))
    engine.put(FORMAT_KEY, _format(ttl_ms))
    return ttl


def _rewrite(engine: KeyValueEngine, entries: Iterator[tuple[bytes, bytes]]) -> None:
    """Write ``entries`` (read from ``engine``) back in chunks. A scan sees the store as it was
    when it began (a RocksDB iterator is a point-in-time view; the in-memory engine copies), so
    it never meets its own writes."""
    while chunk := list(islice(entries, SWEEP_CHUNK)):
        engine.write_batch(chunk)


__all__ = [
    "FORMAT_KEY",
    "TtlEngine",
    "prepare",
    "readable",
    "stored_ttl",
    "ttl_of",
]

"""The RocksDB engine, over ``rocksdict`` in raw (bytes) mode.

``flush`` syncs the write-ahead log, so everything written before it survives a process or
machine crash. ``checkpoint`` makes a RocksDB checkpoint: hard links to the immutable SST files
plus copies of the small metadata files, in milliseconds whatever the store's size. Opening a
store that another process still holds (a Spark Python worker that is still exiting) is retried
until ``open_timeout`` seconds have passed, then fails naming the store and path.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import cast

from rocksdict import (
    AccessType,
    Checkpoint,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from sparkpoint.errors import StoreError
from sparkpoint.storage.kv.base import KeyValueEngine

IDENTITY = "IDENTITY"  # RocksDB's unique id of a database, made when it is created
#: RocksDB's own info logs kept per store (``LOG`` and ``LOG.old.*``): each open starts a new
#: one, and a task opens its stores every batch, so RocksDB's default of 1,000 left about 27 MB
#: of them in every store of a long-running job
KEEP_INFO_LOGS = 3
#: about the most bytes of one write batch of :meth:`RocksDBEngine.write_bulk`: a 1 GB changelog
#: restore of 16 KB values wrote its 64 MB reads in 0.82 s as one batch each, and in 0.24 s in
#: batches of a few MB (docs/performance.md, "Changelog restore in batches of a few MB")
BULK_BATCH_BYTES = 4 * 1024 * 1024
FIRST_BULK_BATCH = 64  # entries in the first batch, before their size is known
log = logging.getLogger(__name__)


class RocksDBEngine(KeyValueEngine):
    """One RocksDB database in ``path``. Not thread-safe."""

    def __init__(
        self,
        name: str,
        path: Path,
        *,
        read_only: bool = False,
        open_timeout: float = 30.0,
        must_exist: bool = False,
    ) -> None:
        self.name = name
        self.path = Path(path)
        self.read_only = read_only
        options = Options(raw_mode=True)
        options.create_if_missing(not read_only and not must_exist)
        options.set_keep_log_file_num(KEEP_INFO_LOGS)
        # one thread opens the SST files: RocksDB's default of 16 threads made an open of a
        # task's store about twice as slow (10.6 ms against 5.4 ms, median of 40), and a task
        # opens its stores every batch (docs/performance.md, "Many tasks")
        options.set_max_file_opening_threads(1)
        if not read_only and not must_exist:
            self.path.mkdir(parents=True, exist_ok=True)
        elif not (self.path / "CURRENT").is_file():
            raise StoreError(f"store {name}: no database at {self.path}")
        access = AccessType.read_only() if read_only else AccessType.read_write()
        deadline = time.monotonic() + open_timeout
        delay = 0.05
        while True:
            try:
                self._db: Rdict | None = Rdict(str(self.path), options=options, access_type=access)
                break
            except Exception as exc:
                locked = "lock" in str(exc).lower()
                if not locked or time.monotonic() >= deadline:
                    raise StoreError(
                        f"store {name}: cannot open RocksDB at {self.path}: {exc}"
                    ) from exc
                log.info("store %s: %s is locked by another process; retrying", name, self.path)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

        #: whether writes since the last flush skipped the write-ahead log (:meth:`load`)
        self._unlogged = False

    def _d(self) -> Rdict:
        if self._db is None:
            raise StoreError(f"store {self.name}: used after close")
        return self._db

    def get(self, key: bytes) -> bytes | None:
        db = self._db
        if db is None:
            raise StoreError(f"store {self.name}: used after close")
        value = db.get(key)  # raw mode: bytes or None
        return None if value is None else bytes(value)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        # RocksDB's multi-get in key order: 1.3 us a key against 2.3 us in the callers' order
        # (100,000 random keys, the sort and the reordering included)
        order = sorted(range(len(keys)), key=keys.__getitem__)
        values = cast("list[bytes | None]", self._d()[[keys[i] for i in order]])
        out: list[bytes | None] = [None] * len(keys)
        for i, value in zip(order, values, strict=True):
            out[i] = value
        return out

    def put(self, key: bytes, value: bytes) -> None:
        self._d()[key] = value

    def delete(self, key: bytes) -> None:
        del self._d()[key]

    def write_batch(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        self._d().write(_batch(puts))

    def load(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        # no write-ahead log: a restore wrote every value twice (log, then memtable flush);
        # flush() flushes the memtables instead (docs/performance.md, "Changelog restore")
        self.write_bulk(puts)

    def write_bulk(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        unlogged = WriteOptions()
        # a property (rocksdict's stub declares a method)
        unlogged.disable_wal = True  # type: ignore[method-assign,assignment]
        db = self._d()
        self._unlogged = True
        for batch in _bounded_batches(puts):
            db.write(batch, unlogged)

    def range(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        bounded = ReadOptions()
        bounded.set_iterate_upper_bound(end)  # RocksDB stops at ``end``, reading nothing past
        it = self._d().iter(bounded)
        it.seek(start)
        while it.valid():
            key = it.key()
            if key >= end:
                break
            yield key, it.value()
            it.next()

    def entries_from(self, start: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        items = cast("Iterator[tuple[bytes, bytes]]", iter(self._d().items(from_key=start)))
        return list(islice(items, limit))

    def keys_from(self, start: bytes, limit: int) -> list[bytes]:
        keys = cast("Iterator[bytes]", iter(self._d().keys(from_key=start)))
        return list(islice(keys, limit))

    def all(self) -> Iterator[tuple[bytes, bytes]]:
        it = self._d().iter()
        it.seek_to_first()
        while it.valid():
            yield it.key(), it.value()
            it.next()

    def flush(self) -> None:
        if not self.read_only:
            if self._unlogged:  # writes without the log are durable once in SST files
                self._d().flush(True)
                self._unlogged = False
            self._d().flush_wal(True)

    @property
    def persistent(self) -> bool:
        return True

    def compact(self) -> None:
        """Compact the whole key range (a maintenance operation; blocks until done)."""
        self._d().compact_range(None, None)

    def checkpoint(self, destination: Path) -> None:
        if destination.exists():
            raise StoreError(
                f"store {self.name}: checkpoint directory {destination} already exists"
            )
        destination.parent.mkdir(parents=True, exist_ok=True)
        self._d().flush(True)
        Checkpoint(self._d()).create_checkpoint(str(destination))
        identity = self.path / IDENTITY
        if identity.exists():  # which database the files belong to (see blobstore.diff)
            shutil.copyfile(identity, destination / IDENTITY)

    def close(self) -> None:
        if self._db is not None:
            try:
                self.flush()
            finally:
                self._db.close()
                self._db = None

    def discard(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            finally:
                self._db = None
                self._unlogged = False


def _bounded_batches(puts: Iterable[tuple[bytes, bytes | None]]) -> Iterator[WriteBatch]:
    """``puts`` in order, as write batches of about :data:`BULK_BATCH_BYTES` each: the
    number of entries per batch follows the bytes per entry seen so far, so no Python step is
    added per entry."""
    entries = iter(puts)
    count = FIRST_BULK_BATCH
    while True:
        batch = _batch(islice(entries, count))
        written, size = batch.len(), batch.size_in_bytes()  # before the write consumes it
        if written:
            yield batch
        if written < count:
            return
        count = max(1, BULK_BATCH_BYTES * written // max(1, size))


def _batch(puts: Iterable[tuple[bytes, bytes | None]]) -> WriteBatch:
    """A write batch of puts (value ``None`` = delete), in order."""
    wb = WriteBatch(raw_mode=True)
    put, delete = wb.put, wb.delete  # bound once: this loop runs once per entry restored
    for k, v in puts:
        if v is None:
            delete(k)
        else:
            put(k, v)
    return wb

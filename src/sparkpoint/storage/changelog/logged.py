"""An engine that appends every write to the store's changelog partition.

Writes go to the store and to the changelog producer; the producer is flushed by the backup
manager's snapshot, so the changelog offset in a marker covers every write made before it.
A delete is logged as a record with a null value (a tombstone).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from sparkpoint.model import SystemStreamPartition
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.system.base import Record, SystemProducer


class LoggedEngine(KeyValueEngine):
    def __init__(
        self, inner: KeyValueEngine, producer: SystemProducer, ssp: SystemStreamPartition
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self._producer = producer
        self._ssp = ssp

    def _log(self, key: bytes, value: bytes | None) -> None:
        self._producer.send(
            self._ssp.stream, self._ssp.partition, Record("", key, value, int(time.time() * 1000))
        )

    def get(self, key: bytes) -> bytes | None:
        return self.inner.get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return self.inner.get_many(keys)

    def put(self, key: bytes, value: bytes) -> None:
        self.inner.put(key, value)
        self._log(key, value)

    def delete(self, key: bytes) -> None:
        self.inner.delete(key)
        self._log(key, None)

    def write_batch(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        batch = list(puts)
        self.inner.write_batch(batch)
        now = int(time.time() * 1000)
        self._producer.send_many(
            self._ssp.stream, self._ssp.partition, (Record("", k, v, now) for k, v in batch)
        )

    def range(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.range(start, end)

    def all(self) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.all()

    def flush(self) -> None:
        self.inner.flush()

    @property
    def persistent(self) -> bool:
        return self.inner.persistent

    def checkpoint(self, destination: Path) -> None:
        self.inner.checkpoint(destination)

    def close(self) -> None:
        self.inner.close()

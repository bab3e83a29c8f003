"""An engine that logs every write to the store's changelog partition.

Writes go to the store at once. For the changelog only the newest value of each key is kept
until the backup manager drains it (its snapshot, before flushing the producer, and its close),
or until ``stores.<s>.write.batch.size`` distinct keys wait: a key written many times between
two drains is logged once, as Samza's CachedStore does. A drain precedes every changelog marker,
so the offset in a marker covers every write made before it. A delete is logged as a record
with a null value (a tombstone).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from sparkpoint.model import SystemStreamPartition
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.system.base import SystemProducer


class LoggedEngine(KeyValueEngine):
    def __init__(
        self,
        inner: KeyValueEngine,
        producer: SystemProducer,
        ssp: SystemStreamPartition,
        batch_size: int = 10_000,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self._producer = producer
        self._ssp = ssp
        self._batch_size = max(1, batch_size)
        self._pending: dict[bytes, bytes | None] = {}

    def _log(self, key: bytes, value: bytes | None) -> None:
        self._pending[key] = value
        if len(self._pending) >= self._batch_size:
            self.drain()

    def drain(self) -> None:
        """Send the newest value of every key written since the last drain to the producer."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        now = int(time.time() * 1000)
        ssp = self._ssp
        self._producer.send_entries(
            ssp.stream, ssp.partition, list(pending), list(pending.values()), now
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
        self._logged(batch)

    def write_bulk(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        batch = list(puts)
        self.inner.write_bulk(batch)
        self._logged(batch)

    def _logged(self, batch: list[tuple[bytes, bytes | None]]) -> None:
        self._pending.update(batch)
        if len(self._pending) >= self._batch_size:
            self.drain()

    def discard(self) -> None:
        self.inner.discard()

    def load(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        self.inner.load(puts)  # a restore's entries: in the changelog already

    def range(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.range(start, end)

    def all(self) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.all()

    def entries_from(self, start: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        return self.inner.entries_from(start, limit)

    def keys_from(self, start: bytes, limit: int) -> list[bytes]:
        return self.inner.keys_from(start, limit)

    def flush(self) -> None:
        self.inner.flush()

    @property
    def persistent(self) -> bool:
        return self.inner.persistent

    def checkpoint(self, destination: Path) -> None:
        self.inner.checkpoint(destination)

    def close(self) -> None:
        self.inner.close()

"""A persistent engine opened at its first use.

A task's batch that only cleans up after its last checkpoint (the last pass of a run, see
:mod:`sparkpoint.runtime.plan`) deletes superseded local checkpoints and publishes staged
output: it needs the store's files, not the database. Opening RocksDB is not free: each open
writes a new MANIFEST, CURRENT and OPTIONS file, with five fsyncs, and a 256-task job's last pass
opened 256 databases for nothing. :class:`LazyEngine` opens the real engine only when something
reads or writes it, and closing one never opened does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from sparkpoint.storage.kv.base import KeyValueEngine


class LazyEngine(KeyValueEngine):
    """The engine ``opener`` opens, opened at the first call that needs it."""

    def __init__(self, name: str, opener: Callable[[], KeyValueEngine]) -> None:
        self.name = name
        self._opener = opener
        self._engine: KeyValueEngine | None = None

    @property
    def opened(self) -> bool:
        return self._engine is not None

    def _real(self) -> KeyValueEngine:
        if self._engine is None:
            self._engine = self._opener()
        return self._engine

    def get(self, key: bytes) -> bytes | None:
        return self._real().get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return self._real().get_many(keys)

    def put(self, key: bytes, value: bytes) -> None:
        self._real().put(key, value)

    def delete(self, key: bytes) -> None:
        self._real().delete(key)

    def write_batch(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        self._real().write_batch(puts)

    def load(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        self._real().load(puts)

    def write_bulk(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        self._real().write_bulk(puts)

    def range(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._real().range(start, end)

    def all(self) -> Iterator[tuple[bytes, bytes]]:
        return self._real().all()

    def entries_from(self, start: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        return self._real().entries_from(start, limit)

    def keys_from(self, start: bytes, limit: int) -> list[bytes]:
        return self._real().keys_from(start, limit)

    def flush(self) -> None:
        if self._engine is not None:  # nothing written since the open that never happened
            self._engine.flush()

    @property
    def persistent(self) -> bool:
        return True

    def checkpoint(self, destination: Path) -> None:
        self._real().checkpoint(destination)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()

    def discard(self) -> None:
        if self._engine is not None:
            self._engine.discard()

"""An in-memory engine: a dict, sorted on range scans. Not persistent; cannot checkpoint."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence

from sparkpoint.errors import StoreError
from sparkpoint.storage.kv.base import KeyValueEngine


class InMemoryEngine(KeyValueEngine):
    """Keeps everything in a dict; ``range`` and ``all`` sort the keys on each call."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._data: dict[bytes, bytes] | None = {}

    def _d(self) -> dict[bytes, bytes]:
        if self._data is None:
            raise StoreError(f"store {self.name}: used after close")
        return self._data

    def get(self, key: bytes) -> bytes | None:
        return self._d().get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        d = self._d()
        return [d.get(k) for k in keys]

    def put(self, key: bytes, value: bytes) -> None:
        self._d()[key] = value

    def delete(self, key: bytes) -> None:
        self._d().pop(key, None)

    def write_batch(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        d = self._d()
        staged = list(puts)
        for k, v in staged:
            if v is None:
                d.pop(k, None)
            else:
                d[k] = v

    def range(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        d = self._d()
        keys = sorted(d)
        lo = bisect.bisect_left(keys, start)
        hi = bisect.bisect_left(keys, end)
        return iter([(k, d[k]) for k in keys[lo:hi]])

    def all(self) -> Iterator[tuple[bytes, bytes]]:
        d = self._d()
        return iter([(k, d[k]) for k in sorted(d)])

    def entries_from(self, start: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        d = self._d()
        keys = sorted(d)
        lo = bisect.bisect_left(keys, start)
        return [(k, d[k]) for k in keys[lo : lo + limit]]

    def flush(self) -> None:
        self._d()

    @property
    def persistent(self) -> bool:
        return False

    def close(self) -> None:
        self._data = None

"""The typed store a task uses: an engine plus key and value serdes, with simple metrics.

Batched calls (``get_all``, ``put_all``, ``delete_all``) make one engine call for many entries;
``put_all`` and ``delete_all`` are atomic. A value that a serde cannot handle raises
:class:`StoreError` naming the store and the operation; nothing of that call is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sparkpoint.config import Config
from sparkpoint.errors import StoreError
from sparkpoint.serde import Serde, load_serde
from sparkpoint.storage.kv.base import KeyValueEngine, KeyValueStore

K = TypeVar("K")
V = TypeVar("V")


def store_serdes(config: Config, store: str) -> tuple[Serde[Any], Serde[Any]]:
    """The key and value serdes of ``store`` (``stores.<s>.key.serde`` / ``msg.serde``)."""
    k, m = f"stores.{store}.key.serde", f"stores.{store}.msg.serde"
    return (
        load_serde(config.get_str(k) or "", config, key=k),
        load_serde(config.get_str(m) or "", config, key=m),
    )


@dataclass
class StoreMetrics:
    gets: int = 0
    puts: int = 0
    deletes: int = 0
    bytes_written: int = 0


class SerializedKeyValueStore(KeyValueStore[K, V]):
    """A :class:`KeyValueStore` over a byte engine."""

    def __init__(
        self, name: str, engine: KeyValueEngine, key_serde: Serde[Any], msg_serde: Serde[Any]
    ) -> None:
        self.name = name
        self.engine = engine
        self._ks = key_serde
        self._vs = msg_serde
        self.metrics = StoreMetrics()

    def _key(self, key: K, op: str) -> bytes:
        try:
            return self._ks.to_bytes(key)
        except (TypeError, ValueError) as exc:
            raise StoreError(
                f"store {self.name}: {op}: cannot serialize key {key!r}: {exc}"
            ) from exc

    def _value(self, value: V, op: str) -> bytes:
        try:
            return self._vs.to_bytes(value)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"store {self.name}: {op}: cannot serialize value: {exc}") from exc

    def _decode(self, data: bytes | None) -> V | None:
        if data is None:
            return None
        value: V = self._vs.from_bytes(data)
        return value

    def get(self, key: K) -> V | None:
        self.metrics.gets += 1
        return self._decode(self.engine.get(self._key(key, "get")))

    def get_all(self, keys: Sequence[K]) -> list[V | None]:
        self.metrics.gets += len(keys)
        raw = self.engine.get_many([self._key(k, "get_all") for k in keys])
        return [self._decode(v) for v in raw]

    def put(self, key: K, value: V) -> None:
        kb, vb = self._key(key, "put"), self._value(value, "put")
        self.engine.put(kb, vb)
        self.metrics.puts += 1
        self.metrics.bytes_written += len(kb) + len(vb)

    def put_all(self, entries: Iterable[tuple[K, V]]) -> None:
        batch = [(self._key(k, "put_all"), self._value(v, "put_all")) for k, v in entries]
        self.engine.write_batch(batch)
        self.metrics.puts += len(batch)
        self.metrics.bytes_written += sum(len(k) + len(v) for k, v in batch)

    def delete(self, key: K) -> None:
        self.engine.delete(self._key(key, "delete"))
        self.metrics.deletes += 1

    def delete_all(self, keys: Iterable[K]) -> None:
        batch: list[tuple[bytes, bytes | None]] = [(self._key(k, "delete_all"), None) for k in keys]
        self.engine.write_batch(batch)
        self.metrics.deletes += len(batch)

    def range(self, start: K, end: K) -> Iterator[tuple[K, V]]:
        ks, vs = self._ks, self._vs
        for k, v in self.engine.range(self._key(start, "range"), self._key(end, "range")):
            yield ks.from_bytes(k), vs.from_bytes(v)

    def all(self) -> Iterator[tuple[K, V]]:
        ks, vs = self._ks, self._vs
        for k, v in self.engine.all():
            yield ks.from_bytes(k), vs.from_bytes(v)

    def flush(self) -> None:
        self.engine.flush()

    def close(self) -> None:
        self.engine.close()

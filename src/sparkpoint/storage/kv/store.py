"""The typed store a task uses: an engine plus key and value serdes, with simple metrics.

Batched calls (``get_all``, ``put_all``, ``delete_all``) make one engine call for many entries;
``put_all`` and ``delete_all`` are atomic. A value that a serde cannot handle raises
:class:`StoreError` naming the store and the operation; nothing of that call is written.

With ``write_buffer`` (``stores.<s>.write.batch.size`` in a task), writes are buffered as in
Samza's CachedStore: ``put`` and ``delete`` serialize at once (so a bad value still fails the
call that made it) and keep the newest bytes per key; reads see the buffer first; the buffer
goes to the engine in one atomic write batch when it holds ``write_buffer`` keys, before
``range``, ``all`` and ``flush``, and on :meth:`drain`, which the task's storage calls before
every commit. A buffered value is handed back by ``get`` as the object that was put only when
it is immutable (int, str, ...) and the serde is a built-in one that gives it back exactly; any
other value is decoded again, so mutating what ``get`` returned never changes the store behind
the task's back, and a lossy serde reads the same before and after the buffer is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from sparkpoint.config import Config
from sparkpoint.errors import StoreError
from sparkpoint.serde import BytesSerde, IntegerSerde, JsonSerde, Serde, StringSerde, load_serde
from sparkpoint.storage.kv.base import KeyValueEngine, KeyValueStore

K = TypeVar("K")
V = TypeVar("V")


def store_serdes(config: Config, store: str) -> tuple[Serde[Any], Serde[Any]]:
    """The key and value serdes of ``store`` (``stores.<s>.key.serde`` / ``msg.serde``)."""
    k, m = f"stores.{store}.key.serde", f"stores.{store}.msg.serde"
    return (
        load_serde(config.get_str(k) or "", config, key=k),
        load_serde(config.get_str(m) or "", config, key=m, store=store),
    )


def check_store_schemas(config: Config) -> None:
    """Every store whose values are ``avro``: its current schema can read each schema its
    values were written with (the serde says which rule a change breaks, and where)."""
    for store in config.stores:
        if config.get_str(f"stores.{store}.msg.serde") == "avro":
            from sparkpoint.serde.registry import RegistrySerde

            serde = store_serdes(config, store)[1]
            assert isinstance(serde, RegistrySerde)
            serde.check_evolution(store)


_DECODE: Final = object()  # a buffered value that get() must decode again (it may be mutable)
_IMMUTABLE: Final = frozenset({int, str, bytes, float, bool, type(None)})
# serdes whose decode(encode(v)) == v for those types
_EXACT: Final = frozenset({BytesSerde, IntegerSerde, JsonSerde, StringSerde})


@dataclass
class StoreMetrics:
    gets: int = 0
    puts: int = 0
    deletes: int = 0
    bytes_written: int = 0


class SerializedKeyValueStore(KeyValueStore[K, V]):
    """A :class:`KeyValueStore` over a byte engine."""

    def __init__(
        self,
        name: str,
        engine: KeyValueEngine,
        key_serde: Serde[Any],
        msg_serde: Serde[Any],
        *,
        write_buffer: int = 0,
    ) -> None:
        self.name = name
        self.engine = engine
        self._ks = key_serde
        self._vs = msg_serde
        self._to_key = key_serde.to_bytes  # bound once: get and put run once per message
        self._to_value = msg_serde.to_bytes
        self._from_value = msg_serde.from_bytes
        self.metrics = StoreMetrics()
        self._limit = write_buffer
        self._keep = _IMMUTABLE if type(msg_serde) in _EXACT else frozenset()
        # serialized key -> (the value put, or _DECODE; its bytes, None for a delete)
        self._pending: dict[bytes, tuple[Any, bytes | None]] = {}

    @property
    def key_serde(self) -> Serde[Any]:
        return self._ks

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
        try:
            value: V = self._from_value(data)
        except (TypeError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            raise self._undecodable(data, exc) from exc
        return value

    def _undecodable(self, data: bytes, exc: Exception) -> StoreError:
        return StoreError(
            f"store {self.name}: cannot decode a stored value ({len(data)} bytes, "
            f"{data[:16]!r}) with its value serde {type(self._vs).__name__}: {exc}. The value "
            f"was written with another serde (did stores.{self.name}.msg.serde change?): the "
            f"store's data is not at fault, and neither is the input message; set the serde "
            f"back, or rebuild the store's state"
        )

    def _buffered(self, hit: tuple[Any, bytes | None]) -> V | None:
        """A buffered write as ``get`` returns it: the object put, or its bytes decoded."""
        value, data = hit
        return self._decode(data) if value is _DECODE else value

    def get(self, key: K) -> V | None:
        self.metrics.gets += 1
        try:
            kb = self._to_key(key)
        except (TypeError, ValueError):
            kb = self._key(key, "get")  # raises, naming the store
        if self._pending:
            hit = self._pending.get(kb)
            if hit is not None:
                value, data = hit
                return self._decode(data) if value is _DECODE else value
        data = self.engine.get(kb)
        if data is None:
            return None
        try:
            found: V = self._from_value(data)
        except (TypeError, ValueError) as exc:
            raise self._undecodable(data, exc) from exc
        return found

    def get_all(self, keys: Sequence[K]) -> list[V | None]:
        self.metrics.gets += len(keys)
        kbs = [self._key(k, "get_all") for k in keys]
        if not self._pending:
            return [self._decode(v) for v in self.engine.get_many(kbs)]
        pending = self._pending
        misses = [kb for kb in kbs if kb not in pending]
        found = dict(zip(misses, self.engine.get_many(misses), strict=True))
        out: list[V | None] = []
        for kb in kbs:
            hit = pending.get(kb)
            if hit is None:
                out.append(self._decode(found[kb]))
            else:
                out.append(self._buffered(hit))
        return out

    def put(self, key: K, value: V) -> None:
        try:
            kb, vb = self._to_key(key), self._to_value(value)
        except (TypeError, ValueError):
            kb, vb = self._key(key, "put"), self._value(value, "put")  # raises, naming the store
        self.metrics.puts += 1
        self.metrics.bytes_written += len(kb) + len(vb)
        if not self._limit:
            self.engine.put(kb, vb)
            return
        self._pending[kb] = (value if type(value) in self._keep else _DECODE, vb)
        if len(self._pending) >= self._limit:
            self.drain()

    def put_all(self, entries: Iterable[tuple[K, V]]) -> None:
        batch = [(self._key(k, "put_all"), self._value(v, "put_all")) for k, v in entries]
        self._write(batch)
        self.metrics.puts += len(batch)
        self.metrics.bytes_written += sum(len(k) + len(v) for k, v in batch)

    def delete(self, key: K) -> None:
        kb = self._key(key, "delete")
        self.metrics.deletes += 1
        if not self._limit:
            self.engine.delete(kb)
            return
        self._pending[kb] = (None, None)
        if len(self._pending) >= self._limit:
            self.drain()

    def delete_all(self, keys: Iterable[K]) -> None:
        batch: list[tuple[bytes, bytes | None]] = [(self._key(k, "delete_all"), None) for k in keys]
        self._write(batch)
        self.metrics.deletes += len(batch)

    def _write(self, batch: Sequence[tuple[bytes, bytes | None]]) -> None:
        """One atomic engine write of the buffer, then ``batch`` (newest wins per key)."""
        if self._pending:
            merged = {k: data for k, (_, data) in self._pending.items()}
            merged.update(batch)
            self.engine.write_batch(list(merged.items()))
            self._pending = {}  # only once written: a failed write keeps them for a retry
        elif batch:
            self.engine.write_batch(batch)

    def drain(self) -> None:
        """Write the buffered writes to the engine (one atomic write batch)."""
        if self._pending:
            self._write(())

    def range(self, start: K, end: K) -> Iterator[tuple[K, V]]:
        self.drain()
        ks, vs = self._ks, self._vs
        for k, v in self.engine.range(self._key(start, "range"), self._key(end, "range")):
            yield ks.from_bytes(k), vs.from_bytes(v)

    def all(self) -> Iterator[tuple[K, V]]:
        self.drain()
        ks, vs = self._ks, self._vs
        for k, v in self.engine.all():
            yield ks.from_bytes(k), vs.from_bytes(v)

    def flush(self) -> None:
        self.drain()
        self.engine.flush()

    def close(self) -> None:
        self.drain()
        self.engine.close()

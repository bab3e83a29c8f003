"""Key-value store interfaces.

:class:`KeyValueEngine` is the byte-level engine (RocksDB, in-memory). :class:`KeyValueStore` is
what a task uses: the same operations on typed keys and values through serdes. Keys order
lexicographically by their serialized bytes; ``range(a, b)`` is half-open ``[a, b)``.
A store is used by one task on one thread; engines are not required to be thread-safe.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from itertools import dropwhile, islice
from pathlib import Path
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class KeyValueEngine(ABC):
    """A byte-keyed, byte-valued ordered store."""

    name: str

    @abstractmethod
    def get(self, key: bytes) -> bytes | None: ...

    @abstractmethod
    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values for ``keys`` in the same order, ``None`` where absent (one batched call)."""

    @abstractmethod
    def put(self, key: bytes, value: bytes) -> None: ...

    @abstractmethod
    def delete(self, key: bytes) -> None:
        """Remove ``key``; no error when absent."""

    @abstractmethod
    def write_batch(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Apply puts (value ``None`` = delete) atomically, in order."""

    def load(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        """:meth:`write_batch` for a restore's bulk writes of entries as they are stored (a
        wrapper passes them on as they are: nothing stamped, nothing logged): an engine may
        skip its write-ahead log for them, so they are durable only after :meth:`flush` (or
        :meth:`close`), and apply them in several batches, in order (not atomically: a crash
        before the flush leaves any part of them, and the restore is run again)."""
        self.write_batch(puts)

    def write_bulk(self, puts: Iterable[tuple[bytes, bytes | None]]) -> None:
        """:meth:`write_batch` for a tool's bulk writes that commits the store (which flushes
        it) before anything relies on them, as a reshard does: an engine may skip its
        write-ahead log for them and split them, as for :meth:`load`, but a wrapper takes them
        as writes (a changelog logs them)."""
        self.write_batch(puts)

    @abstractmethod
    def range(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Entries with ``start <= key < end`` in key order."""

    @abstractmethod
    def all(self) -> Iterator[tuple[bytes, bytes]]:
        """Every entry in key order."""

    def entries_from(self, start: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` entries with ``key >= start``, in key order: a scan in chunks, each
        read ahead of any write the caller makes before asking for the next one."""
        return list(islice(dropwhile(lambda kv: kv[0] < start, self.all()), limit))

    def keys_from(self, start: bytes, limit: int) -> list[bytes]:
        """The keys of :meth:`entries_from`, without reading their values where the engine
        can."""
        return [key for key, _value in self.entries_from(start, limit)]

    @abstractmethod
    def flush(self) -> None:
        """Make every write so far durable on local disk (no-op for in-memory engines)."""

    @property
    @abstractmethod
    def persistent(self) -> bool:
        """Whether the engine keeps its data on disk and can make a local checkpoint."""

    def checkpoint(self, destination: Path) -> None:
        """Write a consistent copy of the store into ``destination`` (which must not exist).

        For RocksDB this is a checkpoint made of hard links: milliseconds, whatever the size.
        """
        raise NotImplementedError(f"store {self.name}: engine cannot make checkpoints")

    @abstractmethod
    def close(self) -> None:
        """Flush and release the store. Idempotent."""

    def discard(self) -> None:
        """Release the store without making its pending writes durable, for a store about to
        be deleted (a failed restore): a flush there could fail as the restore did, and hide
        its error. Idempotent."""
        self.close()


class KeyValueStore(ABC, Generic[K, V]):
    """The store a task sees, with typed keys and values."""

    name: str

    @abstractmethod
    def get(self, key: K) -> V | None: ...

    @abstractmethod
    def get_all(self, keys: Sequence[K]) -> list[V | None]:
        """Values for many keys in one engine call, in order; ``None`` where absent."""

    @abstractmethod
    def put(self, key: K, value: V) -> None: ...

    @abstractmethod
    def put_all(self, entries: Iterable[tuple[K, V]]) -> None:
        """Write many entries in one atomic batch."""

    @abstractmethod
    def delete(self, key: K) -> None: ...

    @abstractmethod
    def delete_all(self, keys: Iterable[K]) -> None: ...

    @abstractmethod
    def range(self, start: K, end: K) -> Iterator[tuple[K, V]]:
        """Entries with ``start <= key < end`` by serialized key order."""

    @abstractmethod
    def all(self) -> Iterator[tuple[K, V]]: ...

    @abstractmethod
    def flush(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

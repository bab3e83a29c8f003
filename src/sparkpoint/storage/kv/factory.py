"""Opening a store's engine by the name in ``stores.<s>.factory``."""

from __future__ import annotations

from pathlib import Path

from sparkpoint.errors import ConfigError
from sparkpoint.storage.kv.base import KeyValueEngine

ALIASES = {
    "rocksdb": "rocksdb",
    "org.apache.samza.storage.kv.RocksDbKeyValueStorageEngineFactory": "rocksdb",
    "in-memory": "in-memory",
    "inmemory": "in-memory",
    "org.apache.samza.storage.kv.inmemory.InMemoryKeyValueStorageEngineFactory": "in-memory",
}


def engine_kind(store: str, factory: str) -> str:
    """``rocksdb`` or ``in-memory``; a ConfigError naming the key for anything else."""
    kind = ALIASES.get(factory)
    if kind is None:
        raise ConfigError(
            f"stores.{store}.factory={factory!r} is unknown; allowed: rocksdb, in-memory"
        )
    return kind


def open_engine(
    store: str, factory: str, path: Path, *, must_exist: bool = False
) -> KeyValueEngine:
    """Open the engine for ``store`` (RocksDB in ``path``; in-memory ignores it);
    ``must_exist``: a ``StoreError`` rather than a new empty database."""
    if engine_kind(store, factory) == "rocksdb":
        from sparkpoint.storage.kv.rocksdb import RocksDBEngine

        return RocksDBEngine(store, path, must_exist=must_exist)
    from sparkpoint.storage.kv.memory import InMemoryEngine

    return InMemoryEngine(store)

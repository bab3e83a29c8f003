"""The store contract, run for every engine; then RocksDB's durability and checkpoints."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkpoint.errors import ConfigError, StoreError
from sparkpoint.serde import IntegerSerde, JsonSerde, StringSerde
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.kv.factory import open_engine
from sparkpoint.storage.kv.rocksdb import RocksDBEngine
from sparkpoint.storage.kv.store import SerializedKeyValueStore


@pytest.fixture(params=["rocksdb", "in-memory"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyValueEngine]:
    e = open_engine("s", request.param, tmp_path / "db")
    yield e
    e.close()


class TestEngineContract:
    def test_get_put_delete(self, engine: KeyValueEngine) -> None:
        assert engine.get(b"a") is None
        engine.put(b"a", b"1")
        assert engine.get(b"a") == b"1"
        engine.put(b"a", b"2")
        assert engine.get(b"a") == b"2"
        engine.delete(b"a")
        engine.delete(b"never-there")
        assert engine.get(b"a") is None

    def test_get_many_keeps_order_and_gaps(self, engine: KeyValueEngine) -> None:
        engine.write_batch([(b"x", b"1"), (b"z", b"3")])
        assert engine.get_many([b"z", b"y", b"x"]) == [b"3", None, b"1"]
        assert engine.get_many([]) == []

    def test_write_batch_applies_in_order(self, engine: KeyValueEngine) -> None:
        engine.write_batch([(b"k", b"1"), (b"k", b"2"), (b"d", b"x"), (b"d", None)])
        assert engine.get(b"k") == b"2"
        assert engine.get(b"d") is None

    def test_range_is_half_open_and_ordered(self, engine: KeyValueEngine) -> None:
        engine.write_batch([(bytes([c]), bytes([c])) for c in b"edcba"])
        assert [k for k, _ in engine.range(b"b", b"d")] == [b"b", b"c"]
        assert [k for k, _ in engine.all()] == [b"a", b"b", b"c", b"d", b"e"]
        assert list(engine.range(b"x", b"z")) == []

    def test_flush_and_use_after_close(self, engine: KeyValueEngine) -> None:
        engine.put(b"a", b"1")
        engine.flush()
        engine.close()
        engine.close()  # idempotent
        with pytest.raises(StoreError, match="store s: used after close"):
            engine.get(b"a")

    def test_typed_store_round_trips_and_counts(self, engine: KeyValueEngine) -> None:
        store = SerializedKeyValueStore[str, dict[str, int]](
            "s", engine, StringSerde(), JsonSerde()
        )
        store.put("u1", {"n": 1})
        store.put_all([("u2", {"n": 2}), ("u3", {"n": 3})])
        assert store.get_all(["u3", "nobody", "u1"]) == [{"n": 3}, None, {"n": 1}]
        assert list(store.range("u1", "u3")) == [("u1", {"n": 1}), ("u2", {"n": 2})]
        store.delete_all(["u1", "u2"])
        store.delete("u3")
        assert list(store.all()) == []
        assert (store.metrics.puts, store.metrics.deletes, store.metrics.gets) == (3, 3, 3)
        assert store.metrics.bytes_written > 0

    def test_integer_keys_order_numerically(self, engine: KeyValueEngine) -> None:
        store = SerializedKeyValueStore[int, str]("s", engine, IntegerSerde(), StringSerde())
        store.put_all([(n, str(n)) for n in (300, 2, 10)])
        assert [k for k, _ in store.all()] == [2, 10, 300]

    def test_serde_errors_name_the_store_and_write_nothing(self, engine: KeyValueEngine) -> None:
        store = SerializedKeyValueStore[str, int]("counts", engine, StringSerde(), IntegerSerde())
        with pytest.raises(StoreError, match="store counts: put_all: cannot serialize value"):
            store.put_all([("a", 1), ("b", "not-an-int")])  # type: ignore[list-item]
        assert store.get("a") is None


def test_unknown_factory_lists_allowed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"stores.s.factory='lmdb' is unknown; allowed: rocksdb"):
        open_engine("s", "lmdb", tmp_path)


def test_rocksdb_survives_reopen(tmp_path: Path) -> None:
    e = RocksDBEngine("s", tmp_path / "db")
    e.write_batch([(b"a", b"1"), (b"b", b"2")])
    e.flush()
    e.close()
    again = RocksDBEngine("s", tmp_path / "db")
    assert list(again.all()) == [(b"a", b"1"), (b"b", b"2")]
    again.close()


def test_rocksdb_checkpoint_is_a_point_in_time_copy(tmp_path: Path) -> None:
    e = RocksDBEngine("s", tmp_path / "db")
    e.put(b"a", b"1")
    e.checkpoint(tmp_path / "ckpt")
    e.put(b"a", b"2")
    e.put(b"b", b"3")
    with pytest.raises(StoreError, match="already exists"):
        e.checkpoint(tmp_path / "ckpt")
    e.close()
    ro = RocksDBEngine("s", tmp_path / "ckpt", read_only=True)
    assert list(ro.all()) == [(b"a", b"1")]
    ro.close()
    with pytest.raises(StoreError, match="no database"):
        RocksDBEngine("s", tmp_path / "missing", read_only=True)


def test_rocksdb_lock_wait_times_out_or_succeeds_when_released(tmp_path: Path) -> None:
    first = RocksDBEngine("s", tmp_path / "db")
    with pytest.raises(StoreError, match="cannot open RocksDB"):
        RocksDBEngine("s", tmp_path / "db", open_timeout=0.3)
    timer = threading.Timer(0.3, first.close)
    timer.start()
    start = time.monotonic()
    second = RocksDBEngine("s", tmp_path / "db", open_timeout=10)
    assert time.monotonic() - start >= 0.2
    second.close()
    timer.join()

"""The store contract, run for every engine; then RocksDB's durability and checkpoints."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.errors import ConfigError, StoreError
from sparkpoint.serde import IntegerSerde, JsonSerde, StringSerde
from sparkpoint.storage.kv import rocksdb, ttl
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.kv.factory import open_engine
from sparkpoint.storage.kv.lazy import LazyEngine
from sparkpoint.storage.kv.rocksdb import KEEP_INFO_LOGS, RocksDBEngine
from sparkpoint.storage.kv.store import SerializedKeyValueStore


@pytest.fixture(params=["rocksdb", "in-memory", "rocksdb+ttl", "in-memory+ttl", "lazy-rocksdb"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyValueEngine]:
    """Every engine, and each with a TTL (an hour: nothing expires in the contract); and
    RocksDB opened at its first use (a clean-up's stores)."""
    factory, _, with_ttl = str(request.param).partition("+")
    if factory == "lazy-rocksdb":
        e: KeyValueEngine = LazyEngine("s", lambda: open_engine("s", "rocksdb", tmp_path / "db"))
    else:
        e = open_engine("s", factory, tmp_path / "db")
    if with_ttl:
        e = ttl.prepare(e, 3_600_000)
    yield e
    e.close()


@pytest.fixture(params=[0, 2, 10_000], ids=["unbuffered", "buffer-2", "buffer-10000"])
def buffer(request: pytest.FixtureRequest) -> int:
    """``write_buffer`` of the typed store: off, draining every 2 keys, and the default."""
    return int(request.param)


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
        # any order, a key twice: each answer in its place (RocksDB's is read in key order)
        keys = [b"x", b"z", b"w", b"x", b"a"]
        assert engine.get_many(keys) == [b"1", b"3", None, b"1", None]

    def test_write_batch_applies_in_order(self, engine: KeyValueEngine) -> None:
        engine.write_batch([(b"k", b"1"), (b"k", b"2"), (b"d", b"x"), (b"d", None)])
        assert engine.get(b"k") == b"2"
        assert engine.get(b"d") is None

    def test_load_writes_entries_as_stored_in_order(self, engine: KeyValueEngine) -> None:
        """A restore loads entries as they are stored: a wrapper (TTL) passes them on as they
        are, not stamped again."""
        raw = getattr(engine, "inner", engine)
        engine.write_batch([(b"k", b"2")])
        stored = raw.get(b"k")
        assert stored is not None
        engine.write_batch([(b"k", None), (b"gone", b"0")])
        engine.load([(b"k", b"overwritten"), (b"k", stored), (b"gone", None)])
        assert engine.get(b"k") == b"2"
        assert engine.get(b"gone") is None
        assert raw.get(b"k") == stored

    def test_write_bulk_is_a_write_batch(self, engine: KeyValueEngine) -> None:
        """A tool's bulk writes read back as a write batch's would (a wrapper takes them as
        writes: a TTL stamps them like any other)."""
        raw = getattr(engine, "inner", engine)
        engine.write_bulk([(b"k", b"1"), (b"k", b"2"), (b"d", b"x"), (b"d", None)])
        assert engine.get(b"k") == b"2" and engine.get(b"d") is None
        engine.write_batch([(b"same", b"2")])
        bulk, batch = raw.get(b"k"), raw.get(b"same")
        assert bulk is not None and batch is not None and len(bulk) == len(batch)

    def test_bulk_writes_of_many_sizes_apply_in_order_across_batches(
        self, engine: KeyValueEngine, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """RocksDB splits a bulk write into batches of about ``BULK_BATCH_BYTES`` (here
        1 KB): a key written, deleted and written again in different batches, with values
        from 1 byte to 3 KB, reads back as the last write says, for load and write_bulk.
        The expected state has deleted keys (``every`` minus ``expected``)."""
        monkeypatch.setattr(rocksdb, "BULK_BATCH_BYTES", 1024)
        monkeypatch.setattr(rocksdb, "FIRST_BULK_BATCH", 3)
        puts: list[tuple[bytes, bytes | None]] = []
        expected: dict[bytes, bytes] = {}
        for i in range(600):
            key = b"k%03d" % (i % 37)
            value = None if i % 5 == 4 else bytes([i % 251]) * (1 + (i * 97) % 3000)
            puts.append((key, value))
            if value is None:
                expected.pop(key, None)
            else:
                expected[key] = value
        raw = getattr(engine, "inner", engine)  # load takes entries as stored (a TTL's stamp)
        every = [b"k%03d" % n for n in range(37)]
        for write, get in ((raw.load, raw.get), (engine.write_bulk, engine.get)):
            write(puts)
            assert {k: get(k) for k in expected} == expected
            assert [k for k in every if get(k) is None] == [k for k in every if k not in expected]

    def test_discard_releases_the_store_and_is_idempotent(self, engine: KeyValueEngine) -> None:
        engine.load([(b"a", b"1")])
        engine.discard()
        engine.discard()
        with pytest.raises(StoreError, match="store s: used after close"):
            engine.get(b"a")

    def test_range_is_half_open_and_ordered(self, engine: KeyValueEngine) -> None:
        engine.write_batch([(bytes([c]), bytes([c])) for c in b"edcba"])
        assert [k for k, _ in engine.range(b"b", b"d")] == [b"b", b"c"]
        assert [k for k, _ in engine.all()] == [b"a", b"b", b"c", b"d", b"e"]
        assert list(engine.range(b"x", b"z")) == []

    def test_entries_from_scans_in_chunks_from_a_key_with_no_upper_bound(
        self, engine: KeyValueEngine
    ) -> None:
        keys = [b"a", b"b", b"b\x00", b"c", b"\xff" * 64, b"\xff" * 64 + b"z"]
        engine.write_batch((k, k) for k in reversed(keys))
        assert engine.entries_from(b"b", 2) == [(b"b", b"b"), (b"b\x00", b"b\x00")]
        scanned, start = [], b""
        while chunk := engine.entries_from(start, 2):
            scanned += [k for k, _ in chunk]
            start = chunk[-1][0] + b"\x00"
        assert scanned == keys
        assert engine.keys_from(b"b\x00", 3) == [b"b\x00", b"c", b"\xff" * 64]

    def test_flush_and_use_after_close(self, engine: KeyValueEngine) -> None:
        engine.put(b"a", b"1")
        engine.flush()
        engine.close()
        engine.close()  # idempotent
        with pytest.raises(StoreError, match="store s: used after close"):
            engine.get(b"a")

    def test_typed_store_round_trips_and_counts(self, engine: KeyValueEngine, buffer: int) -> None:
        store = SerializedKeyValueStore[str, dict[str, int]](
            "s", engine, StringSerde(), JsonSerde(), write_buffer=buffer
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

    def test_integer_keys_order_numerically(self, engine: KeyValueEngine, buffer: int) -> None:
        store = SerializedKeyValueStore[int, str](
            "s", engine, IntegerSerde(), StringSerde(), write_buffer=buffer
        )
        store.put(7, "7")
        store.put_all([(n, str(n)) for n in (300, 2, 10)])
        assert [k for k, _ in store.all()] == [2, 7, 10, 300]

    def test_serde_errors_name_the_store_and_write_nothing(
        self, engine: KeyValueEngine, buffer: int
    ) -> None:
        store = SerializedKeyValueStore[str, int](
            "counts", engine, StringSerde(), IntegerSerde(), write_buffer=buffer
        )
        with pytest.raises(StoreError, match="store counts: put_all: cannot serialize value"):
            store.put_all([("a", 1), ("b", "not-an-int")])  # type: ignore[list-item]
        assert store.get("a") is None
        with pytest.raises(StoreError, match="store counts: put: cannot serialize value"):
            store.put("c", 1.5)  # type: ignore[arg-type]
        store.drain()
        assert engine.get(b"c") is None


class TestWriteBuffer:
    """Buffered writes (``stores.<s>.write.batch.size``), as Samza's CachedStore."""

    def test_reads_see_buffered_writes_and_the_engine_gets_them_on_drain(
        self, engine: KeyValueEngine
    ) -> None:
        store = SerializedKeyValueStore[str, int](
            "counts", engine, StringSerde(), IntegerSerde(), write_buffer=100
        )
        engine.put(b"old", IntegerSerde().to_bytes(5))
        engine.put(b"gone", IntegerSerde().to_bytes(9))
        store.put("new", 1)
        store.put("new", 2)
        store.delete("gone")
        assert engine.get(b"new") is None  # not written yet
        assert engine.get(b"gone") is not None
        assert store.get("new") == 2
        assert store.get("gone") is None
        assert store.get_all(["old", "new", "gone", "nobody"]) == [5, 2, None, None]
        store.drain()
        assert engine.get(b"new") == IntegerSerde().to_bytes(2)
        assert engine.get(b"gone") is None
        assert store.get_all(["old", "new"]) == [5, 2]

    def test_it_drains_at_its_size_and_before_scans_and_flush(self, engine: KeyValueEngine) -> None:
        store = SerializedKeyValueStore[str, int](
            "counts", engine, StringSerde(), IntegerSerde(), write_buffer=3
        )
        store.put("a", 1)
        store.put("a", 2)  # one key, however often written
        store.put("b", 1)
        assert engine.get(b"a") is None
        store.put("c", 1)  # the third distinct key drains
        assert engine.get_many([b"a", b"b", b"c"]) == [
            IntegerSerde().to_bytes(v) for v in (2, 1, 1)
        ]
        store.put("d", 4)
        assert [k for k, _ in store.range("c", "e")] == ["c", "d"]
        store.put("e", 5)
        assert dict(store.all())["e"] == 5
        store.put("f", 6)
        store.flush()
        assert engine.get(b"f") == IntegerSerde().to_bytes(6)

    def test_mutating_a_value_read_back_does_not_change_the_store(
        self, engine: KeyValueEngine
    ) -> None:
        store = SerializedKeyValueStore[str, dict[str, int]](
            "s", engine, StringSerde(), JsonSerde(), write_buffer=100
        )
        value = {"n": 1}
        store.put("k", value)
        value["n"] = 99  # after the put: the store keeps what was put
        got = store.get("k")
        assert got == {"n": 1}
        assert got is not None
        got["n"] = 42  # without a put: nothing changes
        assert store.get("k") == {"n": 1}
        assert store.get_all(["k"]) == [{"n": 1}]

    def test_a_lossy_serde_reads_the_same_before_and_after_the_drain(
        self, engine: KeyValueEngine
    ) -> None:
        class Rounding(IntegerSerde):
            """Keeps whole hundreds only: decode(encode(v)) != v."""

            def to_bytes(self, value: int) -> bytes:
                return super().to_bytes(value // 100 * 100)

        store = SerializedKeyValueStore[str, int](
            "s", engine, StringSerde(), Rounding(), write_buffer=100
        )
        store.put("k", 1234)
        before = store.get("k")
        store.drain()
        assert before == store.get("k") == 1200

    def test_a_failed_write_keeps_the_buffer_for_a_retry(self, engine: KeyValueEngine) -> None:
        store = SerializedKeyValueStore[str, int](
            "counts", engine, StringSerde(), IntegerSerde(), write_buffer=100
        )
        store.put("a", 1)
        store.delete("gone")
        real = engine.write_batch
        engine.write_batch = _failing_twice(real)  # type: ignore[method-assign]
        with pytest.raises(OSError, match="No space left"):
            store.drain()
        assert store.get("a") == 1  # still buffered, not lost
        with pytest.raises(OSError, match="No space left"):
            store.put_all([("b", 2)])  # atomic: neither the buffer nor b was written ...
        assert engine.get(b"a") is None and engine.get(b"b") is None
        store.put_all([("b", 2)])  # ... and the retry writes both
        assert engine.get_many([b"a", b"b"]) == [IntegerSerde().to_bytes(v) for v in (1, 2)]


def _failing_twice(write: Any) -> Any:
    """``write``, failing its first two calls as a full disk would."""
    calls = {"n": 0}

    def failing(puts: Any) -> None:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise OSError(28, "No space left on device")
        write(puts)

    return failing


def test_unknown_factory_lists_allowed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"stores.s.factory='lmdb' is unknown; allowed: rocksdb"):
        open_engine("s", "lmdb", tmp_path)


def test_a_lazy_engine_opens_its_database_at_first_use_only(tmp_path: Path) -> None:
    opened: list[RocksDBEngine] = []

    def opener() -> RocksDBEngine:
        opened.append(RocksDBEngine("s", tmp_path / "db"))
        return opened[-1]

    idle = LazyEngine("s", opener)
    idle.flush()
    idle.close()
    idle.discard()
    assert opened == [] and not (tmp_path / "db").exists()  # never opened, never created
    used = LazyEngine("s", opener)
    used.put(b"k", b"v")
    assert len(opened) == 1 and used.opened and used.get(b"k") == b"v"
    used.close()
    assert RocksDBEngine("s", tmp_path / "db").get(b"k") == b"v"  # closed: the lock is free


def test_rocksdb_survives_reopen(tmp_path: Path) -> None:
    e = RocksDBEngine("s", tmp_path / "db")
    e.write_batch([(b"a", b"1"), (b"b", b"2")])
    e.flush()
    e.close()
    again = RocksDBEngine("s", tmp_path / "db")
    assert list(again.all()) == [(b"a", b"1"), (b"b", b"2")]
    again.close()


LOAD_THEN_DIE = """
import os, sys
from sparkpoint.storage.kv.rocksdb import RocksDBEngine
e = RocksDBEngine("s", sys.argv[1])
e.put(b"logged", b"1")
write = e.write_bulk if sys.argv[3] == "bulk" else e.load
write([(b"loaded-%d" % i, b"v") for i in range(100)])
if sys.argv[2] == "flush":
    e.flush()
os._exit(0)  # a crash: no close
"""


@pytest.mark.parametrize("how", ["load", "bulk"])
@pytest.mark.parametrize("flushed", [True, False], ids=["flushed", "not-flushed"])
def test_rocksdb_loaded_writes_skip_the_log_and_are_durable_after_flush(
    tmp_path: Path, flushed: bool, how: str
) -> None:
    """A restore's loads and a tool's bulk writes (a reshard's) skip RocksDB's write-ahead
    log: a crash before the flush loses them, as it may (nothing relied on them yet)."""
    db = tmp_path / "db"
    flush = "flush" if flushed else "no"
    subprocess.run([sys.executable, "-c", LOAD_THEN_DIE, str(db), flush, how], check=True)
    again = RocksDBEngine("s", db)
    loaded = [k for k, _ in again.all() if k.startswith(b"loaded-")]
    assert again.get(b"logged") == b"1"  # written through the log: survives the crash
    # loaded writes survive only once flushed: they never went through the log
    assert len(loaded) == (100 if flushed else 0)
    again.close()


def test_rocksdb_discard_releases_the_lock_without_a_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = RocksDBEngine("s", tmp_path / "db")
    e.load([(b"a", b"1")])
    monkeypatch.setattr(RocksDBEngine, "flush", lambda self: pytest.fail("flushed"))
    e.discard()
    monkeypatch.undo()
    RocksDBEngine("s", tmp_path / "db", open_timeout=1.0).close()  # not locked any more


def test_rocksdb_loaded_writes_are_flushed_by_close(tmp_path: Path) -> None:
    e = RocksDBEngine("s", tmp_path / "db")
    e.load([(b"a", b"1"), (b"b", b"2")])
    e.close()
    again = RocksDBEngine("s", tmp_path / "db")
    assert list(again.all()) == [(b"a", b"1"), (b"b", b"2")]
    again.close()


def test_rocksdb_keeps_a_few_info_logs_however_often_it_is_opened(tmp_path: Path) -> None:
    for i in range(12):  # a task opens its stores once a batch
        e = RocksDBEngine("s", tmp_path / "db")
        e.put(b"k", str(i).encode())
        e.close()
    logs = [p.name for p in (tmp_path / "db").iterdir() if p.name.startswith("LOG")]
    assert "LOG" in logs and len(logs) <= KEEP_INFO_LOGS
    again = RocksDBEngine("s", tmp_path / "db")
    assert again.get(b"k") == b"11"
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

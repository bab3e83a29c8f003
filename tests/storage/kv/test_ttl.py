"""Store TTL on every engine: expired entries are hidden from every read at once, swept on
demand, and a TTL added to, changed on or removed from a store with data is applied once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, StoreError
from sparkpoint.serde import StringSerde
from sparkpoint.storage.kv import ttl
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.kv.factory import open_engine
from sparkpoint.storage.kv.store import SerializedKeyValueStore


class FakeClock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture(params=["rocksdb", "in-memory"])
def raw(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyValueEngine]:
    e = open_engine("s", str(request.param), tmp_path / "db")
    yield e
    e.close()


def visible(engine: KeyValueEngine) -> dict[bytes, bytes]:
    return dict(engine.all())


def test_an_expired_entry_is_hidden_from_every_read(raw: KeyValueEngine) -> None:
    clock = FakeClock()
    e = ttl.prepare(raw, 1000, clock)
    e.put(b"old", b"1")
    clock.now += 600
    e.write_batch([(b"new", b"2"), (b"gone", b"3"), (b"gone", None)])
    clock.now += 400  # "old" is exactly 1000 ms old: expired
    assert e.get(b"old") is None and e.get(b"new") == b"2"
    assert e.get_many([b"new", b"old", b"none"]) == [b"2", None, None]
    assert visible(e) == {b"new": b"2"}
    assert list(e.range(b"a", b"z")) == [(b"new", b"2")]
    typed = SerializedKeyValueStore("s", e, StringSerde(), StringSerde())
    assert typed.get("old") is None and typed.get_all(["old", "new"]) == [None, "2"]
    clock.now += 600
    assert visible(e) == {}


def test_the_format_entry_is_never_read(raw: KeyValueEngine) -> None:
    e = ttl.prepare(raw, 1000, FakeClock())
    assert raw.get(ttl.FORMAT_KEY) == b"ttl-v1 1000"
    assert e.get(ttl.FORMAT_KEY) is None and visible(e) == {}
    assert list(e.range(b"", b"\xff")) == []


def test_a_sweep_deletes_only_expired_entries_through_the_wrapped_engine(
    raw: KeyValueEngine,
) -> None:
    clock = FakeClock()
    e = ttl.prepare(raw, 1000, clock)
    assert isinstance(e, ttl.TtlEngine)
    e.write_batch([(f"k{i}".encode(), b"v") for i in range(25)])
    clock.now += 500
    e.put(b"fresh", b"v")
    clock.now += 500
    assert e.sweep() == 25
    assert [k for k, _ in raw.all()] == [ttl.FORMAT_KEY, b"fresh"]
    assert e.sweep() == 0


def test_adding_a_ttl_stamps_what_the_store_holds_now(raw: KeyValueEngine) -> None:
    raw.write_batch([(b"a", b"1"), (b"b", b"2")])
    clock = FakeClock()
    e = ttl.prepare(raw, 1000, clock)
    assert visible(e) == {b"a": b"1", b"b": b"2"}
    clock.now += 999
    assert visible(e) == {b"a": b"1", b"b": b"2"}
    clock.now += 1
    assert visible(e) == {}


def test_removing_a_ttl_keeps_the_live_entries_and_never_brings_back_expired_ones(
    raw: KeyValueEngine,
) -> None:
    clock = FakeClock()
    e = ttl.prepare(raw, 1000, clock)
    e.put(b"expired", b"1")
    clock.now += 1500
    e.put(b"live", b"2")
    assert ttl.readable(raw, None, clock).get(b"expired") is None  # what the tools show
    plain = ttl.prepare(raw, None, clock)
    assert plain is raw and raw.get(ttl.FORMAT_KEY) is None
    assert visible(raw) == {b"live": b"2"}  # plain bytes again, the expired entry gone
    clock.now += 10**9
    assert ttl.prepare(raw, None, clock).get(b"live") == b"2"  # no TTL any more


def test_changing_a_ttl_sweeps_what_the_old_one_expired(raw: KeyValueEngine) -> None:
    clock = FakeClock()
    ttl.prepare(raw, 1000, clock).put(b"a", b"1")
    clock.now += 1200
    ttl.prepare(raw, 1000, clock).put(b"b", b"2")
    longer = ttl.prepare(raw, 5000, clock)
    assert raw.get(ttl.FORMAT_KEY) == b"ttl-v1 5000"
    assert visible(longer) == {b"b": b"2"}  # "a" stays expired under the longer TTL
    clock.now += 3000
    assert visible(longer) == {b"b": b"2"}
    shorter = ttl.prepare(raw, 100, clock)
    assert visible(shorter) == {}  # "b" is 3000 ms old


def test_the_tools_read_as_the_next_start_would(raw: KeyValueEngine) -> None:
    clock = FakeClock()
    e = ttl.prepare(raw, 1000, clock)
    e.put(b"a", b"1")
    clock.now += 500
    e.put(b"b", b"2")
    assert visible(ttl.readable(raw, 1000, clock)) == {b"a": b"1", b"b": b"2"}
    assert visible(ttl.readable(raw, 400, clock)) == {b"b": b"2"}  # a shorter TTL configured
    clock.now += 600
    assert visible(ttl.readable(raw, None, clock)) == {b"b": b"2"}


def test_a_plain_store_is_left_as_it_is(raw: KeyValueEngine) -> None:
    raw.put(b"a", b"1")
    assert ttl.prepare(raw, None) is raw and ttl.readable(raw, 1000) is raw
    assert visible(raw) == {b"a": b"1"}


def test_a_value_without_a_write_time_in_a_ttl_store_is_an_error(raw: KeyValueEngine) -> None:
    e = ttl.prepare(raw, 1000, FakeClock())
    raw.put(b"short", b"abc")
    with pytest.raises(StoreError, match=r"store s: a value of 3 bytes has no write time"):
        e.get(b"short")


def test_an_unknown_format_entry_is_refused(raw: KeyValueEngine) -> None:
    raw.put(ttl.FORMAT_KEY, b"ttl-v9 x")
    with pytest.raises(StoreError, match="store s: its format entry is b'ttl-v9 x'"):
        ttl.prepare(raw, 1000)


@pytest.mark.parametrize("value", ["-5", "0", "1.5", "soon"])
def test_a_bad_ttl_is_a_one_line_config_error(value: str) -> None:
    base = {"job.name": "j", "stores.s.factory": "rocksdb"}
    with pytest.raises(ConfigError, match=r"stores\.s\.rocksdb\.ttl\.ms") as err:
        Config({**base, "stores.s.rocksdb.ttl.ms": value})
    assert "\n" not in str(err.value)
    assert ttl.ttl_of(Config({**base, "stores.s.rocksdb.ttl.ms": "250"}), "s") == 250
    assert ttl.ttl_of(Config(base), "s") is None

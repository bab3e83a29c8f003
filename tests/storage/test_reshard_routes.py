"""Where ``state reshard`` finds an entry's input key (:mod:`sparkpoint.storage.reshard`): the
store key itself, the key inside a window or join store's layout, the key inside each timer of
the timer store, or a function's answer; the entries of a task (a TTL store's format entry, a
timer store's event-time entries) belong to no key, and a new task starts with their smallest
values."""

from __future__ import annotations

import sys
import types

import pytest

from sparkpoint.config import load_config
from sparkpoint.errors import ConfigError, UserError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.storage.kv import ttl
from sparkpoint.storage.kv.memory import InMemoryEngine
from sparkpoint.storage.reshard import TASK_ENTRY, input_keys, key_route, new_task_entries
from sparkpoint.storage.timers import PartitionTime, TimeKind, TimerStore
from sparkpoint.storage.windows import entry_key


def config(**values: str) -> object:
    base = {"job.name": "j", "stores.s.factory": "rocksdb", "stores.t.factory": "rocksdb"}
    return load_config(None, {**base, **values})


def test_a_plain_store_s_key_is_the_input_key_and_its_format_entry_belongs_to_the_task() -> None:
    c = config(**{"stores.s.rocksdb.ttl.ms": "1000"})
    route = key_route(c, "s")  # type: ignore[arg-type]
    assert route(b"user-1") == b"user-1"
    assert route(ttl.FORMAT_KEY) is TASK_ENTRY
    # the chunked form, also for a store whose TTL was removed (the format entry stays)
    keys = input_keys(config(), "s")  # type: ignore[arg-type]
    assert list(keys([b"a", ttl.FORMAT_KEY, b"b"])) == [b"a", TASK_ENTRY, b"b"]


def test_window_layout_and_a_key_not_of_it() -> None:
    c = config(**{"stores.s.reshard.key": "window"})
    route = key_route(c, "s")  # type: ignore[arg-type]
    assert route(entry_key(b"user-7", 1_700_000_000_000)) == b"user-7"
    with pytest.raises(UserError, match=r"store s: key b'x' is not of the layout"):
        input_keys(c, "s")([b"x"])  # type: ignore[arg-type]


def test_the_timer_store_routes_each_timer_by_its_key_and_keeps_event_time_with_the_task() -> None:
    c = config(**{"task.timers.store": "t", "stores.t.reshard.key": "window"})
    engine = InMemoryEngine("t")
    timers = TimerStore(engine)
    window = entry_key(b"user-3", 1000)
    timers.register(TimeKind.EVENT, 2000, window)
    timers.register(TimeKind.PROCESSING, 5, window)
    ssp = SystemStreamPartition("filelog", "in", 2)
    timers.set_partition_time(ssp, PartitionTime(1500, 10))
    timers.advance_watermark(frozenset({ssp}), 10, 0, 60_000)
    route = key_route(c, "t")  # type: ignore[arg-type]
    routed = {raw: route(raw) for raw, _ in engine.all()}
    assert {k for k in routed.values() if k is not TASK_ENTRY} == {b"user-3"}
    assert sum(1 for raw, k in routed.items() if k == b"user-3") == 3  # two timers, one index
    task = {raw: v for raw, v in engine.all() if routed[raw] is TASK_ENTRY}
    other = dict(task)
    other[b"M"] = b"\x00" * 8  # an earlier watermark in another old task
    fresh = new_task_entries("t", c, [task, other])  # type: ignore[arg-type]
    assert fresh[b"M"] == b"\x00" * 8  # the smallest
    assert not any(k.startswith(b"W") for k in fresh)  # a partition's event time stays


def test_a_window_or_join_store_s_timers_go_with_their_window_s_key() -> None:
    """The runtime's own timers (``OWNED``, then the store's name, then the window's entry
    key; no index entry, or one an earlier version wrote) route by the key inside the window,
    whatever ``reshard.key`` says for the user's timers of the same store."""
    from sparkpoint.storage.timers import BY_KEY, OWNED

    c = config(**{"task.timers.store": "t"})  # the user's timers: by their own key
    engine = InMemoryEngine("t")
    owned = OWNED + b"minute-counts\x00" + entry_key(b"user-5", 60_000)
    TimerStore(engine, unindexed=OWNED).register(TimeKind.EVENT, 60_000, owned)
    TimerStore(engine).register(
        TimeKind.EVENT, 120_000, OWNED + b"sessions\x00" + entry_key(b"user-6", 90_000)
    )  # as an earlier version wrote it: with an index entry
    TimerStore(engine).register(TimeKind.PROCESSING, 5, b"user-7")
    route = key_route(c, "t")  # type: ignore[arg-type]
    routed = {raw: route(raw) for raw, _ in engine.all()}
    assert sorted(v for v in routed.values() if v is not TASK_ENTRY) == [
        b"user-5",
        b"user-6",
        b"user-6",
        b"user-7",
        b"user-7",
    ]
    assert routed[BY_KEY + OWNED + b"sessions\x00" + entry_key(b"user-6", 90_000)] == b"user-6"


def test_a_function_names_the_input_key() -> None:
    module = types.ModuleType("reshard_keys_for_test")
    module.prefix = lambda raw: None if raw == b"meta" else raw.split(b"|")[0]  # type: ignore[attr-defined]
    module.wrong = lambda raw: 7  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        c = config(**{"stores.s.reshard.key": "reshard_keys_for_test:prefix"})
        route = key_route(c, "s")  # type: ignore[arg-type]
        assert route(b"user-1|page") == b"user-1"
        assert route(b"meta") is TASK_ENTRY
        bad = config(**{"stores.s.reshard.key": "reshard_keys_for_test:wrong"})
        with pytest.raises(UserError, match="must return bytes, str or None"):
            key_route(bad, "s")(b"k")  # type: ignore[arg-type]
        missing = config(**{"stores.s.reshard.key": "reshard_keys_for_test:absent"})
        with pytest.raises(
            ConfigError,
            match=r"stores.s.reshard.key='reshard_keys_for_test:absent': cannot import it",
        ):
            key_route(missing, "s")  # type: ignore[arg-type]
    finally:
        del sys.modules[module.__name__]


def test_a_new_task_starts_with_the_smallest_watermark_also_below_zero() -> None:
    """A watermark is a signed time: below 0 when every event time seen is under the
    lateness. Compared as bytes, -4,000 sorted above 50,000, and a new task of a reshard
    started ahead of an old one (its windows and timers fired early; found by a reviewer)."""
    from sparkpoint.storage.timers import MARK, SINCE, TIME

    config = load_config(None, {"job.name": "j", "task.timers.store": "timers"})
    old = [
        {MARK: TIME.pack(-4_000), SINCE: TIME.pack(70)},
        {MARK: TIME.pack(50_000), SINCE: TIME.pack(-1)},
    ]
    new = new_task_entries("timers", config, old)
    assert TIME.unpack(new[MARK])[0] == -4_000 and TIME.unpack(new[SINCE])[0] == -1

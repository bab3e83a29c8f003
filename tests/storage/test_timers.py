"""The timer store on its own: timers in firing order by kind, and the watermark's rules
(smallest busy partition, idleness, lateness, never back)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkpoint.model import SystemStreamPartition
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.kv.factory import open_engine
from sparkpoint.storage.timers import PartitionTime, TimeKind, Timer, TimerStore

P0 = SystemStreamPartition("filelog", "in", 0)
P1 = SystemStreamPartition("filelog", "in", 1)
BOTH = frozenset({P0, P1})


@pytest.fixture(params=["rocksdb", "in-memory"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyValueEngine]:
    e = open_engine("timers", str(request.param), tmp_path / "db")
    yield e
    e.close()


def test_timers_come_in_firing_order_per_kind(engine: KeyValueEngine) -> None:
    store = TimerStore(engine)
    store.register(TimeKind.PROCESSING, 300, b"b")
    store.register(TimeKind.PROCESSING, 100, b"z")
    store.register(TimeKind.PROCESSING, 300, b"a")
    store.register(TimeKind.EVENT, 50, b"e")
    store.register(TimeKind.PROCESSING, 100, b"z")  # once
    p = TimeKind.PROCESSING
    assert list(store.timers(p)) == [Timer(100, p, b"z"), Timer(300, p, b"a"), Timer(300, p, b"b")]
    assert list(store.timers(p, 299)) == [Timer(100, p, b"z")]
    assert [t.key for t in store.timers(p, 300)] == [b"z", b"a", b"b"]
    assert list(store.timers(TimeKind.EVENT)) == [Timer(50, TimeKind.EVENT, b"e")]
    store.delete(p, 100, b"z")
    store.delete(p, 100, b"never")
    assert next(store.timers(p, 1000), None) == Timer(300, p, b"a")
    assert next(store.timers(p, 299), None) is None


def test_the_watermark_is_the_smallest_busy_partition_minus_lateness(
    engine: KeyValueEngine,
) -> None:
    store = TimerStore(engine)
    assert store.advance_watermark(BOTH, 0, 10, 1000) is None  # nothing seen yet
    store.set_partition_time(P0, PartitionTime(500, 0))
    assert store.advance_watermark(BOTH, 10, 10, 1000) is None  # P1 not idle yet: wait for it
    store.set_partition_time(P1, PartitionTime(300, 10))
    assert store.advance_watermark(BOTH, 20, 10, 1000) == 290
    store.set_partition_time(P1, PartitionTime(800, 20))
    assert store.advance_watermark(BOTH, 30, 10, 1000) == 490
    assert store.watermark() == 490


def test_an_idle_partition_stops_holding_the_watermark_back(engine: KeyValueEngine) -> None:
    store = TimerStore(engine)
    store.set_partition_time(P0, PartitionTime(100, 0))
    store.set_partition_time(P1, PartitionTime(900, 1500))
    assert store.advance_watermark(BOTH, 1500, 0, 1000) == 900  # P0 idle since 0
    store.set_partition_time(P0, PartitionTime(200, 1600))  # P0 busy again, but behind
    assert store.advance_watermark(BOTH, 1600, 0, 1000) == 900  # never back
    store.set_partition_time(P1, PartitionTime(1200, 3000))
    assert store.advance_watermark(BOTH, 3000, 0, 1000) == 1200  # P0 idle again


def test_a_partition_never_seen_counts_as_idle_after_the_idle_time(
    engine: KeyValueEngine,
) -> None:
    store = TimerStore(engine)
    assert store.since(0) == 0
    store.set_partition_time(P0, PartitionTime(700, 0))
    assert store.advance_watermark(BOTH, 999, 0, 1000) is None
    assert store.advance_watermark(BOTH, 1000, 0, 1000) == 700


def test_kinds_parse_and_refuse_anything_else() -> None:
    assert TimeKind.parse("event") is TimeKind.EVENT
    with pytest.raises(ValueError, match="'processing' or 'event', not 'wall'"):
        TimeKind.parse("wall")


@pytest.mark.parametrize("deletion", ["at once", "later"])
def test_due_timers_see_the_changes_made_while_they_fire(
    engine: KeyValueEngine, deletion: str
) -> None:
    """Firing deletes each timer (at once, or held for one write batch as the task's timers
    do) and may register or delete others: a deleted one never comes, one deleted and
    registered again does, one registered behind the scan still does, and chunks resume where
    they stopped."""
    store = TimerStore(engine)
    p = TimeKind.PROCESSING
    for i in range(25):
        store.register(p, 100 + i, b"k%02d" % i)
    seen = []
    for timer in store.due(p, 1000, chunk=4):
        seen.append(timer.key)
        if deletion == "later":
            store.delete_later(timer)
        else:
            store.delete(p, timer.timestamp_ms, timer.key)
        if timer.key == b"k03":
            store.delete(p, 110, b"k10")  # deleted before its turn: never given out
            store.delete(p, 104, b"k04")  # in this chunk, deleted then registered again:
            store.register(p, 104, b"k04")  # given out
            store.replace(p, 200, b"k05")  # moved out of this chunk: comes at its new time
            store.register(p, 50, b"early")  # behind the scan: still given out
            store.register(p, 5000, b"later")  # not due
    store.settle()
    expected = [b"k%02d" % i for i in range(25) if i not in (5, 10)] + [b"k05", b"early"]
    assert seen == expected
    assert [t.key for t in store.timers(p)] == [b"later"]
    assert [k for k, _ in engine.all() if k.startswith(b"K")] == [b"Klater"]


def test_timers_changed_together_end_as_changed_one_by_one(engine: KeyValueEngine) -> None:
    """``change_many`` (one write batch) leaves what ``register`` and ``delete`` in the same
    order leave, repeats and deletions of unknown timers included."""
    e, p = TimeKind.EVENT, TimeKind.PROCESSING
    changes = [
        (True, Timer(5, e, b"a")),
        (True, Timer(5, e, b"a")),  # again: one timer
        (True, Timer(7, p, b"a")),
        (False, Timer(9, e, b"b")),  # none to delete
        (True, Timer(3, e, b"b")),
        (False, Timer(5, e, b"a")),
        (True, Timer(8, e, b"c")),
        (False, Timer(8, e, b"c")),  # the key's last timer: its index goes too
    ]
    store = TimerStore(engine)
    store.register(e, 1, b"a")
    store.change_many(changes)
    together = list(engine.all())
    for key, _ in together:
        engine.delete(key)
    store.register(e, 1, b"a")
    for register, timer in changes:
        if register:
            store.register(timer.kind, timer.timestamp_ms, timer.key)
        else:
            store.delete(timer.kind, timer.timestamp_ms, timer.key)
    assert together == list(engine.all())
    assert list(store.timers_of(b"a")) == [Timer(1, e, b"a"), Timer(7, p, b"a")]


def test_a_keys_timers_are_found_by_its_index_and_leave_with_it(engine: KeyValueEngine) -> None:
    store = TimerStore(engine)
    store.register(TimeKind.EVENT, 7, b"user-1")
    store.register(TimeKind.PROCESSING, 9, b"user-1")
    store.register(TimeKind.PROCESSING, 3, b"user-10")  # a longer key with the same start
    assert list(store.timers_of(b"user-1")) == [
        Timer(7, TimeKind.EVENT, b"user-1"),
        Timer(9, TimeKind.PROCESSING, b"user-1"),
    ]
    for timer in list(store.due(TimeKind.PROCESSING, 100)):
        store.delete(timer.kind, timer.timestamp_ms, timer.key)
    assert list(store.timers_of(b"user-10")) == []
    assert list(store.timers_of(b"user-1")) == [Timer(7, TimeKind.EVENT, b"user-1")]
    assert list(engine.all()) == [
        (b"Kuser-1", b"e" + (7).to_bytes(8, "big")),
        (b"Te" + (7).to_bytes(8, "big") + b"user-1", b""),
    ]


def test_replace_leaves_one_timer_of_its_kind_and_the_other_kind_alone(
    engine: KeyValueEngine,
) -> None:
    store = TimerStore(engine)
    store.register(TimeKind.PROCESSING, 5, b"u")
    store.register(TimeKind.PROCESSING, 6, b"u")
    store.register(TimeKind.EVENT, 5, b"u")
    store.replace(TimeKind.PROCESSING, 9, b"u")
    assert list(store.timers_of(b"u")) == [
        Timer(5, TimeKind.EVENT, b"u"),
        Timer(9, TimeKind.PROCESSING, b"u"),
    ]
    assert list(store.timers(TimeKind.PROCESSING)) == [Timer(9, TimeKind.PROCESSING, b"u")]
    before = list(engine.all())
    store.replace(TimeKind.PROCESSING, 9, b"u")  # already the one: nothing written
    assert list(engine.all()) == before
    store.replace(TimeKind.EVENT, 1, b"v")  # a key without timers
    assert list(store.timers(TimeKind.EVENT)) == [
        Timer(1, TimeKind.EVENT, b"v"),
        Timer(5, TimeKind.EVENT, b"u"),
    ]


def test_unindexed_keys_are_one_blind_write_each_and_an_earlier_index_goes_with_them(
    engine: KeyValueEngine,
) -> None:
    """A helper's keys (a window store's) have no index entry: a register or a delete is one
    write and no read, mixed with indexed keys in one batch. Timers of such keys registered
    under an index by an earlier version lose their index entry when they go."""
    e = TimeKind.EVENT
    old = TimerStore(engine)  # as an earlier version wrote a window's timer
    old.register(e, 4, b"\x00h\x00w1")
    store = TimerStore(engine, unindexed=b"\x00h\x00")
    reads: list[object] = []
    get_many = engine.get_many

    def counted(keys: list[bytes]) -> list[bytes | None]:
        reads.append(keys)
        return get_many(keys)

    engine.get_many = counted  # type: ignore[method-assign]
    store.change_many([(True, Timer(9, e, b"\x00h\x00w2")), (True, Timer(9, e, b"\x00h\x00w3"))])
    store.register(e, 6, b"user")
    store.delete(e, 9, b"\x00h\x00w3")
    assert reads == []  # no index read for a helper's key (the user's key: register() reads)
    assert list(store.timers(e)) == [
        Timer(4, e, b"\x00h\x00w1"),
        Timer(6, e, b"user"),
        Timer(9, e, b"\x00h\x00w2"),
    ]
    assert [k for k, _ in engine.all() if k.startswith(b"K")] == [b"K\x00h\x00w1", b"Kuser"]
    fired = list(store.due(e, 100))
    for timer in fired:
        store.delete_later(timer)
    store.settle()
    assert list(engine.all()) == []  # every timer and index entry gone, the earlier one's too
    with pytest.raises(ValueError, match="needs a key's index"):
        store.replace(e, 1, b"\x00h\x00w4")
    fresh = TimerStore(engine, unindexed=b"\x00h\x00")  # nothing left from before: no index
    fresh.register(e, 1, b"\x00h\x00w5")
    fresh.delete(e, 1, b"\x00h\x00w5")
    fresh.delete(e, 2, b"\x00h\x00never")  # deleting a timer that is not there: no error
    assert list(engine.all()) == []


def test_a_negative_watermark_finds_nothing_due_and_negative_times_are_refused(
    engine: KeyValueEngine,
) -> None:
    """Issue 72: times are signed big-endian in the keys, so a scan up to a negative time
    (early event times less the lateness) used to find every timer due."""
    store = TimerStore(engine)
    store.register(TimeKind.EVENT, 0, b"a")
    store.register(TimeKind.EVENT, 60_000, b"b")
    assert list(store.timers(TimeKind.EVENT, -1_000)) == []
    assert list(store.due(TimeKind.EVENT, -1)) == []
    assert [t.key for t in store.timers(TimeKind.EVENT, 0)] == [b"a"]
    with pytest.raises(ValueError, match="event-time timer at -5 ms: timers are at times >= 0"):
        store.register(TimeKind.EVENT, -5, b"c")

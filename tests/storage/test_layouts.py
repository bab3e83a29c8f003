"""A store's entries read in their layout (``sparkpoint state dump``): written by the real
window, join and timer helpers over an in-memory engine, recognised from the first entry, and
decoded; an entry that does not read in a layout names the fix (issue 72)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.storage.joins import JoinBuffer
from sparkpoint.storage.kv.memory import InMemoryEngine
from sparkpoint.storage.layouts import Layout, decoder, recognise
from sparkpoint.storage.timers import END_OF_TIME, TIME, TimeKind, TimerStore, owned_key
from sparkpoint.storage.windows import entry_key

CONFIG = Config(
    {
        "job.name": "j",
        "task.timers.store": "timers",
        **{f"stores.{s}.factory": "rocksdb" for s in ("plain", "w", "j", "timers")},
        **{f"stores.{s}.key.serde": "string" for s in ("plain", "w", "j", "timers")},
        "stores.plain.msg.serde": "json",
    }
)


def read(store: str, engine: InMemoryEngine, layout: Layout = Layout.AUTO) -> list[Any]:
    entries = list(engine.all())
    if layout is Layout.AUTO:
        layout = recognise(CONFIG, store, entries[0] if entries else None)
    decode = decoder(CONFIG, store, layout)
    return [r for k, v in entries if (r := decode(k, v)) is not None]


def test_window_and_join_stores_are_recognised_and_decoded() -> None:
    w = InMemoryEngine("w")
    w.put(entry_key(b"user-1", 60_000), json.dumps({"end": 120_000, "acc": 3}).encode())
    w.put(entry_key(b"user-2", 0), json.dumps({"end": 60_000, "acc": 1, "fired": True}).encode())
    assert recognise(CONFIG, "w", next(iter(w.all()))) is Layout.WINDOW
    assert read("w", w) == [
        {"key": "user-1", "window_start": 60_000, "window_end": 120_000, "value": 3},
        {"key": "user-2", "window_start": 0, "window_end": 60_000, "value": 1, "fired": True},
    ]
    j = InMemoryEngine("j")
    buffer = JoinBuffer(j, "j")
    buffer.add(b"ad-7", 5_000, {"click": 1})
    buffer.add(b"ad-7", 5_000, {"click": 2})
    assert read("j", j) == [{"key": "ad-7", "time": 5_000, "values": [{"click": 1}, {"click": 2}]}]
    plain = InMemoryEngine("plain")
    plain.put(b"user-1", b'{"n": 2}')
    assert read("plain", plain) == [{"key": "user-1", "value": {"n": 2}}]


def test_the_timer_store_reads_as_timers_event_times_and_the_watermark() -> None:
    engine = InMemoryEngine("timers")
    timers = TimerStore(engine)
    timers.register(TimeKind.PROCESSING, 7_000, b"user-1")
    timers.register(TimeKind.EVENT, 60_000, owned_key("w", entry_key(b"user-2", 0)))
    ssp = SystemStreamPartition.parse("log.views.3")
    timers.advance_watermark(frozenset([ssp]), 1_000, 500, 60_000, seen={ssp: 9_000})
    rows = read("timers", engine)
    assert {"entry": "timer", "kind": "processing", "time": 7_000, "key": "user-1"} in rows
    window_timer = {"store": "w", "key": "user-2", "window_start": 0}
    assert {"entry": "timer", "kind": "event", "time": 60_000, **window_timer} in rows
    assert {"entry": "event-time", "ssp": "log.views.3", "max": 9_000, "active": 1_000} in rows
    assert {"entry": "watermark", "time": 8_500, "end_of_input": False} in rows
    assert not any(r["entry"] == "unknown" for r in rows)  # the index entries are left out
    engine.put(b"M", TIME.pack(END_OF_TIME))  # --final-watermark
    assert {"entry": "watermark", "time": END_OF_TIME, "end_of_input": True} in read(
        "timers", engine
    )


def test_an_entry_that_does_not_read_in_the_layout_names_the_fix() -> None:
    w = InMemoryEngine("w")
    w.put(entry_key(b"user-1", 60_000), b'{"end": 120000, "acc": 3}')
    with pytest.raises(UserError, match=r"store w: entry .* does not read in the plain layout"):
        read("w", w, Layout.PLAIN)
    with pytest.raises(UserError, match=r"--layout window\|join\|timers, or see the bytes with"):
        read("w", w, Layout.JOIN)

"""The task API's ``IdleUsers`` (``timer_task.py``) as a DataFrame pipeline, with the same
state layout and the same output streams: views counted per user in ``user-counts``; a user
idle for ``IDLE_MS`` of processing time goes to the ``idle`` stream with its count and is
forgotten. With ``testing.timers.event`` set, every view also gets an event-time timer at its
event time + 1000 (``due`` stream), and late views go to the ``late`` stream."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from timer_task import IDLE_MS

from sparkpoint import Batch, Output, Pipeline, StepState

SCHEMA = "kind STRING, user STRING, count LONG, at LONG, due LONG"
_TYPES = pa.schema(
    [
        ("kind", pa.string()),
        ("user", pa.string()),
        ("count", pa.int64()),
        ("at", pa.int64()),
        ("due", pa.int64()),
    ]
)


def _rows(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=_TYPES)


def count_and_touch(state: StepState, chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    counts = state.store("user-counts")
    timers = state.timers
    event = bool(state.config.get("testing.timers.event"))
    now = timers.now_ms()
    for chunk in chunks:
        users = [str(u) for u in chunk.column("user").to_pylist()]
        for user in set(users):  # one idle timer per user, moved on every view (the task
            timers.replace(user, now + IDLE_MS)  # lists, deletes and registers: the same)
        seen = Counter(users)
        known = dict(zip(seen, counts.get_all(list(seen)), strict=True))
        counts.put_all([(u, (known[u] or 0) + n) for u, n in seen.items()])
        if event:
            times = chunk.column("event_time").to_pylist()
            timers.register_all(
                [f"{u}@{t}" for u, t in zip(users, times, strict=True)],
                [t + 1000 for t in times],
                "event",
            )
            late = chunk.filter(chunk.column("late"))
            if late.num_rows:
                yield _rows(
                    [
                        {"kind": "late", "user": u, "at": t}
                        for u, t in zip(
                            late.column("user").to_pylist(),
                            late.column("event_time").to_pylist(),
                            strict=True,
                        )
                    ]
                )


def on_timer(state: StepState, expired: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    counts = state.store("user-counts")
    rows: list[dict[str, Any]] = []
    for key, due in zip(
        expired.column("key").to_pylist(), expired.column("timestamp_ms").to_pylist(), strict=True
    ):
        if "@" in key:
            user, at = key.split("@")
            rows.append({"kind": "due", "user": user, "at": int(at), "due": due})
        else:
            rows.append({"kind": "idle", "user": key, "count": counts.get(key)})
            counts.delete(key)
    yield _rows(rows)


def build(batch: Batch) -> list[Output]:
    system = batch.config.inputs[0].system
    views = batch.df.select("task", "value.user", "event_time", "late")
    out = batch.stateful(views, count_and_touch, SCHEMA, stores=["user-counts"], on_timer=on_timer)
    columns: Mapping[str, list[str]] = {
        "idle": ["user", "count"],
        "due": ["user", "at", "due"],
        "late": ["user", "at"],
    }
    return [
        batch.to_stream(out.where(out.kind == kind).select(*cols), f"{system}.{kind}", key="user")
        for kind, cols in columns.items()
    ]


def pipeline(config: Mapping[str, str]) -> Pipeline:
    return Pipeline(build, config=config, value_schema="user STRING, page STRING, ts LONG")

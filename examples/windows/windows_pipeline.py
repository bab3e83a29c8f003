"""The windows example as a DataFrame pipeline: the same windows, kept in the same stores, sent
to the same streams as ``windows_task.py`` (a job can move between the two and keep its open
windows). Run it with ``sparkpoint run windows_pipeline:job`` from this directory."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F
from windows_task import MINUTE_MS, SESSION_GAP_MS

from sparkpoint import Batch, Output, Pipeline, session_window, tumbling_window


def build(batch: Batch) -> list[Output]:
    system = batch.config.inputs[0].system
    late = f"{system}.late-views"
    views = batch.df.select("task", "value.user", "event_time")
    closed = batch.window(
        views,
        key="user",
        windows=[
            tumbling_window("minute-counts", size_ms=MINUTE_MS, late_stream=late),
            session_window("sessions", gap_ms=SESSION_GAP_MS, late_stream=late),
        ],
    )
    minutes = _named(closed, "minute-counts", "window_start", "window_end", "count")
    sessions = _named(closed, "sessions", "session_start", "session_end", "views")
    return [
        batch.to_stream(minutes, f"{system}.user-minute-counts", key="user"),
        batch.to_stream(sessions, f"{system}.user-sessions", key="user"),
    ]


def _named(closed: Any, store: str, start: str, end: str, value: str) -> Any:
    return closed.where(F.col("store") == store).select(
        F.col("key").alias("user"),
        F.col("window_start").alias(start),
        F.col("window_end").alias(end),
        F.col("value").alias(value),
    )


job = Pipeline(build, config="job.yaml", value_schema="user STRING, page STRING, ts LONG")

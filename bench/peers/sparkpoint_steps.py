"""The example's DataFrame step, marking when it processes its first view (the task API's
counterpart is in ``sparkpoint_tasks.py``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import mark_first
from pageviews_pipeline import count_views

from sparkpoint import Batch, Output, StepState


def marked_count_views(state: StepState, chunks: Iterator[pa.RecordBatch]) -> Iterator[Any]:
    work = Path(state.config.require("bench.work"))
    for out in count_views(state, chunks):
        mark_first(work)
        yield out


def per_view(batch: Batch) -> Output:
    from pyspark.sql import functions as F

    views = batch.df.select("task", F.col("value.user").alias("user"))
    counts = batch.stateful(views, marked_count_views, "user STRING, count LONG")
    return batch.to_stream(counts, "filelog.user-counts", key="user")

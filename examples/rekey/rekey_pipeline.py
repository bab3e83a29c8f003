"""The re-key example written with the DataFrame API: the same two stages as ``rekey_task.py``.

Stage 1 sends the batch's rows of ``pageviews-by-page`` to the intermediate stream
``pageviews-by-user``, keyed by user; stage 2 counts the rows of ``pageviews-by-user``
(re-keyed by earlier batches) per user in the ``user-counts`` store, and sends ``{user,
count}`` to ``user-counts``. Each row of ``pageviews-by-user`` is in the task of its user's
partition, so the counts are whole.

Run it with:  sparkpoint run rekey_pipeline:job --until-caught-up   (from this directory)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import functions as F

from sparkpoint import Batch, Output, Pipeline, StepState

HERE = Path(__file__).resolve().parent


def count_views(state: StepState, chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Per Arrow batch: one get_all for the users seen, running counts, one put_all."""
    counts = state.store("user-counts")
    for chunk in chunks:
        users: list[str] = chunk.column("user").to_pylist()
        if not users:
            continue
        distinct = list(dict.fromkeys(users))
        current = {u: c or 0 for u, c in zip(distinct, counts.get_all(distinct), strict=True)}
        running = []
        for user in users:
            current[user] += 1
            running.append(current[user])
        counts.put_all(current.items())
        yield pa.RecordBatch.from_arrays(
            [pa.array(users, pa.string()), pa.array(running, pa.int64())], names=["user", "count"]
        )


def build(batch: Batch) -> list[Output]:
    # stage 1: re-key the views by user
    by_page = batch.input("pageviews-by-page").select("value.user", "value.page", "value.ts")
    rekeyed = batch.to_stream(by_page, "filelog.pageviews-by-user", key="user")
    # stage 2: count the views re-keyed by earlier batches, in the task of their user
    views = batch.input("pageviews-by-user").select("task", F.col("value.user").alias("user"))
    counts = batch.stateful(views, count_views, "user STRING, count LONG", stores=["user-counts"])
    return [rekeyed, batch.to_stream(counts, "filelog.user-counts", key="user")]


job = Pipeline(build, config=HERE / "job.yaml", value_schema="user STRING, page STRING, ts LONG")

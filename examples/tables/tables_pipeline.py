"""The example's job with the DataFrame API: every view, with its page's title and section from
the global table ``pages`` (``batch.table``), appended to a Delta and an Iceberg table, and
each user's running count upserted into PostgreSQL (the last count of a user in a batch
wins). Tables take the DataFrame's columns as they are: written as Arrow batches, no row
through Python.

Run it with:  python examples/tables/run_example.py --api dataframe
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import functions as F

from sparkpoint import Batch, Output, Pipeline, StepState

HERE = Path(__file__).resolve().parent


def running_views(state: StepState, chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Each user's count after each of its views: one get_all and one put_all per chunk."""
    counts = state.store("user-counts")
    for chunk in chunks:
        users: list[str] = chunk.column("user").to_pylist()
        seen = dict.fromkeys(users, 0)
        seen.update((u, c or 0) for u, c in zip(seen, counts.get_all(list(seen)), strict=True))
        after = []
        for user in users:
            seen[user] += 1
            after.append(seen[user])
        counts.put_all(seen.items())
        yield pa.record_batch({"user": users, "views": pa.array(after, pa.int64())})


def build(batch: Batch) -> list[Output]:
    views = batch.df.select(
        "task",
        F.col("value.user").alias("user"),
        F.col("value.page").alias("page"),
        F.col("value.ts").alias("ts"),
    )
    counts = batch.stateful(views, running_views, "user STRING, views LONG", stores=["user-counts"])
    pages = batch.table("pages").select("page", "title", "section")
    rows = views.join(F.broadcast(pages), "page", "left").select(
        "user", "page", "title", "section", "ts"
    )
    return [
        batch.to_stream(rows, "lake.views"),
        batch.to_stream(rows, "ice.views"),
        batch.to_stream(counts, "pg.user_counts"),
    ]


job = Pipeline(build, config=HERE / "job.yaml", value_schema="user STRING, page STRING, ts LONG")

"""The page-view job written with the DataFrame API.

Same input, same ``user-counts`` store and the same ``{user, count}`` messages on the
``user-counts`` stream as the low-level ``pageviews_task.py``; in addition each view is enriched
with the page's title and section from a static catalogue (a broadcast join) and written to
Parquet under ``<job.data.dir>/enriched-views``, once per batch.

Run it with:  sparkpoint run pageviews_pipeline:job --until-caught-up   (from this directory)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import functions as F

from sparkpoint import Batch, Output, ParquetSink, Pipeline, StepState

HERE = Path(__file__).resolve().parent

CATALOGUE = [
    ("/", "Home", "marketing"),
    ("/pricing", "Pricing", "marketing"),
    ("/docs", "Documentation", "product"),
    ("/blog", "Blog", "marketing"),
    ("/signup", "Sign up", "funnel"),
    ("/login", "Log in", "funnel"),
    ("/about", "About us", "company"),
]


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
    views = batch.df.select(
        "task",
        F.col("value.user").alias("user"),
        F.col("value.page").alias("page"),
        F.col("value.ts").alias("ts"),
    )
    counts = batch.stateful(views, count_views, "user STRING, count LONG", stores=["user-counts"])
    pages = batch.spark.createDataFrame(CATALOGUE, "page STRING, title STRING, section STRING")
    enriched = views.join(F.broadcast(pages), "page", "left").select(
        "user", "page", "title", "section", "ts"
    )
    out_dir = Path(batch.config.require("job.data.dir")) / "enriched-views"
    return [
        batch.to_stream(counts, f"{batch.config.inputs[0].system}.user-counts", key="user"),
        batch.to_sink(enriched, ParquetSink(out_dir)),
    ]


job = Pipeline(
    build,
    config=HERE / "job.yaml",
    value_schema="user STRING, page STRING, ts LONG",
)

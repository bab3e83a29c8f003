"""The example's counts alone as a DataFrame pipeline: one stateful step whose stream output is
the batch's only output (so it runs fused with the step and finishes the tasks)."""

from __future__ import annotations

from pathlib import Path

from pageviews_pipeline import count_views

from sparkpoint import Batch, Output, Pipeline

JOB = Path(__file__).resolve().parents[2] / "examples" / "pageviews" / "job.yaml"


def build(batch: Batch) -> Output:
    views = batch.df.select("task", "value.user")
    counts = batch.stateful(views, count_views, "user STRING, count LONG")
    return batch.to_stream(counts, "filelog.user-counts", key="user")


job = Pipeline(build, config=JOB, value_schema="user STRING, page STRING, ts LONG")

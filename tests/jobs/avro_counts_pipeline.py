"""The example's counts as a DataFrame pipeline over Avro input: no value_schema, the value
struct comes from the input's registry schema; the counts go out with the output's serde.
``by_referrer`` counts the views per referrer instead: a field a later version of the page
view's schema added, with a default."""

from __future__ import annotations

from pageviews_pipeline import count_views
from pyspark.sql import functions as F

from sparkpoint import Batch, Output, Pipeline


def build(batch: Batch, output: str = "log.user-counts") -> Output:
    views = batch.df.select("task", "value.user")
    counts = batch.stateful(views, count_views, "user STRING, count LONG")
    return batch.to_stream(counts, output, key="user")


job = Pipeline(build, config={})  # the test gives the job's config


def build_by_referrer(batch: Batch) -> Output:
    views = batch.df.select("task", F.col("value.referrer").alias("user"))
    counts = batch.stateful(views, count_views, "user STRING, count LONG")
    return batch.to_stream(counts, "log.user-counts", key="user")


by_referrer = Pipeline(build_by_referrer, config={})

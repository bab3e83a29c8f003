"""A stream-table join in both APIs: each page view (stream ``pageviews``, key = user) goes to
``enriched-views`` with its user's country from the table ``profiles`` (a store filled from the
compacted stream ``profiles`` by ``stores.profiles.side.inputs``); a user the table lacks gets
``null``. The task and the pipeline send the same messages."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from sparkpoint import Batch, OutgoingMessageEnvelope, Output, StreamTask
from sparkpoint.model import SystemStream


def config(system: str = "log", partitions: int = 2) -> dict[str, str]:
    """The job's config on ``system`` (the table's stream must exist, compacted)."""
    return {
        "job.name": "table-join",
        "task.class": "table_join:EnrichViews",
        "task.inputs": f"{system}.pageviews",
        "streams.pageviews.partitions": str(partitions),
        "stores.profiles.factory": "rocksdb",
        "stores.profiles.changelog": f"{system}.profiles-changelog",
        "stores.profiles.side.inputs": f"{system}.profiles",
        "task.commit.ms": "0",
    }


class EnrichViews(StreamTask):
    def init(self, context: Any) -> None:
        self.profiles = context.get_store("profiles")
        self.out = SystemStream(context.config["task.inputs"].split(".")[0], "enriched-views")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        profile = self.profiles.get(envelope.key)
        view = envelope.message
        enriched = {
            "user": view["user"],
            "ts": view["ts"],
            "country": None if profile is None else profile["country"],
        }
        collector.send(OutgoingMessageEnvelope(self.out, envelope.key, enriched))


def build(batch: Batch) -> Output:
    views = batch.df.select("task", "value.user", "value.ts")
    joined = batch.join_table(views, "profiles", key="user", value_schema="country STRING")
    system = batch.config.inputs[0].system
    out = joined.select("user", "ts", F.col("profiles.country").alias("country"))
    return batch.to_stream(out, f"{system}.enriched-views", key="user")

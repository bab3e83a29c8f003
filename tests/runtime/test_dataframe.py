"""A planned micro-batch read as a DataFrame with one Spark partition per task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkpoint.config import load_config
from sparkpoint.runtime.coordinator import JobCoordinator
from sparkpoint.runtime.dataframe import batch_dataframe
from sparkpoint.runtime.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from tests.conftest import pageviews_config
from tests.runtime.helpers import generate


def test_batch_dataframe_has_one_partition_per_task_and_decoded_values(
    tmp_path: Path, spark: Any
) -> None:
    config = load_config(None, pageviews_config(tmp_path))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    expected = generate(config, tmp_path / "a.yaml", 400, seed=71)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    meta = coordinator.metadata(coordinator.all_ssps())
    plans = coordinator._plans({s: m.upcoming for s, m in meta.items()}, commit=False, window=False)
    coordinator.close()
    df = batch_dataframe(spark, plans, value_schema="user STRING, page STRING, ts LONG")
    assert df.rdd.getNumPartitions() == 4
    per_partition = df.rdd.mapPartitions(lambda rows: [sorted({r.task for r in rows})]).collect()
    assert per_partition == [["Partition 0"], ["Partition 1"], ["Partition 2"], ["Partition 3"]]
    counts = {
        r["user"]: r["count"]
        for r in df.groupBy("value.user").count().withColumnRenamed("user", "user").collect()
    }
    assert counts == dict(expected)
    row = df.filter("partition = 1").orderBy("offset").first()
    assert row.key == row.value.user and row.stream == "pageviews" and row.offset == "0"
    raw = batch_dataframe(spark, plans)
    assert raw.schema["value"].dataType.simpleString() == "string"
    assert raw.count() == 400

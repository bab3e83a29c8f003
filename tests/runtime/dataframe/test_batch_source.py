"""A planned micro-batch read as a DataFrame with one Spark partition per task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkpoint.config import load_config
from sparkpoint.runtime.dataframe.source import batch_dataframe
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.runtime.plan import Commits
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from tests.conftest import pageviews_config
from tests.helpers import generate


def test_batch_dataframe_has_one_partition_per_task_and_decoded_values(
    tmp_path: Path, spark: Any
) -> None:
    config = load_config(None, pageviews_config(tmp_path))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    expected = generate(config, tmp_path / "a.yaml", 400, seed=71)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    meta = coordinator.partition_metadata(coordinator.all_ssps())
    plans = coordinator.tasks.plans(
        coordinator.lineage,
        coordinator.batch,
        {s: m.upcoming for s, m in meta.items()},
        Commits(due=False),
        locations={},
        offers={},
    )
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


def _plans_over(
    tmp_path: Path, records: list[tuple[bytes | None, bytes | None]], **overrides: str
) -> Any:
    from sparkpoint.system.base import Record

    config = load_config(None, pageviews_config(tmp_path, **overrides))
    systems = Systems(config)
    systems.admin("filelog").create_stream(StreamSpec("pageviews", 4))
    producer = systems.producer("filelog")
    for key, value in records:
        producer.send("pageviews", 1, Record("", key, value, 1_700_000_000_000))
    producer.flush()
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    meta = coordinator.partition_metadata(coordinator.all_ssps())
    plans = coordinator.tasks.plans(
        coordinator.lineage,
        coordinator.batch,
        {s: m.upcoming for s, m in meta.items()},
        Commits(due=False),
        locations={},
        offers={},
    )
    coordinator.close()
    return plans


def test_values_decode_in_bulk_and_odd_ones_one_by_one(tmp_path: Path, spark: Any) -> None:
    plans = _plans_over(
        tmp_path,
        [
            (b"a", b'{"user": "a", "ts": 5, "extra": [1]}'),
            (b"b", None),  # a tombstone: a null struct
            (b"c", b'{\n  "user": "c"\n}'),  # pretty JSON: not one line, decoded one by one
            (None, b'{"user": "d", "ts": 7}'),
        ],
    )
    df = batch_dataframe(spark, plans, value_schema="user STRING, ts LONG")
    rows = [(r.key, r.value, r.offset) for r in df.orderBy("offset").collect()]
    assert rows == [
        ("a", ("a", 5), "0"),
        ("b", None, "1"),
        ("c", ("c", None), "2"),
        (None, ("d", 7), "3"),
    ]


def test_a_value_that_is_not_json_fails_naming_task_ssp_and_offset(
    tmp_path: Path, spark: Any
) -> None:
    plans = _plans_over(tmp_path, [(b"a", b'{"user": "a"}'), (b"b", b"{not json")])
    df = batch_dataframe(spark, plans, value_schema="user STRING")
    with pytest.raises(Exception) as err:
        df.collect()
    assert "task Partition 1: cannot decode message at filelog.pageviews.1 offset 1" in str(
        err.value
    )


def test_values_as_text_or_bytes_whatever_the_serde(tmp_path: Path, spark: Any) -> None:
    plans = _plans_over(
        tmp_path,
        [(b"a", b"\xff\x00raw"), (b"b", b"text")],
        **{"streams.pageviews.samza.msg.serde": "bytes"},
    )
    raw = batch_dataframe(spark, plans, value_type="BINARY").orderBy("offset").collect()
    assert [r.value for r in raw] == [bytearray(b"\xff\x00raw"), bytearray(b"text")]
    with pytest.raises(Exception, match="offset 0 is not UTF-8 text; read this input with"):
        batch_dataframe(spark, plans).collect()
    with pytest.raises(
        Exception, match=r"value_schema decodes JSON .*but stream filelog.pageviews"
    ):
        batch_dataframe(spark, plans, value_schema="user STRING").collect()


def test_the_batch_dataframe_prefers_each_tasks_executor(tmp_path: Path, spark: Any) -> None:
    """Host affinity for the DataFrame API: the partitions of the batch (and of what is computed
    from them) prefer the executor the driver placed each task on."""
    from dataclasses import replace

    config = load_config(None, pageviews_config(tmp_path))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    meta = coordinator.partition_metadata(coordinator.all_ssps())
    plans = coordinator.tasks.plans(
        coordinator.lineage,
        coordinator.batch,
        {s: m.upcoming for s, m in meta.items()},
        Commits(due=False),
        locations={},
        offers={},
    )
    coordinator.close()
    where = [f"executor_127.0.0.1_{i % 2}" for i in range(4)]
    placed = [replace(p, location=loc) for p, loc in zip(plans, where, strict=True)]
    df = batch_dataframe(spark, placed).selectExpr("task", "upper(value) AS v")
    rdd = df._jdf.queryExecution().toRdd()
    sc = spark.sparkContext._jsc.sc()
    conv = spark.sparkContext._jvm.scala.jdk.javaapi.CollectionConverters
    preferred = [[str(loc) for loc in conv.asJava(sc.getPreferredLocs(rdd, i))] for i in range(4)]
    assert preferred == [[loc] for loc in where]


def test_without_affinity_the_plans_frame_is_built_in_the_jvm(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition ``i`` holds row ``i``, and no Python RDD runs only to make the rows (it used
    to start Python workers of its own every batch)."""
    from types import SimpleNamespace

    from sparkpoint.runtime.spark.session import task_frame

    rows = [f"plan-{i}".encode() * (i + 1) for i in range(5)]
    plans: Any = [SimpleNamespace(location=None) for _ in rows]
    frame = task_frame(spark, plans, rows)
    assert frame.rdd.getNumPartitions() == 5
    per_partition = frame.rdd.mapPartitions(lambda it: [[bytes(r.plan) for r in it]]).collect()
    assert per_partition == [[r] for r in rows]
    physical = frame._jdf.queryExecution().executedPlan().toString()
    assert "Range" in physical and "ExistingRDD" not in physical and "Python" not in physical
    placed: Any = [SimpleNamespace(location=f"executor_h_{i}") for i in range(5)]
    located = task_frame(spark, placed, rows)
    assert "ExistingRDD" in located._jdf.queryExecution().executedPlan().toString()
    monkeypatch.setattr("sparkpoint.runtime.spark.session.JVM_PLANS_MAX_BYTES", 400)
    large = task_frame(spark, plans, rows)  # 5 tasks x 90 bytes: over the limit
    assert "ExistingRDD" in large._jdf.queryExecution().executedPlan().toString()
    assert [bytes(r.plan) for r in large.collect()] == rows


def test_schemas_are_parsed_once_and_must_be_columns(spark: Any) -> None:
    from sparkpoint.errors import ConfigError
    from sparkpoint.runtime.dataframe.source import arrow_schema, spark_schema

    assert spark_schema("user STRING, n LONG") is spark_schema("user STRING, n LONG")
    assert arrow_schema("user STRING, n LONG").names == ["user", "n"]
    with pytest.raises(ConfigError, match="'INT' is not a list of columns"):
        spark_schema("INT")

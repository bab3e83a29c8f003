"""A stateful step runs fused with the stream outputs that are its only readers (its own rows,
or those one column's value picks, with columns selected or renamed), reading its own input
when that input is only columns of ``batch.df``; every way gives the task API's state and
output, and a fused step is held to its declared schema."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pageviews_pipeline import count_views
from pyspark.sql import functions as F

from sparkpoint.config import Config, load_config
from sparkpoint.errors import TaskError
from sparkpoint.model import SystemStream
from sparkpoint.runtime.dataframe.pipeline import Batch, Output, Pipeline
from sparkpoint.runtime.dataframe.sinks import ParquetSink
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.streams import read_json_lines
from tests.conftest import pageviews_config
from tests.helpers import assert_committed_state_matches_its_offsets, committed_counts, generate
from tests.runtime.dataframe.test_pipeline import _run

SCHEMA = "user STRING, count LONG"


def _own_input(batch: Batch) -> Output:
    views = batch.df.select("task", F.col("value.user").alias("user"))
    return batch.to_stream(batch.stateful(views, count_views, SCHEMA), "filelog.out", key="user")


def _filtered(batch: Batch) -> Output:
    views = batch.df.where("offset IS NOT NULL").select("task", "value.user")
    return batch.to_stream(batch.stateful(views, count_views, SCHEMA), "filelog.out", key="user")


def _then_a_sink(batch: Batch) -> list[Output]:
    views = batch.df.select("task", "value.user")
    counts = batch.stateful(views, count_views, SCHEMA)
    sink = ParquetSink(Path(batch.config.require("job.data.dir")) / "views")
    return [batch.to_stream(counts, "filelog.out", key="user"), batch.to_sink(views, sink)]


def _read_twice(batch: Batch) -> list[Output]:
    views = batch.df.select("task", "value.user")
    counts = batch.stateful(views, count_views, SCHEMA)
    sink = ParquetSink(Path(batch.config.require("job.data.dir")) / "counts")
    return [batch.to_stream(counts, "filelog.out", key="user"), batch.to_sink(counts, sink)]


def _with_parity(state: Any, chunks: Any) -> Any:
    """count_views, and each row's parity twice: as a string and as a number."""
    for rows in count_views(state, chunks):
        counts = rows.column("count").to_pylist()
        parity = [c % 2 for c in counts]
        names = ["even" if p == 0 else "odd" for p in parity]
        yield pa.RecordBatch.from_arrays(
            [*rows.columns, pa.array(names), pa.array(parity, pa.int32())],
            names=[*rows.schema.names, "parity", "odd"],
        )


def _parities(batch: Batch) -> Any:
    views = batch.df.select("task", F.col("value.user").alias("user"))
    return batch.stateful(views, _with_parity, f"{SCHEMA}, parity STRING, odd INT")


def _routed_by_string(batch: Batch) -> list[Output]:
    counts = _parities(batch)
    even = counts.where(F.col("parity") == "even").select("user", "count")
    odd = counts.where("parity = 'odd'").select(F.col("user").alias("name"), "count")
    return [
        batch.to_stream(even, "filelog.out", key="user"),
        batch.to_stream(odd.withColumnRenamed("name", "user"), "filelog.out", key="user"),
    ]


def _routed_by_number(batch: Batch) -> list[Output]:
    counts = _parities(batch)
    return [
        batch.to_stream(counts.where(F.col("odd") == 0), "filelog.out", key="user"),
        batch.to_stream(counts.where(F.col("odd") == 1), "filelog.out", key="user"),
    ]


def _routed_by_range(batch: Batch) -> list[Output]:
    counts = _parities(batch)
    return [
        batch.to_stream(counts.where(F.col("count") > 1), "filelog.out", key="user"),
        batch.to_stream(counts.where(F.col("count") <= 1), "filelog.out", key="user"),
    ]


BUILDS: dict[str, tuple[Callable[[Batch], Any], str]] = {
    "own-input": (_own_input, "1 fused with their step, 1 of them reading their own input"),
    "filtered": (_filtered, "1 fused with their step, 0 of them reading their own input"),
    "then-a-sink": (_then_a_sink, "1 fused with their step, 1 of them reading their own input"),
    "read-twice": (_read_twice, "none fused"),
    "routed-by-string": (
        _routed_by_string,
        "2 fused with their step, 2 of them reading their own input",
    ),
    "routed-by-number": (
        _routed_by_number,
        "2 fused with their step, 2 of them reading their own input",
    ),
    "routed-by-range": (_routed_by_range, "none fused"),
}


def _job(tmp_path: Path, **extra: str) -> tuple[Config, Counter[str]]:
    settings = {"task.batch.max.messages": "250", "task.commit.ms": "0", **extra}
    values = pageviews_config(tmp_path, **settings)
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    return config, generate(config, tmp_path / "job.yaml", 2000, seed=21, users=30)


def _sent(config: Config, stream: str) -> Counter[tuple[str, int]]:
    rows = read_json_lines(config, Systems(config), SystemStream("filelog", stream))
    return Counter((str(r["value"]["user"]), int(r["value"]["count"])) for r in rows)


def test_every_way_of_writing_a_step_gives_the_task_apis_state_and_output(
    tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from sparkpoint.runtime.dataframe.runner import DataFrameRunner

    task_config, expected = _job(tmp_path / "task")
    _run(task_config, InlineRunner())
    want = _sent(task_config, "user-counts")
    assert sum(want.values()) == 2000
    for name, (build, described) in BUILDS.items():
        config, _ = _job(tmp_path / name)
        pipeline = Pipeline(build, config=config.to_dict(), value_schema="user STRING")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="sparkpoint.runtime.dataframe.runner"):
            _run(config, DataFrameRunner(spark, pipeline, config))
        batches = [r.getMessage() for r in caplog.records if "outputs written" in r.getMessage()]
        assert len(batches) >= 2, name  # 500 views per task, 250 a batch
        assert all(f"({described})" in m for m in batches), (name, batches[0])
        assert committed_counts(config) == dict(expected), name
        assert_committed_state_matches_its_offsets(config)
        assert _sent(config, "out") == want, name


def test_outputs_fused_with_one_step_each_publish_their_part_with_exactly_once(
    tmp_path: Path, spark: Any
) -> None:
    """Both routed outputs of one step send to the same stream, so each task stages two parts
    of a partition in one Spark task: the batch names both, and every count goes out once."""
    from sparkpoint.runtime.dataframe.runner import DataFrameRunner

    task_config, _ = _job(tmp_path / "task")
    _run(task_config, InlineRunner())
    config, expected = _job(tmp_path / "eo", **{"job.processing.guarantee": "exactly-once"})
    pipeline = Pipeline(_routed_by_string, config=config.to_dict(), value_schema="user STRING")
    _run(config, DataFrameRunner(spark, pipeline, config))
    assert committed_counts(config) == dict(expected)
    assert _sent(config, "out") == _sent(task_config, "user-counts")


def test_a_step_s_plan_token_names_that_step_alone() -> None:
    """Steps whose names differ only where a token cannot tell (``a-b``, ``a_b``) get their
    own tokens, and a plan calling a UDF whose name contains a token does not call it."""
    from sparkpoint.runtime.dataframe.fusion import _calls, step_token

    assert step_token("a-b", 1) != step_token("a_b", 1)
    token = step_token("a", 1)
    assert _calls(f"MapInArrow {token}(task#0, user#1)#2, [user#3], false", token)
    assert not _calls(f"MapInArrow x{token}(task#0)#2, [user#3], false", token)
    assert not _calls(f"MapInArrow {token}0(task#0)#2, [user#3], false", token)


def _wrong_types(state: Any, chunks: Any) -> Any:
    state.store("user-counts")
    for chunk in chunks:
        users = chunk.column("user")
        yield pa.RecordBatch.from_arrays([users, users], names=["user", "count"])


def test_a_fused_step_that_yields_other_types_fails_naming_task_and_step(
    tmp_path: Path, spark: Any
) -> None:
    from sparkpoint.runtime.dataframe.runner import DataFrameRunner

    config, _ = _job(tmp_path)

    def build(batch: Batch) -> Output:
        views = batch.df.select("task", "value.user")
        out = batch.stateful(views, _wrong_types, SCHEMA, name="typed")
        return batch.to_stream(out, "filelog.out", key="user")

    pipeline = Pipeline(build, config=config.to_dict(), value_schema="user STRING")
    with pytest.raises(TaskError) as err:
        _run(config, DataFrameRunner(spark, pipeline, config))
    message = str(err.value)
    assert "stateful step 'typed' yielded columns (user string, count string)" in message
    assert "but its schema is (user string, count int64)" in message
    assert "task Partition " in message


def test_spark_caches_a_batch_uncompressed(spark: Any) -> None:
    # the batch cache lives for one batch: compressing it was half of the JVM's work there
    assert spark.conf.get("spark.sql.inMemoryColumnarStorage.compressed") == "false"

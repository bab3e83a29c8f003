"""A micro-batch as a Spark DataFrame, read through a Python data source.

:func:`batch_dataframe` turns the coordinator's plans for one batch into a DataFrame with **one
Spark partition per task**, in plan order, read on the executors as Arrow batches (no
driver-side collect) by :func:`sparkpoint.runtime.frame_task.read_batches`, which also
establishes the task's state. Columns:
``task``, ``stream``, ``partition``, ``offset``, ``key``, ``value``, ``timestamp``. The key is
decoded by the stream's key serde into a string; the value by the stream's value serde: with
``value_schema`` (a DDL string such as ``"user STRING, page STRING, ts LONG"``) JSON values
become a struct of those fields (missing fields are null); otherwise ``value_type`` decides:
``STRING`` (UTF-8 text, the default) or ``BINARY`` (the raw bytes, whatever the serde).
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from sparkpoint.runtime.plan import TaskBatchPlan

NAME = "sparkpoint-batch"
SCHEMA = (
    "task STRING, stream STRING, partition INT, offset STRING, key STRING, "
    "value {value}, timestamp LONG"
)


class _TaskPartition(InputPartition):
    def __init__(self, index: int, plan: TaskBatchPlan) -> None:
        super().__init__(index)
        self.plan = plan


class _Reader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], schema: Any) -> None:
        self.plans: list[TaskBatchPlan] = pickle.loads(base64.b64decode(options["plans"]))
        self.schema = schema  # the Arrow schema of the batches read() yields

    def partitions(self) -> list[_TaskPartition]:
        return [_TaskPartition(i, plan) for i, plan in enumerate(self.plans)]

    def read(self, partition: _TaskPartition) -> Iterator[Any]:  # type: ignore[override]
        from sparkpoint.runtime.frame_task import read_batches

        return read_batches(partition.plan, self.schema)


class BatchDataSource(DataSource):
    """The ``sparkpoint-batch`` data source: one partition per task plan."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        value = self.options.get("value_schema") or ""
        value_type = f"STRUCT<{value}>" if value else self.options.get("value_type", "STRING")
        return SCHEMA.format(value=value_type)

    def reader(self, schema: Any) -> _Reader:
        from pyspark.sql.pandas.types import to_arrow_schema

        return _Reader(self.options, to_arrow_schema(schema))


def batch_dataframe(
    spark: Any,
    plans: Sequence[TaskBatchPlan],
    *,
    value_schema: str | None = None,
    value_type: str = "STRING",
) -> Any:
    """The batch of ``plans`` as a DataFrame: Spark partition ``i`` is the task of ``plans[i]``."""
    if not getattr(spark, "_sparkpoint_batch_source", False):
        spark.dataSource.register(BatchDataSource)
        spark._sparkpoint_batch_source = True
    encoded = base64.b64encode(pickle.dumps(list(plans))).decode("ascii")
    reader = spark.read.format(NAME).option("plans", encoded).option("value_type", value_type)
    if value_schema:
        reader = reader.option("value_schema", value_schema)
    return reader.load()

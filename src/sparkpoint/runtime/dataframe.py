"""A micro-batch as a Spark DataFrame, read on the executors.

:func:`batch_dataframe` turns the coordinator's plans for one batch into a DataFrame with **one
Spark partition per task**, in plan order: a DataFrame of the pickled plans, built over an RDD
whose partitions prefer their task's executor (host affinity, :func:`~sparkpoint.runtime.
spark.task_rdd`), mapped by ``mapInArrow`` to the task's messages as Arrow batches (no
driver-side collect) by :func:`sparkpoint.runtime.frame_task.read_batches`, which also
establishes the task's state. Every step after it is narrow or reads its cache, so it runs
where the task's state is. Columns:
``task``, ``stream``, ``partition``, ``offset``, ``key``, ``value``, ``timestamp``. The key is
decoded by the stream's key serde into a string; the value by the stream's value serde: with
``value_schema`` (a DDL string such as ``"user STRING, page STRING, ts LONG"``) JSON values
become a struct of those fields (missing fields are null); otherwise ``value_type`` decides:
``STRING`` (UTF-8 text, the default) or ``BINARY`` (the raw bytes, whatever the serde).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from typing import Any

from sparkpoint.runtime.plan import TaskBatchPlan
from sparkpoint.runtime.spark import task_rdd

SCHEMA = (
    "task STRING, stream STRING, partition INT, offset STRING, key STRING, "
    "value {value}, timestamp LONG"
)


class _ReadPlans:
    """``mapInArrow`` function: each pickled plan of the partition -> its task's messages."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema  # the Arrow schema of the batches read_batches yields

    def __call__(self, chunks: Iterator[Any]) -> Iterator[Any]:
        from sparkpoint.runtime.frame_task import read_batches

        for chunk in chunks:
            for raw in chunk.column(0).to_pylist():
                yield from read_batches(pickle.loads(raw), self.schema)


def batch_dataframe(
    spark: Any,
    plans: Sequence[TaskBatchPlan],
    *,
    value_schema: str | None = None,
    value_type: str = "STRING",
) -> Any:
    """The batch of ``plans`` as a DataFrame: Spark partition ``i`` is the task of ``plans[i]``."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    value = f"STRUCT<{value_schema}>" if value_schema else value_type
    ddl = SCHEMA.format(value=value)
    schema = _parse_datatype_string(ddl)
    assert isinstance(schema, StructType)
    rows = [(pickle.dumps(plan),) for plan in plans]
    source = spark.createDataFrame(task_rdd(spark.sparkContext, list(plans), rows), "plan BINARY")
    return source.mapInArrow(_ReadPlans(to_arrow_schema(schema)), schema)

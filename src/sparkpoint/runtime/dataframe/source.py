"""A micro-batch as a Spark DataFrame, read on the executors.

:func:`batch_dataframe` turns the coordinator's plans for one batch into a DataFrame with **one
Spark partition per task**, in plan order: a DataFrame of the pickled plans (built in the JVM,
or over an RDD whose partitions prefer their task's executor under host affinity:
:func:`~sparkpoint.runtime.spark.session.task_frame`), mapped by ``mapInArrow`` to the task's
messages as Arrow batches (no driver-side collect) by :func:`sparkpoint.runtime.dataframe.task.
read_batches`, which also establishes the task's state. Every step after it is narrow or
reads its cache, so it runs where the task's state is. Columns:
``task``, ``stream``, ``partition``, ``offset``, ``key``, ``value``, ``timestamp``,
``event_time`` (the timestamp, or the field ``streams.<s>.event.time.field`` of the value) and
``late`` (the event time is below the task's watermark as the batch began). The key is
decoded by the stream's key serde into a string; the value by the stream's value serde: with
``value_schema`` (a DDL string such as ``"user STRING, page STRING, ts LONG"``) JSON values
become a struct of those fields (missing fields are null); otherwise ``value_type`` decides:
``STRING`` (UTF-8 text, the default) or ``BINARY`` (the raw bytes, whatever the serde).
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sparkpoint.errors import ConfigError
from sparkpoint.runtime.plan import TaskBatchPlan
from sparkpoint.runtime.spark.session import task_frame

SCHEMA = (
    "task STRING, stream STRING, partition INT, offset STRING, key STRING, "
    "value {value}, timestamp LONG, event_time LONG, late BOOLEAN"
)


class _ReadPlans:
    """``mapInArrow`` function: each pickled plan of the partition -> its task's messages."""

    def __init__(self, schema: Any, name: str) -> None:
        self.schema = schema  # the Arrow schema of the batches read_batches yields
        self.__name__ = name  # pyspark names the UDF after it (its plans show it)

    def __call__(self, chunks: Iterator[Any]) -> Iterator[Any]:
        from sparkpoint.runtime.dataframe.task import read_batches

        for chunk in chunks:
            for raw in chunk.column(0).to_pylist():
                yield from read_batches(pickle.loads(raw), self.schema)


@dataclass(frozen=True)
class BatchSource:
    """A batch's DataFrame (``df``), the DataFrame of pickled plans it is read from
    (``plans``: a ``plan`` column, partition ``i`` holds ``plans[i]``), the Arrow schema of
    what each task reads, and the name of the reading UDF in Spark's plans."""

    df: Any
    plans: Any
    read_schema: Any
    name: str


def batch_source(
    spark: Any,
    plans: Sequence[TaskBatchPlan],
    *,
    value_schema: str | None = None,
    value_type: str = "STRING",
    name: str = "read_batch",
) -> BatchSource:
    """The batch of ``plans``: Spark partition ``i`` of its DataFrame is the task of
    ``plans[i]``; ``name`` names the reading UDF."""
    value = f"STRUCT<{value_schema}>" if value_schema else value_type
    schema = spark_schema(SCHEMA.format(value=value))
    source = task_frame(spark, list(plans), [pickle.dumps(plan) for plan in plans])
    read_schema = arrow_schema(schema)
    df = source.mapInArrow(_ReadPlans(read_schema, name), schema)
    return BatchSource(df, source, read_schema, name)


@functools.lru_cache(maxsize=64)
def spark_schema(ddl: str) -> Any:
    """The ``StructType`` of a DDL string. Cached: Spark's JVM parses it, and every batch asks
    for the same few schemas again."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    struct = _parse_datatype_string(ddl)
    if not isinstance(struct, StructType):
        raise ConfigError(f"schema {ddl!r} is not a list of columns (name TYPE, ...)")
    return struct


def arrow_schema(schema: Any) -> Any:
    """The Arrow schema of a DDL string or a Spark ``StructType``, as Spark hands it to Python."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema(schema) if isinstance(schema, str) else schema)


def batch_dataframe(
    spark: Any,
    plans: Sequence[TaskBatchPlan],
    *,
    value_schema: str | None = None,
    value_type: str = "STRING",
) -> Any:
    """The batch of ``plans`` as a DataFrame: Spark partition ``i`` is the task of ``plans[i]``."""
    return batch_source(spark, plans, value_schema=value_schema, value_type=value_type).df

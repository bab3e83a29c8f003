"""A micro-batch as a Spark DataFrame, read through a Python data source (groundwork for issue 7).

:func:`batch_dataframe` turns the ranges the coordinator planned for each task into a DataFrame
with **one Spark partition per task**, read on the executors (no driver-side collect). Columns:
``task``, ``stream``, ``partition``, ``offset``, ``key``, ``value``, ``timestamp``. The key is
decoded by the stream's key serde into a string (bytes keys stay binary); the value is decoded
by the stream's value serde: with ``value_schema`` (a DDL string such as
``"user STRING, page STRING, ts LONG"``) JSON values become a struct of those fields (missing
fields are null), otherwise JSON and string values are strings and bytes values binary.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

NAME = "sparkpoint-batch"


class _TaskRanges(InputPartition):
    def __init__(self, task: str, ranges: list[list[Any]]) -> None:
        super().__init__(task)
        self.task = task
        self.ranges = ranges  # [system, stream, partition, start, end]


class _Reader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], field_names: list[str]) -> None:
        self.plan = json.loads(options["plan"])
        self.field_names = field_names

    def partitions(self) -> list[_TaskRanges]:
        return [_TaskRanges(t["task"], t["ranges"]) for t in self.plan["tasks"]]

    def read(self, partition: _TaskRanges) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        from sparkpoint.config import Config
        from sparkpoint.model import SystemStream, SystemStreamPartition
        from sparkpoint.system.registry import Systems
        from sparkpoint.tools.streams import stream_serdes

        config = Config(self.plan["config"], validate=False)
        systems = Systems(config)
        for system, stream, part, start, end in partition.ranges:
            ssp = SystemStreamPartition(system, stream, int(part))
            key_serde, value_serde = stream_serdes(config, SystemStream(system, stream))
            admin = systems.admin(system)
            consumer = systems.consumer(system)
            offset = start
            while admin.offset_comparator(offset, end) < 0:
                records = consumer.read(ssp, offset, end, 10_000)
                if not records:
                    break
                for rec in records:
                    key = None if rec.key is None else key_serde.from_bytes(rec.key)
                    value = None if rec.value is None else self._value(value_serde, rec.value)
                    yield (partition.task, stream, int(part), rec.offset, key, value, rec.timestamp)
                offset = admin.offset_after(ssp, records[-1].offset)
            consumer.close()

    def _value(self, serde: Any, raw: bytes) -> Any:
        if not self.field_names:
            return raw.decode("utf-8") if serde.name in ("json", "string") else raw
        data = serde.from_bytes(raw)
        return tuple(data.get(f) if isinstance(data, dict) else None for f in self.field_names)


class BatchDataSource(DataSource):
    """The ``sparkpoint-batch`` data source: planned offset ranges, one partition per task."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _value_type(self) -> str:
        schema = self.options.get("value_schema") or ""
        if schema:
            return f"STRUCT<{schema}>"
        return self.options.get("value_type", "STRING")

    def schema(self) -> str:
        return (
            "task STRING, stream STRING, partition INT, offset STRING, key STRING, "
            f"value {self._value_type()}, timestamp LONG"
        )

    def reader(self, schema: Any) -> _Reader:
        value_type = schema["value"].dataType
        names = [f.name for f in value_type.fields] if hasattr(value_type, "fields") else []
        return _Reader(self.options, names)


def batch_dataframe(
    spark: Any,
    config: Mapping[str, str],
    ranges: Mapping[str, Sequence[tuple[str, str, int, str, str]]],
    *,
    value_schema: str | None = None,
    value_type: str = "STRING",
) -> Any:
    """The batch as a DataFrame: ``ranges`` maps each task to its (system, stream, partition,
    start, end) ranges; one Spark partition per task, in the order given."""
    spark.dataSource.register(BatchDataSource)
    plan = {
        "config": dict(config),
        "tasks": [{"task": t, "ranges": [list(r) for r in rs]} for t, rs in ranges.items()],
    }
    reader = (
        spark.read.format(NAME).option("plan", json.dumps(plan)).option("value_type", value_type)
    )
    if value_schema:
        reader = reader.option("value_schema", value_schema)
    return reader.load()

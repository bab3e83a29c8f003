"""The ``sparkpoint-state`` data source (PySpark's Python Data Source API): a store's state as
of each task's last written checkpoint, read by Spark partitions, one per task.

``spark.read.format("sparkpoint-state").option("job", "job.yaml").option("store", "counts")
.load()``. Options: ``job`` (the job file) and ``store`` (required); ``layout``
(``auto``, the default: recognised from the store's first entry; ``plain``, ``window``,
``join``, ``timers``); ``value_schema`` (a DDL struct to read a JSON store's values as);
``tasks`` (``Partition 1,Partition 3``: only those tasks are read); ``set.<key>`` (a config
value, as ``--set`` does). The columns are :mod:`.columns`'.

Filters are not pushed down: PySpark 4.3 keeps a reader whose filters were pushed for the same
DataFrame's next query without filters, which then got the filtered rows (found in testing:
``df.where("task = 'Partition 2'").count()`` then ``df.count()`` gave 82 and 82 of 342). Spark
applies every filter itself; the ``tasks`` option is the way to read less.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from sparkpoint.config import Config, load_config
from sparkpoint.errors import UserError
from sparkpoint.state.columns import Column, columns, ddl, fill
from sparkpoint.storage.layouts import Layout, recognise
from sparkpoint.system.registry import Systems
from sparkpoint.tools.state import (
    committed_raw_entries,
    committed_rows,
    require_store,
    task_checkpoints,
)

ROWS_PER_BATCH = 10_000


def _config(options: dict[str, str]) -> tuple[Config, str]:
    job, store = options.get("job"), options.get("store")
    if not job or not store:
        raise UserError(
            'sparkpoint-state: give .option("job", <the job file>) and .option("store", <a store>)'
        )
    overrides = {k[len("set.") :]: v for k, v in options.items() if k.startswith("set.")}
    config = load_config(Path(job), overrides)
    require_store(config, store)
    return config, store


def _layout(config: Config, store: str, asked: str) -> Layout:
    try:
        layout = Layout(asked.lower())
    except ValueError:
        known = ", ".join(v.value for v in Layout)
        raise UserError(f"sparkpoint-state: layout {asked!r}: one of {known}") from None
    if layout is not Layout.AUTO:
        return layout
    first = next(iter(committed_raw_entries(config, store)), None)
    return recognise(config, store, None if first is None else first[1:])


class StateDataSource(DataSource):
    """``sparkpoint-state``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "sparkpoint-state"

    def _columns(self) -> tuple[Layout, list[Column]]:
        """The store's layout and columns, found once (``auto`` reads its first entry)."""
        found: tuple[Layout, list[Column]] | None = getattr(self, "_found", None)
        if found is None:
            options = dict(self.options)
            config, store = _config(options)
            layout = _layout(config, store, options.get("layout", "auto"))
            found = layout, columns(config, store, layout, options.get("value_schema"))
            self._found = found
        return found

    def schema(self) -> str:
        return ddl(self._columns()[1])

    def reader(self, schema: Any) -> StateReader:
        from pyspark.sql.pandas.types import to_arrow_schema

        layout, _ = self._columns()
        options = dict(self.options)
        options["job"] = str(Path(options["job"]).resolve())  # (read where the tasks run)
        return StateReader(options, layout, to_arrow_schema(schema))


class _Task(InputPartition):
    """One task's state: a Spark partition."""


class StateReader(DataSourceReader):
    def __init__(self, options: dict[str, str], layout: Layout, arrow: pa.Schema) -> None:
        self.options = options
        self.layout = layout
        self.arrow = arrow  # the columns as Spark reads them (made where Spark runs: the driver)
        tasks = options.get("tasks")
        self.tasks = None if not tasks else {t.strip() for t in tasks.split(",") if t.strip()}

    def partitions(self) -> list[InputPartition]:
        config, _store = _config(self.options)
        systems = Systems(config)
        try:
            names = [m.name.name for m, _ in task_checkpoints(config, systems)]
        finally:
            systems.close()
        return [_Task(n) for n in names if self.tasks is None or n in self.tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        config, store = _config(self.options)
        cols = columns(config, store, self.layout, self.options.get("value_schema"))
        rows: list[tuple[str, dict[str, Any]]] = []
        for task, _layout, row in committed_rows(config, store, partition.value, self.layout):
            rows.append((task, row))
            if len(rows) >= ROWS_PER_BATCH:
                yield self._batch(cols, rows, store)
                rows = []
        if rows:
            yield self._batch(cols, rows, store)

    def _batch(
        self, cols: list[Column], rows: list[tuple[str, dict[str, Any]]], store: str
    ) -> pa.RecordBatch:
        try:
            return pa.RecordBatch.from_pydict(fill(cols, rows), schema=self.arrow)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise UserError(
                f"sparkpoint-state: store {store} task {rows[0][0]}: a value does not fit its "
                f"column ({exc}); check the value_schema option, or read without it (JSON "
                "text) and use from_json"
            ) from None

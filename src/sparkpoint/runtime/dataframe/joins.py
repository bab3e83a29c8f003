"""Joins as stateful steps of a DataFrame pipeline.

``batch.join_window``: the task API's windowed stream-stream join
(:mod:`sparkpoint.runtime.executor.joins`, the same buffers and timers, so a job can move
between the APIs): the rows of one DataFrame, split into the two sides by a column (the
``stream`` column of ``batch.df``), are joined by key within ``within_ms`` of event time; the
step yields each matching pair once, as the row ``key, left_time, left, right_time, right``.

``batch.join_table``: rows joined with a table (:mod:`sparkpoint.storage.tables`).

The table is the task's store with ``stores.<s>.side.inputs``: the batch's read put the table
stream's records of this batch into it before the step runs, so each row sees the table as
of its batch (with bootstrap, a complete one). The step looks each row's key up (one store
call per chunk) and adds the table's value as a column: a struct with ``value_schema``, else
the value as JSON text; ``how="inner"`` drops rows whose key the table lacks, ``"left"`` keeps
them with a null.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.errors import TaskError
from sparkpoint.runtime.dataframe.task import NoOutput, StepCode, StepState
from sparkpoint.runtime.executor.joins import open_join
from sparkpoint.runtime.executor.output import OutputCollector
from sparkpoint.storage.joins import Joined

JOIN_KINDS = ("left", "inner")


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)


class TableJoinStep:
    """The function of a table join step (picklable): rows in, rows with the table's value
    out."""

    def __init__(
        self, table: str, key: str, column: str, how: str, value_type: pa.DataType | None
    ) -> None:
        self.table = table
        self.key = key
        self.column = column
        self.how = how
        self.value_type = value_type  # a struct for value_schema, else None (JSON text)

    def code(self) -> StepCode:
        return StepCode(self.join)

    def join(self, state: StepState, chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = state.store(self.table)
        for chunk in chunks:
            keys = chunk.column(self.key).to_pylist()
            found = store.get_all(keys)
            if self.value_type is None:
                values = pa.array([_json(v) for v in found], pa.string())
            else:
                values = pa.array(found, self.value_type)
            joined = pa.RecordBatch.from_arrays(
                [*chunk.columns, values], names=[*chunk.schema.names, self.column]
            )
            if self.how == "inner":
                joined = joined.filter(pc.is_valid(values))
            if joined.num_rows:
                yield joined


#: the columns of ``batch.join_window``'s result, after the values' type
PAIR_SCHEMA = "key STRING, left_time LONG, left {t}, right_time LONG, right {t}"


class WindowJoinStep:
    """The functions of a windowed join step (picklable): rows of both sides in, pairs out."""

    def __init__(
        self,
        stores: tuple[str, str],
        sides: tuple[str, str],
        columns: tuple[str, str, str, str | None],
        within_ms: int,
        value_type: pa.DataType,
        late_stream: str | None,
    ) -> None:
        self.stores = stores
        self.sides = sides  # the side column's value of the left and right rows
        self.side, self.key, self.time, self.value = columns
        self.within_ms = within_ms
        self.value_type = value_type
        self.late_stream = late_stream
        self._late: OutputCollector | None = None

    def code(self) -> StepCode:
        return StepCode(self.add, self.on_timer, finish=self.finish)

    def add(self, state: StepState, chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pairs: list[Joined] = []
        late: Any = NoOutput("a join step without a late stream")
        if self.late_stream is not None:
            late = self._late = state.late_collector()
        join = open_join(
            state.task_name,
            state.config,
            {s: state.store(s) for s in self.stores},
            state.timers,
            self.stores,
            within_ms=self.within_ms,
            emit=lambda pair, _collector: pairs.append(pair),
            late_stream=self.late_stream,
        )
        left, right = self.sides
        for chunk in chunks:
            sides = chunk.column(self.side).to_pylist()
            keys = chunk.column(self.key).to_pylist()
            times = chunk.column(self.time).to_pylist()
            n = len(keys)
            values = [None] * n if self.value is None else chunk.column(self.value).to_pylist()
            for side, key, at, value in zip(sides, keys, times, values, strict=True):
                if side == left:
                    join.left(key, at, value, late)
                elif side == right:
                    join.right(key, at, value, late)
            if pairs:
                yield self._rows(pairs)
                pairs.clear()

    def _rows(self, pairs: list[Joined]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict(
            {
                "key": pa.array([str(p.key) for p in pairs], pa.string()),
                "left_time": pa.array([p.left_time for p in pairs], pa.int64()),
                "left": pa.array([p.left for p in pairs], self.value_type),
                "right_time": pa.array([p.right_time for p in pairs], pa.int64()),
                "right": pa.array([p.right for p in pairs], self.value_type),
            }
        )

    def on_timer(self, state: StepState, expired: Any) -> Iterator[Any]:
        """A timer of the step's own: there are none (its buffers' timers expire records)."""
        raise TaskError(
            f"task {state.task_name}: a join step got {len(expired)} timers it did not "
            "register; the timer store holds another step's timers"
        )

    def finish(self, state: StepState) -> Iterator[pa.RecordBatch]:
        """Late rows sent and flushed before the step ends (at-least-once)."""
        if self._late is not None:
            self._late.flush()
            self._late.close()
            self._late = None
        yield from ()


__all__ = ["JOIN_KINDS", "PAIR_SCHEMA", "TableJoinStep", "WindowJoinStep"]

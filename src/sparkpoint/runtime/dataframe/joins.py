"""``batch.join_table``: a DataFrame pipeline's rows joined with a table
(:mod:`sparkpoint.storage.tables`), as a stateful step.

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

from sparkpoint.runtime.dataframe.task import StepCode, StepState

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


__all__ = ["JOIN_KINDS", "TableJoinStep"]

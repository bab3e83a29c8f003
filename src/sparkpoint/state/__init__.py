"""A job's committed state as data: read as a Spark DataFrame (the ``sparkpoint-state`` data
source), and looked up by key without Spark (``lookup``, ``sparkpoint state get``).

Owns the state's columns (:mod:`.columns`: which columns each store layout reads as, and the
rows of a task as Arrow), the data source (:mod:`.source`, PySpark's Python Data Source API)
and the lookup (:mod:`.lookup`). What state is committed, and where it is read from (a local
checkpoint, the changelog, the blob store), is :mod:`sparkpoint.tools.state`'s: a read never
shows uncommitted state and never disturbs a running job.

May import :mod:`sparkpoint.tools` and every package below it; pyspark only in
:mod:`.source` (a reader with no Spark installed still looks keys up).
"""

from __future__ import annotations

from typing import Any

from sparkpoint.state.lookup import Answer, lookup

#: the data source's name: ``spark.read.format(FORMAT)``
FORMAT = "sparkpoint-state"


def register(spark: Any) -> None:
    """Register the ``sparkpoint-state`` data source on ``spark`` (every session sparkpoint
    starts has it): ``spark.read.format("sparkpoint-state").option("job", path)
    .option("store", name).load()``. It turns on the session's filter pushdown to Python data
    sources (``spark.sql.python.filterPushdown.enabled``), which its reader uses."""
    from sparkpoint.state.source import StateDataSource

    spark.dataSource.register(StateDataSource)
    # its reader takes the task and key filters (Spark refuses a reader that could otherwise)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


__all__ = ["FORMAT", "Answer", "lookup", "register"]

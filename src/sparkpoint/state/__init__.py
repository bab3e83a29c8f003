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
    """Register ``sparkpoint-state`` on ``spark`` (``spark.read.format("sparkpoint-state")
    .option("job", path).option("store", name).load()``). PySpark also finds it by itself,
    as the ``pyspark_sparkpoint`` module, the first time a query needs a Python data source,
    so a session need not: registering costs a Python worker's start (2-3 s), which is why
    the sessions sparkpoint starts do not."""
    from sparkpoint.state.source import StateDataSource

    spark.dataSource.register(StateDataSource)


__all__ = ["FORMAT", "Answer", "lookup", "register"]

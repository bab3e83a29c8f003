"""sparkpoint's Python data sources, found by PySpark itself: a session looks up the top-level
``pyspark_*`` modules with a ``DefaultSource`` the first time a query needs a Python data
source, so ``spark.read.format("sparkpoint-state")`` works in any session where sparkpoint is
installed, with no start-up cost for a session that never reads one
(:mod:`sparkpoint.state`)."""

from sparkpoint.state.source import StateDataSource as DefaultSource

__all__ = ["DefaultSource"]

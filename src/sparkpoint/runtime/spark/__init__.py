"""The Spark glue: how sparkpoint runs on Apache Spark.

Owns the shared SparkSession and its settings (:mod:`.session`, with ``SparkRunner``, which
sends each task's batch to an executor as one Spark partition), the executors' locality and
preferred hosts (:mod:`.locality`), the Python worker daemon that imports sparkpoint once
before it forks (:mod:`.pydaemon`) and the JVM class archive that shortens every start
(:mod:`.jvm_archive`).

May import :mod:`sparkpoint.runtime.plan`, :mod:`sparkpoint.runtime.executor`, pyspark and
every package below the runtime; never the DataFrame API or the driver.
"""

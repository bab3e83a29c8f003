"""The DataFrame API: a job as a function from each micro-batch's DataFrame to its outputs.

Owns the user's side: ``Pipeline``, ``Batch`` and the outputs (:mod:`.pipeline`), the sink
contract and the Parquet sink (:mod:`.sinks`, which imports no runtime implementation); the
runner of a pipeline's batches (:mod:`.runner`, the driver's ``BatchRunner``); the batch source
that reads each task's messages as one Spark partition (:mod:`.source`), the functions Spark
runs per task partition (:mod:`.udfs`), which outputs run fused with their stateful step
(:mod:`.fusion`), the executor side of a task's batch in phases (:mod:`.task`) and the phase
machine those phases advance (:mod:`.phases`, no Spark in it).

May import :mod:`sparkpoint.runtime.plan`, :mod:`sparkpoint.runtime.executor`,
:mod:`sparkpoint.runtime.spark`, pyspark and every package below the runtime; never the driver.
"""

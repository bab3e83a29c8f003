"""The runtime: everything that runs a job, in five packages and two shared contracts.

* :mod:`sparkpoint.runtime.plan`: the batch plan the driver sends each task and the result a
  task sends back; :mod:`sparkpoint.runtime.runner`: what the driver asks of whatever runs a
  batch (:class:`~sparkpoint.runtime.runner.BatchRunner`). Every package below may import them.
* :mod:`~sparkpoint.runtime.api`: the task API a user implements and calls (``StreamTask``,
  its context, collector, coordinator, timers and windows), as classes and protocols that
  import no runtime implementation.
* :mod:`~sparkpoint.runtime.executor`: the executor runtime: one task's batch (establish state,
  process, flush output, commit), its timers, window stores and joins, with no Spark in it;
  the DataFrame API's tasks run on it too.
* :mod:`~sparkpoint.runtime.spark`: the Spark glue: the session, the runner that sends each
  task's batch to an executor, locality, the Python worker daemon, the JVM class archive.
* :mod:`~sparkpoint.runtime.dataframe`: the DataFrame API: ``Pipeline``, the batch source, the
  stateful steps, fusion, sinks, the runner, and each task's batch phases.
* :mod:`~sparkpoint.runtime.driver`: the driver: the job coordinator (start-up, the batch loop
  and its decider, checkpoints, startpoints), placement and host affinity, metrics, progress,
  launch.

They import each other one way only: api -> executor -> spark -> dataframe -> driver (a package
may import the ones before it, never those after it), held by ``tests/test_architecture.py``.
Only the runtime (and the CLI above it) imports pyspark.
"""

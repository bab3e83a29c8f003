"""The runtime: everything that runs a job, in four packages and one shared contract.

* :mod:`sparkpoint.runtime.plan` (this package's only module): the batch plan the driver sends
  each task and the result a task sends back. Every package below may import it.
* :mod:`~sparkpoint.runtime.taskapi`: the task API (``StreamTask``) and the executor side of a
  task's batch (establish state, process, flush output, commit), with no Spark in it.
* :mod:`~sparkpoint.runtime.spark`: the Spark glue: the session, the runner that sends each
  task's batch to an executor, locality, the Python worker daemon, the JVM class archive.
* :mod:`~sparkpoint.runtime.dataframe`: the DataFrame API: ``Pipeline``, the batch source, the
  stateful steps, fusion, and each task's batch phases.
* :mod:`~sparkpoint.runtime.driver`: the driver: the job coordinator (plans batches, writes
  checkpoints, applies startpoints), placement and host affinity, metrics, progress, launch.

They import each other one way only: taskapi -> spark -> dataframe -> driver (a package may
import the ones before it, never those after it), held by ``tests/test_architecture.py``. Only
the runtime (and the CLI above it) imports pyspark.
"""

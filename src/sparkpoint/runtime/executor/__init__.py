"""The executor runtime: a task's micro-batch on an executor, with no Spark in it.

Owns :class:`~.task_batch.TaskBatch`, which runs one task's batch around its
:class:`~sparkpoint.storage.task_storage.TaskStorage` (establish state, process, flush, commit,
close) and implements the task API's context and coordinator; the output collector that sends a
task's messages (:mod:`.output`); the task's timers (:mod:`.timers`), window stores
(:mod:`.windows`) and windowed joins (:mod:`.joins`); standby copies' catch-up
(:mod:`.standby`); and what a Python worker does with its heap (:mod:`.worker_heap`). The
DataFrame API's tasks run on it too.

May import :mod:`sparkpoint.runtime.plan`, :mod:`sparkpoint.runtime.runner`,
:mod:`sparkpoint.runtime.api` and every package below the runtime; never another runtime
package, nor pyspark.
"""

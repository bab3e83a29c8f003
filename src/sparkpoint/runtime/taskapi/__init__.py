"""The task API and the executor side of a task's micro-batch, with no Spark in it.

Owns ``StreamTask`` and its context, collector and coordinator (:mod:`.api`), the output
collector that sends a task's messages (:mod:`.output`), :class:`~.executor.TaskBatch`, which
runs one task's batch around its :class:`~sparkpoint.storage.task_storage.TaskStorage`
(establish state, process, flush, commit, close), and what a Python worker does with its heap
(:mod:`.worker_heap`).

May import :mod:`sparkpoint.runtime.plan` and every package below the runtime; never another
runtime package, nor pyspark.
"""

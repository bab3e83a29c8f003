"""Task-local state: the stores, the backends that back them up, and a task's state protocol.

Owns the key-value stores (:mod:`.kv`), the task directory on disk (:mod:`.local`), the typed
state ids and their transitions (:mod:`.state_id`), the state backends (:mod:`.changelog`,
:mod:`.blobstore`, behind :mod:`.backend`), the commit sequence (:mod:`.commit`), restore
(:mod:`.restore`) and :class:`~.task_storage.TaskStorage`, which ties them together for one task.

May import startpoint, checkpoint, metadata, system, config, model, serde and the leaf
utilities; never tools, the runtime or pyspark.
"""

"""The runtime: the task API, the executor side of a task, and the Spark driver (coordinator)."""

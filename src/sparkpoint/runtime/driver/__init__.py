"""The driver: the process that runs a job's batches and owns its checkpoints.

Owns the :class:`~.coordinator.JobCoordinator` (start: heartbeat, startpoints, restores; each
batch: plan, run, write checkpoints), the durable batch ids (:mod:`.batchlog`) and a
DataFrame batch's exactly-once output (:mod:`.batch_outputs`), task placement
and host affinity (:mod:`.placement`, :mod:`.affinity`), what a batch reports
(:mod:`.reports`), metrics (:mod:`.metrics`), the live progress display (:mod:`.progress`),
the in-process runner for tests (:mod:`.inline`) and launching a job from the CLI or from
Python, on a session of the caller's, through spark-submit, or supervised (:mod:`.launch`,
:mod:`.job_path`, :mod:`.entry`, :mod:`.submit`, :mod:`.supervise`); log lines (:mod:`.logs`).

May import every other runtime package and every package below the runtime.
"""

"""The driver's upkeep after commits: the retention of the job's input streams, and the
compaction of its changelogs on a background thread (:class:`Maintenance`).

Neither changes what the job computes: retention never trims past the job's committed offsets
(:mod:`sparkpoint.system.retention`), and a changelog is compacted only up to the checkpoints
(the embedded log has no broker that compacts it). A compaction pass that fails (a damaged
record) is raised at the next check or at the run's end, never logged and forgotten.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.config import Config
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.storage.backend import StateBackendAdmin
from sparkpoint.system.registry import Systems
from sparkpoint.system.retention import protected, retention_of, trim

log = logging.getLogger(__name__)


def yield_cpu() -> None:
    """Lower this thread's scheduling priority (nice 10; on Linux a thread has its own): a
    pass of background work takes the CPU the batches leave. Elsewhere it runs as it is."""
    me = threading.get_native_id()
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + 10))


class Maintenance:
    """Retention and changelog compaction, at most every ``job.retention.check.ms``."""

    def __init__(self, config: Config, systems: Systems) -> None:
        self.config = config
        self.systems = systems
        #: the state backends' admins (set at start, once they are prepared)
        self.admins: list[StateBackendAdmin] = []
        #: the changelogs' compaction pass running beside the batches, and what it raised
        self._compaction: threading.Thread | None = None
        self._compaction_error: BaseException | None = None
        self._last = float("-inf")  # the first commit applies it

    def after_commit(
        self,
        read: Mapping[SystemStreamPartition, str],
        checkpoints: Mapping[TaskName, Checkpoint],
    ) -> None:
        """After a commit, at most every ``job.retention.check.ms``: the retention of the
        job's input streams, never past ``read`` (each SSP's offset the job reads next after
        its checkpoints), and the compaction of its changelogs up to ``checkpoints`` (those
        that grew enough since the last)."""
        now = time.monotonic()
        if (now - self._last) * 1000 < self.config.get_int("job.retention.check.ms"):
            return
        self._last = now
        streams = sorted(
            {
                s.system_stream
                for s in read
                if retention_of(self.config, s.system_stream) is not None
            }
        )
        try:
            protect = {
                ssp: offset
                for stream in streams
                for ssp, offset in protected(
                    self.systems.admin(stream.system), stream, read
                ).items()
            }
            trimmed = trim(self.config, self.systems, streams, protect, job=self.config.job_label)
        except OSError as exc:  # retention only frees disk: the job goes on, and retries
            log.warning("retention: %s; tried again after the next commit", exc)
            return
        self.compact_changelogs(checkpoints)
        for t in trimmed:
            if t.dropped:
                log.info(
                    "retention: %s dropped %d records (oldest now %s)", t.ssp, t.dropped, t.oldest
                )
            if t.held_back:
                log.warning(
                    "retention: %s keeps %d offsets past its retention that job %s has not "
                    "committed yet (the job is behind)",
                    t.ssp,
                    t.held_back,
                    self.config.job_label,
                )

    def compact_changelogs(self, checkpoints: Mapping[TaskName, Checkpoint]) -> None:
        """Compact the changelogs (which the job alone writes) up to ``checkpoints``, beside
        the next batches: a pass reads every record it keeps, and run between batches it
        cost a windowed job about a third of its throughput (docs/performance.md). One pass at
        a time; while one runs, the next waits for a later commit. A pass holds a partition's
        lock while it compacts it, so its task's appends there wait for it meanwhile. What a
        pass raised (a damaged record) stops the job at the next retention check (after a
        commit, every ``job.retention.check.ms``) or at the run's end."""
        self._raise_compaction_error()
        if self._compaction is not None and self._compaction.is_alive():
            return
        admins = list(self.admins)

        def compact() -> None:
            try:
                yield_cpu()  # the batches' workers first (in local mode they share the cores)
                for admin in admins:
                    admin.compact(checkpoints, during_run=True)
            except BaseException as exc:  # raised in the driver's thread (above)
                self._compaction_error = exc

        self._compaction = threading.Thread(
            target=compact, name="sparkpoint-changelog-compaction", daemon=True
        )
        self._compaction.start()

    def finish(self) -> None:
        """Wait for the changelogs' compaction pass, if one runs; raise what it raised."""
        if self._compaction is not None:
            self._compaction.join()
            self._compaction = None
        self._raise_compaction_error()

    def _raise_compaction_error(self) -> None:
        error, self._compaction_error = self._compaction_error, None
        if error is not None:
            raise error

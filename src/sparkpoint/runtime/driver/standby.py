"""The driver's side of standby tasks (``job.standbytasks.replication.factor``): where each
task's standby copies are kept, how far each has caught up, which one a task whose executor
is lost is promoted on, and what ``sparkpoint job show`` and the metrics say about them.

The rules, applied before every batch (:meth:`Standbys.place`):

* each task of a job with changelogged stores has ``factor - 1`` copies, each on a live
  executor other than the task's own, on another host than the task's when one exists, the
  executor with the fewest copies first; a copy whose executor is gone is dropped, and one on
  the task's own executor (the task was promoted or moved there) is taken by the task;
* a task whose executor is gone is placed on the executor of its most current copy
  (:meth:`Standbys.promotion`), where its restore promotes the copy (the plan's
  ``start.standby``), replaying only the changelog after the copy's checkpoint;
* after a batch that wrote checkpoints, every copy behind its task's last written checkpoint
  is caught up by one Spark job (:meth:`Standbys.plans`, then :meth:`Standbys.caught_up`).
  A copy is only vouched for at the checkpoint this driver saw it reach. After a restart, a
  copy the last run recorded at its task's current checkpoint is kept: the first catch-up
  checks it on its executor (its ``POSITION`` must say that checkpoint, else it is seeded
  again) before it may be promoted. Any other copy of the last run is seeded again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.config import Config
from sparkpoint.metadata.base import MetadataStore
from sparkpoint.metadata.locality import Executor, store_task_standbys, task_standbys
from sparkpoint.model import TaskModel
from sparkpoint.runtime.plan import StandbyPlan, StandbyResult, StandbyTarget
from sparkpoint.storage.changelog.backend import changelog_ssp, marker_for
from sparkpoint.storage.standby import FACTOR, replication_factor, standby_stores

log = logging.getLogger(__name__)

#: catch-ups of one copy (or catch-up jobs) that may fail in a row before the driver stops
#: keeping it (them), with an ERROR
MAX_FAILURES = 3


@dataclass
class Copy:
    """One standby copy: its executor, the checkpoint it reached (None: not yet seeded), its
    stores' changelog offsets then, and how many changelog records it is behind."""

    executor: Executor
    at: str | None = None
    offsets: dict[str, str | None] = field(default_factory=dict)
    lag: int | None = None
    failures: int = 0  # catch-ups that failed in a row
    busy: int = 0  # catch-ups in a row that found the copy in use by another process
    #: seen at ``at`` by this driver; False for a copy of the last run until a catch-up
    #: finds it there on its executor
    checked: bool = True


def records_behind(
    checkpoint: Mapping[str, str | None], copy: Mapping[str, str | None]
) -> int | None:
    """Changelog records between a copy's offsets and a checkpoint's, summed over stores;
    None when an offset is not a number (a system whose offsets are not counts)."""
    total = 0
    for store, offset in checkpoint.items():
        try:
            end = -1 if offset is None else int(offset)
            start = -1 if copy.get(store) is None else int(str(copy.get(store)))
        except ValueError:
            return None
        total += max(0, end - start)
    return total


def most_current_first(copies: Iterable[Copy]) -> list[Copy]:
    """The caught-up copies among ``copies``, the most current first: the fewest records
    behind (a known lag before an unknown one), then the newest checkpoint."""
    ready = sorted(
        (c for c in copies if c.at is not None and c.checked), key=lambda c: str(c.at), reverse=True
    )
    ready.sort(key=lambda c: (c.lag is None, c.lag or 0))
    return ready


class Standbys:
    """The standby copies of one run (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        store: MetadataStore,
        tasks: Mapping[str, TaskModel],
        checkpoints: Mapping[str, Checkpoint | None] | None = None,
    ) -> None:
        """``checkpoints``: the last written checkpoint of each task whose committed state is
        trusted at this start (one restoring from scratch has none here); the last run's
        copies recorded at it are kept (see the module docstring)."""
        self.config = config
        self.factor = replication_factor(config)
        self.stores = standby_stores(config)
        self.enabled = self.factor > 1 and bool(self.stores)
        if self.factor > 1 and not self.stores:
            log.warning(
                "%s=%d: no store writes a changelog, so no standby can be kept current; "
                "tasks restore from their backends instead",
                FACTOR,
                self.factor,
            )
        self.store = store
        self.tasks = dict(tasks)
        self.copies: dict[str, list[Copy]] = {t: [] for t in self.tasks}
        self._short: int | None = None  # the fewest standbys a task had, when short (logged)
        self._failed_jobs = 0  # catch-up jobs that failed in a row
        #: tasks whose copies failed :data:`MAX_FAILURES` catch-ups in a row: none kept now
        self.given_up: set[str] = set()
        if self.enabled and checkpoints:
            self._keep_the_last_runs(checkpoints)
        # the last run's other copies are not this run's: not shown any more
        store_task_standbys(self.store, {t: self.describe(t) for t in self.tasks})

    def _keep_the_last_runs(self, checkpoints: Mapping[str, Checkpoint | None]) -> None:
        """Keep each copy the last run recorded at its task's current checkpoint, unchecked
        (at most ``factor - 1`` a task); the others are seeded again."""
        kept = dropped = 0
        for task, records in sorted(task_standbys(self.store).items()):
            if task not in self.tasks:
                continue
            checkpoint = checkpoints.get(task)
            offsets = self._offsets(task, checkpoint) if checkpoint is not None else {}
            for record in records:
                recorded = record if isinstance(record, dict) else {}
                at, executor, host = (recorded.get(k) for k in ("checkpoint", "executor", "host"))
                if (
                    checkpoint is None
                    or at != str(checkpoint.checkpoint_id)
                    or not isinstance(executor, str)
                    or not isinstance(host, str)
                    or len(self.copies[task]) >= self.factor - 1
                ):
                    dropped += 1
                    continue
                self.copies[task].append(
                    Copy(Executor(executor, host), at, dict(offsets), checked=False)
                )
                kept += 1
        if kept or dropped:
            log.info(
                "standbys: %d copies of the last run kept at their tasks' checkpoints (checked "
                "on their executors at the first catch-up), %d to seed again",
                kept,
                dropped,
            )

    # -- placement
    def promotion(self, live: Sequence[Executor]) -> dict[str, Executor]:
        """Per task, the executor of its most current live copy (the one it is promoted on if
        its own executor is gone)."""
        alive = set(live)
        out = {}
        for task, copies in self.copies.items():
            ready = most_current_first(c for c in copies if c.executor in alive)
            if ready:
                out[task] = ready[0].executor
        return out

    def offers(self) -> dict[str, tuple[tuple[str, str], ...]]:
        """Per task, ``(executor id, checkpoint)`` of each caught-up copy, most current first:
        for its plan (a restore promotes the one on its own disk: the executor the driver
        placed it on, or the one Spark re-ran it on after an executor was lost mid-batch)."""
        out = {}
        for task, copies in self.copies.items():
            ready = most_current_first(copies)
            if ready:
                out[task] = tuple((c.executor.id, str(c.at)) for c in ready)
        return out

    def place(self, live: Sequence[Executor], assignment: Mapping[str, Executor]) -> None:
        """Drop copies on gone executors and on their task's own, and those on their task's
        host when an executor of another host can keep one instead; add copies up to the
        factor (see the module docstring)."""
        if not self.enabled or not live:
            return
        alive = set(live)
        shortest = self.factor - 1
        for task in sorted(set(self.tasks) - self.given_up):
            own = assignment.get(task)
            copies = [c for c in self.copies[task] if c.executor in alive and c.executor != own]
            if own is not None:  # a copy on its task's host goes where another host is free
                elsewhere = [e for e in live if e.host != own.host]
                for copy in [c for c in copies if c.executor.host == own.host]:
                    used = {c.executor for c in copies}
                    if any(e not in used for e in elsewhere):
                        copies.remove(copy)
            taken = {c.executor for c in copies}
            while len(copies) < self.factor - 1:
                free = [e for e in live if e != own and e not in taken]
                if not free:
                    break
                pick = min(
                    free,
                    key=lambda e: (own is not None and e.host == own.host, self._load(e), e),
                )
                copies.append(Copy(pick))
                taken.add(pick)
            self.copies[task] = copies
            shortest = min(shortest, len(copies))
        if shortest < self.factor - 1 and shortest != self._short:
            log.warning(
                "%s=%d: %d live executor(s) can keep only %d standby(s) per task, not %d; "
                "the standbys cannot be placed until more executors join",
                FACTOR,
                self.factor,
                len(live),
                shortest,
                self.factor - 1,
            )
        self._short = shortest if shortest < self.factor - 1 else None

    def _load(self, executor: Executor) -> int:
        return sum(c.executor == executor for copies in self.copies.values() for c in copies)

    # -- catching up
    def plans(
        self,
        values: dict[str, str],
        checkpoints: Mapping[str, Checkpoint | None],
        live: Sequence[Executor],
    ) -> list[StandbyPlan]:
        """One plan per executor keeping a copy that is behind its task's last written
        checkpoint: those copies, and every task whose copy it keeps (the others are deleted
        there)."""
        if not self.enabled:
            return []
        keep: dict[Executor, list[str]] = {}
        behind: dict[Executor, list[StandbyTarget]] = {}
        alive = set(live)
        if not alive:  # the executors are not known yet: no executor may judge its copies
            return []
        for task, copies in sorted(self.copies.items()):
            checkpoint = checkpoints.get(task)
            for c in copies:
                if c.executor not in alive:
                    continue
                keep.setdefault(c.executor, []).append(task)
                if checkpoint is not None and (
                    c.at != str(checkpoint.checkpoint_id) or not c.checked
                ):
                    target = StandbyTarget(self.tasks[task], checkpoint.dumps(), c.at)
                    behind.setdefault(c.executor, []).append(target)
        ids = [e.id for e in live]
        return [
            StandbyPlan(values, e, targets, ids, tuple(keep[e]))
            for e, targets in sorted(behind.items())
        ]

    def caught_up(
        self, results: Sequence[StandbyResult], checkpoints: Mapping[str, Checkpoint | None]
    ) -> None:
        """Record where each copy is now; a copy caught up on another executor than its own
        (Spark ran it elsewhere) is seeded again where it belongs next time. A copy another
        process held (``busy``) keeps what the driver knew (the next catch-up checks the
        copy's own position), and counts toward its own limit, not the failures'."""
        self._failed_jobs = 0
        for r in results:
            for c in self.copies.get(r.task, []):
                if c.executor.id != r.executor:
                    continue
                if r.busy:  # left as it is: its own POSITION says where it is next time
                    c.busy += 1
                    self._busy(r.task, c, r.error or "")
                elif r.error is not None:
                    c.at, c.offsets, c.busy = None, {}, 0
                    c.failures += 1
                    self._failing(r.task, c, r.error)
                elif r.ran_on is not None and r.ran_on.id != r.executor:
                    c.at, c.offsets = None, {}
                else:
                    c.at, c.offsets, c.failures, c.busy = r.checkpoint, dict(r.offsets), 0, 0
                    c.checked = True
        self.measure(checkpoints)

    def _busy(self, task: str, copy: Copy, error: str) -> None:
        """A copy another process held: counted apart from failures (the copy was not at
        fault), but a holder that never lets go (a hung stray catch-up) would make every
        batch's catch-up wait for it, so after :data:`MAX_FAILURES` in a row the task keeps
        no standby for the run."""
        self._count(
            task,
            copy,
            copy.busy,
            error,
            "was in use by another process ({error}); it catches up after the next batch",
            "was in use by another process in {n} catch-ups in a row (last: {error})",
            "Find the process holding the copy's lock (a stray catch-up: fuser on the .lock "
            "file beside the copy) and restart the job",
        )

    def _failing(self, task: str, copy: Copy, error: str) -> None:
        self._count(
            task,
            copy,
            copy.failures,
            error,
            "failed to catch up ({error}); seeding it again",
            "failed {n} catch-ups in a row (last: {error})",
            "Fix the cause (the error names it) and restart the job",
        )

    def _count(
        self, task: str, copy: Copy, n: int, error: str, again: str, stop: str, fix: str
    ) -> None:
        """A WARNING (``again``) while ``n`` is under :data:`MAX_FAILURES`; then an ERROR
        (``stop``, then ``fix``) and the task keeps no standby for the rest of the run."""
        where = f"task {task}: its standby copy on {copy.executor}"
        if n < MAX_FAILURES:
            log.warning("%s %s", where, again.format(error=error))
            return
        log.error(
            "%s %s; the task keeps no standby for the rest of this run, and restores from its "
            "backends if its executor is lost. %s",
            where,
            stop.format(n=n, error=error),
            fix,
        )
        self.given_up.add(task)
        self.copies[task] = []

    def failed(self, plans: Sequence[StandbyPlan], error: str) -> None:
        """A catch-up job failed as a whole (an executor lost during it): each copy's own
        ``POSITION`` says whether it changed (the next catch-up there seeds it, a restore does
        not promote it), so the driver keeps what it knows. After :data:`MAX_FAILURES` in a row
        no more are run in this run."""
        self._failed_jobs += 1
        if self._failed_jobs < MAX_FAILURES:
            log.warning("standby catch-up failed (%s); it runs again after the next batch", error)
            return
        log.error(
            "standby catch-up failed %d times in a row (last: %s); no standby is kept for the "
            "rest of this run: tasks restore from their backends if their executor is lost. "
            "Fix the cause and restart the job",
            self._failed_jobs,
            error,
        )
        self.enabled = False
        self.copies = {t: [] for t in self.tasks}
        self.measure({})

    def taken(self, task: str, executor: str) -> None:
        """``task``'s restore promoted its copy kept for ``executor``: that copy is gone."""
        self.copies[task] = [c for c in self.copies.get(task, []) if c.executor.id != executor]

    def measure(self, checkpoints: Mapping[str, Checkpoint | None]) -> None:
        """Each copy's lag behind its task's last written checkpoint, recorded for ``sparkpoint
        job show`` (changed records only)."""
        for task, copies in sorted(self.copies.items()):
            ends = self._offsets(task, checkpoints.get(task))
            for c in copies:
                c.lag = None if c.at is None or not c.checked else records_behind(ends, c.offsets)
        store_task_standbys(self.store, {t: self.describe(t) for t in self.copies})

    def _offsets(self, task: str, checkpoint: Checkpoint | None) -> dict[str, str | None]:
        model = self.tasks[task]
        out: dict[str, str | None] = {}
        for store in self.stores:
            ssp = changelog_ssp(self.config, store, model.changelog_partition)
            marker = marker_for(self.config, checkpoint, store, ssp)
            out[store] = None if marker is None else marker.offset
        return out

    def describe(self, task: str) -> list[dict[str, Any]]:
        """The task's copies as ``job show`` prints them."""
        return [
            {
                "executor": c.executor.id,
                "host": c.executor.host,
                "checkpoint": c.at,
                "lag": c.lag,
            }
            for c in self.copies.get(task, [])
        ]

    def lags(self) -> dict[str, int]:
        """Per task, the changelog records its most current copy is behind (tasks with a
        caught-up copy whose lag is known)."""
        out = {}
        for task, copies in self.copies.items():
            known = [c.lag for c in copies if c.lag is not None]
            if known:
                out[task] = min(known)
        return out

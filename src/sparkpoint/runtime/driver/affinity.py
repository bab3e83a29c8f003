"""The driver's side of host affinity for one run: place tasks before each batch, learn where
they ran after it, and keep both in the metadata store.

The assignment rules are in :mod:`sparkpoint.runtime.driver.placement`; the Spark calls in
:mod:`sparkpoint.runtime.spark.locality`. A runner that runs on a Spark cluster offers
``executors()`` (the live executors) and fills in :attr:`TaskBatchResult.ran_on`; without it
(local mode, the inline runner) nothing is placed and every count stays zero.

Besides the assignment, each task's ``task-locality`` record in the metadata store says where
it last committed, which checkpoint that was and how large its stores were then; ``sparkpoint
job show`` prints it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparkpoint.config import Config
from sparkpoint.metadata.base import MetadataStore
from sparkpoint.metadata.locality import (
    Executor,
    store_assignment,
    store_task_locality,
    stored_assignment,
)
from sparkpoint.runtime.driver.placement import Move, Placement
from sparkpoint.runtime.plan import TaskBatchResult

log = logging.getLogger(__name__)


@dataclass
class BatchPlacement:
    """What host affinity saw in one batch."""

    moved: list[Move]  # before the batch: new tasks, lost executors, rebalance
    away: list[Move]  # after it: tasks the scheduler ran away from their executor


class HostAffinity:
    """Host affinity of one run (see the module docstring)."""

    def __init__(self, config: Config, store: MetadataStore, tasks: Sequence[str]) -> None:
        self.enabled = config.get_bool("job.host-affinity.enabled")
        self.rebalance = config.get_bool("job.host-affinity.rebalance")
        #: the executors of a host share its state directory (no ``{cwd}`` in its path)
        self.state_per_host = "{cwd}" not in (config.get_str("job.logged.store.base.dir") or "")
        self.store = store
        self.tasks = list(tasks)
        self.placement = Placement(stored_assignment(store, tasks) if self.enabled else {})
        self._moved: list[Move] = []
        self._live: set[Executor] | None = None
        self._away: list[Move] = []  # the last batch's tasks that ran away from their executor
        self._commits: dict[str, dict[str, Any]] = {}  # task -> where it committed, until recorded
        #: each task's last watermark reported (a batch that did not open its timers has none)
        self._watermarks: dict[str, int] = {}

    def place(
        self, live: Sequence[Executor] | None, standbys: Mapping[str, Executor] | None = None
    ) -> dict[str, str]:
        """Before a batch: (re)assign tasks to ``live`` executors (a task whose executor is
        gone to its entry in ``standbys``, if any); each task's location."""
        self._moved = []
        if not self.enabled or live is None:
            return {}
        alive = set(live)
        self._log_changes(alive)
        self._moved = self.placement.place(
            self.tasks,
            live,
            rebalance=self.rebalance,
            standbys=standbys,
            state_per_host=self.state_per_host,
        )
        for move in self._moved:
            level = logging.INFO if move.reason == "new task" else logging.WARNING
            log.log(level, "host affinity: %s", move)
        store_assignment(self.store, {m.task: m.new for m in self._moved})
        return {
            task: executor.location
            for task, executor in self.placement.assignment.items()
            if executor in alive  # none when no executor is known yet: nothing to prefer
        }

    def _log_changes(self, live: set[Executor]) -> None:
        if self._live is not None:
            for gone in sorted(self._live - live):
                held = sorted(t for t, e in self.placement.assignment.items() if e == gone)
                ran = sorted(m.task for m in self._away if m.old == gone)
                log.warning(
                    "host affinity: lost %s (its tasks: %s)",
                    gone,
                    ", ".join(held + [f"{t} (already run elsewhere by Spark)" for t in ran]),
                )
            for new in sorted(live - self._live):
                log.warning(
                    "host affinity: %s joined; %s",
                    new,
                    "rebalancing onto it"
                    if self.rebalance
                    else "no task moves to it (sparkpoint run --rebalance moves some)",
                )
        self._live = live

    def ran(self, results: Sequence[TaskBatchResult]) -> BatchPlacement:
        """After a batch: tasks that ran elsewhere are re-assigned there (their state is
        there now)."""
        changed: list[Move] = []
        for r in results:
            if r.state_bytes:
                self.placement.sizes[r.task] = sum(r.state_bytes.values())
            if self.enabled and r.ran_on is not None:
                move = self.placement.ran(r.task, r.ran_on)
                if move is not None:
                    changed.append(move)
        away = [m for m in changed if m.old is not None]  # the others ran for the first time
        self._away = away
        for move in away:
            log.warning("host affinity: %s", move)
        store_assignment(self.store, {m.task: m.new for m in changed})  # one write per batch
        return BatchPlacement(self._moved, away)

    def committed(self, result: TaskBatchResult, checkpoint_id: str) -> None:
        """Note where ``result``'s task committed ``checkpoint_id`` and its state size, for
        :meth:`record_commits`."""
        record: dict[str, Any] = {
            "checkpoint": checkpoint_id,
            "worker": result.executor,
            "state-bytes": result.state_bytes,
            "group": result.group,
        }
        if result.ran_on is not None:
            record["executor"] = result.ran_on.id
            record["host"] = result.ran_on.host
        if result.watermark_ms is not None:  # (else the last one known: kept on)
            self._watermarks[result.task] = result.watermark_ms
        if result.task in self._watermarks:
            record["watermark"] = self._watermarks[result.task]
        self._commits[result.task] = record

    def record_commits(self) -> None:
        """Record the commits noted since the last call, after their checkpoints are written:
        one write for the batch, however many tasks."""
        if self._commits:
            store_task_locality(self.store, self._commits)
            self._commits = {}

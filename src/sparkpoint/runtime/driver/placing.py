"""Where each batch's tasks run, and their standby copies: the driver's glue between its
runner and :class:`~.affinity.HostAffinity` and :class:`~.standby.Standbys`.

Before a batch (:meth:`TaskPlacer.place`): each task's preferred executor, standby copies
placed, and the copies a restoring task may promote offered to its plan. After the batch's
checkpoints are written (:meth:`TaskPlacer.catch_up`): one Spark job brings every copy behind
to its task's last written checkpoint. Only a runner that :attr:`~.BatchRunner.places_tasks`
is asked for executors or catch-ups (the runner contract, :mod:`sparkpoint.runtime.runner`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.metadata.locality import Executor
from sparkpoint.runtime.driver.affinity import HostAffinity
from sparkpoint.runtime.driver.reports import StandbyReport
from sparkpoint.runtime.driver.standby import Standbys
from sparkpoint.runtime.runner import BatchRunner
from sparkpoint.storage.standby import FACTOR

log = logging.getLogger(__name__)


class TaskPlacer:
    """Host affinity and standby copies, batch by batch."""

    def __init__(self, affinity: HostAffinity, standbys: Standbys) -> None:
        self.affinity = affinity
        self.standbys = standbys
        self._live: list[Executor] = []  # the live executors the last placement or catch-up saw
        #: this batch's standby copies a restoring task may promote (Standbys.offers)
        self.offers: dict[str, tuple[tuple[str, str], ...]] = {}

    def place(self, runner: BatchRunner) -> dict[str, str]:
        """Host affinity: each task's preferred executor for the next batch (none unless the
        runner runs on a Spark cluster and ``job.host-affinity.enabled``); standby copies
        placed, and those to promote offered to their tasks' plans."""
        self.offers = {}
        if not runner.places_tasks:
            return {}  # a runner of the driver's own (the restore ahead, the last pass)
        live = runner.executors()
        if live is None:
            self.no_standbys("the job runs in local mode: one executor")
        self._live = list(live or [])
        promotion = self.standbys.promotion(self._live)
        locations = self.affinity.place(live, promotion)
        self.offers = self.standbys.offers()
        self.standbys.place(self._live, self.affinity.placement.assignment)
        return locations

    def no_standbys(self, why: str) -> None:
        """Say once that standbys were asked for but cannot be kept, and why."""
        if self.standbys.enabled:
            log.warning(
                "%s=%d: no standby can be placed (%s); tasks restore from their backends",
                FACTOR,
                self.standbys.factor,
                why,
            )
            self.standbys.enabled = False

    def catch_up(
        self, runner: BatchRunner, checkpoints: Mapping[str, Checkpoint | None]
    ) -> StandbyReport:
        """After a batch: bring every standby copy to its task's last written checkpoint (one
        Spark job, when any is behind). A failed catch-up loses no state: its copies are
        seeded again."""
        report = StandbyReport()
        standbys = self.standbys
        if not standbys.enabled or not runner.places_tasks:
            return report
        # the executors alive now, not at the batch's start: a catch-up job whose partition
        # prefers an executor lost during the batch waits spark.locality.wait (30 s) for it
        self._live = list(runner.executors() or [])
        standbys.place(self._live, self.affinity.placement.assignment)  # tasks that ran away
        plans = standbys.plans(standbys.config.to_dict(), dict(checkpoints), self._live)
        if plans:
            t0 = time.monotonic()
            try:
                results = runner.catch_up(plans)
            except Exception as exc:  # an executor lost during it: the copies say what changed
                first = str(exc).splitlines()[0] if str(exc) else ""
                standbys.failed(plans, f"{type(exc).__name__}: {first}")
                results = []
            report.seconds = time.monotonic() - t0
            done = [r for r in results if r.error is None]
            report.seeded = sum(r.seeded for r in done)
            report.caught_up = sum(not r.seeded for r in done)
            report.records = sum(r.records for r in done if not r.seeded)
            standbys.caught_up(results, dict(checkpoints))
        report.lags = standbys.lags()
        report.copies = sum(len(c) for c in standbys.copies.values())
        return report

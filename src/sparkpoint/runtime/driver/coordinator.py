"""The job coordinator, running in the Spark driver: the one writer of the checkpoint stream.

:meth:`JobCoordinator.start` builds the job model (one task per input partition number),
reads each task's last checkpoint and works out where every SSP starts, in the named steps of
:mod:`.startup`. :meth:`JobCoordinator.run` hands the batches to the loop (:mod:`.loop`), and
:meth:`JobCoordinator.run_batch` runs one of them in five phases:

1. **plan**: each task's plan (how far it reads, the state it must have, where it runs:
   :mod:`.placing`), the batch logged first for exact batches (:mod:`.logged_batches`);
2. **run**: the runner runs the plans (:mod:`sparkpoint.runtime.runner`);
3. **apply**: each task's result checked against what the driver expects, the checkpoints it
   completed queued (the commit's step 4, docs/architecture.md);
4. **commit**: the queued checkpoints written in one append, then the startpoints they cover
   removed (step 5) and the batch log pruned;
5. **maintain**: standby copies caught up (:mod:`.placing`); retention and compaction after a
   commit (:mod:`.maintenance`, from the loop).

Stopping (a signal, ``max_batches``, a task's ``coordinator.shutdown()``, or being caught up with
``until_caught_up``) always ends with a batch in which every task commits.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.checkpoint.offsets import OffsetManager
from sparkpoint.config import Config
from sparkpoint.errors import BatchInterrupted, UserError
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.job_state import (
    DriverConflict,
    Heartbeat,
)
from sparkpoint.model import JobModel, SystemStreamPartition
from sparkpoint.runtime.driver import startup
from sparkpoint.runtime.driver.accounting import count_restores, report_batch
from sparkpoint.runtime.driver.affinity import BatchPlacement, HostAffinity
from sparkpoint.runtime.driver.batch_outputs import BatchOutputsLost
from sparkpoint.runtime.driver.batchlog import BatchLog
from sparkpoint.runtime.driver.commits import CheckpointWriter
from sparkpoint.runtime.driver.global_tables import GlobalTableVersions
from sparkpoint.runtime.driver.logged_batches import LoggedBatches
from sparkpoint.runtime.driver.loop import MicroBatchLoop
from sparkpoint.runtime.driver.maintenance import Maintenance
from sparkpoint.runtime.driver.metrics import MetricsReporters
from sparkpoint.runtime.driver.placing import TaskPlacer
from sparkpoint.runtime.driver.reports import (
    BatchReport,
    Listener,
    RunSummary,
    StandbyReport,
    Transactions,
)
from sparkpoint.runtime.driver.shutdown import ShutdownWatch
from sparkpoint.runtime.driver.standby import Standbys
from sparkpoint.runtime.driver.task_state import DriverTasks
from sparkpoint.runtime.plan import Commits, TaskBatchPlan, TaskBatchResult
from sparkpoint.runtime.runner import BatchRunner, RunBatch, as_runner
from sparkpoint.startpoint.manager import StartpointManager
from sparkpoint.storage.outputs import (
    stages_output,
)
from sparkpoint.storage.state_id import CleanStart
from sparkpoint.storage.tables import check_tables
from sparkpoint.system.base import PartitionMetadata
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import job_model

log = logging.getLogger(__name__)

#: batches in a row the driver may rewind (an executor lost, exact output lost) before it stops
MAX_REWINDS = 5


class JobCoordinator:
    """Starts the job, runs its micro-batches on the driver, and writes its checkpoints."""

    def __init__(
        self,
        config: Config,
        runner: BatchRunner | RunBatch,
        *,
        listener: Listener | None = None,
        systems: Systems | None = None,
        force: bool = False,
    ) -> None:
        self.config = config
        #: start even while another driver's heartbeat is fresh (``sparkpoint run --force``)
        self.force = force
        self.heartbeat: Heartbeat | None = None
        self.runner = as_runner(runner)
        #: a runner in the driver's process for the run's last pass, which reads nothing; set
        #: when the driver shares the executors' disk (local mode): it saves a Spark job
        self.local_runner: BatchRunner | None = None
        self.listener = listener
        self.reporters: MetricsReporters | None = None  # started with the job (metrics.reporters)
        self.systems = systems or Systems(config)
        self.checkpoints = CheckpointManager(config, self.systems)
        self.offsets = OffsetManager(config, self.systems)
        self.run_id = uuid.uuid4().hex[:12]
        #: the run id the tasks see: a new one each time the driver rewinds (see :meth:`_rewind`)
        self.lineage = self.run_id
        self._rewinds = 0  # in a row: batches rewound since the last one that kept its output
        self.stop_event = threading.Event()
        self.stop_reason = ""
        #: task.shutdown.ms: how long a stop asked from outside waits for the run to end
        self.shutdown = ShutdownWatch(config, lambda: self.runner.cancel())
        self.model: JobModel | None = None
        self.metadata_store: CoordinatorStreamStore | None = None
        self.startpoints: StartpointManager | None = None
        self.tasks = DriverTasks(config, self.systems)
        self.placer: TaskPlacer | None = None  # host affinity and standbys, from the start
        self.maintenance = Maintenance(config, self.systems)
        self.batch = 0  # the last batch's id
        self.exact_batches = self.runner.exact_batches
        #: exact batches: the batch log and the batches it replays (opened at start)
        self.logged: LoggedBatches | None = None
        #: startpoints wait for the replay of logged batches (:meth:`.JobStart.fan_out_startpoints`)
        self.startpoints_after_replay = False
        self.discarded = 0  # staged parts the start discarded, for the first batch report
        #: transactions committed and aborted since the driver started (every report carries
        #: the totals, so a report nobody forwards to the metrics loses no count)
        self.tx = Transactions()
        #: the global tables' versions the tasks see (read from the sources at start)
        self.global_tables = GlobalTableVersions(config, self.systems)
        self.writer = CheckpointWriter(
            config, self.systems, self.checkpoints, self.tasks, self.tx, self.check_still_the_driver
        )
        self.writer.global_tables = self.global_tables
        self.last_commit = time.monotonic()
        self.last_window = time.monotonic()
        #: the tasks' state may differ from their last commits' (true at start: startpoints
        #: may have moved them); see :meth:`.DriverLoop.note_changes`
        self.changed_since_commit = True
        #: the restore ahead's pass (restore_ahead), counted in the run's summary
        self._restored_ahead: BatchReport | None = None

    @property
    def affinity(self) -> HostAffinity | None:
        return None if self.placer is None else self.placer.affinity

    @property
    def standbys(self) -> Standbys | None:
        return None if self.placer is None else self.placer.standbys

    @property
    def batch_log(self) -> BatchLog | None:
        return None if self.logged is None else self.logged.log

    # -- start-up (the steps of :mod:`.startup`)
    def all_ssps(self) -> list[SystemStreamPartition]:
        """Every SSP some task reads (inputs and broadcast inputs)."""
        inputs, shared = self.systems.job_inputs(self.config.inputs, self.config.broadcast_inputs)
        return sorted(set(inputs) | set(shared))

    def partition_metadata(
        self, ssps: list[SystemStreamPartition]
    ) -> dict[SystemStreamPartition, PartitionMetadata]:
        """Each SSP's committed partition metadata (its oldest and upcoming offsets)."""
        out: dict[SystemStreamPartition, PartitionMetadata] = {}
        by_system: dict[str, list[SystemStreamPartition]] = {}
        for ssp in ssps:
            by_system.setdefault(ssp.system, []).append(ssp)
        for system, members in by_system.items():
            out.update(self.systems.admin(system).get_committed_metadata(members))
        return out

    def upcoming(self) -> dict[SystemStreamPartition, str]:
        """Each SSP's upcoming offset: the ends of a batch that reads everything there is."""
        return {s: m.upcoming for s, m in self.partition_metadata(self.all_ssps()).items()}

    def start(self) -> JobModel:
        """The job's start-up, step by step; then :meth:`run` loops over batches."""
        if stages_output(self.config):
            startup.check_exactly_once(self.config, self.checkpoints)
        startup.check_registry_serdes(self.config)
        startup.prepare_intermediate_streams(self.config, self.systems)
        job_model(self.config, self.systems)
        self.all_ssps()  # every input exists, before anything is written
        check_tables(self.config, self.systems)
        self._claim_the_job()
        steps = startup.JobStart(self)
        try:
            model, fanned = steps.run()
        except BaseException:  # a start refused after the claim lets the job go
            self._release_the_job()
            raise
        steps.announce(model, fanned)
        return model

    def coordinator_store(self) -> CoordinatorStreamStore:
        """The job's coordinator stream, open from the start on."""
        assert self.metadata_store is not None, "the job's metadata store opens at start()"
        return self.metadata_store

    def _claim_the_job(self) -> None:
        """Refuse to start while another driver runs the job (unless forced), then beat: from
        here on a second driver refuses to start, and this one stops if another takes over."""
        heartbeat = Heartbeat(self.config, self.run_id)
        heartbeat.start(force=self.force)
        self.heartbeat = heartbeat

    def check_still_the_driver(self) -> None:
        """Stop (raise) when another driver took the job over since the last heartbeat."""
        if self.heartbeat is not None and self.heartbeat.conflict is not None:
            raise DriverConflict(self.heartbeat.conflict)

    # -- the batches
    def stop(self, reason: str = "stopped", *, bounded: bool = False) -> None:
        """Ask the loop to finish the current batch, commit and return. Thread- and signal-safe.
        ``bounded`` (a signal, Ctrl-C): for ``task.shutdown.ms`` at most; then the batch is
        cancelled and :meth:`run` raises :class:`~sparkpoint.errors.ShutdownOverdue`."""
        self.stop_reason = self.stop_reason or reason
        self.stop_event.set()
        if bounded:
            self.shutdown.arm(reason)

    def run(
        self,
        *,
        until_caught_up: bool = False,
        max_batches: int | None = None,
        final_watermark: bool = False,
    ) -> RunSummary:
        """Run batches until stopped; always finish with a commit of every task.
        ``final_watermark`` (with ``until_caught_up``): once caught up, every event-time timer
        fires before that commit (:meth:`MicroBatchLoop.end_input`)."""
        if final_watermark and not until_caught_up:
            raise UserError(
                "--final-watermark ends the input once the run is caught up: use it with "
                "--until-caught-up"
            )
        if self.model is None:
            self.start()
        try:
            loop = MicroBatchLoop(self, until_caught_up, max_batches, final_watermark)
            summary = loop.run()
            self.maintenance.finish()
            return summary
        except Exception:
            if self.shutdown.overdue:  # the batch failed because the shutdown cancelled it
                raise self.shutdown.error() from None
            raise
        finally:
            self.shutdown.disarm()
            with contextlib.suppress(Exception):  # an error of its own is raised above
                self.maintenance.finish()
            self._release_the_job()

    def run_batch(
        self,
        end: Mapping[SystemStreamPartition, str],
        *,
        commit: bool,
        window: bool = False,
        wait: bool = False,
        batch_id: int | None = None,
        clean_up_only: bool = False,
        logged: bool = True,
        end_of_input: bool = False,
    ) -> tuple[BatchReport, list[TaskBatchResult]]:
        """One micro-batch, in its five phases; ``wait`` makes tasks finish their uploads
        before returning. ``batch_id`` replays a logged batch under its old id;
        ``logged=False`` keeps the batch out of the batch log; ``end_of_input``: see
        :class:`~sparkpoint.runtime.plan.Commits`."""
        logged = logged and self.logged is not None
        commits = Commits(commit, window, wait, clean_up_only, end_of_input)
        plans = self._plan_batch(end, commits, batch_id, logged)
        self.writer.to_publish = 0  # the batch's clean-ups publish what was written before it
        results, seconds = self._run_plans(plans, logged=logged, clean_up_only=clean_up_only)
        placed = self.affinity.ran(results) if self.affinity else BatchPlacement([], [])
        committed = self._apply_results(results)
        standby = (  # phase 5
            self.placer.catch_up(
                self.runner, {n: ts.last_checkpoint for n, ts in self.tasks.items()}
            )
            if self.placer is not None
            else StandbyReport()
        )
        if commit or committed:
            self.last_commit = time.monotonic()
        if window:
            self.last_window = time.monotonic()
        report = BatchReport.of_batch(
            self.batch,
            seconds,
            results,
            committed=committed,
            moved=placed.moved,
            away=placed.away,
            parts_discarded=self.discarded,
            parts_open={
                n: sum(map(len, ts.pending_outputs.values())) for n, ts in self.tasks.items()
            },
            parts_to_publish=self.writer.to_publish,
            transactions=self.transactions(),
            standby=standby,
        )
        self.discarded = 0
        if report.uploads:
            log.info("batch %d commits: %s", self.batch, report.uploads)
        return report, results

    def _plan_batch(
        self,
        end: Mapping[SystemStreamPartition, str],
        commits: Commits,
        batch_id: int | None,
        logged: bool,
    ) -> list[TaskBatchPlan]:
        """Phase 1: the batch's id (logged first for exact batches) and every task's plan."""
        self.writer.refuse_if_unwritten()
        if batch_id is not None:
            self.batch = batch_id
        else:  # after a replay's old id: past every logged one (ids are never given twice)
            last_logged = self.logged.log.last_id if self.logged is not None else 0
            self.batch = max(self.batch, last_logged) + 1
        if logged and self.logged is not None:
            self.logged.log.record(self.batch, end)
        locations = self.placer.place(self.runner) if self.placer is not None else {}
        offers = self.placer.offers if self.placer is not None else {}
        return self.tasks.plans(
            self.lineage,
            self.batch,
            end,
            commits,
            locations=locations,
            offers=offers,
            global_tables=self.global_tables.current,
        )

    def _run_plans(
        self, plans: list[TaskBatchPlan], *, logged: bool, clean_up_only: bool
    ) -> tuple[list[TaskBatchResult], float]:
        """Phase 2: the runner runs the plans; their results and the seconds the run took. An
        interrupted batch, or (exact batches) one whose staged output a task lost, has no
        results to apply: every task rewinds."""
        t0 = time.monotonic()
        try:
            results = self.runner(self.batch, plans)
        except BatchInterrupted as exc:
            self.tx.aborted += bool(self.runner.staged)
            self._rewind(exc)
            return [], time.monotonic() - t0
        seconds = time.monotonic() - t0
        if logged and self.logged is not None:
            try:
                self.logged.record(
                    self.batch,
                    self.runner.staged,
                    results,
                    clean_up_only=clean_up_only,
                    runner=type(self.runner).__name__,
                )
            except BatchOutputsLost as exc:
                self._rewind(exc)
                return [], seconds
        self._rewinds = 0  # a batch that kept its output
        return results, seconds

    def _rewind(self, why: BatchInterrupted | BatchOutputsLost) -> None:
        """Start every task again from its last written checkpoint, as a restart does, without
        one: a new lineage (the tasks restore, abandoning the commits in flight, and the
        DataFrame phases of a replayed batch id start afresh), the offsets of the checkpoints,
        and the batch log's uncovered batches replayed under their own ids. Too many rewinds
        in a row stop the job."""
        self._rewinds += 1
        if self._rewinds > MAX_REWINDS:
            more = (
                ""
                if isinstance(why, BatchInterrupted)
                else " (a task keeps losing its progress: see the executors' logs)"
            )
            raise type(why)(
                f"{why}; {MAX_REWINDS} batches in a row were rewound: the job stops{more}"
            ) from why
        log.warning("%s; every task starts again from its last checkpoint", why)
        self.lineage = f"{self.run_id}-r{self._rewinds}"
        self.tx.aborted += sum(1 for ts in self.tasks.values() if ts.pending_outputs)
        for ts in self.tasks.values():
            ts.expected_state_id = CleanStart(self.lineage)
            ts.resume = dict(ts.from_checkpoint)
            ts.last_processed = dict(ts.checkpoint_last_processed)
            ts.pending_outputs = {}
        if self.logged is not None:
            self.logged.rewind(self.tasks.checkpointed(), self.tasks.cmp)

    def _apply_results(self, results: list[TaskBatchResult]) -> bool:
        """Phases 3 and 4: apply each task's result, then write the checkpoints they
        completed; whether any was written."""
        for r in results:
            if r.promoted_copy is not None and self.standbys is not None:
                self.standbys.taken(r.task, r.promoted_copy)
        committed = False
        try:
            for result in sorted(results, key=lambda r: r.task):
                committed = self.writer.apply(result) or committed
        finally:  # a later task's error leaves the earlier ones' checkpoints written
            self.writer.write_queued()
        if committed and self.logged is not None:
            self.logged.prune(self.tasks.checkpointed(), self.tasks.cmp)
        return committed

    def apply(self, result: TaskBatchResult) -> bool:
        """Apply one task's result (:meth:`CheckpointWriter.apply`); whether it committed."""
        return self.writer.apply(result)

    def transactions(self) -> Transactions:
        """The transactions committed and aborted since the driver started, and those open."""
        done = Transactions(self.tx.committed, self.tx.aborted)
        done.open = sum(1 for ts in self.tasks.values() if ts.pending_outputs)
        done.open += 0 if self.logged is None else len(self.logged.log.outputs)
        return done

    def commit_all(self, attempts: int = 3) -> list[BatchReport]:
        """Batches that read nothing and commit every task, waiting for the uploads, until every
        task's state is a written checkpoint (a task whose previous commit was still waiting to
        be written commits again in the next one)."""
        reports = []
        for _ in range(attempts):
            report, results = self.run_batch(self.tasks.resumes(), commit=True, wait=True)
            reports.append(report)
            if all(r.state_id.committed for r in results):
                break
        return reports

    def clean_up(self) -> None:
        """A pass that reads nothing: tasks clean up after their last checkpoint (step 0), so
        a stopped job leaves no superseded local checkpoints or remote snapshots behind."""
        with self.running_on(self.local_runner or self.runner):
            self.run_batch(self.tasks.resumes(), commit=False, clean_up_only=True)

    def restore_ahead(self, runner: BatchRunner | RunBatch) -> BatchReport | None:
        """Establish every task's state with ``runner`` before the first batch: one pass that
        reads nothing (like the last pass of a run). The first batch then finds each task's
        state current and keeps it. ``sparkpoint run`` uses this in local mode, where the
        driver shares the executors' disk, to restore while Spark starts
        (:mod:`sparkpoint.runtime.driver.launch`). Returns None, doing nothing, while batches
        logged before the last stop wait to be replayed under their own ids."""
        if self.model is None:
            self.start()
        if self.logged is not None and self.logged.replay:
            return None
        with self.running_on(runner):
            # under the last batch's id, unlogged: the first batch that reads is still the
            # next id, as it is without this pass
            report, _ = self.run_batch(
                self.tasks.resumes(),
                commit=False,
                clean_up_only=True,
                batch_id=self.batch,
                logged=False,
            )
        report.ahead = True
        if self.listener:
            self.listener.on_batch(report)
        self._restored_ahead = report
        return report

    def count_restored_ahead(self, summary: RunSummary) -> None:
        """The restore ahead's restores are the run's (it is no batch)."""
        if self._restored_ahead is not None:
            count_restores(summary, self._restored_ahead)

    @contextlib.contextmanager
    def running_on(self, runner: BatchRunner | RunBatch) -> Iterator[None]:
        """Run the batches of the block with ``runner`` instead of the job's runner."""
        saved, self.runner = self.runner, as_runner(runner)
        try:
            yield
        finally:
            self.runner = saved

    def apply_deferred_startpoints(self, summary: RunSummary) -> None:
        """The startpoints a start left waiting (:meth:`.JobStart.fan_out_startpoints`), once
        no logged batch waits to be replayed: every task commits (its checkpoint covers the
        replayed batches), then they apply."""
        replaying = self.logged is not None and bool(self.logged.replay)
        if self.startpoints_after_replay and not replaying:
            self.startpoints_after_replay = False
            log.info("applying the startpoints set while the job was stopped")
            self.report(summary, self.apply_startpoints_now())

    def apply_startpoints_now(self) -> BatchReport:
        """Commit every task, fan out the waiting startpoints, and resume from them (no restart)."""
        report = self.commit_all()[-1]
        self.changed_since_commit = True  # the tasks move to the startpoints
        assert self.startpoints is not None
        fanned = self.startpoints.fan_out(
            {ts.model.name: ts.model.ssps for ts in self.tasks.values()}
        )
        for task, sps in fanned.items():
            ts = self.tasks[task.name]
            for ssp, sp in sps.items():
                offset = self.systems.admin(ssp.system).resolve_startpoint_to_offset(ssp, sp)
                log.warning(
                    "task %s: %s resumes at %s from startpoint %s (applied now)",
                    task,
                    ssp,
                    offset,
                    sp.describe(),
                )
                ts.resume[ssp] = ts.from_checkpoint[ssp] = offset
                ts.last_processed.pop(ssp, None)
                ts.checkpoint_last_processed.pop(ssp, None)
                ts.startpoints.add(ssp)
                if self.listener:
                    self.listener.on_startpoint(task.name, ssp, offset, sp.describe())
            self.startpoints.pin_fan_out(task, {s: ts.resume[s] for s in sps})
        return report

    def report(self, summary: RunSummary, report: BatchReport) -> None:
        """Count a batch in the run's summary, show it, and record its metrics."""
        report_batch(summary, report, self.listener, self.reporters)

    def _release_the_job(self) -> None:
        """Stop beating and remove this driver's heartbeat (the end of a run). Idempotent."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None

    def close(self) -> None:
        self._release_the_job()
        if self.reporters is not None:
            self.reporters.close()
            self.reporters = None
        if self.metadata_store is not None:
            self.metadata_store.close()
        self.checkpoints.close()
        self.systems.close()

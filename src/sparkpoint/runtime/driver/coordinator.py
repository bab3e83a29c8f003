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

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV2
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.checkpoint.offsets import OffsetManager
from sparkpoint.config import Config
from sparkpoint.errors import BatchInterrupted, SparkpointError
from sparkpoint.failpoints import maybe_crash
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.job_state import (
    DriverConflict,
    Heartbeat,
    assign_changelog_partitions,
    check_input_partitions,
    refuse_unfinished_reset,
    store_config,
)
from sparkpoint.model import JobModel, SystemStreamPartition, TaskName
from sparkpoint.model.startpoint import Startpoint
from sparkpoint.runtime.driver import startup
from sparkpoint.runtime.driver.accounting import count_restores, report_batch
from sparkpoint.runtime.driver.affinity import BatchPlacement, HostAffinity
from sparkpoint.runtime.driver.batch_outputs import BatchOutputsLost
from sparkpoint.runtime.driver.batchlog import BatchLog
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
from sparkpoint.runtime.driver.standby import Standbys
from sparkpoint.runtime.driver.task_state import DriverTasks, TaskState, parts_of
from sparkpoint.runtime.plan import Commits, TaskBatchPlan, TaskBatchResult
from sparkpoint.runtime.runner import BatchRunner, RunBatch, as_runner
from sparkpoint.startpoint.manager import StartpointManager
from sparkpoint.storage.backend import v1_changelog_offsets
from sparkpoint.storage.outputs import (
    committed_parts,
    exactly_once,
    foreign_parts,
    settle,
    stages_output,
    uncovered,
)
from sparkpoint.storage.reshard import finish_pending
from sparkpoint.storage.state_id import EMPTY, CleanStart, CommittedState, StateId, check_transition
from sparkpoint.storage.tables import check_tables
from sparkpoint.system.base import PartitionMetadata
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import job_model

log = logging.getLogger(__name__)

#: batches in a row the driver may rewind (an executor lost, exact output lost) before it stops
MAX_REWINDS = 5

Fanned = Mapping[TaskName, Mapping[SystemStreamPartition, Startpoint]]


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
        #: startpoints wait for the replay of logged batches (:meth:`_fan_out_startpoints`)
        self.startpoints_after_replay = False
        self._discarded = 0  # staged parts the start discarded, for the first batch report
        #: staged parts named by the checkpoints written since the last batch began (its
        #: clean-ups publish them)
        self.to_publish = 0
        #: checkpoints the batch's results completed, written together (_write_queued)
        self._queued: list[tuple[TaskState, CheckpointV2]] = []
        #: why writing queued checkpoints failed: no batch runs after that (run_batch)
        self._unwritten: str | None = None
        #: transactions committed and aborted since the driver started (every report carries
        #: the totals, so a report nobody forwards to the metrics loses no count)
        self.tx = Transactions()
        self.last_commit = time.monotonic()
        self.last_window = time.monotonic()
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
        startup.prepare_intermediate_streams(self.config, self.systems)
        job_model(self.config, self.systems)
        self.all_ssps()  # every input exists, before anything is written
        check_tables(self.config, self.systems)
        self._claim_the_job()
        try:
            model, fanned = self._start_claimed()
        except BaseException:  # a start refused after the claim lets the job go
            self._release_the_job()
            raise
        self._announce(model, fanned)
        return model

    def _start_claimed(self) -> tuple[JobModel, Fanned]:
        # read again once the job is ours: a stream grown while this driver started (by a
        # tool that held the job, then let go) is one the tasks must be made for
        model = job_model(self.config, self.systems)
        ssps = self.all_ssps()
        store = self._open_coordinator_store()
        refuse_unfinished_reset(store, self.config.job_name)
        finish_pending(self.config, self.systems, store)  # an interrupted reshard
        check_input_partitions(store, self.config, startup.input_counts(self.config, ssps))
        model = assign_changelog_partitions(store, model)
        checkpoints, must_restore = self._prepare_state(model)
        fanned = self._fan_out_startpoints(model)
        self._plan_tasks(model, checkpoints, fanned, must_restore, self.partition_metadata(ssps))
        self.model = model
        self._start_services()
        return model, fanned

    def coordinator_store(self) -> CoordinatorStreamStore:
        """The job's coordinator stream, open from the start on."""
        assert self.metadata_store is not None, "the job's metadata store opens at start()"
        return self.metadata_store

    def _open_coordinator_store(self) -> CoordinatorStreamStore:
        """Compact the metadata streams, open the coordinator stream, store this run's config."""
        startup.compact_metadata_streams(self.config, self.systems)
        store = CoordinatorStreamStore(self.config, self.systems, source="coordinator")
        self.metadata_store = store
        store_config(store, self.config)
        startup.record_guarantee(self.config, store)
        return store

    def _prepare_state(self, model: JobModel) -> tuple[dict[TaskName, Checkpoint], set[TaskName]]:
        """Create and check the state backends' resources, read every task's last checkpoint,
        let each backend bound its storage by them and name the tasks whose committed state it
        lost, and delete state of stores no longer configured. The checkpoints, and the tasks
        that must restore before they process."""
        self.maintenance.finish()  # a pass of the last run: done before the admins change
        admins = startup.prepare_backends(self.config, model, self.systems, self.checkpoints)
        self.maintenance.admins = admins
        self.checkpoints.create_resources()
        checkpoints = dict(self.checkpoints.read_all())
        must_restore: set[TaskName] = set()
        for admin in admins:
            admin.hold_records(checkpoints, exactly_once(self.config))
            must_restore |= admin.lost_committed_state(checkpoints)
            admin.compact(checkpoints)
        startup.delete_unused_state(self.config, model, self.systems, checkpoints)
        # exactly-once output a crash left: published, or discarded (reported with batch 1)
        # (from the V2 checkpoints: only they name staged output, whatever the reads prefer)
        written = self.checkpoints.read_version(2)
        settled = settle(self.config, self.systems, written)
        # (not counted as aborted transactions: the run that staged them may have counted
        # them already, when its task restored; a crash's open ones were open in its metrics)
        self._discarded = settled.discarded
        return checkpoints, must_restore

    def _fan_out_startpoints(self, model: JobModel) -> Fanned:
        """Fan the waiting startpoints out to the tasks (each task's, new or left from before).

        A DataFrame pipeline's batch log changes that: the batches logged before the last
        stop were read from the checkpoints (or from the fan-outs of an earlier start, which
        apply now, as they did then), and the tasks whose checkpoints cover such a batch do
        not read its input again, so its rows (re-keyed ones too) come only from its recorded
        output or its replay. New startpoints apply after those batches are published or
        replayed, in the run's first batches (:meth:`apply_deferred_startpoints`)."""
        self.startpoints = StartpointManager(
            self.coordinator_store(), max_age_ms=self.config.get_int("task.startpoint.max.age.ms")
        )
        if not self.exact_batches:
            return self.startpoints.fan_out({t.name: t.ssps for t in model.tasks.values()})
        self.startpoints_after_replay = self.startpoints.waiting()
        earlier = {
            t.name: self.startpoints.get_fan_out_for_task(t.name) for t in model.tasks.values()
        }
        return {task: sps for task, sps in earlier.items() if sps}

    def _plan_tasks(
        self,
        model: JobModel,
        checkpoints: Mapping[TaskName, Checkpoint],
        fanned: Fanned,
        must_restore: set[TaskName],
        meta: Mapping[SystemStreamPartition, PartitionMetadata],
    ) -> None:
        """Where each task starts: its offsets (startpoint, else checkpoint, else the stream's
        policy) and the state it must start from."""
        clean_start = any(
            self.config.get_bool(f"stores.{s}.clean.on.container.start") for s in self.config.stores
        )
        for task in model.sorted_tasks():
            ckpt = checkpoints.get(task.name)
            sps = fanned.get(task.name, {})
            nxt, last = self.offsets.starting_offsets(task, ckpt, meta, sps)
            if sps and self.startpoints is not None:  # a start before a checkpoint: the same
                self.startpoints.pin_fan_out(task.name, {s: nxt[s] for s in sps})
            expected: StateId = CommittedState(str(ckpt.checkpoint_id)) if ckpt else EMPTY
            if clean_start or task.name in must_restore:
                expected = CleanStart(self.lineage)  # matches no local state: the task restores
            self.tasks[task.name.name] = TaskState(
                model=task,
                last_checkpoint=ckpt,
                expected_state_id=expected,
                resume=dict(nxt),
                last_processed=dict(last),
                from_checkpoint=dict(nxt),
                checkpoint_last_processed=dict(last),
                startpoints=set(sps),
            )

    def _start_services(self) -> None:
        """Metrics reporters, host affinity and standbys, and (exact batches) the batch log."""
        if self.config.get_list("metrics.reporters") and self.reporters is None:
            self.reporters = MetricsReporters(self.config, self.systems)
        store = self.coordinator_store()
        affinity = HostAffinity(self.config, store, sorted(self.tasks))
        standbys = Standbys(
            self.config,
            store,
            {n: ts.model for n, ts in self.tasks.items()},
            # the last run's copies of a task whose committed state is trusted at this start:
            # not one that restores from scratch (its changelog was lost or recreated, or its
            # stores are cleaned at start), whose copies' changelog offsets mean nothing now
            {
                n: ts.last_checkpoint
                for n, ts in self.tasks.items()
                if isinstance(ts.expected_state_id, CommittedState)
            },
        )
        self.placer = TaskPlacer(affinity, standbys)
        if self.exact_batches:
            self.logged = LoggedBatches(self.config, self.systems, store, self.tx)
            self.runner.begin_epoch(self.logged.log.epoch)  # its sinks tell our batch ids apart
            self.logged.open(
                self.tasks.checkpointed(),
                self.tasks.cmp,
                startpoints_wait=self.startpoints_after_replay,
            )
            self.batch = self.logged.log.last_id

    def _announce(self, model: JobModel, fanned: Fanned) -> None:
        """Tell the listener the job started, and where startpoints make tasks read."""
        if self.listener is None:
            return
        self.listener.on_start(model)
        for task_name, sps in sorted(fanned.items()):
            ts = self.tasks[task_name.name]
            for ssp, sp in sorted(sps.items()):
                self.listener.on_startpoint(task_name.name, ssp, ts.resume[ssp], sp.describe())

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
    def stop(self, reason: str = "stopped") -> None:
        """Ask the loop to finish the current batch, commit and return. Thread- and signal-safe."""
        self.stop_reason = self.stop_reason or reason
        self.stop_event.set()

    def run(self, *, until_caught_up: bool = False, max_batches: int | None = None) -> RunSummary:
        """Run batches until stopped; always finish with a commit of every task."""
        if self.model is None:
            self.start()
        try:
            summary = MicroBatchLoop(self, until_caught_up, max_batches).run()
            self.maintenance.finish()
            return summary
        finally:
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
    ) -> tuple[BatchReport, list[TaskBatchResult]]:
        """One micro-batch, in its five phases; ``wait`` makes tasks finish their uploads
        before returning. ``batch_id`` replays a logged batch under its old id;
        ``logged=False`` keeps the batch out of the batch log."""
        logged = logged and self.logged is not None
        plans = self._plan_batch(
            end, Commits(commit, window, wait, clean_up_only), batch_id, logged
        )
        t0 = time.monotonic()
        self.to_publish = 0  # the batch's clean-ups publish what was written before it
        results = self._run_plans(plans, logged=logged, clean_up_only=clean_up_only)
        seconds = time.monotonic() - t0
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
            parts_discarded=self._discarded,
            parts_open={
                n: sum(map(len, ts.pending_outputs.values())) for n, ts in self.tasks.items()
            },
            parts_to_publish=self.to_publish,
            transactions=self.transactions(),
            standby=standby,
        )
        self._discarded = 0
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
        if self._unwritten is not None:
            raise SparkpointError(
                f"job {self.config.job_label}: this driver failed to write its tasks' "
                f"checkpoints ({self._unwritten}), so what it holds of them may not be what "
                "is written: start the job again (a new driver reads the written ones)"
            )
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
            self.lineage, self.batch, end, commits, locations=locations, offers=offers
        )

    def _run_plans(
        self, plans: list[TaskBatchPlan], *, logged: bool, clean_up_only: bool
    ) -> list[TaskBatchResult]:
        """Phase 2: the runner runs the plans. An interrupted batch, or (exact batches) one
        whose staged output a task lost, has no results to apply: every task rewinds."""
        try:
            results = self.runner(self.batch, plans)
        except BatchInterrupted as exc:
            self.tx.aborted += bool(self.runner.staged)
            self._rewind(exc)
            return []
        if logged and self.logged is not None:
            try:
                self.logged.record(
                    self.batch, self.runner.staged, results, clean_up_only=clean_up_only
                )
            except BatchOutputsLost as exc:
                self._rewind(exc)
                return []
        self._rewinds = 0  # a batch that kept its output
        return results

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
                committed = self.apply(result) or committed
        finally:  # a later task's error leaves the earlier ones' checkpoints written
            self._write_queued()
        if committed and self.logged is not None:
            self.logged.prune(self.tasks.checkpointed(), self.tasks.cmp)
        return committed

    def apply(self, result: TaskBatchResult) -> bool:
        """Phase 3 for one task: check its state's transition, move its offsets on, and queue
        the checkpoints it completed; whether any was queued."""
        ts = self.tasks[result.task]
        check_transition(result.task, result.batch, ts.expected_state_id, result.state_id)
        ts.expected_state_id = result.state_id
        ts.resume = dict(result.next_offsets)
        ts.last_processed = dict(result.last_processed)
        ts.processed += result.processed
        # parts it held that the task no longer does: it restored, and that output is gone
        self.tx.aborted += bool(parts_of(ts.pending_outputs) - parts_of(result.staged_outputs))
        ts.pending_outputs = dict(result.staged_outputs)
        for info in result.restored:
            log.info(
                "task %s store %s: state from %s (%d entries, %d bytes, %.2fs)",
                result.task,
                info.store,
                info.source,
                info.entries,
                info.bytes,
                info.seconds,
            )
        written = False
        bases = result.completed_bases or [None] * len(result.completed_checkpoints)
        for text, base in zip(result.completed_checkpoints, bases, strict=True):
            checkpoint = CheckpointV2.loads(text)
            if not self._writable(ts, result, checkpoint, base):
                continue
            self._queue_checkpoint(ts, checkpoint)
            held = parts_of(ts.pending_outputs)
            ts.pending_outputs = uncovered(ts.pending_outputs, checkpoint)
            self.tx.committed += held != parts_of(ts.pending_outputs)
            # its parts go out with the task's next clean-up (the next batch's step 0)
            self.to_publish += len(committed_parts(checkpoint))
            written = True
            if self.affinity is not None:
                self.affinity.committed(result, str(checkpoint.checkpoint_id))
        return written

    @staticmethod
    def _writable(
        ts: TaskState, result: TaskBatchResult, checkpoint: CheckpointV2, base: str | None
    ) -> bool:
        """Whether a commit the task completed may be written: newer than the last written,
        built on it, and naming no output the task no longer holds."""
        last = ts.last_checkpoint
        if last is not None and checkpoint.checkpoint_id <= last.checkpoint_id:
            return False
        last_id = None if last is None else str(last.checkpoint_id)
        if base != last_id:
            # built on another checkpoint than the last written one (the task ran on two
            # executors at once, e.g. an upload that finished after the task moved): its
            # snapshot forks the chain, and writing it would let two clean-ups delete each
            # other's blobs. Dropped; its uploads expire with their TTL.
            log.info(
                "task %s: not writing commit %s, built on %s instead of the last written %s",
                result.task,
                checkpoint.checkpoint_id,
                base,
                last_id,
            )
            return False
        foreign = foreign_parts(checkpoint, result.staged_outputs)
        if foreign:
            # a commit of a lineage the task left (it restored since): its output was
            # staged again by this one, and writing it would publish that twice
            log.warning(
                "task %s: not writing commit %s: it names output (%s) the task no longer "
                "holds since it restored",
                result.task,
                checkpoint.checkpoint_id,
                ", ".join(foreign[:3]),
            )
            return False
        return True

    def transactions(self) -> Transactions:
        """The transactions committed and aborted since the driver started, and those open."""
        done = Transactions(self.tx.committed, self.tx.aborted)
        done.open = sum(1 for ts in self.tasks.values() if ts.pending_outputs)
        done.open += 0 if self.logged is None else len(self.logged.log.outputs)
        return done

    def _queue_checkpoint(self, ts: TaskState, checkpoint: CheckpointV2) -> None:
        """Step 4 of the commit (docs/architecture.md), queued: the driver's view moves on now,
        and :meth:`_write_queued` writes the batch's checkpoints in one append before anything
        that depends on them being durable (the startpoints they cover, a publish, the batch
        log's pruning). A failed write stops the driver, so its view is never acted on."""
        self._queued.append((ts, checkpoint))
        ts.last_checkpoint = checkpoint
        for ssp, offset in checkpoint.input_offsets.items():
            if ssp in ts.model.ssps:
                ts.from_checkpoint[ssp] = self.systems.admin(ssp.system).offset_after(ssp, offset)
        ts.checkpoint_last_processed = {
            s: o for s, o in checkpoint.input_offsets.items() if s in ts.model.ssps
        }

    def _write_queued(self) -> None:
        """Phase 4: write the queued checkpoints: one message per task and configured version,
        one flush; then step 5, the startpoints they cover; then where each task committed."""
        queued, self._queued = self._queued, []
        if not queued:
            return
        try:
            self.check_still_the_driver()
            self.checkpoints.write_checkpoints(
                [
                    (
                        ts.model.name,
                        c,
                        v1_changelog_offsets(self.config, c.state_checkpoint_markers),
                    )
                    for ts, c in queued
                ],
                after_each=lambda flush: maybe_crash(self.config, "after-checkpoint-write", flush),
            )
        except BaseException as exc:
            # the driver's view moved on with checkpoints some of which may not be written: a
            # batch planned from it could clean up after a checkpoint nobody can read
            self._unwritten = f"{type(exc).__name__}: {exc}"
            raise
        if exactly_once(self.config):  # the state records they cover become visible
            written: list[tuple[TaskName, Checkpoint]] = [(ts.model.name, c) for ts, c in queued]
            for admin in self.maintenance.admins:
                admin.commit_records(written)
        for ts, checkpoint in queued:
            covered = {s for s in ts.startpoints if s in checkpoint.input_offsets}
            if covered and self.startpoints is not None:
                # step 5 of the commit: the checkpoint holds offsets read after the startpoint
                self.startpoints.remove_fan_out_for_task(ts.model.name, covered)
                ts.startpoints -= covered
        if self.affinity is not None:
            self.affinity.record_commits()

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
        """The startpoints a start left waiting (:meth:`_fan_out_startpoints`), once no logged
        batch waits to be replayed: every task commits (its checkpoint covers the replayed
        batches), then they apply."""
        replaying = self.logged is not None and bool(self.logged.replay)
        if self.startpoints_after_replay and not replaying:
            self.startpoints_after_replay = False
            log.info("applying the startpoints set while the job was stopped")
            self.report(summary, self.apply_startpoints_now())

    def apply_startpoints_now(self) -> BatchReport:
        """Commit every task, fan out the waiting startpoints, and resume from them (no restart)."""
        report = self.commit_all()[-1]
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

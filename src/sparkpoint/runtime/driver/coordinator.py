"""The job coordinator, running in the Spark driver.

It builds the job model (one task per input partition number), reads each task's last checkpoint,
works out where every SSP starts (checkpoint, else the stream's reset/default policy), and then
loops over micro-batches: plan how far each task reads, run one Spark job with one partition per
task (through a :class:`BatchRunner`), collect each task's new offsets and state id, and write
the checkpoints of tasks that committed. It alone writes to the checkpoint stream.

Stopping (a signal, ``max_batches``, a task's ``coordinator.shutdown()``, or being caught up with
``until_caught_up``) always ends with a batch in which every task commits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV2
from sparkpoint.checkpoint.manager import CheckpointManager, checkpoint_stream_name
from sparkpoint.checkpoint.offsets import OffsetManager, check_in_range
from sparkpoint.config import Config
from sparkpoint.errors import BatchInterrupted, ConfigError, SparkpointError
from sparkpoint.failpoints import maybe_crash, maybe_pause
from sparkpoint.metadata.coordinator_stream import (
    CoordinatorStreamStore,
    coordinator_stream_name,
)
from sparkpoint.metadata.job_state import (
    DriverConflict,
    Heartbeat,
    PartitionCountChanged,
    assign_changelog_partitions,
    check_input_partitions,
    refuse_unfinished_reset,
    store_config,
)
from sparkpoint.metadata.locality import Executor
from sparkpoint.model import (
    JobModel,
    SystemStream,
    SystemStreamPartition,
    TaskModel,
    TaskName,
)
from sparkpoint.model.clock import fixed_ms, wall_ms
from sparkpoint.model.startpoint import Startpoint
from sparkpoint.runtime.driver import batch_outputs
from sparkpoint.runtime.driver.affinity import BatchPlacement, HostAffinity
from sparkpoint.runtime.driver.batchlog import BatchLog
from sparkpoint.runtime.driver.metrics import MetricsReporters
from sparkpoint.runtime.driver.reports import (
    BatchReport,
    BatchRunner,
    Listener,
    RunSummary,
    StandbyReport,
    Transactions,
)
from sparkpoint.runtime.driver.standby import Standbys
from sparkpoint.runtime.plan import (
    BatchOutputs,
    Commits,
    Reads,
    StartState,
    TaskBatchPlan,
    TaskBatchResult,
)
from sparkpoint.startpoint.manager import StartpointManager
from sparkpoint.storage.backend import (
    StateBackendAdmin,
    backend_factory,
    known_backends,
    store_backends,
    v1_changelog_offsets,
)
from sparkpoint.storage.outputs import (
    EXACTLY_ONCE,
    GUARANTEE,
    batch_owner,
    committed_parts,
    exactly_once,
    foreign_parts,
    guarantee,
    owner_of,
    settle,
    stages_output,
    staging_of,
    uncovered,
)
from sparkpoint.storage.reshard import finish_pending
from sparkpoint.storage.standby import FACTOR
from sparkpoint.storage.state_id import (
    EMPTY,
    CleanStart,
    CommittedState,
    StateId,
    check_transition,
)
from sparkpoint.storage.tables import check_tables
from sparkpoint.system.base import PartitionMetadata
from sparkpoint.system.registry import Systems
from sparkpoint.system.retention import earliest, protected, retention_of, trim
from sparkpoint.system.streams import ensure_stream, job_model

log = logging.getLogger(__name__)

#: batches in a row the driver may rewind (exactly-once DataFrame output) before it stops
MAX_REWINDS = 5


@dataclass
class TaskState:
    """What the driver knows about one task between batches."""

    model: TaskModel
    last_checkpoint: Checkpoint | None
    expected_state_id: StateId
    resume: dict[SystemStreamPartition, str]
    last_processed: dict[SystemStreamPartition, str]
    from_checkpoint: dict[SystemStreamPartition, str]
    checkpoint_last_processed: dict[SystemStreamPartition, str]
    processed: int = 0
    lag: int = 0
    # SSPs started from a startpoint; its fan-out entry goes once a checkpoint covers the SSP
    startpoints: set[SystemStreamPartition] = field(default_factory=set)
    # exactly-once: output staged since the last written checkpoint (storage.outputs)
    pending_outputs: dict[str, list[str]] = field(default_factory=dict)


def _lag(admin_cmp: Callable[[str, str], int], nxt: str, upcoming: str) -> int:
    try:
        return max(0, int(upcoming) - int(nxt))
    except ValueError:
        return 1 if admin_cmp(nxt, upcoming) < 0 else 0


def _parts(pending: Mapping[str, Sequence[str]]) -> set[str]:
    return {p for parts in pending.values() for p in parts}


def check_exactly_once(config: Config, checkpoints: CheckpointManager) -> None:
    """Refuse exactly-once output where it cannot hold: checkpoints that would not carry the
    staged output's markers (V2 only), or a restore that keeps a failed batch's changelog
    records (its state would count that batch, and the records would be published)."""
    if exactly_once(config) and not config.get_bool("task.transactional.state.checkpoint.enabled"):
        raise ConfigError(
            "job.processing.guarantee=exactly-once needs "
            "task.transactional.state.checkpoint.enabled=true (the default): a restore must "
            "drop the changelog records written after the checkpoint, or a failed batch's "
            "state changes would stay and be published with the next commit"
        )
    if 2 not in checkpoints.write_versions or checkpoints.read_versions[0] != 2:
        what = (
            "job.processing.guarantee=exactly-once"
            if exactly_once(config)
            else f"intermediate stream {config.intermediate_streams[0]}"
        )
        raise ConfigError(
            f"{what} needs V2 checkpoints, written and read first "
            "(task.checkpoint.write.versions with 2, task.checkpoint.read.versions starting "
            "with 2): only V2 names the staged output a checkpoint covers"
        )


def prepare_intermediate_streams(config: Config, systems: Systems) -> None:
    """Create the job's intermediate streams (``streams.<s>.samza.intermediate``) with their
    configured partition counts, after checking each is read by the job and can be staged."""
    intermediate = config.intermediate_streams
    unread = sorted(config.intermediate_names - {s.stream for s in intermediate})
    if unread:
        raise ConfigError(
            f"streams.{unread[0]}.samza.intermediate=true, but {unread[0]} is not in task.inputs: "
            "an intermediate stream is one the job writes and reads itself"
        )
    ours = (owner_of(config, TaskName("")), batch_owner(config))  # tasks' prefix, batches'
    for stream in intermediate:
        name = f"streams.{stream.stream}.samza"
        if (
            config.get_bool(f"{name}.reset.offset")
            or (config.get_str(f"{name}.offset.default") or "oldest") != "oldest"
        ):
            raise ConfigError(
                f"{name}.reset.offset / offset.default: an intermediate stream is read from "
                "where the job's checkpoints left it, else from its oldest message (it holds "
                "only what the job sent there): remove the setting"
            )
        staging = staging_of(systems, stream.system)  # refused here, naming it, before a batch
        ensure_stream(config, systems, stream)
        for ssp in systems.partitions_of([stream]):
            others = [
                o
                for o in staging.publishers(ssp.stream, ssp.partition)
                if not o.startswith(ours[0]) and o != ours[1]
            ]
            if others:
                raise ConfigError(
                    f"intermediate stream {stream}: {others[0]!r} wrote to it too (another job, "
                    f"or another job.id of this one), and this job would read its messages: "
                    f"give each job its own intermediate stream (e.g. "
                    f"{stream.stream}-{config.job_label})"
                )


def check_checkpoint_versions(config: Config, store: str, checkpoints: CheckpointManager) -> None:
    """Refuse versions that cannot carry the markers of a store's restore backends: a backend
    whose markers live only in V2 needs V2 checkpoints written and read."""
    v2_only = [
        n for n in store_backends(config, store, "restore") if not backend_factory(n).markers_in_v1
    ]
    if not v2_only:
        return
    for key, versions in (
        ("task.checkpoint.write.versions", checkpoints.write_versions),
        ("task.checkpoint.read.versions", checkpoints.read_versions),
    ):
        if 2 not in versions:
            raise ConfigError(
                f"{key}={','.join(map(str, versions))}: store {store} restores from "
                f"{', '.join(v2_only)}, whose markers only V2 checkpoints carry; include 2 "
                f"(the default: write 1,2 and read 2,1)"
            )


def _yield_cpu() -> None:
    """Lower this thread's scheduling priority (nice 10; on Linux a thread has its own): a
    pass of background work takes the CPU the batches leave. Elsewhere it runs as it is."""
    me = threading.get_native_id()
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + 10))


class JobCoordinator:
    """Plans and runs the job's micro-batches on the driver."""

    def __init__(
        self,
        config: Config,
        runner: BatchRunner,
        *,
        listener: Listener | None = None,
        systems: Systems | None = None,
        force: bool = False,
    ) -> None:
        self.config = config
        #: start even while another driver's heartbeat is fresh (``sparkpoint run --force``)
        self.force = force
        self.heartbeat: Heartbeat | None = None
        self.runner = runner
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
        self.tasks: dict[str, TaskState] = {}
        self.affinity: HostAffinity | None = None
        self.standbys: Standbys | None = None
        self._backend_admins: list[StateBackendAdmin] = []  # the state backends' (at start)
        #: the changelogs' compaction pass running beside the batches, and what it raised
        self._compaction: threading.Thread | None = None
        self._compaction_error: BaseException | None = None
        self._live: list[Executor] = []  # the live executors the last placement or catch-up saw
        #: this batch's standby copies a restoring task may promote (Standbys.offers)
        self._offers: dict[str, tuple[tuple[str, str], ...]] = {}
        self._batch = 0
        self.exact_batches = bool(getattr(runner, "exact_batches", False))
        self._discarded = 0  # staged parts the start discarded, for the first batch report
        #: staged parts named by the checkpoints written since the last batch began (its
        #: clean-ups publish them)
        self._to_publish = 0
        #: checkpoints the batch's results completed, written together (_write_queued)
        self._queued: list[tuple[TaskState, CheckpointV2]] = []
        #: why writing queued checkpoints failed: no batch runs after that (run_batch)
        self._unwritten: str | None = None
        #: transactions committed and aborted since the driver started (every report carries
        #: the totals, so a report nobody forwards to the metrics loses no count)
        self._tx = Transactions()
        self.batch_log: BatchLog | None = None
        self._replay: list[tuple[int, dict[SystemStreamPartition, str]]] = []
        #: startpoints wait for the replay of logged batches (:meth:`_fan_out_startpoints`)
        self._startpoints_after_replay = False
        self._last_commit = time.monotonic()
        self._last_window = time.monotonic()
        self._last_retention = float("-inf")  # the first commit applies it
        #: the restore ahead's pass (restore_ahead), counted in the run's summary
        self._restored_ahead: BatchReport | None = None
        self._stage_lags: list[tuple[str, str, int]] = []  # BatchReport.stages
        #: the input that grew while the job ran (:meth:`_grown_input`): raised at the end
        self._grew: PartitionCountChanged | None = None
        self._grown_warned: set[SystemStream] = set()

    # -- start-up
    def all_ssps(self) -> list[SystemStreamPartition]:
        """Every SSP some task reads (inputs and broadcast inputs)."""
        inputs, shared = self.systems.job_inputs(self.config.inputs, self.config.broadcast_inputs)
        return sorted(set(inputs) | set(shared))

    def metadata(
        self, ssps: list[SystemStreamPartition]
    ) -> dict[SystemStreamPartition, PartitionMetadata]:
        out: dict[SystemStreamPartition, PartitionMetadata] = {}
        by_system: dict[str, list[SystemStreamPartition]] = {}
        for ssp in ssps:
            by_system.setdefault(ssp.system, []).append(ssp)
        for system, members in by_system.items():
            out.update(self.systems.admin(system).get_committed_metadata(members))
        return out

    def start(self) -> JobModel:
        """The job's start-up, step by step; then :meth:`run` loops over batches."""
        if stages_output(self.config):
            check_exactly_once(self.config, self.checkpoints)
        prepare_intermediate_streams(self.config, self.systems)
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

    def _start_claimed(
        self,
    ) -> tuple[JobModel, dict[TaskName, dict[SystemStreamPartition, Startpoint]]]:
        # read again once the job is ours: a stream grown while this driver started (by a
        # tool that held the job, then let go) is one the tasks must be made for
        model = job_model(self.config, self.systems)
        ssps = self.all_ssps()
        self._open_metadata()
        refuse_unfinished_reset(self._metadata(), self.config.job_name)
        finish_pending(self.config, self.systems, self._metadata())  # an interrupted reshard
        self._check_input_partitions(ssps)
        model = assign_changelog_partitions(self._metadata(), model)
        checkpoints, must_restore = self._prepare_state(model)
        fanned = self._fan_out_startpoints(model)
        self._plan_tasks(model, checkpoints, fanned, must_restore, self.metadata(ssps))
        self.model = model
        self._start_services()
        return model, fanned

    def _input_counts(self, ssps: list[SystemStreamPartition]) -> dict[SystemStream, int]:
        """The partition count of each input (not broadcast) stream among ``ssps``."""
        broadcast = {ss for ss, _parts in self.config.broadcast_inputs}
        counts: dict[SystemStream, int] = {}
        for ssp in ssps:
            if ssp.system_stream not in broadcast:
                counts[ssp.system_stream] = max(counts.get(ssp.system_stream, 0), ssp.partition + 1)
        return counts

    def _check_input_partitions(self, ssps: list[SystemStreamPartition]) -> None:
        """Refuse a stateful job whose inputs' partition counts changed since its last run."""
        check_input_partitions(self._metadata(), self.config, self._input_counts(ssps))

    def _grown_input(self, counts: Mapping[SystemStream, int]) -> PartitionCountChanged | None:
        """Before a batch reads (after its ends were read): the error to stop a stateful job
        with when one of its inputs has grown from its ``counts`` at the start (its producers
        place keys by the new count from now on: reading on would split their state), else
        None. A stateless job warns once: it reads the new partitions after a restart."""
        for stream, count in sorted(counts.items(), key=lambda i: str(i[0])):
            now = self.systems.admin(stream.system).current_partition_count(stream.stream)
            if now == count:
                continue
            if self.config.stores:
                return PartitionCountChanged(
                    f"input stream {stream} grew from {count} to {now} partitions while job "
                    f"{self.config.job_name} ran: it stopped after committing what was written "
                    f"before, as reading on would split every key's state. Move the state to "
                    f"the new tasks, then start it again: sparkpoint state reshard JOB"
                )
            if stream not in self._grown_warned:
                self._grown_warned.add(stream)
                log.warning(
                    "input stream %s grew from %d to %d partitions while job %s ran: restart "
                    "the job to read the new partitions",
                    stream,
                    count,
                    now,
                    self.config.job_name,
                )
        return None

    def _metadata(self) -> CoordinatorStreamStore:
        assert self.metadata_store is not None, "the job's metadata store opens at start()"
        return self.metadata_store

    def _open_metadata(self) -> None:
        """Compact the metadata streams, open the coordinator stream, store this run's config."""
        self._compact_metadata_streams()
        self.metadata_store = CoordinatorStreamStore(
            self.config, self.systems, source="coordinator"
        )
        store_config(self.metadata_store, self.config)
        self._record_guarantee(self.metadata_store)

    def _record_guarantee(self, store: CoordinatorStreamStore) -> None:
        """Keep the processing guarantee this run has (``job show`` reads it); log a switch."""
        now = guarantee(self.config)
        before = store.get(GUARANTEE, "last")
        if before is not None and before != now:
            log.warning(
                "job.processing.guarantee: the last run had %s, this one has %s%s",
                before,
                now,
                " (what the last run staged is published or discarded first)"
                if before == EXACTLY_ONCE
                else " (output becomes visible at each written checkpoint from now on)",
            )
        if before != now:
            store.put(GUARANTEE, "last", now)

    def _prepare_state(self, model: JobModel) -> tuple[dict[TaskName, Checkpoint], set[TaskName]]:
        """Create and check the state backends' resources, read every task's last checkpoint,
        let each backend bound its storage by them and name the tasks whose committed state it
        lost, and delete state of stores no longer configured. The checkpoints, and the tasks
        that must restore before they process."""
        self._finish_compaction()  # a pass of the last run: done before the admins change
        admins = self._backend_admins = self._prepare_backends(model)
        self.checkpoints.create_resources()
        checkpoints = dict(self.checkpoints.read_all())
        must_restore: set[TaskName] = set()
        for admin in admins:
            admin.hold_records(checkpoints, exactly_once(self.config))
            must_restore |= admin.lost_committed_state(checkpoints)
            admin.compact(checkpoints)
        self._delete_unused_state(model, checkpoints)
        # exactly-once output a crash left: published, or discarded (reported with batch 1)
        # (from the V2 checkpoints: only they name staged output, whatever the reads prefer)
        written = self.checkpoints.read_version(2)
        settled = settle(self.config, self.systems, written)
        # (not counted as aborted transactions: the run that staged them may have counted
        # them already, when its task restored; a crash's open ones were open in its metrics)
        self._discarded = settled.discarded
        return checkpoints, must_restore

    def _fan_out_startpoints(
        self, model: JobModel
    ) -> dict[TaskName, dict[SystemStreamPartition, Startpoint]]:
        """Fan the waiting startpoints out to the tasks (each task's, new or left from before).

        A DataFrame pipeline's batch log changes that: the batches logged before the last
        stop were read from the checkpoints (or from the fan-outs of an earlier start, which
        apply now, as they did then), and the tasks whose checkpoints cover such a batch do
        not read its input again, so its rows (re-keyed ones too) come only from its recorded
        output or its replay. New startpoints apply after those batches are published or
        replayed, in the run's first batches (:meth:`_apply_deferred_startpoints`)."""
        self.startpoints = StartpointManager(
            self._metadata(), max_age_ms=self.config.get_int("task.startpoint.max.age.ms")
        )
        if not self.exact_batches:
            return self.startpoints.fan_out({t.name: t.ssps for t in model.tasks.values()})
        self._startpoints_after_replay = self.startpoints.waiting()
        earlier = {
            t.name: self.startpoints.get_fan_out_for_task(t.name) for t in model.tasks.values()
        }
        return {task: sps for task, sps in earlier.items() if sps}

    def _apply_deferred_startpoints(self, summary: RunSummary) -> None:
        """The startpoints a start left waiting (:meth:`_fan_out_startpoints`), once no logged
        batch waits to be replayed: every task commits (its checkpoint covers the replayed
        batches), then they apply."""
        if self._startpoints_after_replay and not self._replay:
            self._startpoints_after_replay = False
            log.info("applying the startpoints set while the job was stopped")
            self._publish(summary, self.apply_startpoints_now())

    def _plan_tasks(
        self,
        model: JobModel,
        checkpoints: Mapping[TaskName, Checkpoint],
        fanned: Mapping[TaskName, Mapping[SystemStreamPartition, Startpoint]],
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
        """Metrics reporters, host affinity and (DataFrame pipelines) the batch log."""
        if self.config.get_list("metrics.reporters") and self.reporters is None:
            self.reporters = MetricsReporters(self.config, self.systems)
        self.affinity = HostAffinity(self.config, self._metadata(), sorted(self.tasks))
        self.standbys = Standbys(
            self.config,
            self._metadata(),
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
        if self.exact_batches:
            self._open_batch_log()

    def _announce(
        self, model: JobModel, fanned: Mapping[TaskName, Mapping[SystemStreamPartition, Startpoint]]
    ) -> None:
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

    def _check_still_the_driver(self) -> None:
        """Stop (raise) when another driver took the job over since the last heartbeat."""
        if self.heartbeat is not None and self.heartbeat.conflict is not None:
            raise DriverConflict(self.heartbeat.conflict)

    def _cmp(self, ssp: SystemStreamPartition, a: str, b: str) -> int:
        return self.systems.admin(ssp.system).offset_comparator(a, b)

    def _checkpointed(self) -> dict[SystemStreamPartition, str]:
        """Each SSP's offset the job reads next after its checkpoints (and the startpoints it
        applied): the smallest over its tasks (each task reading a broadcast SSP has its own).
        A logged batch that read past it is one some task's checkpoint does not cover: a
        pipeline applies new startpoints only once no such batch is left
        (:meth:`_fan_out_startpoints`), and what it logs after one was read from it."""
        return earliest([ts.from_checkpoint for ts in self.tasks.values()], self._cmp)

    def _open_batch_log(self) -> None:
        assert self.metadata_store is not None
        self.batch_log = BatchLog(self.metadata_store)
        if hasattr(self.runner, "batch_epoch"):  # its sinks tell this log's batch ids apart
            self.runner.batch_epoch = self.batch_log.epoch
        replay = self.batch_log.uncovered(self._checkpointed(), self._cmp)
        if replay and self._startpoints_after_replay:
            log.warning(
                "startpoints wait until batches %d-%d (logged before the last stop, not "
                "covered by every task's checkpoint) are replayed: they apply once the "
                "replay's checkpoints are written, so that no row those batches re-keyed is "
                "lost",
                replay[0][0],
                replay[-1][0],
            )
        if replay and not exactly_once(self.config):
            # replayed at-least-once: the replay sends its own output as it goes, which misses
            # the rows of tasks whose checkpoints cover the batch already; its re-keyed rows
            # (staged whatever the guarantee) are kept for the replay, which discards its own
            self._publish_uncovered(replay, "the job now runs at-least-once")
        self._replay = replay
        self._prune_batch_log(sweep=True)  # what a crash left staged, whatever is published
        self._batch = self.batch_log.last_id
        if replay:
            log.info(
                "replaying batches %d-%d (logged before the last stop, not yet checkpointed)",
                replay[0][0],
                replay[-1][0],
            )

    def _publish_uncovered(
        self, batches: list[tuple[int, dict[SystemStreamPartition, str]]], why: str
    ) -> None:
        """Publish the recorded output of batches not every checkpoint covers, at the start:
        the tasks whose checkpoints cover them will not read that input again, so their share
        of it would be lost (at-least-once: what other tasks read again may go out twice).
        What is bound for intermediate streams is never published so (the next stage would
        count twice what is read again): it stays in the entry, for the replay."""
        assert self.batch_log is not None
        for batch, _ in batches:
            outputs = self.batch_log.outputs.get(batch)
            if not outputs:
                continue
            inner, rest = batch_outputs.split(self.config, outputs)
            if rest:
                log.warning(
                    "%s: batch %d's staged output is published though not every task's "
                    "checkpoint covers it (what the tasks read again may go out twice)",
                    why,
                    batch,
                )
                batch_outputs.publish(self.config, self.systems, self.batch_log, batch, rest)
                self._tx.committed += 1
            self.batch_log.set_outputs(batch, inner or None)

    def _record_outputs(
        self, results: list[TaskBatchResult], *, clean_up_only: bool
    ) -> list[TaskBatchResult]:
        """Exactly-once: keep the batch's staged output in its log entry, before any checkpoint
        covering it is written. The results to apply: none when the batch is rewound."""
        assert self.batch_log is not None
        staged = getattr(self.runner, "staged", None)
        missing = not clean_up_only and not hasattr(self.runner, "staged")
        if missing and stages_output(self.config):  # its output would wait forever
            raise SparkpointError(
                f"runner {type(self.runner).__name__} of exact batches does not pass on "
                "what its batches staged (BatchRunner.staged)"
            )
        try:
            kept = batch_outputs.record(
                self.config, self.systems, self.batch_log, self._batch, staged, results
            )
        except batch_outputs.BatchOutputsLost as exc:
            self._tx.aborted += bool(staged)
            self._rewinds += 1
            if self._rewinds > MAX_REWINDS:
                raise batch_outputs.BatchOutputsLost(
                    f"{exc}; {MAX_REWINDS} batches in a row were rewound: the job stops (a "
                    "task keeps losing its progress: see the executors' logs)"
                ) from None
            log.warning("%s; every task starts again from its last checkpoint", exc)
            self._rewind()
            return []
        self._tx.aborted += bool(staged) and not kept  # a replay's output, discarded
        self._rewinds = 0  # a batch that kept its output
        return results

    def _interrupted(self, exc: BatchInterrupted) -> None:
        """A batch its runner stopped (an executor lost mid-batch): none of its results are
        applied, and every task starts again from its last written checkpoint (the tasks that
        ran restore it and trim their changelogs; a batch log replays the batch)."""
        self._tx.aborted += bool(getattr(self.runner, "staged", None))
        self._rewinds += 1
        if self._rewinds > MAX_REWINDS:
            raise BatchInterrupted(
                f"{exc}; {MAX_REWINDS} batches in a row were rewound: the job stops"
            ) from exc
        log.warning("%s; every task starts again from its last checkpoint", exc)
        self._rewind()

    def _rewind(self) -> None:
        """Start every task again from its last written checkpoint, as a restart does, without
        one: a new lineage (the tasks restore, abandoning the commits in flight, and the
        DataFrame phases of a replayed batch id start afresh), the offsets of the checkpoints,
        and the batch log's uncovered batches replayed under their own ids."""
        self.lineage = f"{self.run_id}-r{self._rewinds}"
        self._tx.aborted += sum(1 for ts in self.tasks.values() if ts.pending_outputs)
        for ts in self.tasks.values():
            ts.expected_state_id = CleanStart(self.lineage)
            ts.resume = dict(ts.from_checkpoint)
            ts.last_processed = dict(ts.checkpoint_last_processed)
            ts.pending_outputs = {}
        if self.batch_log is not None:
            self._replay = self.batch_log.uncovered(self._checkpointed(), self._cmp)
            if self._replay:
                log.info(
                    "replaying batches %d-%d from the tasks' last checkpoints",
                    self._replay[0][0],
                    self._replay[-1][0],
                )

    def _prune_batch_log(self, *, sweep: bool = False) -> None:
        """Delete the batch log's entries every checkpoint covers, publishing their output;
        then (when any was published, or ``sweep``) delete the staged parts no entry names."""
        if self.batch_log is None:
            return

        published = []
        log_ = self.batch_log

        def publish(batch: int, outputs: BatchOutputs) -> None:
            batch_outputs.publish(self.config, self.systems, log_, batch, outputs)
            published.append(batch)

        self.batch_log.prune(self._checkpointed(), self._cmp, publish)
        self._tx.committed += len(published)
        if published or sweep:  # parts no entry names: a failed batch's, a zombie attempt's
            # (counted as one aborted transaction: the output of one failed batch, or of a
            # crash's last one)
            self._tx.aborted += batch_outputs.sweep(self.config, self.systems, self.batch_log) > 0

    def _compact_metadata_streams(self) -> None:
        """Compact the coordinator and checkpoint streams at start, so that bootstrapping them
        reads one record per key, not every heartbeat and commit since the job was created."""
        streams = [
            (
                self.config.coordinator_system,
                coordinator_stream_name(self.config.job_name, self.config.job_id),
            ),
            (self.config.checkpoint_system, checkpoint_stream_name(self.config)),
        ]
        for system, stream in streams:
            admin = self.systems.admin(system)
            if stream in admin.list_streams():
                result = admin.compact(stream, 0)
                if result is not None and result[0] != result[1]:
                    log.info("compacted %s.%s: %d -> %d records", system, stream, *result)

    def _prepare_backends(self, model: JobModel) -> list[StateBackendAdmin]:
        """Check every store's backends by name, then create and validate their resources."""
        names: set[str] = set()
        for store in self.config.stores:
            for kind in ("backup", "restore"):
                names.update(store_backends(self.config, store, kind))
            check_checkpoint_versions(self.config, store, self.checkpoints)
        admins = []
        for name in sorted(names):
            admin = backend_factory(name).admin(self.config, model, self.systems)
            admin.create_resources()
            admin.validate_resources()
            admins.append(admin)
        return admins

    def _delete_unused_state(
        self, model: JobModel, checkpoints: Mapping[TaskName, Checkpoint]
    ) -> None:
        """Restore's clean-up (docs/architecture.md, Restore): each backend any checkpoint names
        deletes what stores that no longer use it left behind."""
        named = {n for c in checkpoints.values() for n in c.state_checkpoint_markers}
        for name in sorted(n for n in named if n in known_backends()):
            backend_factory(name).admin(self.config, model, self.systems).delete_unused(checkpoints)

    # -- the loop
    def stop(self, reason: str = "stopped") -> None:
        """Ask the loop to finish the current batch, commit and return. Thread- and signal-safe."""
        self.stop_reason = self.stop_reason or reason
        self.stop_event.set()

    def _plans(
        self,
        end: Mapping[SystemStreamPartition, str],
        *,
        commit: bool,
        window: bool,
        wait: bool = False,
        locations: Mapping[str, str] | None = None,
    ) -> list[TaskBatchPlan]:
        max_messages = self.config.get_int("task.batch.max.messages")
        locations = locations or {}
        values = self.config.to_dict()
        clock = fixed_ms()
        driver_wall = wall_ms()
        plans = []
        for ts in self.tasks.values():
            plans.append(
                TaskBatchPlan(
                    config=values,
                    run_id=self.lineage,
                    batch=self._batch,
                    task=ts.model,
                    reads=Reads(
                        resume=dict(ts.resume),
                        last_processed=dict(ts.last_processed),
                        end={s: end[s] for s in ts.model.ssps},
                        max_messages=max_messages,
                    ),
                    start=StartState(
                        expected=ts.expected_state_id,
                        checkpoint=ts.last_checkpoint.dumps() if ts.last_checkpoint else None,
                        from_checkpoint=dict(ts.from_checkpoint),
                        checkpoint_last_processed=dict(ts.checkpoint_last_processed),
                        standbys=self._offers.get(ts.model.name.name, ()),
                    ),
                    commits=Commits(due=commit, window=window, wait_for_uploads=wait),
                    task_count=len(self.tasks),
                    location=locations.get(ts.model.name.name),
                    clock_ms=clock,
                    driver_wall_ms=driver_wall,
                    pending_outputs={k: list(v) for k, v in ts.pending_outputs.items()},
                )
            )
        return plans

    def _apply(self, result: TaskBatchResult) -> bool:
        ts = self.tasks[result.task]
        check_transition(result.task, result.batch, ts.expected_state_id, result.state_id)
        ts.expected_state_id = result.state_id
        ts.resume = dict(result.next_offsets)
        ts.last_processed = dict(result.last_processed)
        ts.processed += result.processed
        # parts it held that the task no longer does: it restored, and that output is gone
        self._tx.aborted += bool(_parts(ts.pending_outputs) - _parts(result.staged_outputs))
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
            last = ts.last_checkpoint
            if last is not None and checkpoint.checkpoint_id <= last.checkpoint_id:
                continue
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
                continue
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
                continue
            self._write_checkpoint(ts, checkpoint)
            held = _parts(ts.pending_outputs)
            ts.pending_outputs = uncovered(ts.pending_outputs, checkpoint)
            self._tx.committed += held != _parts(ts.pending_outputs)
            # its parts go out with the task's next clean-up (the next batch's step 0)
            self._to_publish += len(committed_parts(checkpoint))
            written = True
            if self.affinity is not None:
                self.affinity.committed(result, str(checkpoint.checkpoint_id))
        return written

    def _transactions(self) -> Transactions:
        """The transactions committed and aborted since the driver started, and those open."""
        done = Transactions(self._tx.committed, self._tx.aborted)
        done.open = sum(1 for ts in self.tasks.values() if ts.pending_outputs)
        done.open += 0 if self.batch_log is None else len(self.batch_log.outputs)
        return done

    def _write_checkpoint(self, ts: TaskState, checkpoint: CheckpointV2) -> None:
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
        """Write the queued checkpoints: one message per task and configured version, one
        flush; then step 5, the startpoints they cover; then where each task committed."""
        queued, self._queued = self._queued, []
        if not queued:
            return
        try:
            self._check_still_the_driver()
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
            for admin in self._backend_admins:
                admin.commit_records(written)
        for ts, checkpoint in queued:
            covered = {s for s in ts.startpoints if s in checkpoint.input_offsets}
            if covered and self.startpoints is not None:
                # step 5 of the commit: the checkpoint holds offsets read after the startpoint
                self.startpoints.remove_fan_out_for_task(ts.model.name, covered)
                ts.startpoints -= covered
        if self.affinity is not None:
            self.affinity.record_commits()

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
        """One micro-batch; ``wait`` makes tasks finish their uploads before returning.
        ``batch_id`` replays a logged batch under its old id; ``logged=False`` keeps the batch
        out of the batch log."""
        if self._unwritten is not None:
            raise SparkpointError(
                f"job {self.config.job_label}: this driver failed to write its tasks' "
                f"checkpoints ({self._unwritten}), so what it holds of them may not be what "
                "is written: start the job again (a new driver reads the written ones)"
            )
        if batch_id is not None:
            self._batch = batch_id
        else:  # after a replay's old id: past every logged one (ids are never given twice)
            self._batch = max(self._batch, self.batch_log.last_id if self.batch_log else 0) + 1
        if self.batch_log is not None and logged:
            self.batch_log.record(self._batch, end)
        locations = self._place()
        plans = self._plans(end, commit=commit, window=window, wait=wait, locations=locations)
        if clean_up_only:
            plans = [replace(p, commits=replace(p.commits, clean_up_only=True)) for p in plans]
        t0 = time.monotonic()
        self._to_publish = 0  # the batch's clean-ups publish what was written before it
        try:
            results = self.runner(self._batch, plans)
            interrupted = False
        except BatchInterrupted as exc:
            self._interrupted(exc)
            results, interrupted = [], True
        seconds = time.monotonic() - t0
        if self.batch_log is not None and logged and not interrupted:
            results = self._record_outputs(results, clean_up_only=clean_up_only)
        placed = self.affinity.ran(results) if self.affinity else BatchPlacement([], [])
        for r in results:
            if r.promoted_copy is not None and self.standbys is not None:
                self.standbys.taken(r.task, r.promoted_copy)
        committed = False
        try:
            for result in sorted(results, key=lambda r: r.task):
                committed = self._apply(result) or committed
        finally:  # a later task's error leaves the earlier ones' checkpoints written
            self._write_queued()
        if committed:
            self._prune_batch_log()
        standby = self._catch_up_standbys()
        if commit or committed:
            self._last_commit = time.monotonic()
        if window:
            self._last_window = time.monotonic()
        report = BatchReport(
            batch=self._batch,
            seconds=seconds,
            processed=sum(r.processed for r in results),
            sent=sum(r.sent for r in results),
            committed=committed,
            commit_seconds=max((r.commit_seconds for r in results), default=0.0),
            task_seconds=sum(r.total_seconds for r in results),
            lag={},
            restored=[(r.task, i) for r in results for i in r.restored],
            moved=placed.moved,
            away=placed.away,
            tasks=results,
            parts_discarded=self._discarded,
            parts_open={
                name: sum(len(p) for p in ts.pending_outputs.values())
                for name, ts in self.tasks.items()
            },
            parts_to_publish=self._to_publish,
            transactions=self._transactions(),
            standby=standby,
        )
        self._discarded = 0
        for r in results:
            for metrics in r.upload_metrics:
                for key, value in metrics.items():
                    report.uploads[key] = report.uploads.get(key, 0) + value
        if report.uploads:
            log.info("batch %d commits: %s", self._batch, report.uploads)
        return report, results

    def _place(self) -> dict[str, str]:
        """Host affinity: each task's preferred executor for the next batch (none unless the
        runner runs on a Spark cluster and ``job.host-affinity.enabled``); standby copies
        placed, and those to promote offered to their tasks' plans."""
        executors = getattr(self.runner, "executors", None)
        self._offers = {}
        if self.affinity is None or executors is None:
            return {}  # a runner of the driver's own (the restore ahead, the last pass)
        live = executors()
        if live is None:
            self._no_standbys("the job runs in local mode: one executor")
        self._live = list(live or [])
        promotion = self.standbys.promotion(self._live) if self.standbys else {}
        locations = self.affinity.place(live, promotion)
        if self.standbys is not None:
            assignment = self.affinity.placement.assignment
            self._offers = self.standbys.offers()
            self.standbys.place(self._live, assignment)
        return locations

    def _no_standbys(self, why: str) -> None:
        """Say once that standbys were asked for but cannot be kept, and why."""
        if self.standbys is not None and self.standbys.enabled:
            log.warning(
                "%s=%d: no standby can be placed (%s); tasks restore from their backends",
                FACTOR,
                self.standbys.factor,
                why,
            )
            self.standbys.enabled = False

    def _catch_up_standbys(self) -> StandbyReport:
        """After a batch: bring every standby copy to its task's last written checkpoint (one
        Spark job, when any is behind). A failed catch-up loses no state: its copies are
        seeded again."""
        report = StandbyReport()
        catch_up = getattr(self.runner, "catch_up", None)
        standbys = self.standbys
        if standbys is None or not standbys.enabled or catch_up is None or self.affinity is None:
            return report
        # the executors alive now, not at the batch's start: a catch-up job whose partition
        # prefers an executor lost during the batch waits spark.locality.wait (30 s) for it
        executors = getattr(self.runner, "executors", None)
        if executors is not None:
            self._live = list(executors() or [])
        standbys.place(self._live, self.affinity.placement.assignment)  # tasks that ran away
        checkpoints = {n: ts.last_checkpoint for n, ts in self.tasks.items()}
        plans = standbys.plans(self.config.to_dict(), checkpoints, self._live)
        if plans:
            t0 = time.monotonic()
            try:
                results = catch_up(plans)
            except Exception as exc:  # an executor lost during it: the copies say what changed
                first = str(exc).splitlines()[0] if str(exc) else ""
                standbys.failed(plans, f"{type(exc).__name__}: {first}")
                results = []
            report.seconds = time.monotonic() - t0
            done = [r for r in results if r.error is None]
            report.seeded = sum(r.seeded for r in done)
            report.caught_up = sum(not r.seeded for r in done)
            report.records = sum(r.records for r in done if not r.seeded)
            standbys.caught_up(results, checkpoints)
        report.lags = standbys.lags()
        report.copies = sum(len(c) for c in standbys.copies.values())
        return report

    def _replay_ends(
        self, logged: Mapping[SystemStreamPartition, str]
    ) -> dict[SystemStreamPartition, str]:
        """A logged batch's ends; an SSP already past it (its checkpoint covers the batch)
        reads nothing."""
        out = {}
        for ts in self.tasks.values():
            for s in ts.model.ssps:
                e = logged.get(s, ts.resume[s])
                out[s] = e if self._cmp(s, ts.resume[s], e) < 0 else ts.resume[s]
        return out

    def _bounded(
        self, end: Mapping[SystemStreamPartition, str]
    ) -> dict[SystemStreamPartition, str]:
        """Ends at most ``task.batch.max.messages`` past each SSP's next offset (numeric
        offsets; others read to ``end``)."""
        limit = self.config.get_int("task.batch.max.messages")
        out = dict(end)
        for ts in self.tasks.values():
            for s in ts.model.ssps:
                with contextlib.suppress(ValueError):
                    out[s] = str(min(int(end[s]), int(ts.resume[s]) + limit))
        return out

    def _reads_all(self, goal: Mapping[SystemStreamPartition, str], limit: int) -> bool:
        """Whether one batch reads every SSP up to ``goal``: at most ``limit`` messages
        (``task.batch.max.messages``) left in each (numeric offsets; else unknown: no)."""
        for ts in self.tasks.values():
            for s in ts.model.ssps:
                try:
                    if int(goal[s]) - int(ts.resume[s]) > limit:
                        return False
                except ValueError:
                    return False
        return True

    def _check_resume_offsets(
        self, meta: Mapping[SystemStreamPartition, PartitionMetadata]
    ) -> None:
        """Stop before a batch that would skip input: every task resumes each SSP inside what
        its partition holds (a stream recreated or truncated under the running job is not
        waited for)."""
        for ts in self.tasks.values():
            for ssp in ts.model.ssps:
                admin = self.systems.admin(ssp.system)
                check_in_range(admin, ts.model.name, ssp, ts.resume[ssp], meta[ssp])

    def _lags(self, meta: Mapping[SystemStreamPartition, PartitionMetadata]) -> dict[str, int]:
        """Each task's lag (messages of its inputs not read yet); also each input stream's,
        for a job of stages (:attr:`BatchReport.stages`)."""
        lags = {}
        later = self.config.intermediate_streams
        streams: dict[SystemStream, int] = {}  # a job of stages only
        for name, ts in self.tasks.items():
            total = 0
            for ssp in ts.model.ssps:
                cmp = self.systems.admin(ssp.system).offset_comparator
                lag = _lag(cmp, ts.resume[ssp], meta[ssp].upcoming)
                total += lag
                if later:
                    streams[ssp.system_stream] = streams.get(ssp.system_stream, 0) + lag
            ts.lag = total
            lags[name] = total
        if later:
            roles = [("input", s) for s in self.config.inputs if s not in later]
            roles += [("intermediate", s) for s in later]
            self._stage_lags = [(r, str(s), streams[s]) for r, s in roles if s in streams]
        return lags

    def _measure(
        self, report: BatchReport, meta: Mapping[SystemStreamPartition, PartitionMetadata]
    ) -> None:
        report.lag = self._lags(meta)
        report.stages = list(self._stage_lags)

    def run(self, *, until_caught_up: bool = False, max_batches: int | None = None) -> RunSummary:
        """Run batches until stopped; always finish with a commit of every task."""
        if self.model is None:
            self.start()
        try:
            summary = self._run(until_caught_up, max_batches)
            self._finish_compaction()
            return summary
        finally:
            with contextlib.suppress(Exception):  # an error of its own is raised above
                self._finish_compaction()
            self._release_the_job()

    def _run(self, until_caught_up: bool, max_batches: int | None) -> RunSummary:
        summary = RunSummary()
        if self._restored_ahead is not None:  # its restores are the run's; it is no batch
            self._account_restores(summary, self._restored_ahead)
        started = time.monotonic()
        ssps = [s for ts in self.tasks.values() for s in ts.model.ssps]
        counts = self._input_counts(ssps)  # what the tasks were made for
        targets = (
            {s: m.upcoming for s, m in self.metadata(ssps).items()} if until_caught_up else None
        )
        commit_ms = self.config.get_int("task.commit.ms")
        intermediate_ms = self.config.get_int("task.commit.intermediate.ms")
        window_ms = self.config.get_int("task.window.ms")
        limit = self.config.get_int("task.batch.max.messages")
        poll = self.config.get_int("task.poll.interval.ms") / 1000
        last_committed = False
        #: intermediate streams are read to their end, not to a target set at start: their
        #: messages appear as the tasks that send them commit (staged until then)
        flagged = set(self.config.intermediate_streams)
        intermediate = {s for s in ssps if s.system_stream in flagged}
        drained = False
        while not self.stop_event.is_set():
            self._check_still_the_driver()
            self._apply_deferred_startpoints(summary)
            if (  # not while logged batches wait to be replayed: their ids come first
                self.startpoints is not None
                and not self._replay
                and self.startpoints.take_apply_now_request()
            ):
                self._publish(summary, self.apply_startpoints_now())
            meta = self.metadata(ssps)
            grown = self._grown_input(counts)  # after the ends: what lies before them is old
            if grown is not None:
                self._grew = grown
                self.stop(str(grown))
                break
            self._check_resume_offsets(meta)
            end = dict(targets) if targets is not None else {s: m.upcoming for s, m in meta.items()}
            end.update({s: meta[s].upcoming for s in intermediate})
            replay_id = None
            if self._replay:
                replay_id, logged = self._replay.pop(0)
                end = self._replay_ends(logged)
            elif self.exact_batches:
                end = self._bounded(end)
            behind = {
                s
                for ts in self.tasks.values()
                for s in ts.model.ssps
                if self.systems.admin(s.system).offset_comparator(ts.resume[s], end[s]) < 0
            }
            pending = replay_id is not None or bool(behind)
            # caught up but for staged intermediate messages: commit them, and the next batch's
            # clean-up publishes them, until none waits (then the next stage reads them). What
            # the driver knows waits: parts staged since the last written checkpoints, parts of
            # checkpoints written since the last batch began, and (DataFrame) the parts of
            # logged batches (no file listing: a dead attempt's part is never published, and
            # is swept at the next start)
            caught_up = targets is not None and not pending
            # re-keyed records wait to be published, or this batch will re-key some (it reads
            # a first-stage input)
            waiting = bool(intermediate) and (
                self._to_publish > 0
                or any(ts.pending_outputs for ts in self.tasks.values())
                or (self.batch_log is not None and bool(self.batch_log.staged_parts()))
            )
            rekeying = bool(intermediate) and bool(behind - intermediate)
            drain = caught_up and waiting
            # the last batch of a run to a target commits: no batch more just to commit it
            final = (
                targets is not None
                and pending
                and replay_id is None
                and not (waiting or rekeying)
                and self._reads_all(
                    {**targets, **{s: meta[s].upcoming for s in intermediate}}, limit
                )
            )
            if caught_up and not drain:
                self.stop("caught up")
                break
            if drain and drained:  # a commit may wait for its upload: no busy loop
                self.stop_event.wait(poll)
            drained = drain
            now = time.monotonic()
            since = (now - self._last_commit) * 1000
            # re-keyed records reach the next stage only with a checkpoint that covers them:
            # while some wait, commit at task.commit.intermediate.ms, not task.commit.ms
            commit_due = (
                drain
                or final
                or since >= commit_ms
                or ((waiting or rekeying) and since >= intermediate_ms)
            )
            window_due = window_ms >= 0 and (now - self._last_window) * 1000 >= window_ms
            if not pending and not commit_due and not window_due:
                self.stop_event.wait(poll)
                continue
            maybe_pause(self.config, "before-batch")
            report, results = self.run_batch(
                end, commit=commit_due, window=window_due, wait=final, batch_id=replay_id
            )
            last_committed = all(r.state_id.committed for r in results)
            if report.committed:
                self._apply_retention()
            self._measure(report, self.metadata(ssps))
            self._publish(summary, report)
            if any(r.shutdown_requested for r in results):
                self.stop("a task asked to shut down")
            if max_batches is not None and summary.batches >= max_batches:
                self.stop(f"reached --max-batches {max_batches}")
        if not last_committed:
            meta = self.metadata(ssps)
            for report in self._commit_all():
                self._measure(report, meta)
                self._publish(summary, report)
        # one more pass that reads nothing: tasks clean up after the final checkpoint (step 0),
        # so a stopped job leaves no superseded local checkpoints or remote snapshots behind
        end = {s: ts.resume[s] for ts in self.tasks.values() for s in ts.model.ssps}
        with self._running_on(self.local_runner or self.runner):
            self.run_batch(end, commit=False, clean_up_only=True)
        # measured after that pass: it publishes what the last checkpoints name (re-keyed
        # records an intermediate stream's readers have yet to read are lag too)
        summary.lag = self._lags(self.metadata(ssps))
        summary.seconds = time.monotonic() - started
        summary.stopped_by = self.stop_reason
        if self.listener:
            self.listener.on_end(summary)
        if self._grew is not None:
            raise self._grew
        return summary

    def _apply_retention(self) -> None:
        """After a commit, at most every ``job.retention.check.ms``: the retention of the
        job's input streams, never past the job's committed offsets
        (:mod:`sparkpoint.system.retention`), and the compaction of its changelogs up to its
        checkpoints (those that grew enough since the last: the embedded log has no broker
        that compacts them)."""
        now = time.monotonic()
        if (now - self._last_retention) * 1000 < self.config.get_int("job.retention.check.ms"):
            return
        self._last_retention = now
        read = {s.system_stream for ts in self.tasks.values() for s in ts.model.ssps}
        streams = sorted(s for s in read if retention_of(self.config, s) is not None)
        committed = self._checkpointed()
        try:
            protect = {
                ssp: offset
                for stream in streams
                for ssp, offset in protected(
                    self.systems.admin(stream.system), stream, committed
                ).items()
            }
            trimmed = trim(self.config, self.systems, streams, protect, job=self.config.job_label)
        except OSError as exc:  # retention only frees disk: the job goes on, and retries
            log.warning("retention: %s; tried again after the next commit", exc)
            return
        checkpoints = {
            ts.model.name: ts.last_checkpoint
            for ts in self.tasks.values()
            if ts.last_checkpoint is not None
        }
        self._compact_changelogs(checkpoints)
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

    def _compact_changelogs(self, checkpoints: Mapping[TaskName, Checkpoint]) -> None:
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
        admins = list(self._backend_admins)

        def compact() -> None:
            try:
                _yield_cpu()  # the batches' workers first (in local mode they share the cores)
                for admin in admins:
                    admin.compact(checkpoints, during_run=True)
            except BaseException as exc:  # raised in the driver's thread (above)
                self._compaction_error = exc

        self._compaction = threading.Thread(
            target=compact, name="sparkpoint-changelog-compaction", daemon=True
        )
        self._compaction.start()

    def _finish_compaction(self) -> None:
        """Wait for the changelogs' compaction pass, if one runs; raise what it raised."""
        if self._compaction is not None:
            self._compaction.join()
            self._compaction = None
        self._raise_compaction_error()

    def _raise_compaction_error(self) -> None:
        error, self._compaction_error = self._compaction_error, None
        if error is not None:
            raise error

    def _commit_all(self, attempts: int = 3) -> list[BatchReport]:
        """Batches that read nothing and commit every task, waiting for the uploads, until every
        task's state is a written checkpoint (a task whose previous commit was still waiting to
        be written commits again in the next one)."""
        reports = []
        for _ in range(attempts):
            end = {s: ts.resume[s] for ts in self.tasks.values() for s in ts.model.ssps}
            report, results = self.run_batch(end, commit=True, wait=True)
            reports.append(report)
            if all(r.state_id.committed for r in results):
                break
        return reports

    def restore_ahead(self, runner: BatchRunner) -> BatchReport | None:
        """Establish every task's state with ``runner`` before the first batch: one pass that
        reads nothing (like the last pass of a run). The first batch then finds each task's
        state current and keeps it. ``sparkpoint run`` uses this in local mode, where the
        driver shares the executors' disk, to restore while Spark starts
        (:mod:`sparkpoint.runtime.driver.launch`). Returns None, doing nothing, while batches logged
        before the last stop wait to be replayed under their own ids."""
        if self.model is None:
            self.start()
        if self._replay:
            return None
        end = {s: ts.resume[s] for ts in self.tasks.values() for s in ts.model.ssps}
        with self._running_on(runner):
            # under the last batch's id, unlogged: the first batch that reads is still the
            # next id, as it is without this pass
            report, _ = self.run_batch(
                end, commit=False, clean_up_only=True, batch_id=self._batch, logged=False
            )
        if self.listener:
            self.listener.on_batch(report)
        self._restored_ahead = report
        return report

    @contextlib.contextmanager
    def _running_on(self, runner: BatchRunner) -> Iterator[None]:
        """Run the batches of the block with ``runner`` instead of the job's runner."""
        saved, self.runner = self.runner, runner
        try:
            yield
        finally:
            self.runner = saved

    def apply_startpoints_now(self) -> BatchReport:
        """Commit every task, fan out the waiting startpoints, and resume from them (no restart)."""
        report = self._commit_all()[-1]
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

    def _publish(self, summary: RunSummary, report: BatchReport) -> None:
        """Count a batch in the run's summary, show it, and record its metrics."""
        self._account(summary, report)
        if self.listener:
            self.listener.on_batch(report)
        if self.reporters is not None:
            self.reporters.on_batch(report)

    @staticmethod
    def _account(summary: RunSummary, report: BatchReport) -> None:
        summary.batches += 1
        summary.processed += report.processed
        summary.sent += report.sent
        summary.commits += int(report.committed)
        summary.batch_seconds += report.seconds
        summary.task_seconds += report.task_seconds
        summary.lag = report.lag
        JobCoordinator._account_restores(summary, report)
        summary.away += len(report.away)

    @staticmethod
    def _account_restores(summary: RunSummary, report: BatchReport) -> None:
        summary.restores += report.restored_tasks
        restored_bytes, restored_seconds = report.restore_cost()
        summary.restore_bytes += restored_bytes
        summary.restore_seconds += restored_seconds

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

"""The driver's start-up, as named steps (:meth:`JobCoordinator.start` calls them in order):

1. refuse what cannot hold: exactly-once without V2 checkpoints
   (:func:`check_exactly_once`), inputs' Schema Registry serdes that cannot work
   (:func:`check_registry_serdes`), intermediate streams that are not the job's own
   (:func:`prepare_intermediate_streams`);
2. claim the job (the heartbeat, in the coordinator);
3. compact and open the metadata streams (:func:`compact_metadata_streams`), record the run's
   guarantee (:func:`record_guarantee`);
4. refuse an unfinished reset, finish an interrupted reshard, refuse inputs whose partition
   counts changed (:func:`input_counts`);
5. prepare the state backends (:func:`prepare_backends`), read the checkpoints, drop the
   state of stores no longer configured (:func:`delete_unused_state`);
6. fan out startpoints and plan where every task starts (the coordinator);
7. start the services: metrics, host affinity, standbys, the batch log.

Steps 3 to 7 are :class:`JobStart`'s, run once the job is claimed.

While the job runs, :class:`GrowthWatch` tells whether an input grew under it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.checkpoint.manager import CheckpointManager, checkpoint_stream_name
from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.metadata.coordinator_stream import (
    CoordinatorStreamStore,
    coordinator_stream_name,
)
from sparkpoint.metadata.job_state import (
    PartitionCountChanged,
    assign_changelog_partitions,
    check_input_partitions,
    refuse_unfinished_reset,
    store_config,
)
from sparkpoint.model import JobModel, SystemStream, SystemStreamPartition, TaskName
from sparkpoint.model.startpoint import Startpoint
from sparkpoint.runtime.driver.affinity import HostAffinity
from sparkpoint.runtime.driver.logged_batches import LoggedBatches
from sparkpoint.runtime.driver.metrics import MetricsReporters
from sparkpoint.runtime.driver.placing import TaskPlacer
from sparkpoint.runtime.driver.standby import Standbys
from sparkpoint.runtime.driver.task_state import TaskState
from sparkpoint.startpoint.manager import StartpointManager
from sparkpoint.storage.backend import (
    StateBackendAdmin,
    backend_factory,
    known_backends,
    store_backends,
)
from sparkpoint.storage.kv.store import check_store_schemas
from sparkpoint.storage.outputs import (
    EXACTLY_ONCE,
    GUARANTEE,
    batch_owner,
    exactly_once,
    guarantee,
    owner_of,
    settle,
    staging_of,
)
from sparkpoint.storage.reshard import finish_pending
from sparkpoint.storage.state_id import EMPTY, CleanStart, CommittedState, StateId
from sparkpoint.system.base import PartitionMetadata
from sparkpoint.system.registry import Systems
from sparkpoint.system.staging import OutputStaging
from sparkpoint.system.streams import ensure_stream, job_model, stream_serdes

if TYPE_CHECKING:  # the coordinator runs these steps: it imports this module
    from sparkpoint.runtime.driver.coordinator import JobCoordinator

log = logging.getLogger(__name__)

#: the startpoints fanned out to each task at start
Fanned = Mapping[TaskName, Mapping[SystemStreamPartition, Startpoint]]


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


def check_registry_serdes(config: Config) -> None:
    """Build the inputs' Schema Registry serdes, which checks their settings (no request is
    made): one that cannot work stops the job here, naming the key to set, rather than every
    task of its first batch. Other serdes load where they run (a user's class may be on the
    executors' path only). An avro store's current schema must read every schema its values
    were written with (:func:`~sparkpoint.storage.kv.store.check_store_schemas`)."""
    from sparkpoint.serde import is_registry_serde
    from sparkpoint.serde.registry import RegistrySerde

    for stream in config.inputs:
        names = [config.stream_key(stream, s) for s in ("samza.key.serde", "samza.msg.serde")]
        if any(is_registry_serde(n, config) for n in names):
            for serde in stream_serdes(config, stream):
                if isinstance(serde, RegistrySerde):
                    serde.build()
    check_store_schemas(config)  # an avro store's schema must read what it holds


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
    for stream in intermediate:
        _check_intermediate_policy(config, stream)
        staging = staging_of(systems, stream.system)  # refused here, naming it, before a batch
        ensure_stream(config, systems, stream)
        _check_intermediate_writers(config, systems, stream, staging)


def _check_intermediate_policy(config: Config, stream: SystemStream) -> None:
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


def _check_intermediate_writers(
    config: Config, systems: Systems, stream: SystemStream, staging: OutputStaging
) -> None:
    """Refuse an intermediate stream another job (or job.id) wrote to as well."""
    tasks, batches = owner_of(config, TaskName("")), batch_owner(config)
    for ssp in systems.partitions_of([stream]):
        others = [
            o
            for o in staging.publishers(ssp.stream, ssp.partition)
            if not o.startswith(tasks) and o != batches
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


def compact_metadata_streams(config: Config, systems: Systems) -> None:
    """Compact the coordinator and checkpoint streams at start, so that bootstrapping them
    reads one record per key, not every heartbeat and commit since the job was created."""
    streams = [
        (config.coordinator_system, coordinator_stream_name(config.job_name, config.job_id)),
        (config.checkpoint_system, checkpoint_stream_name(config)),
    ]
    for system, stream in streams:
        admin = systems.admin(system)
        if stream in admin.list_streams():
            result = admin.compact(stream, 0)
            if result is not None and result[0] != result[1]:
                log.info("compacted %s.%s: %d -> %d records", system, stream, *result)


def record_guarantee(config: Config, store: CoordinatorStreamStore) -> None:
    """Keep the processing guarantee this run has (``job show`` reads it); log a switch."""
    now = guarantee(config)
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


def prepare_backends(
    config: Config, model: JobModel, systems: Systems, checkpoints: CheckpointManager
) -> list[StateBackendAdmin]:
    """Check every store's backends by name, then create and validate their resources."""
    names: set[str] = set()
    for store in config.stores:
        for kind in ("backup", "restore"):
            names.update(store_backends(config, store, kind))
        check_checkpoint_versions(config, store, checkpoints)
    admins = []
    for name in sorted(names):
        admin = backend_factory(name).admin(config, model, systems)
        admin.create_resources()
        admin.validate_resources()
        admins.append(admin)
    return admins


def delete_unused_state(
    config: Config, model: JobModel, systems: Systems, checkpoints: Mapping[TaskName, Checkpoint]
) -> None:
    """Restore's clean-up (docs/architecture.md, Restore): each backend any checkpoint names
    deletes what stores that no longer use it left behind."""
    named = {n for c in checkpoints.values() for n in c.state_checkpoint_markers}
    for name in sorted(n for n in named if n in known_backends()):
        backend_factory(name).admin(config, model, systems).delete_unused(checkpoints)


def input_counts(config: Config, ssps: list[SystemStreamPartition]) -> dict[SystemStream, int]:
    """The partition count of each input (not broadcast) stream among ``ssps``."""
    broadcast = {ss for ss, _parts in config.broadcast_inputs}
    counts: dict[SystemStream, int] = {}
    for ssp in ssps:
        if ssp.system_stream not in broadcast:
            counts[ssp.system_stream] = max(counts.get(ssp.system_stream, 0), ssp.partition + 1)
    return counts


class GrowthWatch:
    """Tells whether an input grew from the partition counts the tasks were made for."""

    def __init__(self, config: Config, systems: Systems) -> None:
        self.config = config
        self.systems = systems
        self._warned: set[SystemStream] = set()

    def grown(self, counts: Mapping[SystemStream, int]) -> PartitionCountChanged | None:
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
            if stream not in self._warned:
                self._warned.add(stream)
                log.warning(
                    "input stream %s grew from %d to %d partitions while job %s ran: restart "
                    "the job to read the new partitions",
                    stream,
                    count,
                    now,
                    self.config.job_name,
                )
        return None


class JobStart:
    """Steps 3 to 7 of the start-up, once the job is claimed, on the coordinator's parts."""

    def __init__(self, job: JobCoordinator) -> None:
        self.job = job
        self.config = job.config
        self.systems = job.systems

    def run(self) -> tuple[JobModel, Fanned]:
        # read again once the job is ours: a stream grown while this driver started (by a
        # tool that held the job, then let go) is one the tasks must be made for
        job = self.job
        model = job_model(self.config, self.systems)
        ssps = job.all_ssps()
        store = self.open_coordinator_store()
        refuse_unfinished_reset(store, self.config.job_name)
        finish_pending(self.config, self.systems, store)  # an interrupted reshard
        check_input_partitions(store, self.config, input_counts(self.config, ssps))
        model = assign_changelog_partitions(store, model)
        checkpoints, must_restore = self.prepare_state(model)
        # (from the V2 checkpoints: only they record the global tables' versions)
        job.global_tables.start(job.checkpoints.read_version(2), store)
        fanned = self.fan_out_startpoints(model)
        self.plan_tasks(model, checkpoints, fanned, must_restore, job.partition_metadata(ssps))
        job.model = model
        self.start_services(store)
        return model, fanned

    def open_coordinator_store(self) -> CoordinatorStreamStore:
        """Compact the metadata streams, open the coordinator stream, store this run's config."""
        compact_metadata_streams(self.config, self.systems)
        store = CoordinatorStreamStore(self.config, self.systems, source="coordinator")
        self.job.metadata_store = store
        store_config(store, self.config)
        record_guarantee(self.config, store)
        return store

    def prepare_state(self, model: JobModel) -> tuple[dict[TaskName, Checkpoint], set[TaskName]]:
        """Create and check the state backends' resources, read every task's last checkpoint,
        let each backend bound its storage by them and name the tasks whose committed state it
        lost, and delete state of stores no longer configured. The checkpoints, and the tasks
        that must restore before they process."""
        job = self.job
        job.maintenance.finish()  # a pass of the last run: done before the admins change
        admins = prepare_backends(self.config, model, self.systems, job.checkpoints)
        job.maintenance.admins = job.writer.admins = admins
        job.checkpoints.create_resources()
        checkpoints = dict(job.checkpoints.read_all())
        must_restore: set[TaskName] = set()
        for admin in admins:
            admin.hold_records(checkpoints, exactly_once(self.config))
            must_restore |= admin.lost_committed_state(checkpoints)
            admin.compact(checkpoints)
        delete_unused_state(self.config, model, self.systems, checkpoints)
        # exactly-once output a crash left: published, or discarded (reported with batch 1)
        # (from the V2 checkpoints: only they name staged output, whatever the reads prefer)
        settled = settle(self.config, self.systems, job.checkpoints.read_version(2))
        # (not counted as aborted transactions: the run that staged them may have counted
        # them already, when its task restored; a crash's open ones were open in its metrics)
        job.discarded = settled.discarded
        return checkpoints, must_restore

    def fan_out_startpoints(self, model: JobModel) -> Fanned:
        """Fan the waiting startpoints out to the tasks (each task's, new or left from before).

        A DataFrame pipeline's batch log changes that: the batches logged before the last
        stop were read from the checkpoints (or from the fan-outs of an earlier start, which
        apply now, as they did then), and the tasks whose checkpoints cover such a batch do
        not read its input again, so its rows (re-keyed ones too) come only from its recorded
        output or its replay. New startpoints apply after those batches are published or
        replayed, in the run's first batches (:meth:`JobCoordinator.apply_deferred_startpoints`)."""
        job = self.job
        startpoints = StartpointManager(
            job.coordinator_store(), max_age_ms=self.config.get_int("task.startpoint.max.age.ms")
        )
        job.startpoints = job.writer.startpoints = startpoints
        if not job.exact_batches:
            return startpoints.fan_out({t.name: t.ssps for t in model.tasks.values()})
        job.startpoints_after_replay = startpoints.waiting()
        earlier = {t.name: startpoints.get_fan_out_for_task(t.name) for t in model.tasks.values()}
        return {task: sps for task, sps in earlier.items() if sps}

    def plan_tasks(
        self,
        model: JobModel,
        checkpoints: Mapping[TaskName, Checkpoint],
        fanned: Fanned,
        must_restore: set[TaskName],
        meta: Mapping[SystemStreamPartition, PartitionMetadata],
    ) -> None:
        """Where each task starts: its offsets (startpoint, else checkpoint, else the stream's
        policy) and the state it must start from."""
        job = self.job
        clean_start = any(
            self.config.get_bool(f"stores.{s}.clean.on.container.start") for s in self.config.stores
        )
        for task in model.sorted_tasks():
            ckpt = checkpoints.get(task.name)
            sps = fanned.get(task.name, {})
            nxt, last = job.offsets.starting_offsets(task, ckpt, meta, sps)
            if sps and job.startpoints is not None:  # a start before a checkpoint: the same
                job.startpoints.pin_fan_out(task.name, {s: nxt[s] for s in sps})
            expected: StateId = CommittedState(str(ckpt.checkpoint_id)) if ckpt else EMPTY
            if clean_start or task.name in must_restore:
                expected = CleanStart(job.lineage)  # matches no local state: the task restores
            job.tasks[task.name.name] = TaskState(
                model=task,
                last_checkpoint=ckpt,
                expected_state_id=expected,
                resume=dict(nxt),
                last_processed=dict(last),
                from_checkpoint=dict(nxt),
                checkpoint_last_processed=dict(last),
                startpoints=set(sps),
            )

    def start_services(self, store: CoordinatorStreamStore) -> None:
        """Metrics reporters, host affinity and standbys, and (exact batches) the batch log."""
        job = self.job
        if self.config.get_list("metrics.reporters") and job.reporters is None:
            job.reporters = MetricsReporters(self.config, self.systems)
        affinity = HostAffinity(self.config, store, sorted(job.tasks))
        standbys = Standbys(
            self.config,
            store,
            {n: ts.model for n, ts in job.tasks.items()},
            # the last run's copies of a task whose committed state is trusted at this start:
            # not one that restores from scratch (its changelog was lost or recreated, or its
            # stores are cleaned at start), whose copies' changelog offsets mean nothing now
            {
                n: ts.last_checkpoint
                for n, ts in job.tasks.items()
                if isinstance(ts.expected_state_id, CommittedState)
            },
        )
        job.placer = TaskPlacer(affinity, standbys)
        job.writer.affinity = affinity
        if job.exact_batches:
            logged = job.logged = LoggedBatches(self.config, self.systems, store, job.tx)
            job.runner.begin_epoch(logged.log.epoch)  # its sinks tell our batch ids apart
            logged.open(
                job.tasks.checkpointed(),
                job.tasks.cmp,
                startpoints_wait=job.startpoints_after_replay,
            )
            job.batch = logged.log.last_id

    def announce(self, model: JobModel, fanned: Fanned) -> None:
        """Tell the listener the job started, and where startpoints make tasks read."""
        listener = self.job.listener
        if listener is None:
            return
        listener.on_start(model)
        for task_name, sps in sorted(fanned.items()):
            ts = self.job.tasks[task_name.name]
            for ssp, sp in sorted(sps.items()):
                listener.on_startpoint(task_name.name, ssp, ts.resume[ssp], sp.describe())

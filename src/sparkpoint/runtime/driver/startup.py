"""The driver's start-up, as named steps (:meth:`JobCoordinator.start` calls them in order):

1. refuse what cannot hold: exactly-once without V2 checkpoints
   (:func:`check_exactly_once`), intermediate streams that are not the job's own
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

While the job runs, :class:`GrowthWatch` tells whether an input grew under it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.checkpoint.manager import CheckpointManager, checkpoint_stream_name
from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.metadata.coordinator_stream import (
    CoordinatorStreamStore,
    coordinator_stream_name,
)
from sparkpoint.metadata.job_state import PartitionCountChanged
from sparkpoint.model import JobModel, SystemStream, SystemStreamPartition, TaskName
from sparkpoint.storage.backend import (
    StateBackendAdmin,
    backend_factory,
    known_backends,
    store_backends,
)
from sparkpoint.storage.outputs import (
    EXACTLY_ONCE,
    GUARANTEE,
    batch_owner,
    exactly_once,
    guarantee,
    owner_of,
    staging_of,
)
from sparkpoint.system.registry import Systems
from sparkpoint.system.staging import OutputStaging
from sparkpoint.system.streams import ensure_stream

log = logging.getLogger(__name__)


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

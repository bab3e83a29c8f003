"""Reading a job's committed state without running the job, from whichever copy holds it.

The committed contents of a store are those of its task's last checkpoint: read from the local
checkpoint directory under ``job.logged.store.base.dir`` when this machine has it, else rebuilt
from the store's state backends (:func:`sparkpoint.storage.restore.restore_for_reading`).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.job_state import stored_changelog_partitions
from sparkpoint.model import TaskModel, TaskName
from sparkpoint.storage.backend import checkpoint_markers, store_backends
from sparkpoint.storage.kv import ttl
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.kv.rocksdb import RocksDBEngine
from sparkpoint.storage.kv.store import store_serdes
from sparkpoint.storage.layouts import Layout, decoder, recognise
from sparkpoint.storage.local import LocalTaskState
from sparkpoint.storage.restore import restore_for_reading
from sparkpoint.system.registry import Systems

if TYPE_CHECKING:
    from sparkpoint.storage.blobstore.manager import BlobStoreManager


def committed_entries(
    config: Config, store: str, task: str | None = None
) -> Iterator[tuple[str, Any, Any]]:
    """``(task, key, value)`` of a store's committed contents, task by task, in key order,
    decoded by the store's serdes (:func:`committed_raw_entries`)."""
    require_store(config, store)
    key_serde, msg_serde = store_serdes(config, store)
    for name, key, value in committed_raw_entries(config, store, task):
        yield name, key_serde.from_bytes(key), msg_serde.from_bytes(value)


def committed_rows(
    config: Config, store: str, task: str | None = None, layout: Layout = Layout.AUTO
) -> Iterator[tuple[str, Layout, dict[str, Any]]]:
    """``(task, layout, row)`` of a store's committed contents: each entry decoded in
    ``layout`` (``auto``: the one recognised from the store's first entry), as
    :mod:`sparkpoint.storage.layouts` reads it, with ``expires_at`` (ms) in a TTL store's
    rows; the entries that only index others left out."""
    require_store(config, store)
    systems = Systems(config)
    try:
        decode = None
        for model, checkpoint in _chosen(config, systems, task):
            with committed_engine(config, systems, model, store, checkpoint) as engine:
                entries = (
                    engine.expiring()
                    if isinstance(engine, ttl.TtlEngine)
                    else ((k, v, None) for k, v in engine.all())
                )
                for key, value, expires in entries:
                    if decode is None:
                        if layout is Layout.AUTO:
                            layout = recognise(config, store, (key, value))
                        decode = decoder(config, store, layout)
                    row = decode(key, value)
                    if row is not None:
                        if expires is not None:
                            row["expires_at"] = expires
                        yield model.name.name, layout, row
    finally:
        systems.close()


def _chosen(
    config: Config, systems: Systems, task: str | None
) -> list[tuple[TaskModel, Checkpoint]]:
    """Every task with a checkpoint, or only ``task`` (a :class:`UserError` when it has
    none)."""
    tasks = task_checkpoints(config, systems)
    if task is None:
        return tasks
    known = ", ".join(m.name.name for m, _ in tasks) or "none"
    chosen = [(m, c) for m, c in tasks if m.name == TaskName(task)]
    if not chosen:
        raise UserError(f"task {task!r} has no checkpoint; tasks with checkpoints: {known}")
    return chosen


def committed_raw_entries(
    config: Config, store: str, task: str | None = None
) -> Iterator[tuple[str, bytes, bytes]]:
    """``(task, key bytes, value bytes)`` of a store's committed contents, task by task, in
    key order (a window or timer store's own layout: :mod:`sparkpoint.storage.windows`).

    From the task's local checkpoint when this machine has it (opened read-only), else rebuilt
    in a scratch directory from the store's restore backends (blob-store snapshot, or a replay
    of the changelog up to the checkpointed offset), writing to no backend. Never from a live
    store a running job may be writing.
    """
    require_store(config, store)
    systems = Systems(config)
    try:
        for model, checkpoint in _chosen(config, systems, task):
            for key, value in _committed(config, systems, model, store, checkpoint):
                yield model.name.name, key, value
    finally:
        systems.close()


def require_store(config: Config, store: str) -> None:
    if store not in config.stores:
        known = ", ".join(config.stores) or "none"
        raise UserError(f"no store {store!r} in job {config.job_name}; stores: {known}")


def task_checkpoints(config: Config, systems: Systems) -> list[tuple[TaskModel, Checkpoint]]:
    """Each task with a checkpoint (with the changelog partition the job last ran it with) and
    that checkpoint, in task order."""
    checkpoints = CheckpointManager(config, systems).read_all()
    partitions = stored_changelog_partitions(
        CoordinatorStreamStore(config, systems, source="state-tool")
    )
    names = sorted(checkpoints, key=lambda t: (len(t.name), t.name))
    return [(TaskModel(n, frozenset(), partitions.get(n.name, 0)), checkpoints[n]) for n in names]


def _committed(
    config: Config, systems: Systems, task: TaskModel, store: str, checkpoint: Checkpoint
) -> Iterator[tuple[bytes, bytes]]:
    with committed_engine(config, systems, task, store, checkpoint) as engine:
        yield from engine.all()


@contextlib.contextmanager
def committed_engine(
    config: Config, systems: Systems, task: TaskModel, store: str, checkpoint: Checkpoint
) -> Iterator[KeyValueEngine]:
    """``task``'s ``store`` as of ``checkpoint``, read-only (expired TTL entries hidden): its
    local checkpoint when this machine has it, else rebuilt in a scratch directory from the
    store's restore backends; closed (and the scratch removed) when the block ends."""
    cid = str(checkpoint.checkpoint_id)
    local = LocalTaskState(config.store_base_dir, task.name)
    if local.has_checkpoint(store, cid):
        engine: KeyValueEngine = RocksDBEngine(
            store, local.checkpoint_dir(store, cid), read_only=True
        )
        try:
            yield ttl.readable(engine, ttl.ttl_of(config, store))
        finally:
            engine.close()
        return
    if not store_backends(config, store, "restore"):
        raise UserError(
            f"task {task.name} store {store}: checkpoint {cid} is not on this machine "
            f"({local.checkpoint_dir(store, cid)}) and the store has no state backend"
        )
    with tempfile.TemporaryDirectory(prefix="sparkpoint-state-") as tmp:
        engine = restore_for_reading(config, systems, task, store, checkpoint, Path(tmp))
        try:
            yield ttl.readable(engine, ttl.ttl_of(config, store))
        finally:
            engine.close()


def state_locations(config: Config) -> list[dict[str, Any]]:
    """Where each task's committed state is, store by store: the local checkpoint on this
    machine, the changelog range, the blob-store snapshot (files and bytes). Reads metadata
    only; ``state dump`` reads the contents from the first of these that exists."""
    from sparkpoint.storage.blobstore.backend import NAME as BLOBS
    from sparkpoint.storage.blobstore.backend import blob_manager
    from sparkpoint.storage.changelog.backend import NAME as CHANGELOG
    from sparkpoint.storage.changelog.marker import ChangelogMarker

    systems = Systems(config)
    rows: list[dict[str, Any]] = []
    blobs: BlobStoreManager | None = None
    try:
        for model, checkpoint in task_checkpoints(config, systems):
            name = model.name
            markers = checkpoint_markers(config, checkpoint, model)
            cid = str(checkpoint.checkpoint_id)
            local = LocalTaskState(config.store_base_dir, name)
            for store in config.stores:
                row: dict[str, Any] = {"task": name.name, "store": store, "checkpoint-id": cid}
                row["local"] = (
                    str(local.checkpoint_dir(store, cid))
                    if local.has_checkpoint(store, cid)
                    else None
                )
                raw = markers.get(CHANGELOG, {}).get(store)
                if raw is not None:
                    marker = ChangelogMarker.loads(raw)
                    row["changelog"] = {"ssp": str(marker.ssp), "offset": marker.offset}
                index_id = markers.get(BLOBS, {}).get(store)
                if index_id is not None:
                    blobs = blobs or blob_manager(config)
                    where = f"task {name} store {store}"
                    row["blobstore"] = _snapshot_summary(blobs, index_id, where)
                rows.append(row)
    finally:
        systems.close()
    return rows


def _snapshot_summary(blobs: BlobStoreManager, index_id: str, where: str) -> dict[str, Any]:
    """A blob-store snapshot's index id, file count, bytes and blob store URL."""
    from sparkpoint.storage.blobstore.backend import load_index

    files = [f for _, f in load_index(blobs, index_id, where).dir_index.all_files()]
    return {
        "snapshot-index": index_id,
        "files": len(files),
        "bytes": sum(f.metadata.size for f in files),
        "url": blobs.url,
    }


def blob_snapshots(config: Config) -> list[dict[str, Any]]:
    """Each task's and store's current blob store snapshot: checkpoint, files, bytes, URL."""
    from sparkpoint.checkpoint.manager import CheckpointManager
    from sparkpoint.storage.blobstore.backend import NAME, blob_manager

    blobs = blob_manager(config)
    rows = []
    for task, checkpoint in sorted(CheckpointManager(config).read_version(2).items()):
        for store, index_id in sorted(checkpoint.state_checkpoint_markers.get(NAME, {}).items()):
            summary = _snapshot_summary(blobs, index_id, f"task {task} store {store}")
            rows.append(
                {
                    "task": task.name,
                    "store": store,
                    "checkpoint-id": str(checkpoint.checkpoint_id),
                    "snapshot-index": index_id,
                    "files": summary["files"],
                    "bytes": summary["bytes"],
                    "blob-store": summary["url"],
                }
            )
    return rows


@dataclass
class BlobCheck:
    """What :func:`blob_check` looked at, and the problems it found."""

    checkpoints: int = 0  # V2 checkpoints read
    snapshots: int = 0  # blob-store snapshots they name
    files: int = 0
    problems: list[str] = field(default_factory=list)


def check_blobs(config: Config, *, checksums: bool = True) -> list[str]:
    """Problems found walking every V2 checkpoint's blob-store snapshots: snapshot indexes or
    file blobs that are missing, unreadable, or (with ``checksums``, the default; it downloads
    every blob) of the wrong size or checksum. An empty list means every snapshot any checkpoint
    names can be restored as it was committed."""
    return blob_check(config, checksums=checksums).problems


def blob_check(config: Config, *, checksums: bool = True) -> BlobCheck:
    """:func:`check_blobs`, with how many checkpoints, snapshots and files it checked."""
    from sparkpoint.checkpoint.manager import CheckpointManager
    from sparkpoint.errors import RestoreError
    from sparkpoint.storage.blobstore.backend import NAME, blob_manager, fetch_file
    from sparkpoint.storage.blobstore.index import InvalidSnapshotIndex, SnapshotIndex
    from sparkpoint.storage.blobstore.manager import BlobNotFound

    result = BlobCheck()
    problems = result.problems
    checkpoints = CheckpointManager(config).read_version(2)
    result.checkpoints = len(checkpoints)
    named = [c for c in checkpoints.values() if c.state_checkpoint_markers.get(NAME)]
    if not named:
        return result  # no snapshot to check: the blob store is not even opened
    blobs = blob_manager(config)
    for task, checkpoint in sorted(checkpoints.items()):
        for store, index_id in sorted(checkpoint.state_checkpoint_markers.get(NAME, {}).items()):
            where = f"task {task} store {store} checkpoint {checkpoint.checkpoint_id}"
            result.snapshots += 1
            try:
                index = SnapshotIndex.loads(blobs.get_bytes(index_id))
            except (BlobNotFound, InvalidSnapshotIndex) as exc:
                problems.append(f"{where}: snapshot index {index_id}: {exc}")
                continue
            with tempfile.TemporaryDirectory(prefix="sparkpoint-check-") as tmp:
                for rel, f in index.dir_index.all_files():
                    result.files += 1
                    try:
                        if checksums:
                            fetch_file(blobs, f, Path(tmp) / "file", where)
                        elif not all(blobs.exists(b.blob_id) for b in f.blobs):
                            raise BlobNotFound(rel)
                    except BlobNotFound:
                        ids = ", ".join(b.blob_id for b in f.blobs)
                        problems.append(f"{where}: file {rel}: blob {ids} is missing")
                    except RestoreError as exc:
                        problems.append(str(exc))
    return result

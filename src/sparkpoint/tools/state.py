"""Reading a job's committed state without running the job.

The committed contents of a store are those of its local checkpoint for the task's last
checkpoint (opened read-only, never modified). Until a state backend exists, that checkpoint is
on the disk of the executor that made it; this tool reads ``job.logged.store.base.dir``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.model import TaskModel, TaskName
from sparkpoint.serde import load_serde
from sparkpoint.storage.kv.rocksdb import RocksDBEngine
from sparkpoint.storage.local import LocalTaskState
from sparkpoint.system.registry import Systems


def committed_entries(
    config: Config, store: str, task: str | None = None
) -> Iterator[tuple[str, Any, Any]]:
    """``(task, key, value)`` of a store's committed contents, task by task, in key order."""
    if store not in config.stores:
        known = ", ".join(config.stores) or "none"
        raise UserError(f"no store {store!r} in job {config.job_name}; stores: {known}")
    key_serde = load_serde(config.get_str(f"stores.{store}.key.serde") or "", config)
    msg_serde = load_serde(config.get_str(f"stores.{store}.msg.serde") or "", config)
    systems = Systems(config)
    try:
        manager = CheckpointManager(config, systems)
        checkpoints = manager.read_all()
        v2 = manager.read_version(2)
    finally:
        systems.close()
    names = sorted(checkpoints, key=lambda t: (len(t.name), t.name))
    if task is not None:
        if TaskName(task) not in checkpoints:
            known = ", ".join(t.name for t in names) or "none"
            raise UserError(f"task {task!r} has no checkpoint; tasks with checkpoints: {known}")
        names = [TaskName(task)]
    for name in names:
        cid = str(checkpoints[name].checkpoint_id)
        path = LocalTaskState(config.store_base_dir, name).checkpoint_dir(store, cid)
        with tempfile.TemporaryDirectory(prefix="sparkpoint-dump-") as tmp:
            if not path.is_dir():
                snapshot = v2.get(name)
                if snapshot is None or str(snapshot.checkpoint_id) != cid:
                    snapshot = None
                path = _from_blob_store(config, name, store, snapshot, Path(tmp)) or path
            if not path.is_dir():
                raise UserError(
                    f"task {name} store {store}: checkpoint {cid} is not on this machine ({path}) "
                    "and the store has no blob store snapshot"
                )
            engine = RocksDBEngine(store, path, read_only=True)
            try:
                for k, v in engine.all():
                    yield name.name, key_serde.from_bytes(k), msg_serde.from_bytes(v)
            finally:
                engine.close()


def _from_blob_store(
    config: Config, task: TaskName, store: str, checkpoint: Checkpoint | None, tmp: Path
) -> Path | None:
    """Download the store's snapshot of ``checkpoint`` into ``tmp``; its directory, or None."""
    from sparkpoint.storage.backend import BackendContext
    from sparkpoint.storage.blobstore.backend import NAME, BlobStoreRestoreManager

    if checkpoint is None or store not in checkpoint.state_checkpoint_markers.get(NAME, {}):
        return None
    model = TaskModel(task, frozenset(), 0)
    local = LocalTaskState(tmp, task)
    context = BackendContext(config, model, [store], Systems(config), local)
    manager = BlobStoreRestoreManager(context)
    manager.init(checkpoint)
    manager.restore()
    return local.store_dir(store)


def blob_snapshots(config: Config) -> list[dict[str, Any]]:
    """Each task's and store's current blob store snapshot: checkpoint, files, bytes, URL."""
    from sparkpoint.checkpoint.manager import CheckpointManager
    from sparkpoint.storage.blobstore.backend import NAME, blob_manager, load_index

    blobs = blob_manager(config)
    rows = []
    for task, checkpoint in sorted(CheckpointManager(config).read_version(2).items()):
        for store, index_id in sorted(checkpoint.state_checkpoint_markers.get(NAME, {}).items()):
            index = load_index(blobs, index_id, f"task {task} store {store}")
            files = list(index.dir_index.all_files())
            rows.append(
                {
                    "task": task.name,
                    "store": store,
                    "checkpoint-id": str(checkpoint.checkpoint_id),
                    "snapshot-index": index_id,
                    "files": len(files),
                    "bytes": sum(f.metadata.size for _, f in files),
                    "blob-store": blobs.url,
                }
            )
    return rows


def check_blobs(config: Config) -> list[str]:
    """Problems found walking every V2 checkpoint: snapshot indexes or file blobs that are missing.

    An empty list means every blob every checkpoint references exists.
    """
    from sparkpoint.checkpoint.manager import CheckpointManager
    from sparkpoint.storage.blobstore.backend import NAME, blob_manager
    from sparkpoint.storage.blobstore.index import InvalidSnapshotIndex, SnapshotIndex
    from sparkpoint.storage.blobstore.manager import BlobNotFound

    blobs = blob_manager(config)
    problems = []
    for task, checkpoint in sorted(CheckpointManager(config).read_version(2).items()):
        for store, index_id in sorted(checkpoint.state_checkpoint_markers.get(NAME, {}).items()):
            where = f"task {task} store {store} checkpoint {checkpoint.checkpoint_id}"
            try:
                index = SnapshotIndex.loads(blobs.get_bytes(index_id))
            except (BlobNotFound, InvalidSnapshotIndex) as exc:
                problems.append(f"{where}: snapshot index {index_id}: {exc}")
                continue
            for rel, f in index.dir_index.all_files():
                for blob in f.blobs:
                    if not blobs.exists(blob.blob_id):
                        problems.append(f"{where}: file {rel}: blob {blob.blob_id} is missing")
    return problems

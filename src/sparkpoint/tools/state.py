"""Reading a job's committed state without running the job.

The committed contents of a store are those of its local checkpoint for the task's last
checkpoint (opened read-only, never modified). Until a state backend exists, that checkpoint is
on the disk of the executor that made it; this tool reads ``job.logged.store.base.dir``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.model import TaskName
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
        checkpoints = CheckpointManager(config, systems).read_all()
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
        if not path.is_dir():
            raise UserError(
                f"task {name} store {store}: checkpoint {cid} is not on this machine ({path})"
            )
        engine = RocksDBEngine(store, path, read_only=True)
        try:
            for k, v in engine.all():
                yield name.name, key_serde.from_bytes(k), msg_serde.from_bytes(v)
        finally:
            engine.close()

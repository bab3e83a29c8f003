"""Bringing a task's stores to its last committed checkpoint on this executor (DESIGN.md §3).

For each store, in order of cost:

1. a local checkpoint directory for exactly that checkpoint (it has its ``CHECKPOINT`` file,
   written only after every upload of the commit finished): hard-link it into place;
2. otherwise the first backend of ``stores.<s>.restore.factories`` whose marker the checkpoint
   has (an ERROR is logged when the preferred one has none and a later one is used); the store
   directory is emptied first, so the backend rebuilds it from nothing;
3. with no marker at all: the first restore backend restores from its beginning (or, with no
   checkpoint, starts empty), and a store without backends starts empty, with a WARNING when a
   checkpoint existed (its state is lost with this host's disk).

In non-transactional mode the local checkpoint is not used: the changelog is replayed to its
newest entry. Everything is written inside the task's own directory.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.config import Config
from sparkpoint.model import TaskModel
from sparkpoint.runtime.plan import RestoreInfo
from sparkpoint.storage.backend import BackendContext, backend_factory, store_backends
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.local import LocalTaskState
from sparkpoint.system.registry import Systems
from sparkpoint.testing.faults import maybe_crash

log = logging.getLogger(__name__)


def choose_restore_backend(
    config: Config, store: str, task: TaskModel, checkpoint: Checkpoint | None
) -> str | None:
    """The backend to restore ``store`` from, following the preference order with fallback."""
    names = store_backends(config, store, "restore")
    if not names:
        return None
    with_marker = [
        n for n in names if backend_factory(n).has_marker(config, checkpoint, store, task)
    ]
    if with_marker:
        if with_marker[0] != names[0] and checkpoint is not None:
            log.error(
                "task %s store %s: preferred restore backend %s has no marker in checkpoint %s; "
                "restoring from %s",
                task.name,
                store,
                names[0],
                checkpoint.checkpoint_id,
                with_marker[0],
            )
        return with_marker[0]
    if checkpoint is not None:
        log.error(
            "task %s store %s: checkpoint %s has no marker for any restore backend (%s); "
            "restoring %s from its beginning. A V1 checkpoint holds changelog offsets only: "
            "read V2 checkpoints (task.checkpoint.read.versions=2) to restore from a blob store",
            task.name,
            store,
            checkpoint.checkpoint_id,
            ", ".join(names),
            names[0],
        )
    return names[0]


def restore_stores(
    config: Config,
    systems: Systems,
    task: TaskModel,
    local: LocalTaskState,
    checkpoint: Checkpoint | None,
    open_engine: Mapping[str, Callable[[], KeyValueEngine]],
) -> tuple[dict[str, KeyValueEngine], list[RestoreInfo]]:
    """Rebuild every store of the task; returns the open (unwrapped) engines and what was done.

    ``open_engine`` maps each store name to a callable that opens its engine in its (possibly
    just emptied) directory.
    """
    transactional = config.get_bool("task.transactional.state.checkpoint.enabled", True)
    engines: dict[str, KeyValueEngine] = {}
    infos: list[RestoreInfo] = []
    by_backend: dict[str, list[str]] = {}
    cid = None if checkpoint is None else str(checkpoint.checkpoint_id)
    for store in config.stores:
        start = time.monotonic()
        opener = open_engine[store]
        if transactional and local.restore_from_checkpoint(store, cid):
            engines[store] = opener()
            infos.append(RestoreInfo(store, "local-checkpoint", 0, 0, time.monotonic() - start))
            continue
        local.restore_from_checkpoint(store, None)  # empty the live directory
        backend = choose_restore_backend(config, store, task, checkpoint)
        if backend is None:
            engines[store] = opener()
            if checkpoint is not None:
                log.warning(
                    "task %s store %s: no local checkpoint %s on %s and no restore backend; "
                    "starting EMPTY (configure a state backend to restore state on any executor)",
                    task.name,
                    store,
                    cid,
                    socket.gethostname(),
                )
            infos.append(RestoreInfo(store, "empty", 0, 0, time.monotonic() - start))
            continue
        by_backend.setdefault(backend, []).append(store)
    for backend, stores in by_backend.items():
        context = BackendContext(
            config,
            task,
            stores,
            systems,
            local,
            openers={s: open_engine[s] for s in stores},
        )
        manager = backend_factory(backend).restore_manager(context)
        try:
            manager.init(checkpoint)
            for stats in manager.restore():
                infos.append(
                    RestoreInfo(stats.store, backend, stats.entries, stats.bytes, stats.seconds)
                )
                log.info(
                    "task %s store %s: restored from %s: %d entries, %d bytes in %.2fs",
                    task.name,
                    stats.store,
                    backend,
                    stats.entries,
                    stats.bytes,
                    stats.seconds,
                )
                maybe_crash(config, "during-restore")
        finally:
            manager.close()
        for store in stores:
            engines[store] = context.engine(store)
    return engines, infos

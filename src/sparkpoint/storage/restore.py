"""Bringing a task's stores to its last committed checkpoint on this executor.

See docs/architecture.md, "Restore".

For each store, in order of cost:

1. a local checkpoint directory for exactly that checkpoint (it has its ``CHECKPOINT`` file,
   written only after every upload of the commit finished), once each restore backend agrees it
   holds what the checkpoint names (the blob store compares it with the snapshot's files): hard-
   link it into place. ``stores.<s>.clean.on.container.start`` skips this at every job start;
2. a standby copy of the store on this executor that the driver vouches for (a catch-up of
   this run brought it to, or found it at, a checkpoint: :mod:`sparkpoint.storage.standby`):
   *promoted*, moved into place and brought to the checkpoint by replaying only the changelog
   after the copy's offset (then trimmed as a changelog restore is). If that fails, the copy
   is dropped with an ERROR and the store restores from its backends as below;
3. otherwise the backends of ``stores.<s>.restore.factories`` that have a marker for the store
   in the checkpoint, in that order: the store directory is emptied and the first one rebuilds
   it; if it fails (a missing or corrupt blob, an unreadable changelog) the next one is tried,
   with an ERROR saying so, and when none is left the job stops with a :class:`RestoreError`;
4. with no marker for the store in any restore backend:

   * no checkpoint at all, or a V2 checkpoint with no marker for the store from any backend
     (the store is new to the job): the first restore backend starts it fresh (the changelog
     backend trims what an uncommitted run wrote);
   * a checkpoint that shows committed state for the store that no configured restore backend
     can reach (a V1 checkpoint read while a restore backend keeps its markers in V2 only, or
     a V2 marker of a backend no longer listed in ``restore.factories``): a
     :class:`RestoreError` naming the task, store, checkpoint and the fix. The job never
     continues from an empty or older store while keeping newer input offsets;
   * a store without any backend starts empty, with a WARNING when a checkpoint existed (its
     state was only on the lost disk).

After the store is at its checkpoint, every *other* backup backend of the store is told to
discard what it holds beyond that checkpoint (the changelog appends the checkpointed value or a
tombstone for every key written after its checkpointed offset), so a later restore from that
backend on another executor cannot bring back writes of an uncommitted batch.

In non-transactional mode the local checkpoint is not used: the changelog is replayed to its
newest entry and nothing is discarded. Everything is written inside the task's own directory.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV1
from sparkpoint.config import Config
from sparkpoint.errors import RestoreError
from sparkpoint.failpoints import InjectedCrash, maybe_crash
from sparkpoint.fsutil import user_disk_error
from sparkpoint.model import TaskModel
from sparkpoint.storage.backend import (
    BackendContext,
    RestoreStats,
    backend_factory,
    store_backends,
)
from sparkpoint.storage.changelog.backend import NAME as CHANGELOG
from sparkpoint.storage.changelog.backend import ChangelogRestoreManager
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.kv.factory import open_engine
from sparkpoint.storage.local import LocalTaskState, StandbyCopy
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)

LOCAL = "local-checkpoint"
EMPTY = "empty"
#: a store whose standby copy was promoted (its stats count the changelog tail replayed)
PROMOTED = "standby"
#: how long a promotion waits for its copy's lock (held only by a stray catch-up) before the
#: store restores from its backends
PROMOTE_WAIT_S = 5.0


def _files_and_bytes(directory: Path) -> tuple[int, int]:
    """Files under ``directory`` and their total size (a relinked local checkpoint's)."""
    files = size = 0
    for path in directory.rglob("*"):
        if path.is_file():
            files += 1
            size += path.stat().st_size
    return files, size


def _has_committed_state(checkpoint: Checkpoint, store: str) -> str | None:
    """Why ``checkpoint`` shows committed state for ``store`` (or None if it shows none)."""
    if isinstance(checkpoint, CheckpointV1):
        return None  # V1 names changelog offsets only; the changelog backend reads those
    owners = sorted(  # (sparkpoint's own markers, output and global tables, name no store)
        n
        for n, m in checkpoint.state_checkpoint_markers.items()
        if store in m and not n.startswith("sparkpoint.")
    )
    return f"it has markers of {', '.join(owners)}" if owners else None


def restore_candidates(
    config: Config, store: str, task: TaskModel, checkpoint: Checkpoint | None
) -> list[str]:
    """The backends to try, in order, to restore ``store`` to ``checkpoint``.

    An empty list means the store has no restore backend. Raises :class:`RestoreError` when
    the checkpoint shows committed state for the store that no configured backend can restore.
    """
    names = store_backends(config, store, "restore")
    if not names:
        return []
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
        return with_marker
    if checkpoint is None:
        return [names[0]]  # nothing committed yet: start fresh
    cid = checkpoint.checkpoint_id
    v1_blind = [n for n in names if not backend_factory(n).markers_in_v1]
    if isinstance(checkpoint, CheckpointV1) and v1_blind:
        raise RestoreError(
            f"task {task.name} store {store}: checkpoint {cid} is a V1 checkpoint, which holds "
            f"no marker of the {', '.join(v1_blind)} backend, so the store's committed state "
            f"cannot be found. Read V2 checkpoints first: task.checkpoint.read.versions=2,1 "
            f"(and write them: task.checkpoint.write.versions must include 2)"
        )
    reason = _has_committed_state(checkpoint, store)
    if reason is not None:
        raise RestoreError(
            f"task {task.name} store {store}: checkpoint {cid} has committed state for the store "
            f"({reason}) but none of stores.{store}.restore.factories ({', '.join(names)}) has a "
            f"marker for it. Add the backend that holds it to stores.{store}.restore.factories"
        )
    log.warning(
        "task %s store %s: checkpoint %s has no state for this store (a store new to the job); "
        "starting it fresh with %s",
        task.name,
        store,
        cid,
        names[0],
    )
    return [names[0]]


@dataclass
class _Pending:
    store: str
    candidates: list[str]
    failures: list[str]


class TaskRestore:
    """Restores the stores of one task; see the module docstring. One use per batch."""

    def __init__(
        self,
        config: Config,
        systems: Systems,
        task: TaskModel,
        local: LocalTaskState,
        checkpoint: Checkpoint | None,
        open_engine: Mapping[str, Callable[[], KeyValueEngine]],
        *,
        stores: list[str] | None = None,
        read_only: bool = False,
        standby: StandbyCopy | None = None,
    ) -> None:
        """``standby``: a standby copy on this executor the driver vouches for (a catch-up of
        this run left it at a checkpoint of the task's lineage), promoted for the stores it
        holds."""
        self.config = config
        self.standby = standby
        self.stores = list(config.stores) if stores is None else stores
        self.read_only = read_only
        self.systems = systems
        self.task = task
        self.local = local
        self.checkpoint = checkpoint
        self.open_engine = open_engine
        self.transactional = config.get_bool("task.transactional.state.checkpoint.enabled")
        self.engines: dict[str, KeyValueEngine] = {}
        self.stats: list[RestoreStats] = []
        self.restored_by: dict[str, str] = {}  # store -> where its state came from

    @property
    def checkpoint_id(self) -> str | None:
        return None if self.checkpoint is None else str(self.checkpoint.checkpoint_id)

    def run(self) -> tuple[dict[str, KeyValueEngine], list[RestoreStats]]:
        """Rebuild every store; returns the open (unwrapped) engines and what was done."""
        pending: list[_Pending] = []
        for store in self.stores:
            start = time.monotonic()
            if (
                self.transactional
                and self._local_checkpoint_usable(store)
                and self.local.restore_from_checkpoint(store, self.checkpoint_id)
            ):
                files, size = _files_and_bytes(self.local.store_dir(store))
                stats = RestoreStats(store, LOCAL, files, size, unit="files")
                self._opened(store, LOCAL, stats, start)
                continue
            if self._promote(store, start):
                continue
            self.local.clear_store(store)
            candidates = restore_candidates(self.config, store, self.task, self.checkpoint)
            if candidates:
                pending.append(_Pending(store, candidates, []))
                continue
            if self.checkpoint is not None:
                log.warning(
                    "task %s store %s: no local checkpoint %s on %s and no restore backend; "
                    "starting EMPTY (configure a state backend to restore state on any executor)",
                    self.task.name,
                    store,
                    self.checkpoint_id,
                    socket.gethostname(),
                )
            self._opened(store, EMPTY, RestoreStats(store, EMPTY), start)
        while pending:
            backend = pending[0].candidates[0]
            group = [p for p in pending if p.candidates[0] == backend]
            pending = [p for p in pending if p.candidates[0] != backend]
            pending.extend(self._restore_group(backend, group))
        self._discard_uncommitted()
        return self.engines, self.stats

    def _local_checkpoint_usable(self, store: str) -> bool:
        """Whether the local checkpoint of ``store`` (if any) may be used: not when the store is
        cleaned at every start, nor when a restore backend says it differs from the copy the
        checkpoint names (a disk that lost or damaged files)."""
        if self.config.get_bool(f"stores.{store}.clean.on.container.start"):
            self.local.clean_checkpoints(store, keep=set())
            log.info(
                "task %s store %s: stores.%s.clean.on.container.start: restoring from the backend",
                self.task.name,
                store,
                store,
            )
            return False
        cid = self.checkpoint_id
        if cid is None or not self.local.has_checkpoint(store, cid):
            return True
        for name in store_backends(self.config, store, "restore"):
            manager = backend_factory(name).restore_manager(self._context([store]))
            try:
                manager.init(self.checkpoint)
                reason = manager.local_checkpoint_mismatch(
                    store, self.local.checkpoint_dir(store, cid)
                )
            except Exception as exc:  # cannot verify: restore from a backend instead
                reason = f"cannot be verified against {name}: {type(exc).__name__}: {exc}"
            finally:
                manager.close()
            if reason is not None:
                log.warning(
                    "task %s store %s: local checkpoint %s %s; not using it",
                    self.task.name,
                    store,
                    cid,
                    reason,
                )
                self.local.clean_checkpoints(store, keep=set())
                return False
        return True

    def _promote(self, store: str, start: float) -> bool:
        """Promote the standby copy of ``store`` (see the module docstring); whether it was.
        Under the copy's lock: a catch-up that outlived its failed job and holds it would
        change the copy as it is taken; after :data:`PROMOTE_WAIT_S` the store restores from
        its backends instead."""
        copy = self.standby
        if copy is None:
            return False
        with copy.lock(PROMOTE_WAIT_S) as mine:
            if not mine:
                log.warning(
                    "task %s store %s: its standby copy on executor %s is in use by another "
                    "process (a standby catch-up) after %.0f s; restoring it from its backends",
                    self.task.name,
                    store,
                    copy.executor,
                    PROMOTE_WAIT_S,
                )
                return False
            return self._take_copy(copy, store, start)

    def _take_copy(self, copy: StandbyCopy, store: str, start: float) -> bool:
        held = copy.position()
        if held is None or store not in held[1] or not copy.store_present(store):
            return False
        self.local.clear_store(store)
        self.local.dir.mkdir(parents=True, exist_ok=True)
        context = self._context([store])
        manager = ChangelogRestoreManager(context)
        try:
            os.replace(copy.store_dir(store), self.local.store_dir(store))
            copy.forget_store(store)
            manager.init(self.checkpoint)
            stats = manager.restore_after(store, held[1][store])
        except InjectedCrash:
            raise
        except Exception as exc:
            engine = context.engines.pop(store, None)
            if engine is not None:
                engine.discard()
            self.local.clear_store(store)
            log.error(
                "task %s store %s: cannot promote its standby copy at checkpoint %s (%s: %s); "
                "restoring it from its backends instead",
                self.task.name,
                store,
                held[0],
                type(exc).__name__,
                exc,
            )
            return False
        finally:
            manager.close()
        self.engines[store] = context.engine(store)
        stats.source = PROMOTED
        stats.seconds = time.monotonic() - start
        self.stats.append(stats)
        self.restored_by[store] = CHANGELOG  # trimmed by the replay: nothing else to discard
        log.info(
            "task %s store %s: promoted its standby copy from checkpoint %s to %s: replayed "
            "%d changelog records (%d bytes) in %.2fs",
            self.task.name,
            store,
            held[0],
            self.checkpoint_id,
            stats.entries,
            stats.bytes,
            stats.seconds,
        )
        return True

    def _opened(self, store: str, source: str, stats: RestoreStats, start: float) -> None:
        if store not in self.engines:
            self.engines[store] = self.open_engine[store]()
        stats.seconds = time.monotonic() - start
        self.stats.append(stats)
        self.restored_by[store] = source

    def _restore_group(self, backend: str, group: list[_Pending]) -> list[_Pending]:
        """Restore ``group`` from ``backend``; the stores to retry elsewhere if it failed."""
        stores = [p.store for p in group]
        context = self._context(stores)
        manager = backend_factory(backend).restore_manager(context)
        try:
            manager.init(self.checkpoint)
            for stats in manager.restore():
                self.engines[stats.store] = context.engine(stats.store)
                self.stats.append(stats)
                self.restored_by[stats.store] = backend
                log.info(
                    "task %s store %s: restored from %s: %d %s, %d bytes in %.2fs",
                    self.task.name,
                    stats.store,
                    backend,
                    stats.entries,
                    stats.unit,
                    stats.bytes,
                    stats.seconds,
                )
                maybe_crash(self.config, "during-restore")
        except InjectedCrash:
            raise
        except Exception as exc:
            return self._failed(backend, group, context, exc)
        finally:
            manager.close()
        for store in stores:  # a backend that restores files opens nothing itself
            self.engines.setdefault(store, context.engine(store))
        return []

    def _failed(
        self, backend: str, group: list[_Pending], context: BackendContext, exc: Exception
    ) -> list[_Pending]:
        reason = f"{type(exc).__name__}: {exc}"
        for p in group:
            engine = context.engines.pop(p.store, None)
            if engine is not None:
                engine.discard()
            self.engines.pop(p.store, None)
            self.stats = [s for s in self.stats if s.store != p.store]
            self.local.clear_store(p.store)  # empty it again
        if user_disk_error(exc):  # this disk's fault, not the backend's: no other one helps
            raise exc
        retry = []
        for p in group:
            p.failures.append(f"{backend}: {reason}")
            p.candidates.pop(0)
            if not p.candidates:
                raise RestoreError(
                    f"task {self.task.name} store {p.store}: cannot restore checkpoint "
                    f"{self.checkpoint_id}: {'; '.join(p.failures)}. No other backend of "
                    f"stores.{p.store}.restore.factories has a marker for it; repair the "
                    f"backend's copy, or add another backend that holds the state"
                ) from exc
            log.error(
                "task %s store %s: restore from %s failed (%s); falling back to %s",
                self.task.name,
                p.store,
                backend,
                reason,
                p.candidates[0],
            )
            retry.append(p)
        return retry

    def _context(self, stores: list[str]) -> BackendContext:
        return BackendContext(
            self.config,
            self.task,
            stores,
            self.systems,
            self.local,
            engines={s: self.engines[s] for s in stores if s in self.engines},
            openers={s: self.open_engine[s] for s in stores},
            read_only=self.read_only,
        )

    def _discard_uncommitted(self) -> None:
        """Tell every backup backend the store was not restored from to drop what it holds
        beyond the checkpoint (transactional mode only)."""
        if not self.transactional or self.read_only:
            return
        by_backend: dict[str, list[str]] = {}
        for store, source in self.restored_by.items():
            for name in store_backends(self.config, store, "backup"):
                if name != source:
                    by_backend.setdefault(name, []).append(store)
        for name, stores in by_backend.items():
            manager = backend_factory(name).restore_manager(self._context(stores))
            try:
                manager.init(self.checkpoint)
                manager.discard_uncommitted()
            finally:
                manager.close()


def restore_for_reading(
    config: Config,
    systems: Systems,
    task: TaskModel,
    store: str,
    checkpoint: Checkpoint,
    directory: Path,
) -> KeyValueEngine:
    """The committed contents of ``store`` at ``checkpoint``, rebuilt in the scratch
    ``directory`` from its restore backends (blob-store snapshot, or a changelog replay to the
    checkpointed offset) without writing to any backend; the caller closes the engine."""
    local = LocalTaskState(directory, task.name)
    factory = config.require(f"stores.{store}.factory")
    opener = {store: lambda: open_engine(store, factory, local.store_dir(store))}
    restore = TaskRestore(
        config, systems, task, local, checkpoint, opener, stores=[store], read_only=True
    )
    engines, _ = restore.run()
    return engines[store]

"""One owner of a task's state on this executor: open or restore, wrap, commit, close.

Samza splits this between ``ContainerStorageManager`` (restore) and
``TaskStorageCommitManager`` (commit); here one object per task and batch does it all, and the
runtime (the task API's executor and the DataFrame API's phases alike) only calls it:

.. code-block:: python

    storage = TaskStorage(config, systems, task, run_id=..., pool_size=..., last_checkpoint=...)
    kept = storage.open(expected_state_id)   # keep the live stores, or restore the checkpoint
    stores = storage.stores()                # wrapped for their backup backends, with serdes
    ...                                      # the batch reads and writes the stores
    report = storage.commit(offsets, due=True, wait=False)   # see commit()
    storage.close(report.state_id(uncommitted=...))          # the marker of the new state

The local marker (:mod:`sparkpoint.storage.local`) names the state the live stores hold; it is
cleared by :meth:`TaskStorage.open` before anything changes and written by
:meth:`TaskStorage.close` after every store is flushed and closed. A *state id* is
a :class:`~sparkpoint.storage.state_id.StateId`: a committed checkpoint right after a commit, an
uncommitted batch of a run after one, empty before any.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkpoint import worker
from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.config import Config
from sparkpoint.errors import CommitError
from sparkpoint.fsutil import atomic_write
from sparkpoint.model import SystemStreamPartition, TaskModel
from sparkpoint.model.clock import now_ms
from sparkpoint.storage.backend import (
    BackendContext,
    RestoreStats,
    TaskBackupManager,
    backend_factory,
    store_backends,
)
from sparkpoint.storage.commit import (
    CommitOutcome,
    CommitRecord,
    CommitScope,
    CommitSettings,
    TaskCommitManager,
)
from sparkpoint.storage.kv import ttl
from sparkpoint.storage.kv.base import KeyValueEngine, KeyValueStore
from sparkpoint.storage.kv.factory import engine_kind, open_engine
from sparkpoint.storage.kv.lazy import LazyEngine
from sparkpoint.storage.kv.store import SerializedKeyValueStore, store_serdes
from sparkpoint.storage.local import LocalTaskState, StandbyCopy, remove_standby_copies
from sparkpoint.storage.outputs import TaskOutputs, publish
from sparkpoint.storage.restore import PROMOTED, TaskRestore
from sparkpoint.storage.standby import FACTOR
from sparkpoint.storage.state_id import EMPTY, CommittedState, StateId
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)

# In-memory engines live only inside this Python worker, tagged with the state id they hold
# (the ``memory-stores`` slot of sparkpoint.worker), keyed by (task, store).
_MEMORY: dict[tuple[str, str], tuple[StateId, KeyValueEngine]] = worker.slot("memory-stores", dict)


class _Held:
    """Inside :func:`held_engines`: persistent engines a phase of a batch closed, for the next
    phase in this process, keyed by (task, store); ``engines`` is None outside the block (the
    ``held-engines`` slot of :mod:`sparkpoint.worker`)."""

    def __init__(self) -> None:
        self.engines: dict[tuple[str, str], KeyValueEngine] | None = None


_HELD_SLOT = worker.slot("held-engines", _Held)

# when each TTL store was last swept, by (task directory, store) (the ``ttl-sweeps`` slot)
_SWEPT: dict[tuple[str, str], int] = worker.slot("ttl-sweeps", dict)


@contextlib.contextmanager
def held_engines() -> Iterator[None]:
    """Run several phases of one batch (a DataFrame task's read, stateful step and finish, in
    one Python worker) with their stores opened once: inside the block, a phase's
    :meth:`TaskStorage.close` without a state id keeps the persistent engines open, and the
    next :meth:`TaskStorage.open_live` of the same task and store takes them again (a RocksDB
    open replays its write-ahead log: about 25 ms a store). :meth:`TaskStorage.open`, which
    may restore, and the final close with a state id close them for real; the block closes
    whatever is left, on success or failure."""
    if _HELD_SLOT.engines is not None:
        yield  # already inside a block
        return
    _HELD_SLOT.engines = {}
    try:
        yield
    finally:
        held, _HELD_SLOT.engines = _HELD_SLOT.engines, None
        for engine in held.values():
            engine.close()


def persistent_store(config: Config, store: str) -> bool:
    """Whether ``store`` lives on disk (RocksDB) rather than in one process's memory."""
    return engine_kind(store, config.require(f"stores.{store}.factory")) == "rocksdb"


@dataclass
class CommitReport:
    """What :meth:`TaskStorage.commit` did: the commit it started (if any), and every finished
    commit the driver may now write, oldest first."""

    outcome: CommitOutcome
    completed: list[CommitRecord] = field(default_factory=list)

    @property
    def finished_now(self) -> bool:
        """Whether the commit started in this batch has already finished its upload."""
        started = self.outcome.started
        return started is not None and any(r.checkpoint_id == started for r in self.completed)

    def state_id(self, *, uncommitted: StateId) -> StateId:
        """The state the stores hold after this batch: the commit's when it finished now,
        else ``uncommitted`` (the batch's own state id)."""
        if self.finished_now and self.outcome.started is not None:
            return CommittedState(self.outcome.started)
        return uncommitted


class TaskStorage:
    """The stores of one task in one batch on this executor; see the module docstring."""

    def __init__(
        self,
        config: Config,
        systems: Systems,
        task: TaskModel,
        *,
        run_id: str,
        pool_size: int = 1,
        last_checkpoint: Checkpoint | None = None,
    ) -> None:
        self.config = config
        self.systems = systems
        self.task = task
        self.run_id = run_id
        self.pool_size = pool_size
        self.last_checkpoint = last_checkpoint
        self.local = LocalTaskState(config.store_base_dir, task.name)
        self.engines: dict[str, KeyValueEngine] = {}
        self.restored: list[RestoreStats] = []
        self.backup_names = {s: store_backends(config, s, "backup") for s in config.stores}
        self._backups: dict[str, TaskBackupManager] = {}
        self._typed: list[SerializedKeyValueStore[Any, Any]] = []
        #: exactly-once output staged since the last written checkpoint; its commits name it
        self.outputs: TaskOutputs | None = None
        self.published = 0  # staged records published by this batch's clean-up
        #: the executor whose standby copy :meth:`open` promoted (the copy is gone now)
        self.promoted_copy: str | None = None

    @property
    def last_checkpoint_id(self) -> str | None:
        cp = self.last_checkpoint
        return None if cp is None else str(cp.checkpoint_id)

    # -- open: keep the live stores, or restore the last checkpoint

    def open(
        self,
        expected_state_id: StateId,
        standbys: Sequence[tuple[str, str]] = (),
        *,
        lazily: bool = False,
    ) -> bool:
        """Open every store at the state the driver expects: the live stores when the local
        marker names ``expected_state_id`` (returns ``True``), else the last checkpoint
        restored (:mod:`sparkpoint.storage.restore`; returns ``False``, with
        :attr:`restored` saying what each store's restore did). The marker is cleared either
        way: the stores are about to change. ``standbys``: ``(executor id, checkpoint id)`` of
        each standby copy of the task the driver saw reach that checkpoint; a restore promotes
        the first one on this disk, at that checkpoint. ``lazily`` (a batch that only cleans
        up): live persistent stores are opened at their first use, if any
        (:class:`~sparkpoint.storage.kv.lazy.LazyEngine`)."""
        self._release_held()
        if not standbys and self.config.get_int(FACTOR) == 1:
            remove_standby_copies(self.config.store_base_dir, self.task.name)
        marker = self.local.read_marker()
        missing = self._missing_stores()
        if self.is_current(expected_state_id):
            for store in self.config.stores:
                cached = _MEMORY.get((self.task.name.name, store))
                if cached is not None:
                    self.engines[store] = cached[1]
                elif lazily and persistent_store(self.config, store):
                    self.engines[store] = LazyEngine(store, self._opener(store))
                else:
                    self.engines[store] = self._open_engine(store)
            self.local.clear_marker()
            return True
        if marker == expected_state_id and missing:
            log.warning(
                "task %s: local state %s is expected, but store(s) %s are missing under %s: "
                "restoring checkpoint %s",
                self.task.name,
                marker,
                ", ".join(missing),
                self.local.dir,
                self.last_checkpoint_id,
            )
        elif marker is not None or expected_state_id != EMPTY:
            log.info(
                "task %s: local state %s, expected %s: restoring checkpoint %s",
                self.task.name,
                marker,
                expected_state_id,
                self.last_checkpoint_id,
            )
        self.local.clear_marker()
        # commits this run made before now are of a lineage the stores are leaving: never
        # written (their output was staged by that lineage, and is staged again by this one)
        # (written even with no commit record on disk: a zombie attempt of this task may
        # have snapshotted a commit whose record it writes later)
        self.local.dir.mkdir(parents=True, exist_ok=True)
        stamp = f"{self.run_id} {int(time.time() * 1000)}"  # the commit records' clock
        atomic_write(self.local.abandoned_commits_file(), stamp.encode())
        for store in self.config.stores:
            _MEMORY.pop((self.task.name.name, store), None)
        openers = {s: self._opener(s) for s in self.config.stores}
        copy = self._vouched(standbys)
        self.engines, self.restored = TaskRestore(
            self.config,
            self.systems,
            self.task,
            self.local,
            self.last_checkpoint,
            openers,
            standby=copy,
        ).run()
        if copy is not None and any(s.source == PROMOTED for s in self.restored):
            self.promoted_copy = copy.executor
        return False

    def _vouched(self, standbys: Sequence[tuple[str, str]]) -> StandbyCopy | None:
        """The first standby copy the driver offers that is on this disk at the checkpoint
        the driver saw it reach."""
        for executor, checkpoint_id in standbys:
            copy = StandbyCopy(self.config.store_base_dir, executor, self.task.name)
            held = copy.position()
            if held is not None and held[0] == checkpoint_id:
                return copy
            if held is not None:
                log.warning(
                    "task %s: its standby copy for executor %s is at checkpoint %s, not %s as "
                    "the driver saw; not promoting it",
                    self.task.name,
                    executor,
                    held[0],
                    checkpoint_id,
                )
        return None

    def is_current(self, expected_state_id: StateId) -> bool:
        """Whether :meth:`open` would keep the live stores: the local marker names
        ``expected_state_id`` and every store is there. Changes nothing."""
        return (
            self.local.read_marker() == expected_state_id
            and self._memory_stores_hold(expected_state_id)
            and not self._missing_stores()
        )

    def restores_from_disk(self) -> bool:
        """Whether restoring the last checkpoint would fetch nothing: every store is on disk
        and has its copy of that checkpoint here (hard links; a restart on the same host). The
        restore may still turn a copy down (a backend finds it differs) and fetch after all.
        Changes nothing."""
        cid = self.last_checkpoint_id
        if cid is None or not self.config.get_bool("task.transactional.state.checkpoint.enabled"):
            return False
        return all(
            persistent_store(self.config, store)
            and not self.config.get_bool(f"stores.{store}.clean.on.container.start")
            and self.local.has_checkpoint(store, cid)
            for store in self.config.stores
        )

    def open_live(self, stores: Iterable[str] | None = None) -> None:
        """Open ``stores`` (all by default) as they are on disk, without checking the marker:
        for a later phase of a batch whose state :meth:`open` already established (inside
        :func:`held_engines`, taking the engines an earlier phase left open)."""
        names = self.config.stores if stores is None else list(stores)
        held = {} if _HELD_SLOT.engines is None else _HELD_SLOT.engines
        task = self.task.name.name
        self.engines = {}
        for store in names:
            engine = held.pop((task, store), None)
            self.engines[store] = self._open_engine(store) if engine is None else engine

    def _release_held(self) -> None:
        """Close the engines of this task an earlier phase left open (:func:`held_engines`)."""
        held = _HELD_SLOT.engines
        if held:
            task = self.task.name.name
            for key in [k for k in held if k[0] == task]:
                held.pop(key).close()

    def _missing_stores(self) -> list[str]:
        """Persistent stores whose database is not on disk (a lost or deleted directory): the
        marker cannot vouch for them."""
        return [
            store
            for store in self.config.stores
            if persistent_store(self.config, store) and not self.local.store_present(store)
        ]

    def _memory_stores_hold(self, state_id: StateId) -> bool:
        for store in self.config.stores:
            if not persistent_store(self.config, store):
                cached = _MEMORY.get((self.task.name.name, store))
                if cached is None or cached[0] != state_id:
                    return False
        return True

    def _opener(self, store: str) -> Any:
        return lambda: self._open_engine(store)

    def _open_engine(self, store: str) -> KeyValueEngine:
        factory = self.config.require(f"stores.{store}.factory")
        return open_engine(store, factory, self.local.store_dir(store))

    # -- the stores a task uses: every write also goes to the store's backup backends

    def stores(self, *, init: bool = True) -> dict[str, KeyValueStore[Any, Any]]:
        """The open stores, each wrapped by its backup backends and given its serdes. ``init``
        reads the last checkpoint's markers into the backups (needed to commit, not to log
        writes)."""
        backups = self._backup_managers(init=init)
        stores: dict[str, KeyValueStore[Any, Any]] = {}
        for name in self.engines:
            typed: SerializedKeyValueStore[Any, Any] = SerializedKeyValueStore(
                name,
                self._with_ttl(name, backups),
                *store_serdes(self.config, name),
                write_buffer=self.config.get_int(f"stores.{name}.write.batch.size"),
            )
            self._typed.append(typed)
            stores[name] = typed
        return stores

    def _with_ttl(self, store: str, backups: Mapping[str, TaskBackupManager]) -> KeyValueEngine:
        """The store's engine wrapped by its backup backends, then read and written with its
        TTL (:mod:`sparkpoint.storage.kv.ttl`; rewritten once if the TTL was added, changed or
        removed since the store was written)."""
        return ttl.prepare(self._logged(store, backups), ttl.ttl_of(self.config, store))

    def _logged(self, store: str, backups: Mapping[str, TaskBackupManager]) -> KeyValueEngine:
        engine = self.engines[store]
        for backend in self.backup_names[store]:
            engine = backups[backend].wrap_engine(store, engine)
        return engine

    def logged_engines(self) -> dict[str, KeyValueEngine]:
        """The open stores as raw engines wrapped by their backup backends only: keys and values
        as stored (a TTL store's write times and format entry included), every write logged and
        committed by :meth:`commit`. For tools that move entries as they are (state reshard)."""
        backups = self._backup_managers(init=True)
        return {name: self._logged(name, backups) for name in self.engines}

    def _sweep_expired(self) -> None:
        """Delete the expired entries of each TTL store (through its backups, so the changelog
        gets a tombstone) when a quarter of its TTL has passed since the last sweep here."""
        for store in self.engines:
            ttl_ms = ttl.ttl_of(self.config, store)
            if ttl_ms is None:
                continue
            key, now = (str(self.local.dir), store), now_ms()
            if now - _SWEPT.get(key, now - ttl_ms) < ttl_ms // 4:
                continue
            engine = self._with_ttl(store, self._backup_managers(init=True))
            if isinstance(engine, ttl.TtlEngine):
                removed = engine.sweep()
                if removed:
                    log.info(
                        "task %s: store %s: %d expired entries swept",
                        self.task.name,
                        store,
                        removed,
                    )
            _SWEPT[key] = now

    def _drain(self) -> None:
        """Write the stores' buffered writes to their engines: before a commit snapshots them,
        and before the marker says they hold the batch's state."""
        for store in self._typed:
            try:
                store.drain()
            except Exception as exc:
                raise CommitError(
                    f"task {self.task.name}: store {store.name}: writing the batch's buffered "
                    f"writes failed: {exc} (a full disk? free space and restart: the task "
                    "restores its last checkpoint, nothing is lost)"
                ) from exc

    def _backup_managers(self, *, init: bool) -> dict[str, TaskBackupManager]:
        if self._backups:
            return self._backups
        names = sorted({n for s, ns in self.backup_names.items() if s in self.engines for n in ns})
        for name in names:
            stores = [s for s, ns in self.backup_names.items() if name in ns and s in self.engines]
            context = BackendContext(
                self.config,
                self.task,
                stores,
                self.systems,
                self.local,
                {s: self.engines[s] for s in stores},
            )
            manager = backend_factory(name).backup_manager(context)
            self._backups[name] = manager
            if init:
                manager.init(self.last_checkpoint)
        return self._backups

    # -- commit

    def commit(
        self, offsets: Mapping[SystemStreamPartition, str], *, due: bool, wait: bool
    ) -> CommitReport:
        """Samza's commit sequence, run at the end of a batch (docs/architecture.md):

        0. **clean-up** of the checkpoint the driver wrote since the last batch: older local
           checkpoints and what each backend no longer needs (:meth:`TaskCommitManager.clean_up`);
        1. when ``due``, **snapshot** (synchronous: flush, new checkpoint id, local checkpoints,
           each backend's markers), 2. **upload** (asynchronous unless ``wait``), and
           3. **checkpoint**: once uploaded, the checkpoint into each local checkpoint
           directory (:meth:`TaskCommitManager.commit`);
        4. report every finished commit the driver may write to the checkpoint stream, which it
           does only if the commit builds on the last checkpoint it wrote.

        ``offsets`` are the last processed offset per SSP. With ``wait`` (the final commit of a
        run, or ``task.commit.async.enabled=false``) every upload finishes before this returns.
        """
        self._drain()
        commits = self._commit_manager()
        commits.clean_up(self.last_checkpoint)
        outcome = CommitOutcome()
        if due:
            self._sweep_expired()
            outcome = commits.commit(offsets, wait=wait)
        else:
            if wait:
                commits.wait_all()
            outcome.skipped = commits.check_uploads()
        return CommitReport(outcome, commits.completed(self.last_checkpoint_id))

    def _commit_manager(self) -> TaskCommitManager:
        scope = CommitScope(
            self.task.name,
            self.run_id,
            self.local,
            self.engines,
            self._backup_managers(init=True),
            self.backup_names,
            self.config,
            self.outputs,
            self._publish,
        )
        return TaskCommitManager(
            scope,
            CommitSettings.from_config(self.config, pool_size=self.pool_size),
            committed=self.last_checkpoint_id,
        )

    def _publish(self, committed: Checkpoint) -> int:
        """Publish the staged output a written checkpoint names (its clean-up)."""
        n = publish(self.config, self.systems, self.task.name, committed, self.config)
        self.published += n
        return n

    # -- close

    def close(self, state_id: StateId | None = None) -> None:
        """Close the backups and the persistent stores (idempotent). With ``state_id`` (after
        a batch that finished), in-memory stores stay in this worker tagged with it, and the
        marker says the stores hold it. Without one, buffered writes are dropped: the batch
        failed, and the next one restores the last checkpoint."""
        if state_id is not None:
            self._drain()
        self._typed.clear()
        for manager in self._backups.values():
            manager.close()
        self._backups.clear()
        for name, engine in list(self.engines.items()):
            if engine.persistent:
                if state_id is None and _HELD_SLOT.engines is not None:
                    # the next phase takes it
                    _HELD_SLOT.engines[(self.task.name.name, name)] = engine
                else:
                    engine.close()
                del self.engines[name]
        if state_id is None:
            return
        for name, engine in self.engines.items():
            _MEMORY[(self.task.name.name, name)] = (state_id, engine)
        self.engines.clear()
        self.local.write_marker(state_id)

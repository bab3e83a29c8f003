"""State backends: how a task's stores are backed up at a commit and restored after a loss.

A task keeps its stores on local disk. Local disk can be lost (a host dies, a task moves to
another executor), so each store names one or more *backends* (``stores.<s>.backup.factories``)
that keep a copy elsewhere, and the backends it may be restored from, in order of preference
(``stores.<s>.restore.factories``). Built in: ``changelog`` (every write is also appended to a
changelog stream partition, :mod:`sparkpoint.storage.changelog`) and ``blobstore`` (the store's
files are copied to a blob store: a local directory, Azure Blob Storage or S3,
:mod:`sparkpoint.storage.blobstore`). A commit runs in two phases, then a clean-up:

* **snapshot** (synchronous, while processing waits, so it must be fast): the backend notes
  *what* it will back up and returns its markers so far (the changelog backend flushes its
  producer and returns the newest changelog offset; a blob store returns nothing yet);
* **upload** (asynchronous, while processing continues): the backend makes the snapshot
  durable where it keeps copies and returns the final markers (a blob store uploads the new
  files and returns the id of the snapshot index). Only when every upload of a commit has
  finished is the checkpoint, which names all the markers, written;
* **clean_up** (after the checkpoint is written): the backend deletes what the new checkpoint
  no longer needs (older snapshots). It is idempotent and re-run at start-up.

A marker is an opaque string owned by its backend; the checkpoint keeps one per backend per
store (``state-checkpoint-markers``). Restoring reads the marker of the chosen backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sparkpoint.checkpoint.checkpoint import FROM_SAMZA, Checkpoint, CheckpointV1
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import Config, ConfigKey
from sparkpoint.errors import ConfigError
from sparkpoint.model import JobModel, SystemStreamPartition, TaskModel, TaskName
from sparkpoint.refs import installed, load_reference

if TYPE_CHECKING:
    from sparkpoint.storage.kv.base import KeyValueEngine
    from sparkpoint.storage.local import LocalTaskState
    from sparkpoint.system.registry import Systems


@dataclass
class RestoreStats:
    """What one store's restore did."""

    store: str
    source: str
    entries: int = 0  # what was restored, counted in ``unit``
    bytes: int = 0
    seconds: float = 0.0
    unit: str = "entries"  # changelog records; "files" for snapshots

    @property
    def brought_state(self) -> bool:
        """Whether this restore brought any state (a fresh start restores nothing)."""
        return self.entries > 0 or self.bytes > 0


@dataclass
class BackendContext:
    """What a backend's task managers may use: the task, its stores and where they live."""

    config: Config
    task: TaskModel
    stores: list[str]
    systems: Systems
    local: LocalTaskState  # the task's directories: store_dir(s), checkpoint_dir(s, id)
    engines: dict[str, KeyValueEngine] = field(default_factory=dict)
    openers: Mapping[str, Callable[[], KeyValueEngine]] = field(default_factory=dict)
    #: restore into a scratch directory for reading only: write nothing to any backend
    read_only: bool = False

    def engine(self, store: str) -> KeyValueEngine:
        """The store's open engine, opening it (in its directory) on first use."""
        if store not in self.engines:
            self.engines[store] = self.openers[store]()
        return self.engines[store]


class TaskBackupManager(ABC):
    """Backs up one task's stores for one backend. Used by one task on one thread, except
    ``upload``'s future, which runs on the commit pool."""

    @abstractmethod
    def init(self, checkpoint: Checkpoint | None) -> None:
        """Load what the last checkpoint says (e.g. the previous snapshot to diff against)."""

    def wrap_engine(self, store: str, engine: KeyValueEngine) -> KeyValueEngine:
        """The engine the task writes through (the changelog backend logs writes here)."""
        return engine

    @abstractmethod
    def snapshot(self, checkpoint_id: CheckpointId) -> dict[str, str]:
        """Synchronous and fast: record what this commit backs up; markers so far, by store."""

    @abstractmethod
    def upload(
        self, checkpoint_id: CheckpointId, snapshot_markers: Mapping[str, str]
    ) -> Future[dict[str, str]]:
        """Asynchronous: make the snapshot durable; resolves to the final markers by store."""

    @abstractmethod
    def clean_up(self, checkpoint_id: CheckpointId, markers: Mapping[str, str]) -> None:
        """Delete what the committed checkpoint no longer needs. Idempotent."""

    def stats(self) -> dict[str, int]:
        """Counters of the last upload (e.g. files and bytes uploaded), for display and logs."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Idempotent."""


class TaskRestoreManager(ABC):
    """Restores one task's stores from one backend."""

    @abstractmethod
    def init(self, checkpoint: Checkpoint | None) -> None:
        """Read this backend's markers from the checkpoint."""

    @abstractmethod
    def restore(self) -> list[RestoreStats]:
        """Rebuild every store of the context in its (empty) store directory.

        A backend that restores files writes them into the directory and opens nothing; one
        that restores entries writes them through ``context.engine(store)``, which stays open
        for the task.
        """

    def local_checkpoint_mismatch(self, store: str, directory: Path) -> str | None:
        """Why the local checkpoint ``directory`` of ``store`` does not hold what this backend's
        marker says the checkpoint holds (None: it does, or the backend cannot tell). Checked
        before a local checkpoint is trusted."""
        return None

    def discard_uncommitted(self) -> None:  # noqa: B027 - optional hook
        """The context's stores were restored to the checkpoint from elsewhere (a local
        checkpoint, another backend) and are open in ``context.engines``: drop or undo what this
        backend holds beyond the checkpoint, so a later restore from it cannot bring back writes
        of an uncommitted batch. Idempotent. Backends whose copies are immutable and named by
        their markers (a blob store) have nothing to undo."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Idempotent."""


class StateBackendAdmin(ABC):
    """Job-wide resources of a backend, created by the driver before the first batch."""

    @abstractmethod
    def create_resources(self) -> None:
        """Create what the backend needs (e.g. changelog streams). Idempotent."""

    @abstractmethod
    def validate_resources(self) -> None:
        """Raise a clear error if existing resources cannot serve the job."""

    def compact(  # noqa: B027
        self, checkpoints: Mapping[TaskName, Checkpoint], *, during_run: bool = False
    ) -> None:
        """Bound the backend's storage by the tasks' last checkpoints: at job start, and
        (``during_run``) after commits, where a backend may skip what grew too little to be
        worth it."""

    def lost_committed_state(self, checkpoints: Mapping[TaskName, Checkpoint]) -> set[TaskName]:
        """Tasks whose last checkpoint names state this backend no longer holds (e.g. a
        changelog deleted while the job was stopped). Their live local state is not kept as
        is: they restore, and the restore repairs the backend from a local checkpoint or
        stops with an error naming the fix. Checked at job start."""
        return set()

    def hold_records(  # noqa: B027
        self, checkpoints: Mapping[TaskName, Checkpoint], hold: bool
    ) -> None:
        """At job start: with ``hold`` (exactly-once), make the streams the tasks write their
        state to (changelogs) hold back from read-committed readers every record the tasks'
        last checkpoints do not cover, until a checkpoint covers it (:meth:`commit_records`);
        without, release them. Idempotent."""

    def commit_records(self, written: Sequence[tuple[TaskName, Checkpoint]]) -> None:  # noqa: B027
        """After the driver wrote these checkpoints (exactly-once): the records they cover
        become visible to read-committed readers."""

    def delete_unused(self, checkpoints: Mapping[TaskName, Checkpoint]) -> None:  # noqa: B027
        """Delete remote state the tasks' last checkpoints name for stores that no longer use
        this backend (gone from the job, or moved to another backend). Run at job start for
        every backend that any checkpoint names, configured or not. Idempotent."""


class NoResources(StateBackendAdmin):
    """The admin of a backend with no job-wide resources."""

    def __init__(self, config: Config, model: JobModel, systems: Systems) -> None:
        pass

    def create_resources(self) -> None:
        pass

    def validate_resources(self) -> None:
        pass


class StateBackendFactory(ABC):
    """Makes a backend's managers from its classes. Subclasses need a no-argument constructor.

    A backend sets ``backup_class``, ``restore_class`` and (if it has job-wide resources)
    ``admin_class``; it overrides the methods only to build its managers differently.
    """

    name: str = ""
    #: whether a V1 checkpoint carries this backend's markers (as changelog SSP offsets)
    markers_in_v1: bool = False
    #: the config keys this backend reads (``stores.<s>.…`` per store, or global ones), declared
    #: so that ``sparkpoint config keys`` lists them and a job's config is validated against them
    config_keys: tuple[ConfigKey, ...] = ()
    #: whether a restore spends its time with the GIL released (file transfers, checksums), so
    #: that several tasks restore well side by side in threads of one process; a restore that
    #: decodes records in Python (the changelog's) needs processes
    restores_off_the_gil: bool = False
    backup_class: type[TaskBackupManager]
    restore_class: type[TaskRestoreManager]
    admin_class: type[StateBackendAdmin] = NoResources

    def backup_manager(self, context: BackendContext) -> TaskBackupManager:
        return self.backup_class(context)  # type: ignore[call-arg]

    def restore_manager(self, context: BackendContext) -> TaskRestoreManager:
        return self.restore_class(context)  # type: ignore[call-arg]

    def admin(self, config: Config, model: JobModel, systems: Systems) -> StateBackendAdmin:
        return self.admin_class(config, model, systems)  # type: ignore[call-arg]

    def has_marker(
        self, config: Config, checkpoint: Checkpoint | None, store: str, task: TaskModel
    ) -> bool:
        """Whether ``checkpoint`` holds this backend's marker for ``store``."""
        if checkpoint is None:
            return False
        return store in checkpoint.state_checkpoint_markers.get(self.name, {})

    def marker_offsets(
        self, config: Config, markers: Mapping[str, str]
    ) -> dict[SystemStreamPartition, str]:
        """For V1 checkpoints: the changelog SSP offsets this backend's markers imply."""
        return {}

    def markers_from_v1(
        self, config: Config, checkpoint: CheckpointV1, task: TaskModel
    ) -> dict[str, str]:
        """This backend's markers by store, from a V1 checkpoint (``markers_in_v1`` only)."""
        return {}


BUILTIN: dict[str, str] = {
    "changelog": "sparkpoint.storage.changelog:ChangelogStateBackendFactory",
    "blobstore": "sparkpoint.storage.blobstore:BlobStoreStateBackendFactory",
}
ALIASES = FROM_SAMZA  # Samza's factory class names work in config too


def known_backends() -> list[str]:
    return sorted(set(BUILTIN) | {ep.name for ep in installed("sparkpoint.state_backends")})


@cache
def backend_factory(name: str) -> StateBackendFactory:
    """The factory registered as ``name``: built in, or from the entry-point group."""
    name = ALIASES.get(name, name)
    path = BUILTIN.get(name)
    if path is None:
        for ep in installed("sparkpoint.state_backends"):
            if ep.name == name:
                path = ep.value
    if path is None and ":" in name:
        path = name
    if path is None:
        raise ConfigError(f"unknown state backend {name!r}; known: {', '.join(known_backends())}")
    factory = load_reference(path, f"state backend {name!r} ({path})")()
    if not isinstance(factory, StateBackendFactory):
        raise ConfigError(f"state backend {name!r} ({path}) is not a StateBackendFactory")
    return factory


def store_backends(config: Config, store: str, kind: str) -> list[str]:
    """Backends a store lists under ``stores.<s>.<kind>.factories`` (kind: backup, restore).

    A store with ``stores.<s>.changelog`` and no explicit list uses ``changelog``; the restore
    list defaults to the backup list. Unknown names are a ConfigError naming the store.
    """
    key = f"stores.{store}.{kind}.factories"
    names = config.get_list(key)
    if not names and kind == "restore":
        names = config.get_list(f"stores.{store}.backup.factories")
    if not names and config.get_str(f"stores.{store}.changelog"):
        names = ["changelog"]
    out = []
    for name in names:
        canonical = ALIASES.get(name, name)
        # the installed plugins only for a name that is not built in: reading every
        # distribution's entry points took 0.35 s of a Spark worker's first task
        if canonical not in BUILTIN and ":" not in canonical and canonical not in known_backends():
            raise ConfigError(
                f"{key}: store {store} lists unknown backend {name!r}; "
                f"known: {', '.join(known_backends())}"
            )
        out.append(canonical)
    return out


def restores_off_the_gil(config: Config) -> bool:
    """Whether every store restores only from backends whose restore releases the GIL
    (:attr:`StateBackendFactory.restores_off_the_gil`)."""
    return all(
        backend_factory(name).restores_off_the_gil
        for store in config.stores
        for name in store_backends(config, store, "restore")
    )


def checkpoint_markers(
    config: Config, checkpoint: Checkpoint | None, task: TaskModel
) -> dict[str, dict[str, str]]:
    """Every backend's markers a checkpoint holds, by backend and store; a V1 checkpoint's
    are recovered from its changelog offsets. What a tool writing a new checkpoint for the task
    must carry forward, so the state stays restorable."""
    if checkpoint is None:
        return {}
    if not isinstance(checkpoint, CheckpointV1):
        return {n: dict(m) for n, m in checkpoint.state_checkpoint_markers.items()}
    out = {}
    for name in known_backends():
        factory = backend_factory(name)
        if factory.markers_in_v1 and (markers := factory.markers_from_v1(config, checkpoint, task)):
            out[name] = markers
    return out


def v1_changelog_offsets(
    config: Config, markers: Mapping[str, Mapping[str, str]]
) -> dict[SystemStreamPartition, str]:
    """The changelog SSP offsets a V1 checkpoint carries for these markers (by backend)."""
    out: dict[SystemStreamPartition, str] = {}
    for name, by_store in markers.items():
        if name in known_backends():  # (not the markers of staged output: V2 only)
            out.update(backend_factory(name).marker_offsets(config, by_store))
    return out

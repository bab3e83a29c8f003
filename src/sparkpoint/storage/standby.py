"""Standby copies of a task's stores on another executor (Samza's standby tasks, Kafka
Streams' standby replicas): kept current by replaying the task's changelogs up to its last
*written* checkpoint, never past it, so that promoting one (:mod:`sparkpoint.storage.restore`)
replays only the changelog's tail since that checkpoint and serves exactly the committed state.

Owns catching one copy up (:func:`catch_up`). The copy's files belong to
:class:`~sparkpoint.storage.local.StandbyCopy`; which executor keeps which copy is the driver's
(:mod:`sparkpoint.runtime.driver.standby`).

A copy holds the stores that have a changelog (:func:`standby_stores`): nothing else could be
kept current between checkpoints. Its ``POSITION`` is removed before the copy changes and
written after every store of it is closed, so a copy without one is seeded again. A new copy,
or one whose position is not the one the driver expects, is *seeded*: restored to the
checkpoint from the stores' restore backends (the blob store's snapshot when there is one),
reading only, writing nothing to any backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, RestoreError
from sparkpoint.model import TaskModel
from sparkpoint.storage.backend import BackendContext, store_backends
from sparkpoint.storage.changelog.backend import (
    NAME as CHANGELOG,
)
from sparkpoint.storage.changelog.backend import (
    ChangelogRestoreManager,
    changelog_ssp,
    marker_for,
)
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.kv.factory import engine_kind, open_engine
from sparkpoint.storage.local import POSITION, StandbyCopy
from sparkpoint.storage.restore import TaskRestore
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)

FACTOR = "job.standbytasks.replication.factor"
#: how long a catch-up waits for its copy's lock (held by a task promoting the copy: briefly)
CATCH_UP_WAIT_S = 30.0


class StandbyCopyInUse(RestoreError):
    """A catch-up found its copy's lock held by another process (a task taking the copy, or a
    catch-up that outlived its failed job): the copy was left as it is. Not the copy's fault,
    so the driver does not count it toward giving the task's standbys up."""


def replication_factor(config: Config) -> int:
    """Copies of each task's state: the active one and ``factor - 1`` standbys; checked."""
    factor = config.get_int(FACTOR)
    if factor < 1:
        raise ConfigError(f"{FACTOR}={factor}: it counts the active copy too; 1 means no standby")
    if factor > 1 and not config.get_bool("task.transactional.state.checkpoint.enabled"):
        raise ConfigError(
            f"{FACTOR}={factor} needs task.transactional.state.checkpoint.enabled=true: a "
            f"standby stops at the checkpoint, which only transactional state keeps exact"
        )
    if factor > 1 and not config.get_bool("job.host-affinity.enabled"):
        raise ConfigError(
            f"{FACTOR}={factor} needs job.host-affinity.enabled=true: standbys are kept on "
            f"other executors than their task's, which only host affinity places"
        )
    return factor


def standby_stores(config: Config) -> list[str]:
    """The stores a standby copy holds: those on disk that write a changelog."""
    return [
        store
        for store in config.stores
        if engine_kind(store, config.require(f"stores.{store}.factory")) == "rocksdb"
        and CHANGELOG in store_backends(config, store, "backup")
    ]


@dataclass
class CaughtUp:
    """What one catch-up did: the checkpoint the copy is now at; ``seeded`` when it was built
    afresh (``source`` says from where), else ``records`` is the changelog tail replayed."""

    task: str
    checkpoint: str
    seeded: bool
    source: str
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    #: each store's changelog offset the copy is at now (None: nothing of it there)
    offsets: dict[str, str | None] = field(default_factory=dict)


def catch_up(
    config: Config,
    systems: Systems,
    task: TaskModel,
    executor: str,
    checkpoint: Checkpoint,
    at: str | None,
) -> CaughtUp:
    """Bring ``task``'s standby copy kept for ``executor`` to ``checkpoint`` (a written one).
    ``at``: the checkpoint the driver saw the copy reach (None: seed it). A copy at any other
    position (a crash mid catch-up, an earlier run's copy the driver does not vouch for) is
    seeded again, as is one whose tail cannot be replayed (the changelog no longer holds it).
    Under the copy's lock (:meth:`StandbyCopy.lock`); a copy whose catch-up fails is deleted,
    and one whose lock another process holds is left as it is (:class:`StandbyCopyInUse`)."""
    copy = StandbyCopy(config.store_base_dir, executor, task.name)
    with copy.lock(CATCH_UP_WAIT_S) as mine:
        if not mine:
            raise StandbyCopyInUse(
                f"task {task.name}: its standby copy on executor {executor} is in use by "
                f"another process (a task taking it, or another catch-up) after "
                f"{CATCH_UP_WAIT_S:.0f} s; left as it is"
            )
        try:
            return _catch_up(config, systems, task, copy, checkpoint, at)
        except Exception:
            copy.remove()  # nothing half done is kept: the next catch-up seeds it again
            raise


def _catch_up(
    config: Config,
    systems: Systems,
    task: TaskModel,
    copy: StandbyCopy,
    checkpoint: Checkpoint,
    at: str | None,
) -> CaughtUp:
    stores = standby_stores(config)
    cid = str(checkpoint.checkpoint_id)
    held = copy.position()
    started = time.monotonic()
    if (
        at is not None
        and held is not None
        and held[0] == at
        and all(s in held[1] and copy.store_present(s) for s in stores)
    ):
        if at == cid:
            return CaughtUp(task.name.name, cid, False, CHANGELOG, offsets=held[1])
        try:
            return _replay_tail(config, systems, task, copy, checkpoint, held[1], stores, started)
        except RestoreError as exc:
            log.warning(
                "task %s: its standby copy on executor %s cannot catch up from checkpoint %s "
                "(%s); seeding it again",
                task.name,
                copy.executor,
                at,
                exc,
            )
    return _seed(config, systems, task, copy, checkpoint, stores, started)


def _offsets(
    config: Config, task: TaskModel, checkpoint: Checkpoint, stores: list[str]
) -> dict[str, str | None]:
    """Each store's changelog offset in ``checkpoint`` (None: nothing of it there)."""
    out: dict[str, str | None] = {}
    for store in stores:
        marker = marker_for(
            config, checkpoint, store, changelog_ssp(config, store, task.changelog_partition)
        )
        out[store] = None if marker is None else marker.offset
    return out


def _openers(
    config: Config, copy: StandbyCopy, stores: list[str], *, existing: bool = False
) -> dict[str, Callable[[], KeyValueEngine]]:
    """How to open each store of the copy; ``existing``: only a database on disk (a tail
    replay: its store may have been promoted, renamed away, since the position was read)."""

    def opener(store: str) -> Callable[[], KeyValueEngine]:
        factory = config.require(f"stores.{store}.factory")
        return lambda: open_engine(store, factory, copy.store_dir(store), must_exist=existing)

    return {store: opener(store) for store in stores}


def _replay_tail(
    config: Config,
    systems: Systems,
    task: TaskModel,
    copy: StandbyCopy,
    checkpoint: Checkpoint,
    offsets: dict[str, str | None],
    stores: list[str],
    started: float,
) -> CaughtUp:
    copy.delete_note(POSITION)  # the copy changes: unknown until it is at the checkpoint
    records = size = 0
    # a store not on disk now was promoted meanwhile (a catch-up that outlived its failed
    # job): created empty, the tail alone would pass for the copy at the checkpoint
    openers = _openers(config, copy, stores, existing=True)
    for store in stores:
        context = BackendContext(
            config, task, [store], systems, copy, openers=openers, read_only=True
        )
        manager = ChangelogRestoreManager(context)
        try:
            manager.init(checkpoint)
            stats = manager.restore_after(store, offsets[store])
        except BaseException:
            for engine in context.engines.values():  # the copy is dropped: flush nothing
                engine.discard()
            raise
        finally:
            manager.close()
            for engine in context.engines.values():
                engine.close()
        records += stats.entries
        size += stats.bytes
    cid = str(checkpoint.checkpoint_id)
    offsets = _offsets(config, task, checkpoint, stores)
    copy.write_position(cid, offsets)
    return CaughtUp(
        task.name.name, cid, False, CHANGELOG, records, size, time.monotonic() - started, offsets
    )


def _seed(
    config: Config,
    systems: Systems,
    task: TaskModel,
    copy: StandbyCopy,
    checkpoint: Checkpoint,
    stores: list[str],
    started: float,
) -> CaughtUp:
    copy.remove()
    restore = TaskRestore(
        config,
        systems,
        task,
        copy,
        checkpoint,
        _openers(config, copy, stores),
        stores=stores,
        read_only=True,
    )
    try:
        engines, stats = restore.run()
    finally:
        for engine in restore.engines.values():
            engine.close()
    del engines
    cid = str(checkpoint.checkpoint_id)
    offsets = _offsets(config, task, checkpoint, stores)
    copy.write_position(cid, offsets)
    return CaughtUp(
        task.name.name,
        cid,
        True,
        ", ".join(sorted({s.source for s in stats})) or "empty",
        sum(s.entries for s in stats),
        sum(s.bytes for s in stats),
        time.monotonic() - started,
        offsets,
    )

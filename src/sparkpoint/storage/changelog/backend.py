"""The changelog state backend: every write of a store is also appended to a changelog stream.

Each task writes its stores' changes to partition ``changelog_partition`` of each store's
changelog stream (``stores.<s>.changelog``, created compacted by the admin). At a commit the
snapshot flushes the producer and records the newest changelog offset as the marker; there is
nothing left to upload. Restore replays the changelog into the empty store:

* transactional (``task.transactional.state.checkpoint.enabled``, the default): up to exactly
  the checkpointed offset, then *trims* the changelog by appending, for every key written after
  that offset, the restored value (or a tombstone), so the changelog again ends at the state the
  checkpoint describes. With no checkpoint at all the store starts empty and everything is
  trimmed (those writes belonged to input the task will process again);
* non-transactional: up to the newest entry; the state may be ahead of the input offsets, which
  is why transactional is the default.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import cast

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV1
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, RestoreError
from sparkpoint.model import JobModel, SystemStream, SystemStreamPartition, TaskModel, TaskName
from sparkpoint.storage.backend import (
    BackendContext,
    RestoreStats,
    StateBackendAdmin,
    StateBackendFactory,
    TaskBackupManager,
    TaskRestoreManager,
    store_backends,
)
from sparkpoint.storage.changelog.logged import LoggedEngine
from sparkpoint.storage.changelog.marker import ChangelogMarker
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.system.base import (
    PartitionMetadata,
    Record,
    StreamSpec,
    SystemAdmin,
    SystemProducer,
)
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import stream_spec

log = logging.getLogger(__name__)

NAME = "changelog"
READ_CHUNK = 20_000


def changelog_stream(config: Config, store: str) -> SystemStream:
    key = f"stores.{store}.changelog"
    value = config.get_str(key)
    if not value:
        raise ConfigError(f"store {store} uses the changelog backend but {key} is not set")
    return SystemStream.parse(value)


def changelog_ssp(config: Config, store: str, partition: int) -> SystemStreamPartition:
    ss = changelog_stream(config, store)
    return SystemStreamPartition(ss.system, ss.stream, partition)


class ChangelogBackupManager(TaskBackupManager):
    def __init__(self, context: BackendContext) -> None:
        self.ctx = context
        self._producers: dict[str, SystemProducer] = {}
        self._logged: dict[str, LoggedEngine] = {}  # one per store: one buffer, in order
        self._ssps = {
            s: changelog_ssp(context.config, s, context.task.changelog_partition)
            for s in context.stores
        }

    def init(self, checkpoint: Checkpoint | None) -> None:
        pass

    def wrap_engine(self, store: str, engine: KeyValueEngine) -> KeyValueEngine:
        known = self._logged.get(store)
        if known is not None and known.inner is engine:
            return known
        if known is not None:
            known.drain()
        ssp = self._ssps[store]
        if ssp.system not in self._producers:
            self._producers[ssp.system] = self.ctx.systems.producer(ssp.system)
        batch_size = self.ctx.config.get_int(f"stores.{store}.write.batch.size")
        logged = LoggedEngine(engine, self._producers[ssp.system], ssp, batch_size)
        self._logged[store] = logged
        return logged

    def snapshot(self, checkpoint_id: CheckpointId) -> dict[str, str]:
        for logged in self._logged.values():
            logged.drain()
        for producer in self._producers.values():
            producer.flush()
        markers = {}
        for store, ssp in self._ssps.items():
            meta = self.ctx.systems.admin(ssp.system).get_metadata([ssp])[ssp]
            markers[store] = ChangelogMarker(ssp, meta.newest).dumps()
        return markers

    def upload(
        self, checkpoint_id: CheckpointId, snapshot_markers: Mapping[str, str]
    ) -> Future[dict[str, str]]:
        done: Future[dict[str, str]] = Future()
        done.set_result(dict(snapshot_markers))  # the snapshot already made the changelog durable
        return done

    def clean_up(self, checkpoint_id: CheckpointId, markers: Mapping[str, str]) -> None:
        pass  # the admin compacts changelogs up to the checkpoints at job start

    def close(self) -> None:
        """Drain the stores' logged writes and flush them (a batch that does not commit leaves
        its writes in the live stores, and the changelog must have them before any later
        marker)."""
        for logged in self._logged.values():
            logged.drain()
        self._logged.clear()
        for producer in self._producers.values():
            producer.close()
        self._producers.clear()


def marker_for(
    config: Config, checkpoint: Checkpoint | None, store: str, ssp: SystemStreamPartition
) -> ChangelogMarker | None:
    """This store's changelog marker in a V2 checkpoint, or its ``<id>:<offset>`` in a V1 one."""
    if checkpoint is None:
        return None
    if isinstance(checkpoint, CheckpointV1):
        text = checkpoint.input_offsets.get(ssp)
        return None if text is None else ChangelogMarker.from_v1(ssp, text)
    raw = checkpoint.state_checkpoint_markers.get(NAME, {}).get(store)
    return None if raw is None else ChangelogMarker.loads(raw)


class ChangelogRestoreManager(TaskRestoreManager):
    def __init__(self, context: BackendContext) -> None:
        self.ctx = context
        self.transactional = context.config.get_bool("task.transactional.state.checkpoint.enabled")
        self._checkpoint: Checkpoint | None = None

    def init(self, checkpoint: Checkpoint | None) -> None:
        self._checkpoint = checkpoint

    def restore(self) -> list[RestoreStats]:
        return [self._restore_store(store) for store in self.ctx.stores]

    def discard_uncommitted(self) -> None:
        """Trim each store's changelog after the checkpointed offset: the store (restored from
        its local checkpoint or another backend) is at the checkpoint, so every key written
        after it gets its restored value or a tombstone appended."""
        for store in self.ctx.stores:
            ssp = changelog_ssp(self.ctx.config, store, self.ctx.task.changelog_partition)
            admin = self.ctx.systems.admin(ssp.system)
            meta = admin.get_metadata([ssp])[ssp]
            start = self._uncommitted_from(store, ssp, admin, meta)
            if start is None:
                self._reseed(store, ssp, meta)
            elif admin.offset_comparator(start, meta.upcoming) < 0:
                self._trim_logged(store, ssp, self.ctx.engine(store), start, meta.upcoming)

    def _uncommitted_from(
        self,
        store: str,
        ssp: SystemStreamPartition,
        admin: SystemAdmin,
        meta: PartitionMetadata,
    ) -> str | None:
        """The first changelog offset written after the checkpoint (the oldest when nothing of
        the store is committed in the changelog); None when the checkpointed offset is outside
        what the changelog holds (Samza's rule: truncated or recreated; nothing can be trimmed).
        A marker naming another changelog than the configured one is a :class:`RestoreError`."""
        marker = marker_for(self.ctx.config, self._checkpoint, store, ssp)
        if marker is None or marker.offset is None:
            return meta.oldest
        if marker.ssp != ssp:
            raise RestoreError(
                f"task {self.ctx.task.name} store {store}: the checkpoint's changelog marker "
                f"names {marker.ssp} but the store's changelog is {ssp} "
                f"(stores.{store}.changelog changed?). Restore the old stores.{store}.changelog, "
                f"or remove the store's state deliberately with a new checkpoint"
            )
        inside = meta.newest is not None and (
            admin.offset_comparator(meta.oldest, marker.offset) <= 0
            and admin.offset_comparator(marker.offset, meta.newest) <= 0
        )
        return admin.offset_after(ssp, marker.offset) if inside else None

    def _replay_range(
        self, store: str, ssp: SystemStreamPartition, admin: SystemAdmin
    ) -> tuple[str, str, bool]:
        """``(start, end, trim)``: replay ``[start, end)``, then trim ``[end, upcoming)`` if
        ``trim`` (Samza's TransactionalStateTaskRestoreManager rules)."""
        meta = admin.get_metadata([ssp])[ssp]
        task = self.ctx.task.name
        if not self.transactional:
            return meta.oldest, meta.upcoming, False
        marker = marker_for(self.ctx.config, self._checkpoint, store, ssp)
        unmarked = marker is None or marker.offset is None
        if unmarked and self.ctx.config.get_bool("task.transactional.state.retain.existing.state"):
            log.warning(
                "task %s store %s: no checkpointed changelog offset and "
                "task.transactional.state.retain.existing.state=true: restoring the whole "
                "changelog %s (no transactional guarantee for this restore)",
                task,
                store,
                ssp,
            )
            return meta.oldest, meta.upcoming, False
        end = self._uncommitted_from(store, ssp, admin, meta)
        if end is None and marker is not None and marker.offset is not None:
            self._refuse_a_lost_tail(store, ssp, admin, meta, marker.offset)
        if end is None:
            log.error(
                "task %s store %s: checkpointed changelog offset %s is outside what changelog "
                "%s holds (offsets %s..%s): it was truncated (retention) or recreated. Restoring "
                "everything it holds, with no transactional guarantee, and trimming nothing",
                task,
                store,
                None if marker is None else marker.offset,
                ssp,
                meta.oldest,
                meta.newest,
            )
            return meta.oldest, meta.upcoming, False
        # with nothing committed, end is the oldest offset: nothing to replay, all to trim
        return meta.oldest, end, True

    def _refuse_a_lost_tail(
        self,
        store: str,
        ssp: SystemStreamPartition,
        admin: SystemAdmin,
        meta: PartitionMetadata,
        offset: str,
    ) -> None:
        """Stop a restore from a changelog that is missing or shorter than the checkpointed
        offset: it lost committed writes, and restoring what is left would pass a store behind
        its input offsets for the checkpoint's state (unless
        ``stores.<s>.changelog.restore.accept.loss`` says to, once, deliberately)."""
        if meta.newest is not None and admin.offset_comparator(offset, meta.newest) <= 0:
            return  # the head is gone, not the tail: Samza restores what is there
        key = f"stores.{store}.changelog.restore.accept.loss"
        held = "is empty" if meta.newest is None else f"ends at offset {meta.newest}"
        if self.ctx.config.get_bool(key):
            log.error(
                "task %s store %s: changelog %s %s, before the checkpointed offset %s; "
                "%s=true: restoring what it holds (committed writes are lost)",
                self.ctx.task.name,
                store,
                ssp,
                held,
                offset,
                key,
            )
            return
        raise RestoreError(
            f"task {self.ctx.task.name} store {store}: changelog {ssp} {held}, but checkpoint "
            f"{self._checkpoint.checkpoint_id if self._checkpoint else '?'} committed the "
            f"store up to changelog offset {offset}: the changelog was deleted, recreated or "
            f"truncated, and the store cannot be restored to its committed state. Restore the "
            f"changelog, or restore from another backend of the store (list it first in "
            f"stores.{store}.restore.factories); to accept losing the committed state, run "
            f"once with --set {key}=true"
        )

    def _reseed(self, store: str, ssp: SystemStreamPartition, meta: PartitionMetadata) -> None:
        """The store is at its checkpoint (a local checkpoint, or another backend) but the
        changelog no longer holds the checkpointed offset (deleted, recreated, truncated): write
        the store's whole contents to it, and a tombstone for each key it holds that the store
        does not, so a later restore from the changelog gives this state again."""
        engine = self.ctx.engine(store)
        stale = {r.key for r in self._read(ssp, meta.oldest, meta.upcoming) if r.key is not None}
        now = int(time.time() * 1000)
        producer = self.ctx.systems.producer(ssp.system)
        written = 0
        try:
            for key, value in engine.all():
                stale.discard(key)
                producer.send(ssp.stream, ssp.partition, Record("", key, value, now))
                written += 1
            for key in stale:
                producer.send(ssp.stream, ssp.partition, Record("", key, None, now))
            producer.flush()
        finally:
            producer.close()
        log.warning(
            "task %s store %s: changelog %s (offsets %s..%s) does not hold the checkpointed "
            "offset (deleted, recreated or truncated); rewrote the store's %d entries to it "
            "(and %d tombstones) so that it restores this state again",
            self.ctx.task.name,
            store,
            ssp,
            meta.oldest,
            meta.newest,
            written,
            len(stale),
        )

    def restore_after(self, store: str, after: str | None) -> RestoreStats:
        """Bring a copy of ``store`` that already holds the changelog up to offset ``after``
        (``None``: none of it) to the checkpoint, replaying only the records after ``after``
        (then trimming, as :meth:`restore` does): a standby's catch-up and promotion. A
        :class:`RestoreError` when that tail cannot be replayed exactly: the changelog does
        not hold the checkpointed offset (recreated, truncated), or the copy is past the
        checkpoint."""
        return self._restore_store(store, after=after, tail=True)

    def _tail_start(
        self,
        store: str,
        ssp: SystemStreamPartition,
        admin: SystemAdmin,
        replay: tuple[str, str, bool],
        after: str | None,
    ) -> str:
        """Where :meth:`restore_after` starts replaying ``replay`` (see there)."""
        start, end, trim = replay
        if self.transactional and not trim:
            raise RestoreError(
                f"task {self.ctx.task.name} store {store}: changelog {ssp} does not hold the "
                f"checkpointed offset; only a whole restore can rebuild the store"
            )
        if after is None:
            return start
        # a changelog starting after ``after`` was compacted (the admin creates it compacted):
        # each record compaction removed is superseded by a later one up to the checkpoint,
        # which the replay reads
        first = admin.offset_after(ssp, after)
        if admin.offset_comparator(first, end) > 0:
            raise RestoreError(
                f"task {self.ctx.task.name} store {store}: the copy is at changelog offset "
                f"{after}, past the checkpoint's (it would serve uncommitted state)"
            )
        self._refuse_dropped_tombstones(store, ssp, admin, after)
        return first

    def _refuse_dropped_tombstones(
        self, store: str, ssp: SystemStreamPartition, admin: SystemAdmin, after: str
    ) -> None:
        """A :class:`RestoreError` when compaction dropped a tombstone after ``after`` (where a
        copy of the store is): the copy may hold a key deleted since, which its tail no longer
        says."""
        dropped = admin.tombstones_dropped_through(ssp)
        if dropped is not None and admin.offset_comparator(after, dropped) < 0:
            raise RestoreError(
                f"task {self.ctx.task.name} store {store}: the copy is at changelog offset "
                f"{after}, and compaction has since dropped tombstones of {ssp} up to offset "
                f"{dropped} (delete.retention.ms): its deleted keys would come back; only a "
                "whole restore rebuilds it"
            )

    def _restore_store(
        self, store: str, after: str | None = None, tail: bool = False
    ) -> RestoreStats:
        started = time.monotonic()
        ssp = changelog_ssp(self.ctx.config, store, self.ctx.task.changelog_partition)
        admin = self.ctx.systems.admin(ssp.system)
        engine = self.ctx.engine(store)
        start, end, trim = replay = self._replay_range(store, ssp, admin)
        if tail:
            start = self._tail_start(store, ssp, admin, replay, after)
        entries, size = self._replay(ssp, engine, start, end)
        if tail and after is not None:  # a compaction may have run meanwhile
            self._refuse_dropped_tombstones(store, ssp, admin, after)
        upcoming = admin.get_metadata([ssp])[ssp].upcoming
        if trim and not self.ctx.read_only and admin.offset_comparator(end, upcoming) < 0:
            self._trim_logged(store, ssp, engine, end, upcoming)
        engine.flush()
        return RestoreStats(store, NAME, entries, size, time.monotonic() - started)

    def _trim_logged(
        self,
        store: str,
        ssp: SystemStreamPartition,
        engine: KeyValueEngine,
        start: str,
        end: str,
    ) -> None:
        self._abort(store, ssp, start, end)
        trimmed = self._trim(ssp, engine, start, end)
        log.info(
            "task %s store %s: trimmed %d changelog entries after the checkpoint",
            self.ctx.task.name,
            store,
            trimmed,
        )

    def _abort(self, store: str, ssp: SystemStreamPartition, start: str, end: str) -> None:
        """Before a trim of a changelog that holds records back (exactly-once): its records
        from ``start`` (the first the checkpoint does not cover) to ``end`` are never read by
        read-committed readers. The checkpoint being written, what it covers is committed
        (the driver may have died before it said so). A :class:`RestoreError` when the
        changelog committed more than the checkpoint covers: readers may have read records
        the trim would undo."""
        admin = self.ctx.systems.admin(ssp.system)
        committed = admin.committed_end(ssp) if admin.transactional_records else None
        if committed is None:
            return
        if admin.offset_comparator(committed, start) > 0:
            cid = self._checkpoint.checkpoint_id if self._checkpoint else "(none)"
            raise RestoreError(
                f"task {self.ctx.task.name} store {store}: changelog {ssp} has committed its "
                f"records before offset {committed}, but checkpoint {cid} covers them only up "
                f"to {start} (exclusive): a newer checkpoint was written and is no longer the "
                f"last, so restoring this one would undo records readers may have read. "
                f"Restore the newer checkpoint, or run once with "
                f"--set job.processing.guarantee=at-least-once to restore this one anyway"
            )
        admin.commit_records(ssp, start)
        admin.abort_records(ssp, start, end)
        log.info(
            "task %s store %s: aborted changelog %s offsets %s..%s (written after the checkpoint)",
            self.ctx.task.name,
            store,
            ssp,
            start,
            end,
        )

    def _read(self, ssp: SystemStreamPartition, start: str, end: str) -> list[Record]:
        consumer = self.ctx.systems.consumer(ssp.system, uncommitted=True)
        admin = self.ctx.systems.admin(ssp.system)
        out: list[Record] = []
        try:
            while admin.offset_comparator(start, end) < 0:
                chunk = consumer.read(ssp, start, end, READ_CHUNK)
                if not chunk:
                    break
                out.extend(chunk)
                start = admin.offset_after(ssp, chunk[-1].offset)
        finally:
            consumer.close()
        return out

    def _replay(
        self, ssp: SystemStreamPartition, engine: KeyValueEngine, start: str, end: str
    ) -> tuple[int, int]:
        entries = size = 0
        consumer = self.ctx.systems.consumer(ssp.system, uncommitted=True)
        admin = self.ctx.systems.admin(ssp.system)
        try:
            while admin.offset_comparator(start, end) < 0:
                # keys and values only: the embedded log slices them out of its bytes
                chunk = consumer.read_entries(ssp, start, end, READ_CHUNK)
                if chunk.last_offset is None:
                    break
                keys, values = chunk.keys, chunk.values
                if None in keys:  # a keyless record changes no entry
                    pairs = zip(keys, values, strict=True)
                    engine.load([(k, v) for k, v in pairs if k is not None])
                else:
                    engine.load(zip(cast("list[bytes]", keys), values, strict=True))
                entries += len(chunk)
                size += sum(map(len, filter(None, keys))) + sum(map(len, filter(None, values)))
                start = admin.offset_after(ssp, chunk.last_offset)
        finally:
            consumer.close()
        return entries, size

    def _trim(
        self, ssp: SystemStreamPartition, engine: KeyValueEngine, start: str, end: str
    ) -> int:
        keys = list(dict.fromkeys(r.key for r in self._read(ssp, start, end) if r.key is not None))
        if not keys:
            return 0
        values = engine.get_many(keys)
        producer = self.ctx.systems.producer(ssp.system)
        now = int(time.time() * 1000)
        producer.send_many(
            ssp.stream,
            ssp.partition,
            (Record("", k, v, now) for k, v in zip(keys, values, strict=True)),
        )
        producer.close()
        return len(keys)


#: the fewest records a changelog partition grows by before a compaction during a run
COMPACT_MIN_GROWTH = 10_000

#: how long a compaction keeps a tombstone by default (Kafka's ``delete.retention.ms``: a day)
DELETE_RETENTION_MS = 86_400_000


def delete_retention_ms(config: Config, stream: SystemStream) -> int | None:
    """How long (ms) compaction keeps a changelog's tombstones: the stream property
    ``delete.retention.ms`` (Kafka's topic config, set with ``streams.<s>.delete.retention.ms``
    or ``systems.<s>.default.stream.delete.retention.ms``), a day by default; ``None`` for -1
    (forever)."""
    raw = config.stream_properties(stream).get("delete.retention.ms")
    try:
        value = DELETE_RETENTION_MS if raw is None else int(raw)
    except ValueError:
        value = -2
    if value < -1:
        raise ConfigError(
            f"streams.{stream.stream}.delete.retention.ms={raw!r} is invalid: give how long "
            "(ms >= 0) a compaction keeps a tombstone, or -1 to keep tombstones forever"
        )
    return None if value == -1 else value


class ChangelogAdmin(StateBackendAdmin):
    def __init__(self, config: Config, model: JobModel, systems: Systems) -> None:
        #: per partition, its upcoming offset at its last compaction and the records it kept
        #: (None: the system compacts by itself)
        self._compacted: dict[SystemStreamPartition, tuple[str, int | None]] = {}
        self.config = config
        self.systems = systems
        self.model = model
        self.partitions = max((t.changelog_partition for t in model.tasks.values()), default=-1) + 1
        self.stores = [s for s in config.stores if NAME in store_backends(config, s, "backup")]

    def _spec(self, store: str) -> StreamSpec:
        """A compacted stream with a partition per task. With transactional state, the broker
        must not compact records younger than ``min.compaction.lag.ms``: a restore replays to
        the checkpoint and trims what came after, so a write after the checkpoint must not yet
        have compacted away the checkpointed value it overwrote (Samza sets it likewise)."""
        properties = {}
        if self.config.get_bool("task.transactional.state.checkpoint.enabled"):
            key = f"stores.{store}.changelog.min.compaction.lag.ms"
            properties["min.compaction.lag.ms"] = str(self.config.get_int(key))
        ss = changelog_stream(self.config, store)
        return stream_spec(
            self.config, ss, max(1, self.partitions), compacted=True, properties=properties
        )

    def create_resources(self) -> None:
        for store in self.stores:
            ss = changelog_stream(self.config, store)
            self.systems.admin(ss.system).create_stream(self._spec(store))

    def validate_resources(self) -> None:
        for store in self.stores:
            ss = changelog_stream(self.config, store)
            delete_retention_ms(self.config, ss)  # a bad value stops the start, not a compaction
            admin = self.systems.admin(ss.system)
            have = admin.partition_count(ss.stream)
            if have < self.partitions:
                raise ConfigError(
                    f"store {store}: changelog {ss} has {have} partitions but the job's tasks "
                    f"need {self.partitions}; create a new changelog stream for the new task count"
                )
            try:
                admin.validate_stream(self._spec(store))
            except ConfigError as exc:
                raise ConfigError(f"store {store}: changelog {ss}: {exc}") from exc

    def lost_committed_state(self, checkpoints: Mapping[TaskName, Checkpoint]) -> set[TaskName]:
        """Tasks whose checkpointed changelog offset is past the end of their changelog
        partition (the changelog was deleted, recreated or truncated while the job was
        stopped): their stores must not go on logging into a changelog that lacks their state."""
        lost = set()
        for store, task, ssp, offset in self._checkpointed(checkpoints):
            admin = self.systems.admin(ssp.system)
            meta = admin.get_metadata([ssp])[ssp]
            if meta.newest is None or admin.offset_comparator(offset, meta.newest) > 0:
                log.warning(
                    "task %s store %s: changelog %s ends before the checkpointed offset %s "
                    "(deleted, recreated or truncated); the task restores its state first",
                    task.name,
                    store,
                    ssp,
                    offset,
                )
                lost.add(task.name)
        return lost

    def hold_records(self, checkpoints: Mapping[TaskName, Checkpoint], hold: bool) -> None:
        """Each changelog partition holds back what its task's last checkpoint does not cover
        (all of it without a checkpoint: a restore discards it), on a system that can; a
        system that cannot is named with a WARNING. Without ``hold``, released."""
        warned: set[str] = set()
        for store in self.stores:
            for task in self.model.tasks.values():
                ssp = changelog_ssp(self.config, store, task.changelog_partition)
                admin = self.systems.admin(ssp.system)
                if not admin.transactional_records:
                    if hold and ssp.system not in warned:
                        warned.add(ssp.system)
                        log.warning(
                            "job.processing.guarantee=exactly-once: system %s cannot hold "
                            "changelog records back until their checkpoint is written, so "
                            "readers of changelog %s (a table, a tool) may see writes that a "
                            "restore then undoes (docs/exactly-once.md)",
                            ssp.system,
                            ssp.system_stream,
                        )
                    continue
                if not hold:
                    if admin.committed_end(ssp) is not None:
                        admin.commit_records(ssp, None)
                        log.info("changelog %s: no longer holds records back", ssp)
                    continue
                marker = marker_for(self.config, checkpoints.get(task.name), store, ssp)
                meta = admin.get_metadata([ssp])[ssp]
                end = meta.oldest
                if marker is not None and marker.offset is not None:
                    end = admin.offset_after(ssp, marker.offset)
                    if admin.offset_comparator(end, meta.upcoming) > 0:
                        end = meta.upcoming  # a changelog recreated: its restore reseeds it
                admin.commit_records(ssp, end)

    def commit_records(self, written: Sequence[tuple[TaskName, Checkpoint]]) -> None:
        for name, checkpoint in written:
            task = self.model.tasks.get(name)
            if task is None:
                continue
            for store in self.stores:
                ssp = changelog_ssp(self.config, store, task.changelog_partition)
                admin = self.systems.admin(ssp.system)
                marker = marker_for(self.config, checkpoint, store, ssp)
                if not admin.transactional_records or marker is None or marker.ssp != ssp:
                    continue
                if marker.offset is not None:
                    admin.commit_records(ssp, admin.offset_after(ssp, marker.offset))

    def _grown(self, ssp: SystemStreamPartition, upcoming: str) -> bool:
        """Whether ``ssp`` grew enough since its last compaction to compact it again."""
        at, kept = self._compacted.get(ssp, ("0", 0))  # never: as if empty at offset 0
        if kept is None:
            return False  # the system compacts it by itself
        try:
            grown = int(upcoming) - int(at)
        except ValueError:
            return False  # offsets that are not counts: only at job start
        return grown >= max(kept, COMPACT_MIN_GROWTH)

    def _checkpointed(
        self, checkpoints: Mapping[TaskName, Checkpoint]
    ) -> Iterator[tuple[str, TaskModel, SystemStreamPartition, str]]:
        """(store, task, changelog SSP, checkpointed offset) of every store and task whose
        checkpoint names a changelog offset."""
        for store in self.stores:
            for task in self.model.tasks.values():
                ssp = changelog_ssp(self.config, store, task.changelog_partition)
                marker = marker_for(self.config, checkpoints.get(task.name), store, ssp)
                if marker is not None and marker.offset is not None:
                    yield store, task, ssp, marker.offset

    def compact(
        self, checkpoints: Mapping[TaskName, Checkpoint], *, during_run: bool = False
    ) -> None:
        """Compact each changelog partition up to its task's checkpointed changelog offset:
        replaying it to that offset still gives the checkpointed state (a standby copy at an
        earlier offset too: a record compaction removes is superseded by a later one it
        keeps), and the writes after it (which a transactional restore trims) stay as they
        are. Partitions of tasks without a checkpoint are left alone. ``during_run``: only
        partitions that grew since their last compaction by as many records as it kept (at
        least :data:`COMPACT_MIN_GROWTH`), so that the work stays proportional to the writes;
        on a system that compacts by itself (Kafka) nothing is done."""
        now = int(time.time() * 1000)
        for store, _task, ssp, offset in self._checkpointed(checkpoints):
            admin = self.systems.admin(ssp.system)
            upcoming = admin.get_metadata([ssp])[ssp].upcoming
            if during_run and not self._grown(ssp, upcoming):
                continue
            up_to = admin.offset_after(ssp, offset)
            keep_ms = delete_retention_ms(self.config, ssp.system_stream)
            cut_off = None if keep_ms is None else now - keep_ms
            result = admin.compact(ssp.stream, ssp.partition, up_to, cut_off)
            self._compacted[ssp] = (upcoming, None if result is None else result[1])
            if result is not None and result[0] != result[1]:
                log.info(
                    "store %s: compacted changelog %s up to offset %s: %d -> %d records",
                    store,
                    ssp,
                    up_to,
                    *result,
                )


class ChangelogStateBackendFactory(StateBackendFactory):
    name = NAME
    markers_in_v1 = True

    backup_class = ChangelogBackupManager
    restore_class = ChangelogRestoreManager
    admin_class = ChangelogAdmin

    def has_marker(
        self, config: Config, checkpoint: Checkpoint | None, store: str, task: TaskModel
    ) -> bool:
        ssp = changelog_ssp(config, store, task.changelog_partition)
        return marker_for(config, checkpoint, store, ssp) is not None

    def markers_from_v1(
        self, config: Config, checkpoint: CheckpointV1, task: TaskModel
    ) -> dict[str, str]:
        out = {}
        for store in config.stores:
            if NAME in store_backends(config, store, "backup"):
                ssp = changelog_ssp(config, store, task.changelog_partition)
                marker = marker_for(config, checkpoint, store, ssp)
                if marker is not None:
                    out[store] = marker.dumps()
        return out

    def marker_offsets(
        self, config: Config, markers: Mapping[str, str]
    ) -> dict[SystemStreamPartition, str]:
        out = {}
        for raw in markers.values():
            m = ChangelogMarker.loads(raw)
            out[m.ssp] = "null" if m.offset is None else m.offset  # Samza writes <id>:null
        return out

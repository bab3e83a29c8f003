"""The executor side of a task: one micro-batch of one task, run inside a Spark Python worker.

:func:`run_task_batch` is what each Spark partition runs. Its steps:

1. Establish state. If the local marker equals the state id the driver expects, keep the live
   stores and read on from where the last batch stopped. Otherwise restore every store to the
   last committed checkpoint (:mod:`sparkpoint.runtime.restore`: local checkpoint, else a state
   backend) and read from the checkpoint's offsets. State and offsets therefore always match.
2. Clear the marker, wrap the stores for their backup backends, ``init`` the user's task.
3. Read each input SSP's planned range and call ``process`` per message; ``window`` if due.
4. Flush output producers (at-least-once: output is durable before any commit names it).
5. Clean up after the committed checkpoint (older local checkpoints, backends' ``clean_up``),
   then commit when due or asked for (:mod:`sparkpoint.storage.commit`: synchronous snapshot,
   then the upload, asynchronous unless the plan says to wait), and report every commit whose
   upload has finished, for the driver to write to the checkpoint stream.
6. Close the stores and write the marker for the new state.

Steps 1 and 5-6 are :meth:`TaskBatch.begin` and :meth:`TaskBatch.finish`, which the DataFrame
API's phases (:mod:`sparkpoint.runtime.frame_task`) call as well.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, StoreError, TaskError
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.runtime.api import StreamTask
from sparkpoint.runtime.output import OutputCollector
from sparkpoint.runtime.plan import (
    EMPTY_STATE,
    TaskBatchPlan,
    TaskBatchResult,
    checkpoint_state_id,
    parse_checkpoint,
)
from sparkpoint.serde import Serde, load_serde
from sparkpoint.storage.backend import (
    BackendContext,
    RestoreStats,
    TaskBackupManager,
    backend_factory,
    store_backends,
)
from sparkpoint.storage.commit import CommitOutcome, TaskCommitManager
from sparkpoint.storage.kv.base import KeyValueEngine, KeyValueStore
from sparkpoint.storage.kv.factory import engine_kind, open_engine
from sparkpoint.storage.kv.store import SerializedKeyValueStore
from sparkpoint.storage.local import LocalTaskState
from sparkpoint.storage.restore import TaskRestore
from sparkpoint.system.base import IncomingMessageEnvelope, Record
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)


class _ProcessCache:
    """What a Python worker keeps between batches: configs, systems, in-memory stores."""

    def __init__(self) -> None:
        self.configs: dict[int, tuple[Config, Systems]] = {}
        # in-memory engines survive only inside this process, tagged with their state id
        self.memory: dict[tuple[str, str], tuple[str, KeyValueEngine]] = {}

    def config(self, values: dict[str, str]) -> tuple[Config, Systems]:
        key = hash(frozenset(values.items()))
        if key not in self.configs:
            config = Config(values, validate=False)
            self.configs[key] = (config, Systems(config))
        return self.configs[key]


_CACHE = _ProcessCache()


def worker_config(values: dict[str, str]) -> tuple[Config, Systems]:
    """The config and systems this Python worker keeps for a job's config values."""
    return _CACHE.config(values)


def persistent_store(config: Config, store: str) -> bool:
    """Whether ``store`` lives on disk (RocksDB) rather than in one process's memory."""
    return engine_kind(store, config.require(f"stores.{store}.factory")) == "rocksdb"


def load_task_class(path: str) -> type[StreamTask]:
    """Import ``module:Class`` (or ``module.Class``) named by ``task.class``."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"task.class={path!r}: cannot import it ({exc})") from exc
    if not (isinstance(cls, type) and issubclass(cls, StreamTask)):
        raise ConfigError(f"task.class={path!r} is not a subclass of sparkpoint StreamTask")
    return cls


@dataclass(frozen=True)
class ErrorPolicy:
    """What a task does with a message it cannot decode or whose ``process`` raises (Samza's
    ``task.drop.deserialization.errors`` and ``task.ignored.exceptions``): by default it fails
    the batch naming the message's SSP and offset; these skip the message with an ERROR log."""

    drop_deserialization_errors: bool
    ignored: frozenset[str]

    @classmethod
    def from_config(cls, config: Config) -> ErrorPolicy:
        return cls(
            config.get_bool("task.drop.deserialization.errors"),
            frozenset(config.get_list("task.ignored.exceptions")),
        )

    def ignores(self, exc: BaseException) -> bool:
        if "*" in self.ignored:
            return True
        for cls in type(exc).__mro__:
            if cls.__qualname__ in self.ignored or f"{cls.__module__}.{cls.__qualname__}" in (
                self.ignored
            ):
                return True
        return False


class BatchCoordinator:
    def __init__(self) -> None:
        self.commit_requested = False
        self.shutdown_requested = False

    def commit(self) -> None:
        self.commit_requested = True

    def shutdown(self) -> None:
        self.shutdown_requested = True
        self.commit_requested = True


@dataclass
class _Context:
    task_name: TaskName
    ssps: frozenset[SystemStreamPartition]
    config: Mapping[str, str]
    stores: dict[str, KeyValueStore[Any, Any]] = field(default_factory=dict)

    def get_store(self, name: str) -> KeyValueStore[Any, Any]:
        try:
            return self.stores[name]
        except KeyError:
            known = ", ".join(sorted(self.stores)) or "none"
            raise StoreError(
                f"task {self.task_name}: no store {name!r} (configure stores.{name}.factory); "
                f"stores: {known}"
            ) from None


class TaskBatch:
    """One task's run of one micro-batch on this executor."""

    def __init__(self, plan: TaskBatchPlan) -> None:
        self.plan = plan
        self.config, self.systems = _CACHE.config(plan.config)
        self.task = plan.task.name
        self.local = LocalTaskState(self.config.store_base_dir, self.task)
        self.engines: dict[str, KeyValueEngine] = {}
        self.restored: list[RestoreStats] = []
        self.last_checkpoint = (
            parse_checkpoint(plan.last_checkpoint) if plan.last_checkpoint else None
        )
        self.backup_names = {
            s: store_backends(self.config, s, "backup") for s in self.config.stores
        }
        self.last_processed: dict[SystemStreamPartition, str] = {}

    # -- 1. state

    def opener(self, store: str) -> Callable[[], KeyValueEngine]:
        factory = self.config.require(f"stores.{store}.factory")
        return lambda: open_engine(store, factory, self.local.store_dir(store))

    def _memory_stores_match(self, marker: str) -> bool:
        for store in self.config.stores:
            if not persistent_store(self.config, store):
                cached = _CACHE.memory.get((self.task.name, store))
                if cached is None or cached[0] != marker:
                    return False
        return True

    def _establish_state(self) -> dict[SystemStreamPartition, str]:
        plan = self.plan
        marker = self.local.read_marker()
        if marker == plan.expected_state_id and self._memory_stores_match(marker):
            for store in self.config.stores:
                cached = _CACHE.memory.get((self.task.name, store))
                self.engines[store] = cached[1] if cached else self.opener(store)()
            self.last_processed = dict(plan.last_processed)
            return dict(plan.resume)
        if marker is not None or plan.expected_state_id != EMPTY_STATE:
            log.info(
                "task %s: local state %s, expected %s: restoring checkpoint %s",
                self.task,
                marker,
                plan.expected_state_id,
                plan.last_checkpoint_id,
            )
        self.local.clear_marker()
        for store in self.config.stores:
            _CACHE.memory.pop((self.task.name, store), None)
        openers = {s: self.opener(s) for s in self.config.stores}
        self.engines, self.restored = TaskRestore(
            self.config, self.systems, plan.task, self.local, self.last_checkpoint, openers
        ).run()
        self.last_processed = dict(plan.checkpoint_last_processed)
        return dict(plan.from_checkpoint)

    def backup_managers(self, *, init: bool = True) -> dict[str, TaskBackupManager]:
        """Backup managers of the open stores; ``init`` reads the last checkpoint's markers
        (needed to commit, not to log writes)."""
        names = sorted({n for s, ns in self.backup_names.items() if s in self.engines for n in ns})
        managers: dict[str, TaskBackupManager] = {}
        for name in names:
            stores = [s for s, ns in self.backup_names.items() if name in ns and s in self.engines]
            context = BackendContext(
                self.config,
                self.plan.task,
                stores,
                self.systems,
                self.local,
                {s: self.engines[s] for s in stores},
            )
            managers[name] = backend_factory(name).backup_manager(context)
            if init:
                managers[name].init(self.last_checkpoint)
        return managers

    def wrapped_stores(
        self, backups: Mapping[str, TaskBackupManager]
    ) -> dict[str, KeyValueStore[Any, Any]]:
        stores: dict[str, KeyValueStore[Any, Any]] = {}
        for name, engine in self.engines.items():
            for backend in self.backup_names[name]:
                engine = backups[backend].wrap_engine(name, engine)
            stores[name] = SerializedKeyValueStore(
                name,
                engine,
                self._serde(f"stores.{name}.key.serde"),
                self._serde(f"stores.{name}.msg.serde"),
            )
        return stores

    def _serde(self, key: str) -> Serde[Any]:
        return load_serde(self.config.get_str(key) or "", self.config, key=key)

    def _committer(self, backups: Mapping[str, TaskBackupManager]) -> TaskCommitManager:
        return TaskCommitManager(
            self.task,
            self.plan.run_id,
            self.local,
            self.engines,
            backups,
            self.backup_names,
            config=self.config,
            max_delay_ms=self.config.get_int("task.commit.max.delay.ms"),
            timeout_ms=self.config.get_int("task.commit.timeout.ms"),
            pool_size=self.plan.task_count,
            committed=self.plan.last_checkpoint_id,
        )

    # -- 3. input
    def input_serdes(self, stream: SystemStream) -> tuple[Serde[Any], Serde[Any]]:
        k = self.config.stream_key(stream, "samza.key.serde") or "string"
        m = self.config.stream_key(stream, "samza.msg.serde") or "json"
        return (
            load_serde(k, self.config, key=f"streams.{stream.stream}.samza.key.serde"),
            load_serde(m, self.config, key=f"streams.{stream.stream}.samza.msg.serde"),
        )

    def begin(self) -> dict[SystemStreamPartition, str]:
        """Step 1: establish state (keep or restore); the next offset to read per SSP."""
        next_offsets = self._establish_state()
        self.local.clear_marker()
        return next_offsets

    def run(self) -> TaskBatchResult:
        plan = self.plan
        t0 = time.monotonic()
        next_offsets = self.begin()
        context = _Context(self.task, plan.task.ssps, self.config)
        coordinator = BatchCoordinator()
        collector = OutputCollector(self.config, self.systems, self.task)
        processed = 0
        backups: dict[str, TaskBackupManager] = {}
        try:
            backups = self.backup_managers()
            context.stores = self.wrapped_stores(backups)
            task = load_task_class(self.config.require("task.class"))()
            task.init(context)
            for ssp in plan.task.sorted_ssps():
                processed += self._process_ssp(ssp, next_offsets, task, collector, coordinator)
            if plan.window:
                task.window(collector, coordinator)
            task.close()
            collector.close()
            return self.finish(
                backups,
                next_offsets,
                processed=processed,
                sent=collector.sent,
                coordinator=coordinator,
                started=t0,
                processed_at=time.monotonic(),
            )
        finally:
            self.close(backups)

    def finish(
        self,
        backups: Mapping[str, TaskBackupManager],
        next_offsets: dict[SystemStreamPartition, str],
        *,
        processed: int,
        sent: int,
        coordinator: BatchCoordinator,
        started: float,
        processed_at: float,
    ) -> TaskBatchResult:
        """Steps 5 and 6 once the batch's messages are handled and its output is durable:
        clean up after the committed checkpoint, commit if due or asked for, close the stores
        and write the marker of the new state."""
        plan = self.plan
        try:
            committer = self._committer(backups)
            committer.clean_up(self.last_checkpoint)
            outcome = CommitOutcome()
            if plan.commit or coordinator.commit_requested:
                wait = plan.wait_for_uploads or not self.config.get_bool(
                    "task.commit.async.enabled", True
                )
                outcome = committer.commit(self.last_processed, wait=wait)
            elif plan.wait_for_uploads:
                committer.wait_all()
            done = committer.completed(plan.last_checkpoint_id)
            completed = [json.dumps(r.checkpoint, separators=(",", ":")) for r in done]
            upload_metrics = [r.metrics for r in done]
            bases = [r.base for r in done]
            t_commit = time.monotonic()
        finally:
            self.close(backups)
        finished_now = outcome.started is not None and any(
            str(parse_checkpoint(c).checkpoint_id) == outcome.started for c in completed
        )
        state_id = (
            checkpoint_state_id(outcome.started)
            if finished_now and outcome.started
            else plan.batch_state_id
        )
        self._keep_memory_engines(state_id)
        self.local.write_marker(state_id)
        return TaskBatchResult(
            task=self.task.name,
            batch=plan.batch,
            state_id=state_id,
            next_offsets=next_offsets,
            last_processed=self.last_processed,
            processed=processed,
            sent=sent,
            completed_checkpoints=completed,
            completed_bases=bases,
            upload_metrics=upload_metrics,
            commit_started=outcome.started,
            commit_skipped=outcome.skipped,
            restored=self.restored,
            commit_requested=coordinator.commit_requested,
            shutdown_requested=coordinator.shutdown_requested,
            process_seconds=processed_at - started,
            commit_seconds=t_commit - processed_at,
            total_seconds=time.monotonic() - started,
            executor=f"{socket.gethostname()}:{os.getpid()}",
        )

    def close(self, backups: Mapping[str, TaskBackupManager]) -> None:
        """Close backup managers and persistent engines (idempotent)."""
        for manager in backups.values():
            manager.close()
        self._close_persistent()

    def _process_ssp(
        self,
        ssp: SystemStreamPartition,
        next_offsets: dict[SystemStreamPartition, str],
        task: StreamTask,
        collector: OutputCollector,
        coordinator: BatchCoordinator,
    ) -> int:
        start = next_offsets.get(ssp)
        end = self.plan.end.get(ssp)
        if start is None or end is None:
            return 0
        admin = self.systems.admin(ssp.system)
        if admin.offset_comparator(start, end) >= 0:
            return 0
        consumer = self.systems.consumer(ssp.system)
        try:
            consumer.register(ssp, start)
            records = consumer.read(ssp, start, end, self.plan.max_messages)
        finally:
            consumer.close()
        key_serde, msg_serde = self.input_serdes(ssp.system_stream)
        policy = ErrorPolicy.from_config(self.config)
        for rec in records:
            try:
                key, msg = self.decode(ssp, rec, key_serde, msg_serde)
            except TaskError as exc:
                if not policy.drop_deserialization_errors:
                    raise
                log.error("%s; dropped (task.drop.deserialization.errors=true)", exc)
                continue
            envelope = IncomingMessageEnvelope(ssp, rec.offset, key, msg, rec.timestamp)
            try:
                task.process(envelope, collector, coordinator)
            except Exception as exc:
                error = (
                    f"task {self.task} failed processing {ssp} offset {rec.offset}: "
                    f"{type(exc).__name__}: {exc}"
                )
                if not policy.ignores(exc):
                    raise TaskError(
                        f"{error}. The job stops here and every restart fails at this message "
                        f"until it is fixed, or skipped: task.ignored.exceptions="
                        f"{type(exc).__qualname__} (or *) logs and skips such messages"
                    ) from exc
                log.error("%s; ignored (task.ignored.exceptions)", error)
        if records:
            last = records[-1].offset
            self.last_processed[ssp] = last
            next_offsets[ssp] = admin.offset_after(ssp, last)
        return len(records)

    def decode(
        self,
        ssp: SystemStreamPartition,
        rec: Record,
        key_serde: Serde[Any],
        msg_serde: Serde[Any] | None,
    ) -> tuple[Any, Any]:
        """A record's key and message through the stream's serdes (``msg_serde=None`` keeps the
        raw value); an error names the task, SSP and offset."""
        try:
            key = None if rec.key is None else key_serde.from_bytes(rec.key)
            if msg_serde is None or rec.value is None:
                return key, rec.value
            return key, msg_serde.from_bytes(rec.value)
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            raise TaskError(
                f"task {self.task}: cannot decode message at {ssp} offset {rec.offset}: {exc}"
            ) from exc

    def _close_persistent(self) -> None:
        for name, engine in list(self.engines.items()):
            if engine.persistent:
                engine.close()
                del self.engines[name]

    def _keep_memory_engines(self, state_id: str) -> None:
        """In-memory stores live on in this worker, tagged with the state they hold."""
        for name, engine in self.engines.items():
            if not engine.persistent:
                _CACHE.memory[(self.task.name, name)] = (state_id, engine)
        self.engines.clear()


def setup_worker_logging(config: Mapping[str, str]) -> None:
    """Executors log warnings and errors; restores and commits reach the driver's display."""
    if not logging.getLogger().handlers:
        level = config.get("job.executor.log.level", "WARNING").upper()
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_task_batch(plan: TaskBatchPlan) -> TaskBatchResult:
    """Run one task's micro-batch (called inside a Spark Python worker)."""
    setup_worker_logging(plan.config)
    return TaskBatch(plan).run()

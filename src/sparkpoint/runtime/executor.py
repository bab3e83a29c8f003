"""The executor side of a task: one micro-batch of one task, run inside a Spark Python worker.

:func:`run_task_batch` is what each Spark partition runs. Its steps:

1. Establish state. If the local marker equals the state id the driver expects, keep the live
   stores and read on from where the last batch stopped. Otherwise restore every store from its
   local checkpoint for the last committed checkpoint (or start empty, with a warning, when there
   is none here) and read from the checkpoint's offsets. State and offsets therefore always match.
2. Clear the marker, open the stores, create and ``init`` the user's task.
3. Read each input SSP's planned range and call ``process`` per message; ``window`` if due.
4. Flush output producers (at-least-once: output is durable before any commit names it).
5. Commit when due or asked for: flush stores, take a local checkpoint of each persistent store
   (RocksDB hard links) named by a new checkpoint id, write the checkpoint file into it, and hand
   the checkpoint to the driver, which writes it to the checkpoint stream.
6. Close the stores and write the marker for the new state.

Older local checkpoints are deleted at the start of the following batch, once the driver's plan
names the checkpoint it committed; an uncommitted local checkpoint is deleted the same way.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, StoreError, TaskError
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.runtime.api import StreamTask
from sparkpoint.runtime.local_state import LocalTaskState
from sparkpoint.runtime.output import OutputCollector
from sparkpoint.runtime.plan import EMPTY_STATE, RestoreInfo, TaskBatchPlan, TaskBatchResult
from sparkpoint.serde import Serde, load_serde
from sparkpoint.storage.kv.base import KeyValueEngine, KeyValueStore
from sparkpoint.storage.kv.factory import open_engine
from sparkpoint.storage.kv.store import SerializedKeyValueStore
from sparkpoint.system.base import IncomingMessageEnvelope
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


class _Coordinator:
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
        self.restored: list[RestoreInfo] = []

    # -- 1. state
    def _establish_state(self) -> dict[SystemStreamPartition, str]:
        plan = self.plan
        marker = self.local.read_marker()
        stores = self.config.stores
        if marker == plan.expected_state_id and self._memory_stores_match(marker):
            self._last_processed = dict(plan.last_processed)
            return dict(plan.resume)
        if marker is not None or plan.expected_state_id != EMPTY_STATE:
            log.info(
                "task %s: local state %s, expected %s: restoring checkpoint %s",
                self.task,
                marker,
                plan.expected_state_id,
                plan.last_checkpoint_id,
            )
        for store in stores:
            start = time.monotonic()
            if self._persistent(store):
                ok = self.local.restore_from_checkpoint(store, plan.last_checkpoint_id)
                source = "local-checkpoint" if ok else "empty"
                if not ok and plan.last_checkpoint_id is not None:
                    log.warning(
                        "task %s store %s: no local checkpoint %s on %s; starting EMPTY "
                        "(configure a state backend to restore state on any executor)",
                        self.task,
                        store,
                        plan.last_checkpoint_id,
                        socket.gethostname(),
                    )
            else:
                _CACHE.memory.pop((self.task.name, store), None)
                source = "empty"
            self.restored.append(RestoreInfo(store, source, 0, 0, time.monotonic() - start))
        self._last_processed = dict(plan.checkpoint_last_processed)
        return dict(plan.from_checkpoint)

    def _persistent(self, store: str) -> bool:
        factory = self.config.get_str(f"stores.{store}.factory") or ""
        return "memory" not in factory.lower()

    def _memory_stores_match(self, marker: str) -> bool:
        for store in self.config.stores:
            if not self._persistent(store):
                cached = _CACHE.memory.get((self.task.name, store))
                if cached is None or cached[0] != marker:
                    return False
        return True

    def _open_stores(self) -> dict[str, KeyValueStore[Any, Any]]:
        stores: dict[str, KeyValueStore[Any, Any]] = {}
        for name in self.config.stores:
            factory = self.config.require(f"stores.{name}.factory")
            cached = _CACHE.memory.get((self.task.name, name))
            if cached is not None and not self._persistent(name):
                engine = cached[1]
            else:
                engine = open_engine(name, factory, self.local.store_dir(name))
            self.engines[name] = engine
            key_serde = self._serde(f"stores.{name}.key.serde")
            msg_serde = self._serde(f"stores.{name}.msg.serde")
            stores[name] = SerializedKeyValueStore(name, engine, key_serde, msg_serde)
        return stores

    def _serde(self, key: str) -> Serde[Any]:
        return load_serde(self.config.get_str(key) or "", self.config, key=key)

    # -- 3. input
    def _input_serdes(self, stream: SystemStream) -> tuple[Serde[Any], Serde[Any]]:
        k = self.config.stream_key(stream, "samza.key.serde") or "string"
        m = self.config.stream_key(stream, "samza.msg.serde") or "json"
        return (
            load_serde(k, self.config, key=f"streams.{stream.stream}.samza.key.serde"),
            load_serde(m, self.config, key=f"streams.{stream.stream}.samza.msg.serde"),
        )

    def run(self) -> TaskBatchResult:
        plan = self.plan
        t0 = time.monotonic()
        next_offsets = self._establish_state()
        self.local.clear_marker()
        for store in self.config.stores:
            if self._persistent(store):
                self.local.clean_checkpoints(store, plan.last_checkpoint_id)
        context = _Context(self.task, plan.task.ssps, self.config)
        coordinator = _Coordinator()
        collector = OutputCollector(self.config, self.systems, self.task)
        processed = 0
        try:
            context.stores = self._open_stores()
            task_cls = load_task_class(self.config.require("task.class"))
            task = task_cls()
            task.init(context)
            for ssp in plan.task.sorted_ssps():
                processed += self._process_ssp(ssp, next_offsets, task, collector, coordinator)
            if plan.window:
                task.window(collector, coordinator)
            task.close()
            t_proc = time.monotonic()
            collector.close()
            commit = plan.commit or coordinator.commit_requested
            checkpoint_json = None
            if commit:
                checkpoint_json = self._commit(context)
            t_commit = time.monotonic()
        finally:
            self._close_persistent()
        state_id = (
            f"ckpt:{CheckpointV2.loads(checkpoint_json).checkpoint_id}"
            if checkpoint_json
            else plan.batch_state_id
        )
        self._keep_memory_engines(state_id)
        self.local.write_marker(state_id)
        return TaskBatchResult(
            task=self.task.name,
            batch=plan.batch,
            state_id=state_id,
            next_offsets=next_offsets,
            last_processed=self._last_processed,
            processed=processed,
            sent=collector.sent,
            checkpoint_json=checkpoint_json,
            restored=self.restored,
            commit_requested=coordinator.commit_requested,
            shutdown_requested=coordinator.shutdown_requested,
            process_seconds=t_proc - t0,
            commit_seconds=t_commit - t_proc,
            total_seconds=time.monotonic() - t0,
            executor=f"{socket.gethostname()}:{os.getpid()}",
        )

    def _process_ssp(
        self,
        ssp: SystemStreamPartition,
        next_offsets: dict[SystemStreamPartition, str],
        task: StreamTask,
        collector: OutputCollector,
        coordinator: _Coordinator,
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
        key_serde, msg_serde = self._input_serdes(ssp.system_stream)
        for rec in records:
            try:
                key = None if rec.key is None else key_serde.from_bytes(rec.key)
                msg = None if rec.value is None else msg_serde.from_bytes(rec.value)
            except (ValueError, TypeError, UnicodeDecodeError) as exc:
                raise TaskError(
                    f"task {self.task}: cannot decode message at {ssp} offset {rec.offset}: {exc}"
                ) from exc
            envelope = IncomingMessageEnvelope(ssp, rec.offset, key, msg, rec.timestamp)
            try:
                task.process(envelope, collector, coordinator)
            except Exception as exc:
                raise TaskError(
                    f"task {self.task} failed processing {ssp} offset {rec.offset}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        if records:
            last = records[-1].offset
            self._last_processed[ssp] = last
            next_offsets[ssp] = admin.offset_after(ssp, last)
        return len(records)

    # -- 5. commit
    def _commit(self, context: _Context) -> str:
        for store in context.stores.values():
            store.flush()
        checkpoint = CheckpointV2(CheckpointId.create(), self._last_processed, {})
        text = checkpoint.dumps()
        cid = str(checkpoint.checkpoint_id)
        for name, engine in self.engines.items():
            if engine.persistent:
                engine.checkpoint(self.local.checkpoint_dir(name, cid))
                self.local.write_checkpoint_file(name, cid, text)
        return text

    def _close_persistent(self) -> None:
        for engine in self.engines.values():
            if engine.persistent:
                engine.close()

    def _keep_memory_engines(self, state_id: str) -> None:
        """In-memory stores live on in this worker, tagged with the state they hold."""
        for name, engine in self.engines.items():
            if not engine.persistent:
                _CACHE.memory[(self.task.name, name)] = (state_id, engine)
        self.engines.clear()


def run_task_batch(plan: TaskBatchPlan) -> TaskBatchResult:
    """Run one task's micro-batch (called inside a Spark Python worker)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    return TaskBatch(plan).run()

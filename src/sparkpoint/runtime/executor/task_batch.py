"""The executor side of a task: one micro-batch of one task, run inside a Spark Python worker.

:func:`run_task_batch` is what each Spark partition runs. The task's state is a
:class:`~sparkpoint.storage.task_storage.TaskStorage`; this module drives the batch around it:

1. Establish state (``TaskStorage.open``): keep the live stores and read on from where the last
   batch stopped, or restore the last checkpoint and read from its offsets. State and offsets
   therefore always match.
2. Wrap the stores for their backup backends (``TaskStorage.stores``), ``init`` the user's task.
3. Read each input SSP's planned range and call ``process`` per message; ``window`` if due.
4. Flush output producers (at-least-once: output is durable before any commit names it).
5. ``TaskStorage.commit``: clean up after the committed checkpoint, commit when due or asked
   for, and report every commit whose upload has finished, for the driver to write.
6. ``TaskStorage.close``: close the stores and write the marker for the new state.

Steps 1 and 5-6 are :meth:`TaskBatch.begin` and :meth:`TaskBatch.finish`, which the DataFrame
API's phases (:mod:`sparkpoint.runtime.dataframe.task`) call as well.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkpoint import worker
from sparkpoint.config import Config
from sparkpoint.errors import (
    ConfigError,
    MessageDecodeError,
    OutputError,
    SparkpointError,
    StoreError,
    TaskError,
)
from sparkpoint.failpoints import maybe_pause
from sparkpoint.fsutil import user_disk_error
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.refs import load_reference, raised_at
from sparkpoint.runtime.api.task import StreamTask
from sparkpoint.runtime.executor import job_modules
from sparkpoint.runtime.executor.output import OutputCollector
from sparkpoint.runtime.executor.timers import TaskTimers
from sparkpoint.runtime.executor.windows import TaskWindows
from sparkpoint.runtime.executor.worker_heap import (
    fewer_full_collections,
    freeze_imported_objects,
)
from sparkpoint.runtime.plan import TaskBatchPlan, TaskBatchResult, parse_checkpoint
from sparkpoint.serde import Serde
from sparkpoint.storage.backend import RestoreStats, restores_off_the_gil
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.storage.kv.lazy import LazyEngine
from sparkpoint.storage.outputs import (
    TaskOutputs,
    new_part,
    owner_of,
    staged_streams,
    stages_output,
)
from sparkpoint.storage.state_id import EMPTY, CommittedState, StateId
from sparkpoint.storage.tables import Tables, apply_records
from sparkpoint.storage.task_storage import (
    TaskStorage,
    persistent_store,
)
from sparkpoint.storage.timers import TimerStore
from sparkpoint.system.base import IncomingMessageEnvelope, OutgoingMessageEnvelope, Record
from sparkpoint.system.dead_letters import DECODE, PROCESS, DeadLetters
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import stream_serdes
from sparkpoint.system.tables.global_tables import GlobalTable, open_global_table

log = logging.getLogger(__name__)


class _ProcessCache:
    """What a Python worker keeps between batches: the config and systems of the last few
    configs it ran (the oldest is closed when a new one comes: a worker, or a test process,
    that sees many jobs would otherwise keep their clients open for ever)."""

    SIZE = 4

    def __init__(self) -> None:
        self.configs: dict[int, tuple[Config, Systems]] = {}
        self._lock = threading.Lock()  # the driver restores on threads (RestoreRunner)

    def config(self, values: dict[str, str]) -> tuple[Config, Systems]:
        with self._lock:
            return self._config(values)

    def _config(self, values: dict[str, str]) -> tuple[Config, Systems]:
        key = hash(frozenset(values.items()))
        if key in self.configs:
            self.configs[key] = self.configs.pop(key)  # the most recent last
        else:
            config = Config(values, validate=False)
            self.configs[key] = (config, Systems(config))
            while len(self.configs) > self.SIZE:
                _config, oldest = self.configs.pop(next(iter(self.configs)))
                oldest.close()
        return self.configs[key]


_CACHE = worker.slot("configs", _ProcessCache)


def worker_config(values: dict[str, str]) -> tuple[Config, Systems]:
    """The config and systems this Python worker keeps for a job's config values."""
    return _CACHE.config(values)


def load_task_class(path: str) -> type[StreamTask]:
    """Import ``module:Class`` (or ``module.Class``) named by ``task.class``."""
    cls = load_reference(path, f"task.class={path!r}", dotted=True)
    if not (isinstance(cls, type) and issubclass(cls, StreamTask)):
        raise ConfigError(f"task.class={path!r} is not a subclass of sparkpoint StreamTask")
    return cls


def failure_advice(exc: BaseException) -> str:
    """What to do about an exception from ``process``: skipping the message only when the
    message can be at fault."""
    if isinstance(exc, OutputError):
        return (
            "Sending the output failed, not the message: the next run retries this batch from "
            "the last checkpoint (at-least-once); if it keeps failing, check the output system"
        )
    if isinstance(exc, StoreError):
        return "The store failed, not the message: skipping messages would not help"
    return (
        f"The job stops here and every restart fails at this message until it is fixed, or "
        f"skipped: task.ignored.exceptions={type(exc).__qualname__} (or *) logs and skips such "
        f"messages"
    )


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


class CoordinatorRequests:
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
    timers: TaskTimers
    stores: dict[str, KeyValueStore[Any, Any]] = field(default_factory=dict)
    #: the version of each global table this batch sees
    global_tables: Mapping[str, str] = field(default_factory=dict)

    @property
    def windows(self) -> TaskWindows:
        config = self.config if isinstance(self.config, Config) else Config(dict(self.config))
        return TaskWindows(self.task_name, config, self.stores, self.timers)

    def get_table(self, name: str) -> GlobalTable:
        version = self.global_tables.get(name)
        if version is None:
            known = ", ".join(sorted(self.global_tables)) or "none"
            raise ConfigError(
                f"task {self.task_name}: no global table {name!r} (configure "
                f"tables.{name}.source); global tables: {known}"
            )
        return open_global_table(self.config, name, version)

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
    """One task's run of one micro-batch on this executor; its state is a
    :class:`~sparkpoint.storage.task_storage.TaskStorage`."""

    def __init__(self, plan: TaskBatchPlan, attempt: int = 0) -> None:
        self.plan = plan
        self.attempt = attempt
        # an edited module of the job (a notebook's): its new version, before any job code
        # (the task, a serde or system the config names) loads in this process
        job_modules.use_version(plan.config)
        self.config, self.systems = _CACHE.config(plan.config)
        self.task = plan.task.name
        self.storage = TaskStorage(
            self.config,
            self.systems,
            plan.task,
            run_id=plan.run_id,
            pool_size=plan.task_count,
            last_checkpoint=parse_checkpoint(plan.start.checkpoint)
            if plan.start.checkpoint
            else None,
        )
        self.local = self.storage.local
        self.tables = Tables.of(self.config)
        self.last_processed: dict[SystemStreamPartition, str] = {}
        self.kept = False  # whether begin() kept the live stores (else it restored them)
        self.dead = DeadLetters.from_config(self.config)
        self.dead_letters: dict[str, int] = {}  # per reason, in this batch

    # -- input
    def input_serdes(self, stream: SystemStream) -> tuple[Serde[Any], Serde[Any]]:
        return stream_serdes(self.config, stream)

    def begin(self) -> dict[SystemStreamPartition, str]:
        """First, establish state (keep the live stores or restore the last checkpoint); the
        next offset to read per SSP, matching the state."""
        start, lazily = self.plan.start, self.plan.commits.clean_up_only
        self.kept = self.storage.open(start.expected, start.standbys, lazily=lazily)
        if self.kept:
            self.last_processed = dict(self.plan.reads.last_processed)
            return dict(self.plan.reads.resume)
        self.last_processed = dict(self.plan.start.checkpoint_last_processed)
        return dict(self.plan.start.from_checkpoint)

    def resume(
        self,
        *,
        kept: bool,
        restored: Sequence[RestoreStats],
        last_processed: Mapping[SystemStreamPartition, str],
        promoted_copy: str | None = None,
    ) -> None:
        """A later phase of a batch whose state an earlier phase established (the DataFrame
        API): open the stores as they are, and take what :meth:`begin` found (its restore, a
        standby copy it promoted) and what the batch processed since."""
        self.kept = kept
        self.storage.restored = list(restored)
        self.storage.promoted_copy = promoted_copy
        self.last_processed = dict(last_processed)
        self.storage.open_live()

    def run(self) -> TaskBatchResult:
        with fewer_full_collections():
            return self._run()

    def _run(self) -> TaskBatchResult:
        plan = self.plan
        t0 = time.monotonic()
        next_offsets = self.begin()
        coordinator = CoordinatorRequests()
        collector = OutputCollector(
            self.config, self.systems, self.task, self._staging(), staged_streams(self.config)
        )
        if stages_output(self.config):
            # the output staged since the last written checkpoint, when this batch continues
            # the live state that staged it (else it starts again from the checkpoint)
            self.storage.outputs = TaskOutputs(plan.pending_outputs if self.kept else {})
        processed = late = fired = window_late = 0
        try:
            if not plan.commits.clean_up_only:  # (a clean-up opens no store: LazyEngine)
                stores = self.storage.stores()
                timers = TaskTimers.open(self.task, self.config, stores, plan.task.ssps)
                timers.end_of_input = plan.commits.end_of_input
                context = _Context(
                    self.task, plan.task.ssps, self.config, timers, stores, plan.global_tables
                )
                tables, held = self.read_tables(stores, next_offsets)
                processed += tables
                task = load_task_class(self.config.require("task.class"))()
                task.init(context)
                freeze_imported_objects()  # the job's code is imported now
                for ssp in [] if held else self.input_ssps():
                    processed += self._process_ssp(
                        ssp, next_offsets, task, collector, coordinator, timers
                    )
                timers.end_of_batch(task, collector, coordinator)
                if timers.late:
                    log.info("task %s: %d late records in this batch", self.task, timers.late)
                if plan.commits.window:
                    task.window(collector, coordinator)
                timers.flush_owned()  # what on_timer or window() added to window stores
                task.close()
                late, fired, window_late = timers.late, timers.fired, timers.window_late()
                maybe_pause(self.config, "in-task", str(self.task))
            collector.close()
            if self.storage.outputs is not None:
                self.storage.outputs.add(collector.staged)
            result = self.finish(
                next_offsets,
                processed=processed,
                sent=collector.sent,
                coordinator=coordinator,
                started=t0,
                processed_at=time.monotonic(),
            )
            result.late, result.timers_fired, result.window_late = late, fired, window_late
            result.dead_letters = dict(self.dead_letters)
            if self.storage.outputs is not None:
                result.staged_outputs = self.storage.outputs.pending
                result.parts_staged = len(collector.staged)
            result.records_published = self.storage.published
            return result
        finally:
            collector.abort()  # a failed batch's staged output goes (after close(): nothing)
            self.storage.close()

    def _staging(self) -> tuple[str, str] | None:
        """(owner, part) of this attempt's staged output, with exactly-once output or
        intermediate streams."""
        if not stages_output(self.config):
            return None
        return owner_of(self.config, self.task), new_part(self.plan.run_id, self.plan.batch)

    def finish(
        self,
        next_offsets: dict[SystemStreamPartition, str],
        *,
        processed: int,
        sent: int,
        coordinator: CoordinatorRequests,
        started: float,
        processed_at: float,
    ) -> TaskBatchResult:
        """Steps 5 and 6 once the batch's messages are handled and its output is durable:
        the storage's commit sequence (clean-up, commit if due or asked for), then close the
        stores with the marker of the new state."""
        plan = self.plan
        try:
            watermark = self.watermark(open_store=False)
            report = self.storage.commit(
                self.last_processed,
                due=plan.commits.due or coordinator.commit_requested,
                wait=plan.commits.wait_for_uploads
                or not self.config.get_bool("task.commit.async.enabled"),
            )
        except BaseException:
            self.storage.close()
            raise
        t_commit = time.monotonic()
        state_id = report.state_id(uncommitted=self._uncommitted_state_id())
        self.storage.close(state_id)
        sizes = {
            s: self.local.store_bytes(s)
            for s in self.config.stores
            if persistent_store(self.config, s)
        }
        done = report.completed
        return TaskBatchResult(
            task=self.task.name,
            batch=plan.batch,
            state_id=state_id,
            next_offsets=next_offsets,
            last_processed=self.last_processed,
            processed=processed,
            sent=sent,
            completed_checkpoints=[json.dumps(r.checkpoint, separators=(",", ":")) for r in done],
            completed_bases=[r.base for r in done],
            upload_metrics=[r.metrics for r in done],
            commit_started=report.outcome.started,
            watermark_ms=watermark,
            commit_skipped=report.outcome.skipped,
            restored=self.storage.restored,
            promoted_copy=self.storage.promoted_copy,
            commit_requested=coordinator.commit_requested,
            shutdown_requested=coordinator.shutdown_requested,
            process_seconds=processed_at - started,
            commit_seconds=t_commit - processed_at,
            total_seconds=time.monotonic() - started,
            executor=f"{socket.gethostname()}:{os.getpid()}",
            state_bytes=sizes,
        )

    def watermark(self, *, open_store: bool = True) -> int | None:
        """The task's watermark in its timer store (``task.timers.store``), if it has one;
        ``open_store=False``: ``None`` when the batch has not opened that store."""
        name = self.config.get_str("task.timers.store")
        engine = self.storage.engines.get(name) if name else None
        if engine is None:
            return None
        if not open_store and isinstance(engine, LazyEngine) and not engine.opened:
            return None
        return TimerStore(engine).watermark()

    def _uncommitted_state_id(self) -> StateId:
        """The state id of the stores after this batch when it committed nothing: the batch's
        own, unless the batch only cleaned up (then the stores hold what they held)."""
        plan = self.plan
        if not plan.commits.clean_up_only:
            return plan.batch_state_id
        if self.kept:
            return plan.start.expected
        last = plan.start.checkpoint_id
        return EMPTY if last is None else CommittedState(last)

    def input_ssps(self) -> list[SystemStreamPartition]:
        """The task's input partitions in reading order: its SSPs without the tables'."""
        return [s for s in self.plan.task.sorted_ssps() if self.tables.store_of(s) is None]

    def read_tables(
        self,
        stores: Mapping[str, KeyValueStore[Any, Any]],
        next_offsets: dict[SystemStreamPartition, str],
    ) -> tuple[int, bool]:
        """Put this batch's records of the task's table streams into their tables (before any
        input record); (records read, whether the inputs must wait: a bootstrapping table's
        stream has records this batch did not read yet)."""
        read, held = 0, False
        for ssp in self.plan.task.sorted_ssps():
            store = self.tables.store_of(ssp)
            if store is None:
                continue
            serdes = self.input_serdes(ssp.system_stream)
            table = stores[store]
            apply = functools.partial(apply_records, table, ssp, serdes=serdes, task=self.task)
            read += self._read_ssp(ssp, next_offsets, apply)
            if store in self.tables.bootstrap and not held:
                held = self._behind(ssp, next_offsets.get(ssp))
        if held:
            log.info(
                "task %s: a table is still bootstrapping (%d records read this batch); its "
                "input records wait",
                self.task,
                read,
            )
        return read, held

    def _behind(self, ssp: SystemStreamPartition, next_offset: str | None) -> bool:
        """Whether ``ssp`` has records from ``next_offset`` on (the batch's planned end may
        stop short of them: the planner caps a batch's reads)."""
        if next_offset is None:
            return False
        admin = self.systems.admin(ssp.system)
        upcoming = admin.get_committed_metadata([ssp])[ssp].upcoming
        return admin.offset_comparator(next_offset, upcoming) < 0

    def _process_ssp(
        self,
        ssp: SystemStreamPartition,
        next_offsets: dict[SystemStreamPartition, str],
        task: StreamTask,
        collector: OutputCollector,
        coordinator: CoordinatorRequests,
        timers: TaskTimers,
    ) -> int:
        """Process the SSP's messages of this batch."""

        def process(records: Sequence[Record]) -> None:
            self._process_records(ssp, records, task, collector, coordinator, timers)

        return self._read_ssp(ssp, next_offsets, process)

    def _read_ssp(
        self,
        ssp: SystemStreamPartition,
        next_offsets: dict[SystemStreamPartition, str],
        handle: Callable[[Sequence[Record]], None],
    ) -> int:
        """Hand the SSP's messages of this batch to ``handle``: up to ``max_messages``, read in
        chunks (a read stops early at ``systems.<s>.read.max.bytes``, so memory stays bounded
        whatever the message size); the offsets advance after each chunk."""
        start = next_offsets.get(ssp)
        end = self.plan.reads.end.get(ssp)
        if start is None or end is None:
            return 0
        admin = self.systems.admin(ssp.system)
        remaining = self.plan.reads.max_messages
        if remaining < 1 or admin.offset_comparator(start, end) >= 0:
            return 0
        consumer = self.systems.consumer(ssp.system)
        try:
            consumer.register(ssp, start)
            while remaining > 0 and admin.offset_comparator(start, end) < 0:
                records = consumer.read(ssp, start, end, remaining)
                if not records:
                    skipped = consumer.skipped_through(ssp)
                    if skipped is not None:  # offsets that hold no record (Kafka markers)
                        self.last_processed[ssp] = skipped
                        next_offsets[ssp] = admin.offset_after(ssp, skipped)
                    break
                handle(records)
                last = records[-1].offset
                self.last_processed[ssp] = last
                start = next_offsets[ssp] = admin.offset_after(ssp, last)
                remaining -= len(records)
        finally:
            consumer.close()
        return self.plan.reads.max_messages - remaining

    def _process_records(
        self,
        ssp: SystemStreamPartition,
        records: Sequence[Record],
        task: StreamTask,
        collector: OutputCollector,
        coordinator: CoordinatorRequests,
        timers: TaskTimers,
    ) -> None:
        key_serde, msg_serde = self.input_serdes(ssp.system_stream)
        policy = ErrorPolicy.from_config(self.config)
        key_of, msg_of, process = key_serde.from_bytes, msg_serde.from_bytes, task.process
        new = tuple.__new__  # an envelope without the named tuple's Python-level __new__
        field = timers.event_time_of(ssp.system_stream)
        watermark = timers.watermark_ms
        top = -1  # the largest event time of these records
        for rec in records:
            try:  # the decode() below, inlined: this loop runs once per message
                key = None if rec.key is None else key_of(rec.key)
                msg = None if rec.value is None else msg_of(rec.value)
            except (ValueError, TypeError, UnicodeDecodeError):
                try:
                    key, msg = self.decode(ssp, rec, key_serde, msg_serde)
                except TaskError as exc:
                    self._undecodable(ssp, rec, exc, policy, collector)
                    continue
            try:
                event_time = (
                    rec.timestamp if field is None else self._event_time(ssp, rec, msg, field)
                )
            except MessageDecodeError as exc:
                self._undecodable(ssp, rec, exc, policy, collector)
                continue
            late = watermark is not None and event_time < watermark
            if late:
                timers.late += 1
            if event_time > top:
                top = event_time
            envelope = new(
                IncomingMessageEnvelope,
                (ssp, rec.offset, key, msg, rec.timestamp, event_time, late),
            )
            collector.arrived = (envelope, rec.value, msg_serde)  # what forward() may send
            try:
                process(envelope, collector, coordinator)
            except Exception as exc:
                error = (
                    f"task {self.task} failed processing {ssp} offset {rec.offset}: "
                    f"{type(exc).__name__}: {exc}{raised_at(exc)}"
                )
                if self.dead.takes(PROCESS):
                    self._dead_letter(collector, ssp, rec, exc, PROCESS)
                elif not policy.ignores(exc):
                    raise TaskError(f"{error}. {failure_advice(exc)}") from exc
                else:
                    log.error("%s; ignored (task.ignored.exceptions)", error)
        collector.arrived = None
        if top >= 0 and timers.tracking:
            timers.seen(ssp, top)

    def _undecodable(
        self,
        ssp: SystemStreamPartition,
        rec: Record,
        exc: TaskError,
        policy: ErrorPolicy,
        collector: OutputCollector,
    ) -> None:
        """A record that cannot be decoded (or has no event time): to the dead-letter stream,
        or dropped under task.drop.deserialization.errors, or the batch fails naming it."""
        if self.dead.takes(DECODE):
            self._dead_letter(collector, ssp, rec, exc, DECODE)
        elif policy.drop_deserialization_errors:
            log.error("%s; dropped (task.drop.deserialization.errors=true)", exc)
        else:
            raise exc

    def _dead_letter(
        self,
        collector: OutputCollector,
        ssp: SystemStreamPartition,
        rec: Record,
        exc: BaseException,
        reason: str,
    ) -> None:
        assert self.dead.stream is not None
        letter = self.dead_letter(ssp, rec, exc, reason)
        collector.send(OutgoingMessageEnvelope(self.dead.stream, rec.key, letter))

    def dead_letter(
        self, ssp: SystemStreamPartition, rec: Record, exc: BaseException, reason: str
    ) -> dict[str, Any]:
        """The dead letter of ``rec`` (to go to ``task.dlq.stream``), counted and logged."""
        letter = self.dead.letter(
            str(self.task),
            ssp,
            rec,
            exc,
            reason=reason,
            checkpoint=self.storage.last_checkpoint_id,
            attempt=self.attempt,
        )
        self.dead_letters[reason] = self.dead_letters.get(reason, 0) + 1
        log.warning(
            "task %s: %s at offset %s of %s went to the dead-letter stream %s (%s)",
            self.task,
            "a record that cannot be decoded" if reason == DECODE else "a failed record",
            rec.offset,
            ssp,
            self.dead.stream,
            letter["error"]["message"][:200],
        )
        return letter

    def _event_time(self, ssp: SystemStreamPartition, rec: Record, msg: Any, field: str) -> int:
        """The integer field ``field`` of the message (``streams.<s>.event.time.field``)."""
        value = msg.get(field) if isinstance(msg, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise MessageDecodeError(
                f"task {self.task}: message at {ssp} offset {rec.offset} has no event time: "
                f"streams.{ssp.stream}.event.time.field={field!r} must name an integer field "
                f"of milliseconds >= 0, found {value!r}"
            )
        return value

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
            raise MessageDecodeError(
                f"task {self.task}: cannot decode message at {ssp} offset {rec.offset}: {exc}"
            ) from exc


def setup_worker_logging(config: Mapping[str, str]) -> None:
    """Executors log warnings and errors; restores and commits reach the driver's display."""
    if not logging.getLogger().handlers:
        level = config.get("job.executor.log.level", "WARNING").upper()
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def state_is_on_disk(plan: TaskBatchPlan) -> bool:
    """Whether ``plan``'s batch would fetch no state: the local state is current, the task
    starts empty, or every store restores from its local checkpoint. Changes nothing."""
    if plan.start.expected == EMPTY:
        return True
    storage = TaskBatch(plan).storage
    return storage.is_current(plan.start.expected) or storage.restores_from_disk()


def restores_in_threads(plan: TaskBatchPlan) -> bool:
    """Whether ``plan``'s task restores only from backends whose restore releases the GIL, so
    that it may restore on a thread beside other tasks' (in the driver, while Spark starts)."""
    config, _systems = worker_config(plan.config)
    return restores_off_the_gil(config)


def run_task_batch(plan: TaskBatchPlan, attempt: int = 0) -> TaskBatchResult:
    """Run one task's micro-batch (called inside a Spark Python worker; ``attempt``: the
    Spark task's attempt number, which dead letters carry)."""
    setup_worker_logging(plan.config)
    with disk_errors_named(plan.task.name):
        return TaskBatch(plan, attempt).run()


@contextlib.contextmanager
def disk_errors_named(task: TaskName) -> Iterator[None]:
    """A full disk, a quota, a read-only or not writable directory met by a task's batch:
    one line naming the task, the path and the fix (a :class:`StoreError`, which the driver
    shows as it is), not a traceback through Spark. State is safe: a checkpoint is written
    whole or not at all, and the next run resumes from the last one written."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, SparkpointError) or not user_disk_error(exc):
            raise
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        what = what.splitlines()[0] if what else repr(exc)
        where = f": {exc.filename}" if isinstance(exc, OSError) and exc.filename else ""
        raise StoreError(
            f"task {task}: {what}{where} (a full disk, a "
            "quota, or a read-only or not writable directory: fix it and run again; the next "
            "run resumes from the last written checkpoint)"
        ) from None

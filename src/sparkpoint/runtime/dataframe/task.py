"""The executor side of a DataFrame pipeline's micro-batch: each task's phases, run.

A DataFrame batch runs as several Spark jobs (one per output, then one to finish), and Spark may
compute a part of it more than once (a second output reading the batch again, a retried Spark
task). The work of one task is therefore split into phases, which
:class:`~sparkpoint.runtime.dataframe.phases.TaskPhases` orders and checks (read its docstring
for the machine); this module runs them around the same
:class:`~sparkpoint.runtime.executor.task_batch.TaskBatch` the task API uses, so commits,
backups, restore and the marker work the same:

* **read** (:func:`read_batches`, the batch source of the task's Spark partition): the first
  time in a batch it establishes state exactly as the task API does (keep the live stores if
  the marker says so, else restore the last checkpoint); a later computation reads the same
  messages and touches no state.
* **stateful step** (:func:`run_step`): opens the stores on the partition of the task, once per
  batch; the pipeline runner caches each step's output so that Spark does not recompute it.
* **finish** (:func:`finish_batch`, after every output is written): commit when due and report
  to the driver.
* **drop** (:func:`drop_batch`): a retried fused step's way to give up the batch's progress.

The phases of a task must run where its state is (``job.logged.store.base.dir``): always true
in local mode or with a shared directory. On a cluster with private directories the runner
caches the batch, so Spark's locality preference sends the stateful steps and the finish to the
executor that read it. A stateful step that still lands elsewhere fails the batch; a finish
that lands elsewhere (or finds a step missing, or the batch dropped) drops the batch's progress
for that task: it restores the last checkpoint there, trimming the changelog of the steps'
writes, and the input is read again in the next batch, so state always matches its offsets.
"""

from __future__ import annotations

import io
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, MessageDecodeError, SparkpointError, TaskError
from sparkpoint.failpoints import maybe_crash
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.model.clock import follow
from sparkpoint.refs import raised_at
from sparkpoint.runtime.dataframe.phases import Begun, ReadEnd, TaskPhases, WholeBatch
from sparkpoint.runtime.executor.output import OutputCollector
from sparkpoint.runtime.executor.task_batch import (
    CoordinatorRequests,
    TaskBatch,
    disk_errors_named,
    worker_config,
)
from sparkpoint.runtime.executor.timers import OwnedTimer, TaskTimers
from sparkpoint.runtime.executor.worker_heap import (
    fewer_full_collections,
    freeze_imported_objects,
)
from sparkpoint.runtime.plan import TaskBatchPlan, TaskBatchResult
from sparkpoint.serde import REGISTRY_SERDES
from sparkpoint.serde.registry import RegistrySerde
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.storage.outputs import batch_owner, new_part, staged_streams, stages_output
from sparkpoint.storage.task_storage import persistent_store
from sparkpoint.storage.timers import TimeKind
from sparkpoint.system.base import IncomingMessageEnvelope, OutgoingMessageEnvelope, Record
from sparkpoint.system.columns import RecordColumns, newline_joined
from sparkpoint.system.dead_letters import DECODE, original
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)

READ_CHUNK = 10_000


def require_persistent_stores(config: Config) -> None:
    """DataFrame pipelines run a task's phases in different Python workers: stores must live
    on disk (an in-memory store would exist in one worker only)."""
    for store in config.stores:
        if not persistent_store(config, store):
            factory = config.require(f"stores.{store}.factory")
            raise ConfigError(
                f"stores.{store}.factory={factory!r}: DataFrame pipelines need persistent stores "
                "(set it to rocksdb); an in-memory store lives in one Python worker only"
            )


class FrameTask:
    """One task's batch in one phase: the plan, the task's :class:`TaskBatch` (its storage and
    systems) and its :class:`TaskPhases`, which every phase loads, checks and advances."""

    def __init__(self, plan: TaskBatchPlan) -> None:
        self.plan = plan
        self.batch = TaskBatch(plan)
        self.phases = TaskPhases(
            self.batch.local,
            plan.task.name,
            plan.run_id,
            plan.batch,
            clean_up_only=plan.commits.clean_up_only,
        )

    def begin(self) -> Begun:
        """Establish state once per batch; a later read of the same batch gets the same."""
        earlier = self.phases.begun()
        if earlier is not None:
            return earlier
        batch = self.batch
        require_persistent_stores(batch.config)
        try:
            start = batch.begin()
            watermark = batch.watermark()
            tables, held = 0, False
            if batch.tables:
                stores = batch.storage.stores(init=False)
                tables, held = batch.read_tables(stores, start)
                for store in stores.values():
                    store.flush()
        finally:
            batch.storage.close()  # no marker yet: the batch's state changes until its finish
        begun = Begun(
            start,
            dict(batch.last_processed),
            list(batch.storage.restored),
            batch.kept,
            watermark,
            tables,
            held,
            batch.storage.promoted_copy,
        )
        self.phases.begin(begun)
        return begun

    def finish(
        self, whole: WholeBatch | None, started: float, steps: Sequence[str] = ()
    ) -> TaskBatchResult:
        """Commit when due and report: from where the read ended when the ``whole`` batch ran
        here, else from the last checkpoint, restored here."""
        batch = self.batch
        if whole is None:
            next_offsets, processed = batch.begin(), 0
        else:
            begun, end = whole.begun, whole.end
            batch.resume(
                kept=begun.kept,
                restored=begun.restored,
                last_processed=end.last_processed,
                promoted_copy=begun.promoted_copy,
            )
            next_offsets, processed = dict(end.next), end.processed
        sent, parts = self._send_dead_letters([] if whole is None else whole.end.dead_letters)
        result = batch.finish(
            next_offsets,
            processed=processed,
            sent=sent,
            coordinator=CoordinatorRequests(),
            started=started,
            processed_at=time.monotonic(),
        )
        result.frame_parts = [p for p in [parts, *self.phases.staged(steps)] if p]
        if whole is not None:
            result.dead_letters = dict(Counter(d["reason"] for d in whole.end.dead_letters))
            result.late = whole.end.late
            result.timers_fired = self.phases.counted(steps, "fired")
            result.window_late = self.phases.counted(steps, "window_late")
        result.dropped = whole is None
        self.phases.finished()
        return result

    def _send_dead_letters(self, letters: Sequence[dict[str, Any]]) -> tuple[int, dict[str, str]]:
        """Send the batch's dead letters (read once, sent once: here, before the commit);
        exactly-once, staged as a part of the batch. How many, and the parts staged."""
        batch = self.batch
        stream, config = batch.dead.stream, batch.config
        if not letters or stream is None:
            return 0, {}
        collector = batch_collector(config, batch.systems, batch.task, self.plan)
        try:
            for letter in letters:
                key = original(letter)[0]
                collector.send(OutgoingMessageEnvelope(stream, key, letter))
            collector.flush()  # durable before the task commits
            collector.close()
        finally:
            collector.abort()  # (after close(): nothing)
        return collector.sent, collector.staged_parts


def batch_collector(
    config: Config, systems: Systems, task: TaskName, plan: TaskBatchPlan
) -> OutputCollector:
    """A collector of a DataFrame task's output besides ``to_stream`` (dead letters, a window
    or join step's late rows): a stream whose output is staged (exactly-once, or an
    intermediate stream) gets a part of the batch (:func:`batch_owner`, a new part), published
    with the batch's other parts at its commit; any other is sent as it goes."""
    staging = (batch_owner(config), new_part(plan.run_id, plan.batch))
    return OutputCollector(
        config,
        systems,
        task,
        staging=staging if stages_output(config) else None,
        staged_streams=staged_streams(config),
    )


def read_batches(plan: TaskBatchPlan, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The task's messages of this batch as Arrow record batches with ``schema`` (columns
    ``task, stream, partition, offset, key, value, timestamp, event_time, late``). A struct
    ``value`` is decoded from JSON in bulk by Arrow; otherwise the value column's type decides:
    text (UTF-8) or the raw bytes."""
    with disk_errors_named(plan.task.name):
        yield from _read_batches(plan, schema)


def _read_batches(plan: TaskBatchPlan, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    follow(plan.clock_ms, plan.driver_wall_ms)
    frame = FrameTask(plan)
    batch = frame.batch
    begun = frame.begin()
    last_processed = dict(begun.last_processed)
    next_offsets = dict(begun.start)
    processed, late = begun.table_records, 0
    event_times: dict[SystemStreamPartition, int] = {}
    dead_letters: list[dict[str, Any]] = []
    for ssp in [] if begun.held else batch.input_ssps():
        offset, end = begun.start.get(ssp), plan.reads.end.get(ssp)
        if offset is None or end is None:
            continue
        decoder = _ChunkDecoder(batch, ssp, schema, begun.watermark)
        admin = batch.systems.admin(ssp.system)
        consumer = batch.systems.consumer(ssp.system)
        try:
            while admin.offset_comparator(offset, end) < 0:
                columns = consumer.read_columns(ssp, offset, end, READ_CHUNK)
                if not len(columns):
                    skipped = consumer.skipped_through(ssp)
                    if skipped is not None:  # offsets that hold no record (Kafka markers)
                        last_processed[ssp] = skipped
                        next_offsets[ssp] = admin.offset_after(ssp, skipped)
                    break
                chunk = decoder.decode(columns)
                dead_letters += decoder.letters
                yield chunk
                processed += len(columns)
                late += decoder.late
                if decoder.top is not None:
                    event_times[ssp] = max(decoder.top, event_times.get(ssp, decoder.top))
                last_processed[ssp] = columns.last_offset
                offset = next_offsets[ssp] = admin.offset_after(ssp, columns.last_offset)
        finally:
            consumer.close()
    frame.phases.end_read(
        ReadEnd(next_offsets, last_processed, processed, event_times, late, dead_letters)
    )


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class _ChunkDecoder:
    """Turns a chunk of one SSP's records (as columns) into an Arrow record batch."""

    def __init__(
        self,
        batch: TaskBatch,
        ssp: SystemStreamPartition,
        schema: pa.Schema,
        watermark: int | None,
    ) -> None:
        self.batch = batch
        self.ssp = ssp
        self.schema = schema
        self.watermark = watermark
        self.key_serde, self.msg_serde = batch.input_serdes(ssp.system_stream)
        self.value_type = schema.field("value").type
        if isinstance(self.msg_serde, RegistrySerde) and pa.types.is_struct(self.value_type):
            self.msg_serde.read_by_latest()  # as the struct is built: older records resolved
        self.task = batch.plan.task.name.name
        self.field = batch.config.get_str(f"streams.{ssp.stream}.event.time.field")
        if self.field and not (
            pa.types.is_struct(self.value_type) and self.value_type.get_field_index(self.field) >= 0
        ):
            raise ConfigError(
                f"streams.{ssp.stream}.event.time.field={self.field!r}: a DataFrame pipeline "
                f"reads the event time from its value_schema; add '{self.field} LONG' to it"
            )
        self.top: int | None = None  # the largest event time of the last chunk
        self.late = 0  # late records in the last chunk
        #: the last chunk's records that could not be decoded, as dead letters
        self.letters: list[dict[str, Any]] = []

    def decode(self, columns: RecordColumns) -> pa.RecordBatch:
        """The chunk as a record batch of ``schema``. A record that cannot be decoded (or has
        no event time) fails it, naming the record; with a dead-letter stream for decode
        failures it leaves the chunk as a dead letter (:attr:`letters`) instead."""
        self.letters = []
        try:
            return self._decode(columns)
        except TaskError:
            if not self.batch.dead.takes(DECODE):
                raise
        good = []
        for i, record in enumerate(columns.records()):  # the slow path: which ones
            try:
                self._decode(columns.take([i]))
            except TaskError as exc:
                self.letters.append(self.batch.dead_letter(self.ssp, record, exc, DECODE))
            else:
                good.append(i)
        if not good:
            self.top, self.late = None, 0
            return pa.RecordBatch.from_pylist([], schema=self.schema)
        return self._decode(columns.take(good))

    def _decode(self, columns: RecordColumns) -> pa.RecordBatch:
        n = len(columns)
        values = self._values(columns)
        event_times = self._event_times(columns, values)
        if self.watermark is None:
            late = pa.repeat(pa.scalar(False), n)
        else:
            late = pc.less(event_times, pa.scalar(self.watermark, pa.int64()))
        self.late = int(pc.sum(late).as_py() or 0)
        self.top = pc.max(event_times).as_py() if n else None
        arrays = [
            pa.repeat(pa.scalar(self.task, pa.string()), n),
            pa.repeat(pa.scalar(self.ssp.stream, pa.string()), n),
            pa.repeat(pa.scalar(self.ssp.partition, pa.int32()), n),
            columns.offsets,
            self._keys(columns),
            values,
            columns.timestamps,
            event_times,
            late,
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _event_times(self, columns: RecordColumns, values: pa.Array) -> pa.Array:
        """Each record's event time: its timestamp, or the field of its message named by
        ``streams.<s>.event.time.field`` (an integer of milliseconds >= 0, or an error naming
        the record)."""
        if not self.field:
            return columns.timestamps.cast(pa.int64())
        assert isinstance(values, pa.StructArray)
        found = values.flatten()[self.value_type.get_field_index(self.field)]
        if not pa.types.is_integer(found.type):
            raise ConfigError(
                f"streams.{self.ssp.stream}.event.time.field={self.field!r}: the field is "
                f"{found.type} in value_schema; event times are integers (ms): declare it LONG"
            )
        times = found.cast(pa.int64())
        bad = pc.or_kleene(pc.is_null(times), pc.less(times, 0))
        if pc.any(bad).as_py():
            i = pc.index(bad, True).as_py()
            raise MessageDecodeError(
                f"task {self.task}: message at {self.ssp} offset {columns.offsets[i]} has no "
                f"event time: streams.{self.ssp.stream}.event.time.field={self.field!r} must "
                f"name an integer field of milliseconds >= 0, found {times[i].as_py()!r}"
            )
        return times

    def _keys(self, columns: RecordColumns) -> pa.Array:
        if self.key_serde.name == "string":
            try:
                return columns.keys.cast(pa.string())
            except pa.ArrowInvalid:
                pass  # not UTF-8 somewhere: the serde names the record below
        records = columns.records()
        keys = [self.batch.decode(self.ssp, r, self.key_serde, None)[0] for r in records]
        return pa.array([None if k is None else str(k) for k in keys], pa.string())

    def _values(self, columns: RecordColumns) -> pa.Array:
        data = columns.values
        if not pa.types.is_struct(self.value_type):
            if pa.types.is_binary(self.value_type):
                return data  # the raw bytes, whatever the serde
            try:
                return data.cast(pa.string())
            except pa.ArrowInvalid:
                bad = next(r for r in columns.records() if r.value and not _utf8(r.value))
                raise TaskError(
                    f"task {self.task}: message at {self.ssp} offset {bad.offset} is not UTF-8 "
                    "text; read this input with value_type='BINARY'"
                ) from None
        if self.msg_serde.name == "protobuf":
            raise ConfigError(
                f"stream {self.ssp.system_stream}: the DataFrame API reads avro and json-schema "
                "values into a struct, not protobuf ones (Protobuf's dicts hold 64-bit "
                "integers as strings): read it with value_type='BINARY' and decode it yourself"
            )
        if self.msg_serde.name in REGISTRY_SERDES:  # records to dicts, by the writer's schema
            return self._struct_rows(columns.records())
        if self.msg_serde.name != "json":
            raise ConfigError(
                f"value_schema decodes JSON (or a registry serde's records), but stream "
                f"{self.ssp.system_stream} uses the {self.msg_serde.name!r} serde "
                f"(streams.{self.ssp.stream}.samza.msg.serde); read it with "
                "value_type='STRING' or 'BINARY' instead"
            )
        if not data.null_count and not pc.any(pc.match_substring(data, pattern="\n")).as_py():
            try:
                return self._json_structs(data)
            except pa.ArrowInvalid:
                pass  # a value Arrow cannot parse: decode one by one for a precise error
        return self._struct_rows(columns.records())

    def _struct_rows(self, records: Sequence[Record]) -> pa.Array:
        """Each record decoded by the stream's serde, as a row of ``value_schema``."""
        names = [f.name for f in self.value_type]
        rows = [
            {f: v.get(f) for f in names} if isinstance(v, dict) else None
            for v in self._decode_each(records)
        ]
        try:
            return pa.array(rows, self.value_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            raise self._misfit(records, rows) from None

    def _misfit(self, records: Sequence[Record], rows: list[Any]) -> MessageDecodeError:
        """The error naming the first value that does not fit ``value_schema``."""
        for record, row in zip(records, rows, strict=True):
            try:
                pa.array([row], self.value_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
                shown = (record.value or b"")[:200].decode("utf-8", "replace")
                return MessageDecodeError(
                    f"task {self.task}: message at {self.ssp} offset {record.offset} does not "
                    f"fit the pipeline's value_schema ({self.value_type}): {e}; value {shown!r}. "
                    f"Every restart stops here until the schema fits it, or the job is moved "
                    f"past it (sparkpoint startpoint set JOB --stream {self.ssp.stream} "
                    f"--partition {self.ssp.partition} --offset <the next offset>)"
                )
        return MessageDecodeError(
            f"task {self.task}: the messages at {self.ssp} from offset {records[0].offset} do "
            f"not fit the pipeline's value_schema ({self.value_type})"
        )

    def _json_structs(self, data: pa.Array) -> pa.Array:
        """Values without nulls or newlines parsed as JSON by Arrow, in bulk."""
        text = newline_joined(data)
        table = pa_json.read_json(
            io.BytesIO(text),
            read_options=pa_json.ReadOptions(block_size=max(1 << 20, len(text) + 1)),
            parse_options=pa_json.ParseOptions(
                explicit_schema=pa.schema(list(self.value_type)),
                unexpected_field_behavior="ignore",
            ),
        )
        if table.num_rows != len(data):
            raise pa.ArrowInvalid("row count differs")
        columns = [table.column(f.name).combine_chunks() for f in self.value_type]
        return pa.StructArray.from_arrays(columns, fields=list(self.value_type))

    def _decode_each(self, records: Sequence[Record]) -> list[Any]:
        values = [r.value for r in records]
        if all(v is not None for v in values):
            try:  # in one go where the serde can (the avro serde's blocks)
                return self.msg_serde.from_bytes_many(values)  # type: ignore[arg-type]
            except (ValueError, TypeError, UnicodeDecodeError):
                pass  # one by one below, which names the record
        return [self.batch.decode(self.ssp, r, self.key_serde, self.msg_serde)[1] for r in records]


class StepState:
    """What a stateful step's function gets for its task: the stores, with vectorised
    ``get_all`` / ``put_all`` / ``delete_all`` (one store call for a whole Arrow batch), and
    the task's timers (``timers``, in the step that has ``on_timer``)."""

    def __init__(
        self,
        task: TaskName,
        config: Config,
        stores: Mapping[str, KeyValueStore[Any, Any]],
        step: str,
        timers: TaskTimers | None = None,
        plan: TaskBatchPlan | None = None,
    ) -> None:
        self.task_name = task
        self.config = config
        self.step = step
        self._stores = dict(stores)
        self._timers = timers
        self._plan = plan
        self._collectors: list[OutputCollector] = []

    def late_collector(self) -> OutputCollector:
        """A collector for the step's late rows (a window or join step's ``late_stream``):
        staged as a part of the batch where the stream is staged (:func:`batch_collector`).
        The step flushes and closes it; :meth:`staged_parts` names what it staged."""
        if self._plan is None:
            raise TaskError(f"task {self.task_name}: step {self.step!r} runs outside a batch")
        config, systems = worker_config(self.config.to_dict())
        collector = batch_collector(config, systems, self.task_name, self._plan)
        self._collectors.append(collector)
        return collector

    def staged_parts(self) -> list[dict[str, str]]:
        """The parts the step's late collectors staged (once closed), by collector."""
        return [c.staged_parts for c in self._collectors if c.staged]

    def abort(self) -> None:
        """The step failed: what its collectors staged and did not close goes."""
        for collector in self._collectors:
            collector.abort()

    def store(self, name: str) -> KeyValueStore[Any, Any]:
        try:
            return self._stores[name]
        except KeyError:
            known = ", ".join(sorted(self._stores)) or "none"
            raise TaskError(
                f"task {self.task_name}: stateful step {self.step!r} has no store {name!r} "
                f"(declare it in stores=[...] of the step; it has: {known})"
            ) from None

    @property
    def timers(self) -> TaskTimers:
        """The task's timers (``register``/``register_all``/``delete``/``list``/``now_ms``),
        as ``context.timers`` in the task API; due ones reach the step's ``on_timer``."""
        if self._timers is None:
            raise TaskError(
                f"task {self.task_name}: stateful step {self.step!r} has no timers: pass "
                "on_timer=... to batch.stateful (with task.timers.store set) to register "
                "timers and receive them"
            )
        return self._timers

    @property
    def watermark_ms(self) -> int | None:
        """The task's event-time watermark (``None`` before any event time, or no timers)."""
        return None if self._timers is None else self._timers.watermark_ms


#: what a step's ``on_timer(state, expired)`` gets: due timers, at most this many at a time
EXPIRED_CHUNK = 10_000

#: the columns of ``expired``: the timer's key (as registered), its time and kind
EXPIRED_COLUMNS = ("key", "timestamp_ms", "kind")


def _expired(timers: TaskTimers, pandas: bool) -> Iterator[Any]:
    """The due timers (:meth:`TaskTimers.expire`) in chunks: Arrow record batches of
    :data:`EXPIRED_COLUMNS` (pandas DataFrames with ``pandas``). A window store's timers
    close its windows on the way (:meth:`TaskTimers.fire_owned`)."""
    due = _users(timers)
    while chunk := list(islice(due, EXPIRED_CHUNK)):
        kinds, keys, times = zip(*chunk, strict=True)
        columns = {
            "key": pa.array(keys),
            "timestamp_ms": pa.array(times, pa.int64()),
            "kind": pa.array([k.value for k in kinds], pa.string()),
        }
        batch = pa.RecordBatch.from_pydict(columns)
        yield batch.to_pandas() if pandas else batch


class NoOutput:
    """The collector of DataFrame step code that yields rows and sends nothing (``what``, in
    the error if it sends): a window's timers, a window or join step without a late stream."""

    def __init__(self, what: str) -> None:
        self.what = what

    def send(self, envelope: OutgoingMessageEnvelope) -> None:
        raise TaskError(f"{self.what} sent to {envelope.stream}")

    def forward(self, envelope: IncomingMessageEnvelope, stream: SystemStream, key: Any) -> None:
        raise TaskError(f"{self.what} sent to {stream}")


_NO_OUTPUT = NoOutput("a window's timer of a DataFrame step")


def _users(timers: TaskTimers) -> Iterator[tuple[TimeKind, Any, int]]:
    """The user's due timers; the window stores' fire as they come."""
    for kind, key, timestamp_ms in timers.expire():
        if isinstance(key, OwnedTimer):
            timers.fire_owned(key, timestamp_ms, _NO_OUTPUT)
        else:
            yield kind, key, timestamp_ms


@dataclass(frozen=True)
class StepCode:
    """A stateful step's functions: ``fn(state, chunks)`` over its input, and
    ``on_timer(state, expired)`` for the task's due timers (``pandas``: both take pandas)."""

    fn: Callable[[StepState, Iterator[Any]], Iterator[Any]]
    on_timer: Callable[[StepState, Any], Iterable[Any]] | None = None
    pandas: bool = False
    #: after the due timers: what the step yields last (a window step's closed windows)
    finish: Callable[[StepState], Iterable[Any]] | None = None


def run_step(
    plan: TaskBatchPlan,
    step: str,
    stores: Sequence[str],
    code: StepCode,
    chunks: Iterator[Any],
) -> Iterator[Any]:
    """Run one stateful step of this batch on the plan's task: open ``stores``, yield what
    ``code.fn(state, chunks)`` yields; then, with ``code.on_timer``, advance the task's
    watermark by the event times the batch read and yield what ``on_timer`` yields for the
    due timers; then flush and close the stores. An error in the step's code fails the batch
    with a :class:`TaskError` naming the task and step (and a retry of it says why it
    failed)."""
    with disk_errors_named(plan.task.name):
        yield from _run_step(plan, step, stores, code, chunks)


def _run_step(
    plan: TaskBatchPlan,
    step: str,
    stores: Sequence[str],
    code: StepCode,
    chunks: Iterator[Any],
) -> Iterator[Any]:
    with fewer_full_collections():
        follow(plan.clock_ms, plan.driver_wall_ms)
        frame = FrameTask(plan)
        batch = frame.batch
        frame.phases.start_step(step)
        try:
            batch.storage.open_live(stores)
            opened = batch.storage.stores(init=False)
            timers = None
            if code.on_timer is not None:
                timers = TaskTimers.open(batch.task, batch.config, opened, plan.task.ssps)
                timers.end_of_input = plan.commits.end_of_input
            freeze_imported_objects()  # the step's code and pyarrow are imported now
            state = StepState(batch.task, batch.config, opened, step, timers, plan)
            what = "stateful step"
            try:
                for out in code.fn(state, chunks):
                    yield out
                    maybe_crash(batch.config, "during-stateful-step")
                if code.on_timer is not None and timers is not None:
                    what = "on_timer of stateful step"
                    _advance(frame, timers)
                    for expired in _expired(timers, code.pandas):
                        for out in code.on_timer(state, expired):
                            yield out
                            maybe_crash(batch.config, "during-stateful-step")
                if code.finish is not None:
                    for out in code.finish(state):
                        yield out
                        maybe_crash(batch.config, "during-stateful-step")
            except SparkpointError:
                state.abort()
                raise
            except Exception as exc:
                state.abort()
                error = f"{type(exc).__name__}: {exc}{raised_at(exc)}"
                frame.phases.fail_step(step, error)
                raise TaskError(f"task {batch.task}: {what} {step!r} failed: {error}") from exc
            for store in opened.values():
                store.flush()
            parts = state.staged_parts()
            if parts or (timers is not None and (timers.fired or timers.refused)):
                fired = 0 if timers is None else timers.fired
                late = 0 if timers is None else timers.window_late()
                frame.phases.end_step(step, fired, late, parts)
        finally:
            batch.storage.close()


def _advance(frame: FrameTask, timers: TaskTimers) -> None:
    """Advance the watermark by the event times of the batch's read (which ended before the
    step's input did)."""
    end = frame.phases.read_end()
    if end is None:
        raise TaskError(
            f"task {frame.plan.task.name}: a stateful step with on_timer ended before the "
            f"batch's read did (batch {frame.plan.batch}); its input must be the whole batch "
            "(no limit(), take() or first() before it)"
        )
    for ssp, top in end.event_times.items():
        timers.seen(ssp, top)
    timers.advance()  # (the window stores write their changes as their windows close)


def finish_batch(plan: TaskBatchPlan, steps: Sequence[str]) -> TaskBatchResult:
    """After the batch's outputs are written: commit if due and report (on the executor that
    holds the task's cached batch). ``steps`` are the pipeline's stateful steps."""
    with disk_errors_named(plan.task.name):
        return _finish_batch(plan, steps)


def _finish_batch(plan: TaskBatchPlan, steps: Sequence[str]) -> TaskBatchResult:
    started = time.monotonic()
    follow(plan.clock_ms, plan.driver_wall_ms)
    frame = FrameTask(plan)
    whole = frame.phases.here(steps)
    if whole is None:
        require_persistent_stores(frame.batch.config)
    if whole is None and steps:
        # Stateful steps may have changed the stores (and their changelogs) elsewhere:
        # restore the checkpoint here (which trims the changelog) and read the input again.
        log.warning(
            "task %s: batch %d did not run wholly on this executor (%s); its progress is "
            "dropped and its input is read again from the last checkpoint",
            plan.task.name,
            plan.batch,
            frame.batch.local.dir,
        )
        frame.batch.local.clear_marker()
    return frame.finish(whole, started, steps)


def drop_batch(plan: TaskBatchPlan, step: str) -> None:
    """A retried Spark task of a fused step (:mod:`sparkpoint.runtime.dataframe.udfs`) found
    that ``step`` already changed the task's stores in this batch: the batch's progress for the
    task is dropped. Its other phases still read the batch's planned messages, and its finish
    restores the last checkpoint (trimming the changelog) and reports no progress, so the next
    batch reads that input again. What the failed attempt sent may be sent twice
    (at-least-once); state never counts a message twice. Idempotent."""
    log.warning(
        "task %s: stateful step %r of batch %d ran before in a failed attempt; the batch's "
        "progress is dropped and its input is read again from the last checkpoint",
        plan.task.name,
        step,
        plan.batch,
    )
    FrameTask(plan).phases.drop(step)


def step_ran(plan: TaskBatchPlan, step: str) -> bool:
    """Whether ``step`` has started on this task in this batch (in this state directory)."""
    return FrameTask(plan).phases.step_started(step)

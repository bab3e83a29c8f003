"""The executor side of a DataFrame pipeline's micro-batch: read, stateful steps, finish.

A DataFrame batch runs as several Spark jobs (one per output, then one to finish), and Spark may
compute a part of it more than once (a second output reading the batch again, a retried Spark
task). The work of one task is therefore split into phases, tied together by small notes in the
task's state directory (:meth:`~sparkpoint.storage.local.LocalTaskState.write_note`), each
naming the run and batch it belongs to:

* **read** (:func:`read_batches`, called by the batch source for the task's Spark partition). The
  first time in a batch it establishes state exactly as the low-level executor does (keep the
  live stores if the marker says so, else restore the last checkpoint) and notes where reading
  starts (``FRAME-BATCH``). Any later computation of the source in the same batch reuses that
  note, so it reads the same messages and touches no state. After the last message it notes
  where reading ended (``FRAME-READ``).
* **stateful step** (:func:`run_step`): opens the stores on the partition of the task. Store
  updates are not idempotent, so a step refuses to run twice in one batch (``FRAME-STEP-*``);
  the pipeline runner caches each step's output so that Spark does not recompute it.
* **finish** (:func:`finish_batch`, one Spark job over the cached batch after every output is
  written): commit when due and report to the driver, through the same
  :class:`~sparkpoint.runtime.taskapi.executor.TaskBatch` code as the low-level API, so commits,
  backups, restore and the marker work the same.

The phases of a task must run where its state is (``job.logged.store.base.dir``): always true
in local mode or with a shared directory. On a cluster with private directories the runner
caches the batch, so Spark's locality preference sends the stateful steps and the finish to the
executor that read it. A stateful step that still lands elsewhere fails the batch; a finish
that lands elsewhere (or finds a step missing, or a fused step's retry noted ``FRAME-DROPPED``)
drops the batch's progress for that task:
it restores the last checkpoint there, trimming the changelog of the steps' writes, and the
input is read again in the next batch, so state always matches its offsets.
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, SparkpointError, TaskError
from sparkpoint.failpoints import maybe_crash
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.runtime.plan import TaskBatchPlan, TaskBatchResult
from sparkpoint.runtime.taskapi.executor import BatchCoordinator, TaskBatch, raised_at
from sparkpoint.runtime.taskapi.worker_heap import freeze_imported_objects
from sparkpoint.storage.backend import RestoreStats
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.storage.local import PHASE_NOTE_PREFIX
from sparkpoint.storage.task_storage import persistent_store
from sparkpoint.system.base import Record
from sparkpoint.system.columns import RecordColumns, newline_joined

log = logging.getLogger(__name__)

BATCH_NOTE = PHASE_NOTE_PREFIX + "BATCH"
READ_NOTE = PHASE_NOTE_PREFIX + "READ"
DROPPED_NOTE = PHASE_NOTE_PREFIX + "DROPPED"
READ_CHUNK = 10_000


def batch_key(plan: TaskBatchPlan) -> str:
    return f"{plan.run_id}:{plan.batch}"


def _offsets(data: Mapping[str, str]) -> dict[SystemStreamPartition, str]:
    return {SystemStreamPartition.parse(k): str(v) for k, v in data.items()}


def _texts(data: Mapping[SystemStreamPartition, str]) -> dict[str, str]:
    return {str(k): v for k, v in data.items()}


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


def _begin(batch: TaskBatch) -> dict[SystemStreamPartition, str]:
    """Establish state once per batch; later calls in the same batch reuse the note."""
    key = batch_key(batch.plan)
    note = batch.local.read_note(BATCH_NOTE)
    if note is not None and note.get("batch") == key:
        batch.last_processed = _offsets(note["last_processed"])
        return _offsets(note["start"])
    require_persistent_stores(batch.config)
    try:
        start = batch.begin()
    finally:
        batch.storage.close()  # no marker yet: the batch's state changes until its finish
    batch.local.write_note(
        BATCH_NOTE,
        {
            "batch": key,
            "start": _texts(start),
            "last_processed": _texts(batch.last_processed),
            "restored": [asdict(r) for r in batch.storage.restored],
            "kept": batch.kept,
        },
    )
    return start


def read_batches(plan: TaskBatchPlan, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The task's messages of this batch as Arrow record batches with ``schema`` (columns
    ``task, stream, partition, offset, key, value, timestamp``). A struct ``value`` is decoded
    from JSON in bulk by Arrow; otherwise the value column's type decides: text (UTF-8) or
    the raw bytes."""
    batch = TaskBatch(plan)
    start = _begin(batch)
    last_processed = dict(batch.last_processed)
    next_offsets = dict(start)
    processed = 0
    for ssp in plan.task.sorted_ssps():
        offset, end = start.get(ssp), plan.reads.end.get(ssp)
        if offset is None or end is None:
            continue
        decoder = _ChunkDecoder(batch, ssp, schema)
        admin = batch.systems.admin(ssp.system)
        consumer = batch.systems.consumer(ssp.system)
        try:
            while admin.offset_comparator(offset, end) < 0:
                columns = consumer.read_columns(ssp, offset, end, READ_CHUNK)
                if not len(columns):
                    break
                yield decoder.decode(columns)
                processed += len(columns)
                last_processed[ssp] = columns.last_offset
                offset = next_offsets[ssp] = admin.offset_after(ssp, columns.last_offset)
        finally:
            consumer.close()
    batch.local.write_note(
        READ_NOTE,
        {
            "batch": batch_key(plan),
            "next": _texts(next_offsets),
            "last_processed": _texts(last_processed),
            "processed": processed,
        },
    )


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class _ChunkDecoder:
    """Turns a chunk of one SSP's records (as columns) into an Arrow record batch."""

    def __init__(self, batch: TaskBatch, ssp: SystemStreamPartition, schema: pa.Schema) -> None:
        self.batch = batch
        self.ssp = ssp
        self.schema = schema
        self.key_serde, self.msg_serde = batch.input_serdes(ssp.system_stream)
        self.value_type = schema.field("value").type
        self.task = batch.plan.task.name.name

    def decode(self, columns: RecordColumns) -> pa.RecordBatch:
        n = len(columns)
        arrays = [
            pa.repeat(pa.scalar(self.task, pa.string()), n),
            pa.repeat(pa.scalar(self.ssp.stream, pa.string()), n),
            pa.repeat(pa.scalar(self.ssp.partition, pa.int32()), n),
            columns.offsets,
            self._keys(columns),
            self._values(columns),
            columns.timestamps,
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

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
        if self.msg_serde.name != "json":
            raise ConfigError(
                f"value_schema decodes JSON, but stream {self.ssp.system_stream} uses the "
                f"{self.msg_serde.name!r} serde (streams.{self.ssp.stream}.samza.msg.serde); "
                "read it with value_type='STRING' or 'BINARY' instead"
            )
        if not data.null_count and not pc.any(pc.match_substring(data, pattern="\n")).as_py():
            try:
                return self._json_structs(data)
            except pa.ArrowInvalid:
                pass  # a value Arrow cannot parse: decode one by one for a precise error
        values = self._decode_each(columns.records())
        names = [f.name for f in self.value_type]
        return pa.array(
            [{f: v.get(f) for f in names} if isinstance(v, dict) else None for v in values],
            self.value_type,
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
        return [self.batch.decode(self.ssp, r, self.key_serde, self.msg_serde)[1] for r in records]


class StepState:
    """What a stateful step's function gets for its task: the stores, with vectorised
    ``get_all`` / ``put_all`` / ``delete_all`` (one store call for a whole Arrow batch)."""

    def __init__(
        self,
        task: TaskName,
        config: Config,
        stores: Mapping[str, KeyValueStore[Any, Any]],
        step: str,
    ) -> None:
        self.task_name = task
        self.config = config
        self.step = step
        self._stores = dict(stores)

    def store(self, name: str) -> KeyValueStore[Any, Any]:
        try:
            return self._stores[name]
        except KeyError:
            known = ", ".join(sorted(self._stores)) or "none"
            raise TaskError(
                f"task {self.task_name}: stateful step {self.step!r} has no store {name!r} "
                f"(declare it in stores=[...] of the step; it has: {known})"
            ) from None


def _note_name(step: str) -> str:
    return PHASE_NOTE_PREFIX + "STEP-" + re.sub(r"[^A-Za-z0-9_.-]", "_", step)


def run_step(
    plan: TaskBatchPlan,
    step: str,
    stores: Sequence[str],
    fn: Callable[[StepState, Iterator[Any]], Iterator[Any]],
    chunks: Iterator[Any],
) -> Iterator[Any]:
    """Run one stateful step of this batch on the plan's task: open ``stores``, yield what
    ``fn(state, chunks)`` yields, then flush and close them. An error in ``fn`` fails the batch
    with a :class:`TaskError` naming the task and step (and a retry of it says why it failed)."""
    batch = TaskBatch(plan)
    key = batch_key(plan)
    note = batch.local.read_note(BATCH_NOTE)
    if note is None or note.get("batch") != key:
        raise TaskError(
            f"task {batch.task}: stateful step {step!r} of batch {plan.batch} ran on an executor "
            f"where the task's input of this batch was not read (no note in {batch.local.dir}); "
            "the task's state is elsewhere. Use a job.logged.store.base.dir every executor "
            "shares, or raise spark.locality.wait so the step runs beside its cached input"
        )
    step_note = _note_name(step)
    done = batch.local.read_note(step_note)
    if done is not None and done.get("batch") == key:
        earlier = f" (it failed: {done['error']})" if done.get("error") else ""
        raise TaskError(
            f"task {batch.task}: stateful step {step!r} was computed twice in batch "
            f"{plan.batch}{earlier}: a retried Spark task, or its DataFrame evicted from the "
            "cache. Its store updates are not idempotent, so the batch fails; restart the job "
            "and it resumes from the last checkpoint with state and offsets that match"
        )
    batch.local.write_note(step_note, {"batch": key})
    try:
        batch.storage.open_live(stores)
        opened = batch.storage.stores(init=False)
        freeze_imported_objects()  # the step's code and pyarrow are imported now
        try:
            for out in fn(StepState(batch.task, batch.config, opened, step), chunks):
                yield out
                maybe_crash(batch.config, "during-stateful-step")
        except SparkpointError:
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}{raised_at(exc)}"
            batch.local.write_note(step_note, {"batch": key, "error": error})
            raise TaskError(f"task {batch.task}: stateful step {step!r} failed: {error}") from exc
        for store in opened.values():
            store.flush()
    finally:
        batch.storage.close()


def _batch_is_here(batch: TaskBatch, steps: Sequence[str]) -> dict[str, Any] | None:
    """The READ note if this executor holds the whole batch of the task (its read and every
    stateful step); ``None`` if the batch ran elsewhere, or partly here."""
    key = batch_key(batch.plan)
    note = batch.local.read_note(BATCH_NOTE)
    if note is None or note.get("batch") != key:
        return None
    dropped = batch.local.read_note(DROPPED_NOTE)
    if dropped is not None and dropped.get("batch") == key:
        return None
    read = batch.local.read_note(READ_NOTE)
    if read is None or read.get("batch") != key:
        raise TaskError(
            f"task {batch.task}: batch {batch.plan.batch} read only part of its input (a "
            "limit(), take() or first() on the batch stops reading early), so sparkpoint cannot "
            "tell which messages were processed; write whole DataFrames to outputs"
        )
    for step in steps:
        done = batch.local.read_note(_note_name(step))
        if done is None or done.get("batch") != key:
            return None
    batch.storage.restored = [RestoreStats(**r) for r in note.get("restored", [])]
    batch.kept = bool(note.get("kept"))
    return read


def finish_batch(plan: TaskBatchPlan, steps: Sequence[str]) -> TaskBatchResult:
    """After the batch's outputs are written: commit if due and report (on the executor that
    holds the task's cached batch). ``steps`` are the pipeline's stateful steps."""
    started = time.monotonic()
    batch = TaskBatch(plan)
    read = _batch_is_here(batch, steps)
    if read is None:
        require_persistent_stores(batch.config)
        if steps:
            # Stateful steps may have changed the stores (and their changelogs) elsewhere:
            # restore the checkpoint here (which trims the changelog) and read the input again.
            log.warning(
                "task %s: batch %d did not run wholly on this executor (%s); its progress is "
                "dropped and its input is read again from the last checkpoint",
                batch.task,
                plan.batch,
                batch.local.dir,
            )
            batch.local.clear_marker()
        return _finish(batch, batch.begin(), 0, started)
    batch.storage.open_live()
    batch.last_processed = _offsets(read["last_processed"])
    return _finish(batch, _offsets(read["next"]), int(read["processed"]), started)


def drop_batch(plan: TaskBatchPlan, step: str) -> None:
    """A retried Spark task of a fused step (:mod:`sparkpoint.runtime.dataframe.udfs`) found that
    ``step`` already changed the task's stores in this batch: the batch's progress for the task
    is dropped. Its other phases still read the batch's planned messages, and its finish
    restores the last checkpoint (trimming the changelog) and reports no progress, so the next
    batch reads that input again. What the failed attempt sent may be sent twice
    (at-least-once); state never counts a message twice. Idempotent."""
    batch = TaskBatch(plan)
    log.warning(
        "task %s: stateful step %r of batch %d ran before in a failed attempt; the batch's "
        "progress is dropped and its input is read again from the last checkpoint",
        batch.task,
        step,
        plan.batch,
    )
    batch.local.write_note(DROPPED_NOTE, {"batch": batch_key(plan), "step": step})


def step_ran(plan: TaskBatchPlan, step: str) -> bool:
    """Whether ``step`` has started on this task in this batch (in this state directory)."""
    done = TaskBatch(plan).local.read_note(_note_name(step))
    return done is not None and done.get("batch") == batch_key(plan)


def _finish(
    batch: TaskBatch, next_offsets: dict[SystemStreamPartition, str], processed: int, started: float
) -> TaskBatchResult:
    return batch.finish(
        next_offsets,
        processed=processed,
        sent=0,
        coordinator=BatchCoordinator(),
        started=started,
        processed_at=time.monotonic(),
    )

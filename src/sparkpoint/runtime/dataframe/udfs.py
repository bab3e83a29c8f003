"""The functions Spark runs on each task's partition of a DataFrame batch (all picklable).

* :class:`StepUdf`: a stateful step (``mapInArrow``/``mapInPandas`` over the step's input);
* :class:`StreamWriterUdf`: sends a DataFrame's rows to a stream, and may finish the task;
* :class:`Finisher`: the finish phase alone (commit when due, report);
* :class:`FusedStep`: a stateful step, the stream outputs that read it (each taking the rows
  and columns its :class:`Route` says) and, when one of them is the batch's last, the task's
  finish, in one pass over the step's input: the step's rows go straight from the function to
  the streams, never back through the JVM or into a cache;
* :class:`FusedRead`: the same, reading the task's messages itself, for a step whose input is
  only columns and struct fields of ``batch.df`` (:func:`sparkpoint.runtime.dataframe.fusion.
  source_projection`): the JVM then schedules the batch and moves no rows at all.

A fused step changes the stores and sends in the same Spark task, so a retry of that task
cannot reuse the step's rows: it drops the batch's progress for the task instead
(:func:`~sparkpoint.runtime.dataframe.task.drop_batch`), which restores the last checkpoint. The
unfused path keeps its guard: a step computed twice in a batch fails the batch.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.errors import ConfigError, MessageEncodeError, TaskError
from sparkpoint.failpoints import maybe_crash
from sparkpoint.model import SystemStream, TaskName
from sparkpoint.runtime.dataframe.task import (
    StepCode,
    StepState,
    drop_batch,
    finish_batch,
    read_batches,
    run_step,
    step_ran,
)
from sparkpoint.runtime.plan import TaskBatchPlan
from sparkpoint.storage.outputs import new_part
from sparkpoint.storage.task_storage import held_engines

StepFunction = Callable[[StepState, Iterator[Any]], Iterator[Any]]
#: ``on_timer(state, expired)`` of a stateful step: rows for the due timers in ``expired``
TimerFunction = Callable[[StepState, Any], Iterable[Any]]

#: what a stream output's Spark job returns per task partition
#: (``staged``, exactly-once: the JSON of the part staged per SSP, ``system.stream.partition``)
RESULT_SCHEMA = "task STRING, sent LONG, result BINARY, staged STRING"

#: a column made from another frame's: its name and where it comes from there (a column, then
#: struct fields); a step's input from the batch source, or a stream output from its step
Projection = list[tuple[str, tuple[str, ...]]]


def project(chunk: pa.RecordBatch, projection: Projection, schema: pa.Schema) -> pa.RecordBatch:
    """The columns ``projection`` makes of ``chunk``, as ``schema`` types them (the types Spark
    would hand over: string sizes, say)."""
    columns = []
    for _name, (column, *fields) in projection:
        array: Any = chunk.column(column)
        for field in fields:  # flatten() applies the struct's nulls to its fields
            array = array.flatten()[array.type.get_field_index(field)]
        columns.append(array)
    columns = [c if c.type == t else c.cast(t) for c, t in zip(columns, schema.types, strict=True)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


@dataclass(frozen=True)
class Route:
    """The rows of a stateful step's output that one fused stream output sends: those whose
    column ``where[0]`` equals ``where[1]`` (every row without ``where``), made into the
    output's columns by ``projection`` typed by ``schema`` (the step's own without one), as
    Spark would filter and select them (:func:`sparkpoint.runtime.dataframe.fusion.step_route`)."""

    where: tuple[str, str | int] | None = None
    projection: Projection | None = None
    schema: pa.Schema | None = None

    def apply(self, chunk: pa.RecordBatch) -> pa.RecordBatch:
        if self.where is not None:
            column, value = self.where
            chunk = chunk.filter(pc.equal(chunk.column(column), value))  # nulls: dropped
        if self.projection is not None and self.schema is not None:
            chunk = project(chunk, self.projection, self.schema)
        return chunk


def partition_index() -> int:
    """The Spark partition this Python worker is computing (partition ``i`` is ``plans[i]``)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def partitioning_error(step: str, detail: str) -> ConfigError:
    return ConfigError(
        f"stateful step {step!r} needs its input partitioned by task, but {detail}. A stateful "
        "step gets the stores of one task, so it must run on the batch's own partitions: apply "
        "it to batch.df (select, filter, withColumn and broadcast joins keep the partitioning) "
        "before any repartition(), groupBy(), distinct(), sort or non-broadcast join, and keep "
        "the 'task' column; aggregate per key inside the step with its stores instead"
    )


class StepUdf:
    """A stateful step: ``fn(state, chunks)`` on the partition of each task. ``token``, its
    name in Spark's plans, tells the driver which outputs read the step."""

    def __init__(
        self,
        plans: Sequence[TaskBatchPlan],
        name: str,
        stores: Sequence[str],
        code: StepCode,
        token: str,
    ) -> None:
        self.plans = list(plans)
        self.name = name
        self.stores = list(stores)
        self.code = code
        self.pandas = code.pandas
        self.__name__ = token  # pyspark names the UDF after it

    def plan(self) -> TaskBatchPlan:
        """The plan of the task whose partition this worker computes."""
        index = partition_index()
        if index >= len(self.plans):
            raise partitioning_error(
                self.name, f"its input has more partitions than the job's {len(self.plans)} tasks"
            )
        return self.plans[index]

    def _check(self, chunks: Iterable[Any], task: str) -> Iterator[Any]:
        for chunk in chunks:
            if self.pandas:
                tasks = set(chunk["task"].unique())
            else:
                tasks = set(chunk.column("task").unique().to_pylist())
            if tasks - {task}:
                other = sorted(str(t) for t in tasks - {task})[0]
                raise partitioning_error(
                    self.name, f"rows of task {other} reached the partition of task {task}"
                )
            yield chunk

    def run(self, plan: TaskBatchPlan, chunks: Iterator[Any]) -> Iterator[Any]:
        """What the step yields for ``plan``'s task on ``chunks``, its input."""
        it = iter(chunks)
        first = next(it, None)  # the batch source has established the task's state by now
        rows = self._check(chain([] if first is None else [first], it), plan.task.name.name)
        yield from run_step(plan, self.name, self.stores, self.code, rows)

    def __call__(self, chunks: Iterator[Any]) -> Iterator[Any]:
        yield from self.run(self.plan(), chunks)


class Finisher:
    """The finish phase of each task's partition: commit, then report (picklable)."""

    def __init__(self, plans: Sequence[TaskBatchPlan], steps: Sequence[str]) -> None:
        self.plans = list(plans)
        self.steps = list(steps)

    def finish(self, plan: TaskBatchPlan | None = None) -> bytes:
        """Finish the task of ``plan`` (or of the current Spark partition); its pickled result."""
        from sparkpoint.runtime.executor.task_batch import setup_worker_logging

        plan = plan or self.plans[partition_index()]
        setup_worker_logging(plan.config)
        return pickle.dumps(finish_batch(plan, self.steps))

    def __call__(self, chunks: Iterator[Any]) -> Iterator[Any]:
        for _ in chunks:
            pass
        yield pa.RecordBatch.from_pydict({"result": [self.finish()]})


def _result(
    task: str, sent: int, result: bytes | None, parts: Mapping[str, str] | None = None
) -> pa.RecordBatch:
    columns = {
        "task": [task],
        "sent": [sent],
        "result": [result],
        "staged": [json.dumps(parts) if parts else None],
    }
    types = [("task", pa.string()), ("sent", pa.int64()), ("result", pa.binary())]
    schema = pa.schema([*types, ("staged", pa.string())])
    return pa.RecordBatch.from_pydict(columns, schema=schema)


class StreamWriterUdf:
    """Sends a DataFrame's rows to a stream from each partition: the message is the ``value``
    column, or the whole row as a dict; the partition comes from the ``key`` column. With
    ``finisher`` (the batch's last output, on the task partitions) each partition then finishes
    its task in the same Spark task, which saves the batch a Spark job. With ``staging``
    (exactly-once: the batch's owner and id) each Spark task attempt stages its own part, which
    the driver records with the batch (:mod:`sparkpoint.storage.outputs`)."""

    def __init__(
        self,
        config: Mapping[str, str],
        stream: SystemStream,
        key: str | None,
        value: str | None,
        finisher: Finisher | None,
        staging: tuple[str, int] | None = None,
    ) -> None:
        self.config = dict(config)
        self.stream = stream
        self.key = key
        self.value = value
        self.finisher = finisher
        self.staging = staging

    def write(
        self, chunks: Iterable[pa.RecordBatch], plan: TaskBatchPlan | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Send ``chunks``; yields one row: the task, how many messages were sent, and the
        task's pickled result if this output finishes it (``plan``: the task, when known)."""
        yield from write_routed([(self, Route())], chunks, plan, self.finisher)

    def collector(self, config: Any, systems: Any, task: str) -> Any:
        """This output's collector for a task (an ``OutputCollector``); exactly-once, it
        stages a part of its own."""
        from sparkpoint.runtime.executor.output import OutputCollector

        staging = None
        if self.staging is not None:
            owner, batch = self.staging
            staging = (owner, new_part("df", batch))
        return OutputCollector(
            config, systems, TaskName(task or "pipeline-output"), staging=staging
        )

    def send(self, collector: Any, chunk: pa.RecordBatch) -> None:
        keys = None if self.key is None else chunk.column(self.key)
        if self.value is None:  # the whole row, as a dict of its columns
            messages = pa.StructArray.from_arrays(chunk.columns, names=chunk.schema.names)
        else:
            messages = chunk.column(self.value)
        try:
            collector.send_arrow(self.stream, keys, messages)
        except MessageEncodeError as exc:
            sent = f"value column {self.value!r}" if self.value else "the whole row as value"
            raise MessageEncodeError(
                f"{exc} (the key column {self.key!r}, {sent}: cast them to what the stream's "
                f"serdes take, e.g. F.col(...).cast('string'), or set "
                f"streams.{self.stream.stream}.samza.key.serde / msg.serde)"
            ) from exc

    def __call__(self, chunks: Iterator[Any]) -> Iterator[Any]:
        yield from self.write(chunks)


class FusedStep:
    """A stateful step and the stream outputs that are its only readers, in one pass over the
    step's input (``mapInArrow`` with :data:`RESULT_SCHEMA`); see the module docstring."""

    def __init__(
        self,
        step: StepUdf,
        outputs: Sequence[tuple[StreamWriterUdf, Route]],
        schema: pa.Schema,
        finisher: Finisher | None,
    ) -> None:
        self.step = step
        self.outputs = list(outputs)  # every reader of the step: a stream output and its rows
        self.schema = schema  # the step's declared output schema
        self.finisher = finisher

    def _verified(self, plan: TaskBatchPlan, out: Iterable[Any]) -> Iterator[pa.RecordBatch]:
        """The step's output, held to its declared schema as Spark reads it: record batches
        whose column types match by position (names are the schema's)."""
        want = self.schema.types
        for item in out:
            if isinstance(item, pa.Table):
                batches = item.to_batches()
            elif isinstance(item, pa.RecordBatch):
                batches = [item]
            else:
                raise TaskError(
                    f"task {plan.task.name}: stateful step {self.step.name!r} yielded a "
                    f"{type(item).__name__}; a step yields pyarrow.RecordBatch"
                )
            for batch in batches:
                if batch.schema.types != want:
                    raise TaskError(
                        f"task {plan.task.name}: stateful step {self.step.name!r} yielded "
                        f"columns ({_columns(batch.schema)}), but its schema is "
                        f"({_columns(self.schema)})"
                    )
                if batch.schema.names != self.schema.names:
                    batch = pa.RecordBatch.from_arrays(batch.columns, schema=self.schema)
                yield batch

    def run(self, plan: TaskBatchPlan, chunks: Iterator[Any]) -> Iterator[pa.RecordBatch]:
        if step_ran(plan, self.step.name):  # a retried Spark task: the stores changed already
            drop_batch(plan, self.step.name)
            result = None if self.finisher is None else self.finisher.finish(plan)
            yield _result(plan.task.name.name, 0, result)
            return
        with held_engines():  # the read, the step and the finish open the stores once
            out = self._verified(plan, self.step.run(plan, chunks))
            yield from write_routed(self.outputs, out, plan, self.finisher)

    def __call__(self, chunks: Iterator[Any]) -> Iterator[Any]:
        yield from self.run(self.step.plan(), chunks)


class FusedRead:
    """A :class:`FusedStep` over the batch's plans: each task reads its own messages and takes
    the step's input columns from them (``projection``), so no row crosses the JVM."""

    def __init__(
        self,
        fused: FusedStep,
        read_schema: pa.Schema,
        projection: Projection,
        input_schema: pa.Schema,
    ) -> None:
        self.fused = fused
        self.read_schema = read_schema
        self.projection = projection
        self.input_schema = input_schema

    def __call__(self, chunks: Iterator[Any]) -> Iterator[Any]:
        for chunk in chunks:
            for raw in chunk.column(0).to_pylist():
                plan: TaskBatchPlan = pickle.loads(raw)
                batches = read_batches(plan, self.read_schema)
                rows = (project(c, self.projection, self.input_schema) for c in batches)
                yield from self.fused.run(plan, rows)


def write_routed(
    outputs: Sequence[tuple[StreamWriterUdf, Route]],
    chunks: Iterable[pa.RecordBatch],
    plan: TaskBatchPlan | None,
    finisher: Finisher | None,
) -> Iterator[pa.RecordBatch]:
    """Send each chunk's rows to every output its route picks them for, flush them all, then
    (with ``finisher``) finish the task; yields a :data:`RESULT_SCHEMA` row per output (each
    names the parts its output staged: two outputs may stage to one partition), the task's
    result on the last."""
    from sparkpoint.runtime.executor.task_batch import worker_config

    config, systems = worker_config(outputs[0][0].config)
    task = "" if plan is None else plan.task.name.name
    collectors: list[Any] = []
    written = False

    def opened() -> list[Any]:  # once the task is known (its errors name it)
        if not collectors:
            collectors.extend(writer.collector(config, systems, task) for writer, _ in outputs)
        return collectors

    try:
        for chunk in chunks:
            if not chunk.num_rows:
                continue
            if not task and "task" in chunk.schema.names:
                task = next((str(t) for t in chunk.column("task").to_pylist() if t), "")
            for (writer, route), collector in zip(outputs, opened(), strict=True):
                rows = route.apply(chunk)
                if rows.num_rows:
                    writer.send(collector, rows)
        for collector in opened():
            collector.flush()  # durable before the task commits
        maybe_crash(config, "after-output-flush")
        written = True
    finally:
        _end(outputs, collectors, written)
    result = None if finisher is None else finisher.finish(plan)
    for i, collector in enumerate(collectors):
        last = i == len(collectors) - 1
        yield _result(task, collector.sent, result if last else None, collector.staged_parts)


def _end(
    outputs: Sequence[tuple[StreamWriterUdf, Route]], collectors: Sequence[Any], written: bool
) -> None:
    """Close every collector (a staged part of a failed write is aborted: whole or absent),
    each even if another's close raised; then raise the first error."""
    error: BaseException | None = None
    for (writer, _), collector in zip(outputs, collectors, strict=False):
        try:
            if written or writer.staging is None:
                collector.close()
            else:
                collector.abort()
        except BaseException as exc:  # the others still close
            error = error or exc
    if error is not None:
        raise error


def _columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


__all__ = [
    "RESULT_SCHEMA",
    "Finisher",
    "FusedRead",
    "FusedStep",
    "Projection",
    "Route",
    "StepFunction",
    "StepUdf",
    "StreamWriterUdf",
    "TimerFunction",
    "partition_index",
    "partitioning_error",
    "project",
    "write_routed",
]

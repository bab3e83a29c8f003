"""Runs a :class:`~sparkpoint.runtime.dataframe.pipeline.Pipeline`'s micro-batches: the
:class:`DataFrameRunner`, the driver's :class:`~sparkpoint.runtime.runner.BatchRunner` for the
DataFrame API, and how a batch's outputs are written (:class:`_Writes`: which run fused with
their stateful step, which finish the tasks). The steps of a batch are in
:mod:`sparkpoint.runtime.dataframe.pipeline`'s docstring.
"""

from __future__ import annotations

import json
import logging
import pickle
import time
from collections.abc import Iterable, Sequence
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import functions as F

from sparkpoint.config import Config
from sparkpoint.errors import BatchInterrupted, ConfigError, SparkpointError
from sparkpoint.metadata.locality import Executor
from sparkpoint.runtime.dataframe.fusion import (
    StepFrame,
    fusable,
    reads,
    source_projection,
    source_token,
)
from sparkpoint.runtime.dataframe.pipeline import (
    Batch,
    Output,
    Pipeline,
    SinkOutput,
    StreamOutput,
    on_task_partitions,
)
from sparkpoint.runtime.dataframe.sinks import FunctionSink, StagingSink
from sparkpoint.runtime.dataframe.source import BatchSource, arrow_schema, batch_source
from sparkpoint.runtime.dataframe.task import require_persistent_stores
from sparkpoint.runtime.dataframe.udfs import (
    RESULT_SCHEMA,
    Finisher,
    FusedRead,
    FusedStep,
    StreamWriterUdf,
)
from sparkpoint.runtime.plan import (
    BatchOutputs,
    StagedSink,
    StandbyPlan,
    StandbyResult,
    TaskBatchPlan,
    TaskBatchResult,
)
from sparkpoint.runtime.runner import BatchRunner
from sparkpoint.runtime.spark.locality import ExecutorWatch
from sparkpoint.runtime.spark.session import (
    batch_job_group,
    catch_up_standbys,
    cluster_executors,
    record_executors,
    user_error_from,
)
from sparkpoint.storage.outputs import (
    batch_owner,
    exactly_once,
    staged_stream,
    stages_output,
)
from sparkpoint.system.dead_letters import PROCESS, DeadLetters

log = logging.getLogger(__name__)


def _outputs(result: Output | Iterable[Output] | None) -> list[Output]:
    if result is None:
        return []
    if isinstance(result, (StreamOutput, SinkOutput)):
        return [result]
    outputs = list(result)
    for out in outputs:
        if not isinstance(out, (StreamOutput, SinkOutput)):
            raise ConfigError(
                f"a pipeline returns outputs made by batch.to_stream(...) or batch.to_sink(...), "
                f"not {type(out).__name__}"
            )
    return outputs


class DataFrameRunner(BatchRunner):
    """Runs a :class:`Pipeline`'s micro-batches (the coordinator's :class:`BatchRunner`)."""

    exact_batches = True
    places_tasks = True

    def __init__(self, spark: Any, pipeline: Pipeline, config: Config) -> None:
        if not config.inputs:
            raise ConfigError("task.inputs is empty: list the job's input streams as system.stream")
        require_persistent_stores(config)
        if DeadLetters.from_config(config).takes(PROCESS):
            raise ConfigError(
                f"task.dlq.on={config.get_str('task.dlq.on')!r}: a DataFrame pipeline has no "
                "per-record process() whose failure could be blamed on one record; only "
                "records that cannot be decoded go to task.dlq.stream here (task.dlq.on: decode)"
            )
        self.steps: list[str] | None = None  # the stateful steps of the first batch
        self.spark = spark
        self.pipeline = pipeline
        self.config = config
        #: the job's batch log epoch, set by the driver once the log is open (sinks: begin)
        self.batch_epoch: int | None = None
        #: exactly-once: what the last batch staged, for the driver to record in its batch log
        self._staged: BatchOutputs | None = None
        self._owner = batch_owner(config) if stages_output(config) else None
        self._group: str | None = None  # the running batch's Spark job group (cancel)
        #: the ``value`` struct's columns: the pipeline's, or its Avro input's registry schema
        self.value_schema = pipeline.value_schema
        if self.value_schema is None and pipeline.value_type == "STRING":
            self.value_schema = registry_value_schema(config)

    def begin_epoch(self, epoch: int) -> None:
        """The batch log's epoch, passed on to every sink before it writes (:meth:`Sink.begin`)."""
        self.batch_epoch = epoch

    @property
    def staged(self) -> BatchOutputs | None:
        return self._staged

    def cancel(self) -> None:
        """The running batch's Spark jobs (its job group), not the session's other jobs."""
        if self._group is not None:
            self.spark.sparkContext.cancelJobGroup(self._group)

    def executors(self) -> list[Executor] | None:
        """The live executors on a cluster (host affinity); ``None`` in local mode."""
        return cluster_executors(self.spark.sparkContext)

    def catch_up(self, plans: list[StandbyPlan]) -> list[StandbyResult]:
        """Catch the standby copies up, as the task API's runner does."""
        return catch_up_standbys(self.spark.sparkContext, plans)

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        from pyspark import StorageLevel

        self._staged = None if self._owner is None else BatchOutputs()
        group = self._group = batch_job_group(self.spark.sparkContext, batch)
        source = batch_source(
            self.spark,
            plans,
            value_schema=self.value_schema,
            value_type=self.pipeline.value_type,
            name=source_token(batch),
        )
        cached = source.df.persist(StorageLevel.MEMORY_AND_DISK)
        frame = Batch(self.spark, cached, batch, plans, self.config)
        frame.keep_cached(cached)
        sent: dict[str, int] = {}
        t0 = time.monotonic()
        # (a batch is several Spark jobs, each over every task: one task of a lost executor
        # would hold its job for spark.locality.wait; the task API runs a job per executor)
        locations = {p.location for p in plans if p.location}
        with ExecutorWatch(self.spark.sparkContext, group, locations) as watch:
            try:
                if plans and all(p.commits.clean_up_only for p in plans):
                    # no pipeline: only each task's finish, which cleans up after the checkpoint
                    return self._finish(cached, Finisher(plans, []))
                outputs = self._build(frame, batch)
                steps = frame.step_names
                t1 = time.monotonic()
                writes = _Writes(self.spark, frame, source, outputs)
                finisher = Finisher(plans, steps)
                results: list[TaskBatchResult] = []
                for i, output in enumerate(outputs):
                    watch.check(f"batch {batch}")  # (a job started after the loss: cancelled too)
                    fold = finisher if writes.folded and i == len(outputs) - 1 else None
                    fused = writes.fused.get(i)
                    if fused is None:
                        results = self._write(output, batch, sent, fold) or results
                    elif i == writes.last_of(fused[0]):  # the step's job sends all its outputs
                        job = self._write_fused(writes, fused[0], outputs, batch, fold)
                        results = self._collect(job, sent) or results
                t2 = time.monotonic()
                if not writes.folded:
                    watch.check(f"batch {batch}")
                    results = self._finish(cached, finisher)
                log.info(
                    "batch %d: pipeline built in %.2fs, %d outputs written in %.2fs (%s), tasks "
                    "finished %s",
                    batch,
                    t1 - t0,
                    len(outputs),
                    t2 - t1,
                    writes.describe(),
                    "with the last output" if writes.folded else f"in {time.monotonic() - t2:.2f}s",
                )
            except Exception as exc:
                if watch.lost is not None and not isinstance(exc, BatchInterrupted):
                    raise BatchInterrupted(
                        f"batch {batch}: {watch.lost} was lost while the batch ran on it, and its "
                        f"Spark jobs were cancelled ({type(exc).__name__})"
                    ) from exc
                if isinstance(exc, SparkpointError):
                    raise
                err = user_error_from(exc)
                if err is not None:
                    raise err from None
                raise
            finally:
                frame.release()
        record_executors(self.spark.sparkContext, group, plans, results)
        self._account(results, sent)
        return results

    def _account(self, results: list[TaskBatchResult], sent: dict[str, int]) -> None:
        """Add to the tasks' results what the outputs sent for them, and note the parts
        (dead letters) each task's finish staged."""
        for result in results:
            if self._staged is not None:
                for parts in result.frame_parts:  # one per collector: dead letters, late rows
                    self._staged.add_parts(parts)
        by_task = {r.task: r for r in results}
        for task, n in sent.items():
            target = by_task.get(task) or (results[0] if results else None)
            if target is not None:
                target.sent += n

    def _build(self, frame: Batch, batch: int) -> list[Output]:
        """The pipeline's outputs for the batch, once its steps are checked: the same steps as
        every earlier batch, timers only with a step that fires them, and (exactly-once)
        sinks that stage."""
        outputs = _outputs(self.pipeline.build(frame))
        if exactly_once(self.config):
            _check_sinks_stage(outputs)
        steps = frame.step_names
        if self.steps is not None and steps != self.steps:
            raise ConfigError(
                f"batch {batch}: the pipeline's stateful steps changed from "
                f"{self.steps} to {steps}; build the same steps for every batch (a step "
                "may get no rows, but it must be there), or state would miss messages"
            )
        self.steps = steps
        timer_store = self.config.get_str("task.timers.store")
        if timer_store and frame.timer_step is None:
            raise ConfigError(
                f"task.timers.store={timer_store!r} is set, but no stateful step has "
                "on_timer=...: give the step that registers timers an on_timer (or unset "
                "task.timers.store), or the watermark never advances"
            )
        return outputs

    @staticmethod
    def _finish(source: Any, finisher: Finisher) -> list[TaskBatchResult]:
        """Each task's finish on the cached partitions (locality), without shipping their rows
        to Python: offsets are never null, and a predicate Spark cannot fold keeps the
        partitions."""
        cached = source.select("offset").where(F.col("offset").isNull())
        finish = cached.mapInArrow(finisher, "result BINARY")
        return [pickle.loads(row.result) for row in finish.collect()]

    def _write(
        self, output: Output, batch: int, sent: dict[str, int], finisher: Finisher | None
    ) -> list[TaskBatchResult]:
        """Write one output; the tasks' results if ``finisher`` finished them on the way."""
        if isinstance(output, SinkOutput):
            begin = getattr(output.sink, "begin", None)
            if begin is not None and self.batch_epoch is not None:
                begin(self.batch_epoch)
            if self._staged is None or not exactly_once(self.config):
                output.sink.write(output.df, batch)
                return []
            sink = output.sink
            assert isinstance(sink, StagingSink)  # _check_sinks_stage
            token = sink.stage(output.df, batch)
            if token:
                pickled: bytes = cloudpickle.dumps(sink)  # type: ignore[no-untyped-call]
                self._staged.sinks.append(StagedSink(pickled, repr(sink), token))
            return []
        writer = self._writer(output, batch, finisher)
        return self._collect(output.df.mapInArrow(writer, RESULT_SCHEMA), sent)

    def _write_fused(
        self,
        writes: _Writes,
        step: StepFrame,
        outputs: list[Output],
        batch: int,
        finisher: Finisher | None,
    ) -> Any:
        """The job that runs ``step`` and sends what it yields to the streams of the outputs
        fused with it, in one pass."""
        routes = []
        for i, (sender, route) in sorted(writes.fused.items()):
            output = outputs[i]
            if sender is step and isinstance(output, StreamOutput):
                routes.append((self._writer(output, batch, None), route))
        fused = FusedStep(step.udf, routes, arrow_schema(step.schema), finisher)
        projection = writes.projections.get(step.udf.name)
        if projection is None:
            return step.input.mapInArrow(fused, RESULT_SCHEMA)
        source = writes.source
        own_read = FusedRead(fused, source.read_schema, projection, arrow_schema(step.input.schema))
        return source.plans.mapInArrow(own_read, RESULT_SCHEMA)

    def _writer(
        self, output: StreamOutput, batch: int, finisher: Finisher | None
    ) -> StreamWriterUdf:
        config = self.config.to_dict()
        owner = self._owner if staged_stream(self.config, output.stream) else None
        staging = None if owner is None else (owner, batch)
        return StreamWriterUdf(config, output.stream, output.key, output.value, finisher, staging)

    def _collect(self, job: Any, sent: dict[str, int]) -> list[TaskBatchResult]:
        """Run a stream output's job; count what each task sent, note the parts it staged, and
        return the tasks' results that it carries (when it finished them)."""
        results = []
        for row in job.collect():
            sent[row.task] = sent.get(row.task, 0) + int(row.sent)
            if row.staged and self._staged is not None:
                self._staged.add_parts(json.loads(row.staged))
            if row.result is not None:
                results.append(pickle.loads(row.result))
        return results


class _Writes:
    """How a batch's outputs are written: which run fused with their step (and which of those
    read their own input), whether the last one also finishes the tasks, and whether the
    batch source stays cached (when more than one job reads it)."""

    def __init__(self, spark: Any, frame: Batch, source: BatchSource, outputs: list[Output]):
        self.source = source
        pairs = [(o.df, isinstance(o, StreamOutput)) for o in outputs]
        #: by output: the step it runs fused with, and the rows of the step it sends
        self.fused = fusable(spark, frame.frames, pairs)
        self.projections: dict[str, Any] = {}
        for step in {id(step): step for step, _ in self.fused.values()}.values():
            step.output.unpersist()  # its one job computes it
            projection = source_projection(spark, step.input, source.name)
            if projection is not None:
                self.projections[step.udf.name] = projection
        last = outputs[-1] if outputs else None
        tasks = len(frame.plans)
        self.folded = bool(outputs) and (
            len(outputs) - 1 in self.fused
            or (isinstance(last, StreamOutput) and on_task_partitions(last.df, tasks))
        )
        readers = int(not self.folded)  # the finish job reads the cached source
        for i, output in enumerate(outputs):
            fused = self.fused.get(i)
            if fused is None:
                readers += reads(output.df, source.name)
            elif fused[0].udf.name not in self.projections and i == self.last_of(fused[0]):
                readers += reads(fused[0].input, source.name)
        if readers < 2:
            frame.df.unpersist()  # one job reads the batch: nothing to share

    def last_of(self, step: StepFrame) -> int:
        """The last output fused with ``step``: its job runs there, sending them all."""
        return max(i for i, (s, _) in self.fused.items() if s is step)

    def describe(self) -> str:
        if not self.fused:
            return "none fused"
        own = sum(s.udf.name in self.projections for s, _ in self.fused.values())
        return f"{len(self.fused)} fused with their step, {own} of them reading their own input"


def _check_sinks_stage(outputs: Sequence[Output]) -> None:
    """Exactly-once: every sink must stage its batches (:class:`StagingSink`)."""
    for out in outputs:
        if isinstance(out, SinkOutput) and not isinstance(out.sink, StagingSink):
            what = "a function sink" if isinstance(out.sink, FunctionSink) else repr(out.sink)
            raise ConfigError(
                f"job.processing.guarantee=exactly-once, but {what} cannot stage its output "
                "(a sink needs stage, publish and discard: see StagingSink; ParquetSink has "
                "them): use such a sink, or run with job.processing.guarantee=at-least-once"
            )


def registry_value_schema(config: Config) -> str | None:
    """The columns of the inputs' values when they are read with the ``avro`` serde: their
    subject's latest schema as Spark columns (the inputs must agree); else ``None``."""
    from sparkpoint.serde.avro_types import value_columns
    from sparkpoint.serde.registry import RegistrySerde
    from sparkpoint.system.streams import stream_serdes

    found: dict[str, list[str]] = {}
    for stream in config.inputs:
        serde = stream_serdes(config, stream)[1]
        if isinstance(serde, RegistrySerde) and serde.name == "avro":
            found.setdefault(value_columns(serde.latest_schema()), []).append(str(stream))
    if len(found) > 1:
        raise ConfigError(
            "the inputs read with the avro serde have different schemas ("
            + "; ".join(f"{', '.join(streams)}: {cols}" for cols, streams in found.items())
            + "): give the pipeline a value_schema that fits them all"
        )
    return next(iter(found), None)

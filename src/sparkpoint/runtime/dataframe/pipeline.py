"""The DataFrame API: a job is a function from each micro-batch's DataFrame to its outputs.

::

    def build(batch: Batch) -> list[Output]:
        views = batch.df.select("task", "value.user", "value.page")
        counts = batch.stateful(views, count_views, "user STRING, count LONG",
                                stores=["user-counts"])
        return [batch.to_stream(counts, "filelog.user-counts", key="user"),
                batch.to_sink(views, ParquetSink("out/views"))]

    job = Pipeline(build, config="job.yaml", value_schema="user STRING, page STRING, ts LONG")

``sparkpoint run module:job`` runs it. Everything around the function is the runtime the
low-level task API uses: the same coordinator plans the batches, the same executor code
establishes and restores state, commits (sync snapshot, async upload), writes checkpoints and
applies startpoints (see :mod:`sparkpoint.runtime.dataframe.task` for how a task's batch is split
into phases). Per batch, :class:`DataFrameRunner`

1. builds ``batch.df``: one Spark partition per task (:mod:`sparkpoint.runtime.dataframe.source`);
2. calls the function, which may use any Spark SQL. :meth:`Batch.stateful` runs a function on
   the partition of each task with the task's stores (``mapInArrow`` or ``mapInPandas``); its
   input must still be partitioned by task (no shuffle before it), which is checked;
3. writes each output once, in order: a sparkpoint stream (at-least-once, partitioned by a key
   column exactly as the low-level collector does), or a :class:`Sink` given the batch id;
4. runs one Spark job over the cached batch in which every task commits when due and reports
   to the driver (the batch is cached so that every phase of a task runs where it was read).

Batch ids are durable (:mod:`sparkpoint.runtime.driver.batchlog`): after a crash the batches
after the last checkpoint are replayed with their old ids and input, so a sink that records the
ids it committed (:class:`ParquetSink`) never writes a batch twice.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pyspark import cloudpickle
from pyspark.sql import functions as F

from sparkpoint.config import Config, load_config
from sparkpoint.errors import BatchInterrupted, ConfigError, SparkpointError
from sparkpoint.fsutil import atomic_write, fsync_dir, fsync_tree
from sparkpoint.metadata.locality import Executor
from sparkpoint.model import SystemStream
from sparkpoint.refs import load_reference
from sparkpoint.runtime.dataframe.fusion import (
    StepFrame,
    fusable,
    reads,
    source_projection,
    source_token,
    step_token,
)
from sparkpoint.runtime.dataframe.joins import (
    JOIN_KINDS,
    PAIR_SCHEMA,
    TableJoinStep,
    WindowJoinStep,
)
from sparkpoint.runtime.dataframe.source import BatchSource, arrow_schema, batch_source
from sparkpoint.runtime.dataframe.task import StepCode, StepState, require_persistent_stores
from sparkpoint.runtime.dataframe.udfs import (
    RESULT_SCHEMA,
    Finisher,
    FusedRead,
    FusedStep,
    StepFunction,
    StepUdf,
    StreamWriterUdf,
    TimerFunction,
    partitioning_error,
)
from sparkpoint.runtime.dataframe.windows import SCHEMA as WINDOW_SCHEMA
from sparkpoint.runtime.dataframe.windows import WindowDef, WindowStep, window_defs
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
    staging_of,
)
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)


@runtime_checkable
class Sink(Protocol):
    """Where a DataFrame output goes; called once per batch with its durable id. A sink that
    also has ``begin(epoch)`` is told, before each batch it writes, the epoch of the job's
    batch log (when it began): batch ids start at 1 again after ``sparkpoint job reset``, so
    a sink that skips the ids it wrote must tell a new epoch's from the old ones
    (:class:`ParquetSink` refuses to write over an earlier epoch's batches)."""

    def write(self, df: Any, batch_id: int) -> None: ...


@runtime_checkable
class StagingSink(Sink, Protocol):
    """A sink that can give exactly-once output (``job.processing.guarantee: exactly-once``):
    :meth:`stage` writes a batch where no reader sees it and returns a token; once every task's
    checkpoint covers the batch, the driver calls :meth:`publish` with that token (also after a
    restart, on the sink unpickled from the batch log), or :meth:`discard` when the batch's
    output is not to be published. Both must be idempotent."""

    def stage(self, df: Any, batch_id: int) -> str: ...

    def publish(self, batch_id: int, token: str) -> None: ...

    def discard(self, batch_id: int, token: str) -> None: ...


class FunctionSink:
    """A sink made of a function ``fn(df, batch_id)``."""

    def __init__(self, fn: Callable[[Any, int], None]) -> None:
        self.fn = fn

    def write(self, df: Any, batch_id: int) -> None:
        self.fn(df, batch_id)


@dataclass(frozen=True)
class StreamOutput:
    """Rows sent to a sparkpoint stream: the message is the ``value`` column, or every column
    as a JSON-like dict; the partition comes from the ``key`` column (as in the task API)."""

    df: Any
    stream: SystemStream
    key: str | None = None
    value: str | None = None


@dataclass(frozen=True)
class SinkOutput:
    df: Any
    sink: Sink


Output = StreamOutput | SinkOutput


class ParquetSink:
    """Parquet files under ``path/batch_id=<id>/``; a batch id it has committed is skipped.

    Each batch overwrites its own directory (a retry of an unfinished batch replaces its
    partial files) and then records its id in ``path/_sparkpoint/last-batch``; reading ``path``
    with Spark gives every batch once, with a ``batch_id`` column. A relative ``path`` is
    relative to the module that creates the sink (the pipeline's, next to its job file), as a
    pipeline's job file is, not to the current directory.

    With exactly-once (a :class:`StagingSink`) a batch is written under
    ``path/_sparkpoint/staged/batch_id=<id>-<random>/`` (Spark's own commit protocol keeps only
    the files of the task attempts that succeeded), and renamed to ``path/batch_id=<id>`` when
    the batch's checkpoints are written: readers never see a batch whose state was not
    committed, and an executor lost mid-batch leaves nothing behind but a staged directory that
    the next publish deletes.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._epoch: int | None = None  # the batch log's (:meth:`begin`)
        if not self.path.is_absolute():
            creator = sys._getframe(1).f_globals.get("__file__")  # the module calling us
            base = Path(creator).resolve().parent if creator else Path.cwd()
            self.path = base / self.path

    @property
    def _commit_file(self) -> Path:
        return self.path / "_sparkpoint" / "last-batch"

    def last_committed(self) -> int | None:
        return self._last()[0]

    def _last(self) -> tuple[int | None, int | None]:
        """The last batch id recorded and its batch log's epoch (None: not recorded)."""
        try:
            data = json.loads(self._commit_file.read_text())
        except FileNotFoundError:
            return None, None
        epoch = data.get("epoch")
        return int(data["batch"]), None if epoch is None else int(epoch)

    def begin(self, epoch: int) -> None:
        """The job's batch log epoch for the batches to come (:class:`Sink`). Batches recorded
        under another epoch are an earlier run's (before a ``job reset``, ids from 1 again):
        skipped as written, the new run's output would be lost, so this refuses, naming the
        directory to move away."""
        last, recorded = self._last()
        if last is not None and recorded is not None and recorded != epoch:
            raise SparkpointError(
                f"parquet sink {self.path} holds batches up to {last} of another run of the "
                f"job (batch log epoch {recorded}; this run's is {epoch}: the job was reset, or "
                f"another job writes here), which this run's batches would be skipped as. Move "
                f"or delete {self.path}, or give the sink another path, and run again"
            )
        self._epoch = epoch

    def _written(self, batch_id: int) -> bool:
        last = self.last_committed()
        if last is not None and batch_id <= last:
            log.info("parquet sink %s: batch %d already written; skipped", self.path, batch_id)
            return True
        return False

    def _record(self, batch_id: int) -> None:
        self._commit_file.parent.mkdir(parents=True, exist_ok=True)
        record: dict[str, int] = {"batch": batch_id}
        epoch = getattr(self, "_epoch", None)  # (a sink pickled before begin() existed)
        if epoch is not None:
            record["epoch"] = epoch
        atomic_write(self._commit_file, json.dumps(record).encode())

    def write(self, df: Any, batch_id: int) -> None:
        if self._written(batch_id):
            return
        df.write.mode("overwrite").parquet(str(self.path / f"batch_id={batch_id}"))
        self._record(batch_id)

    @property
    def _staged(self) -> Path:
        return self.path / "_sparkpoint" / "staged"

    def stage(self, df: Any, batch_id: int) -> str:
        """Write batch ``batch_id`` where no reader looks; its token ('' if written already)."""
        if self._written(batch_id):
            return ""
        token = f"batch_id={batch_id}-{uuid.uuid4().hex[:8]}"
        df.write.parquet(str(self._staged / token))
        fsync_tree(self._staged / token)  # durable before the batch log names it
        return token

    def publish(self, batch_id: int, token: str) -> None:
        """Rename the staged batch into place and record it; then delete older staged dirs."""
        if token and not self._written(batch_id):
            staged, final = self._staged / token, self.path / f"batch_id={batch_id}"
            if staged.is_dir():
                if final.exists():  # the partial files of an at-least-once run's crashed write
                    shutil.rmtree(final)
                os.replace(staged, final)
                fsync_dir(self.path)
            elif not final.is_dir():
                raise SparkpointError(
                    f"parquet sink {self.path}: batch {batch_id}'s staged files ({staged}) are "
                    "gone and the batch is not in place: its output is lost; restore the "
                    "directory, or reset the job's checkpoints to replay that input"
                )
            self._record(batch_id)
        for old in self._staged.glob("batch_id=*"):  # never recorded, discarded, or skipped
            if _staged_batch(old.name) <= batch_id:
                shutil.rmtree(old, ignore_errors=True)

    def discard(self, batch_id: int, token: str) -> None:
        if token:
            shutil.rmtree(self._staged / token, ignore_errors=True)

    def __repr__(self) -> str:
        return f"ParquetSink({str(self.path)!r})"


def _staged_batch(name: str) -> int:
    """The batch id of a staged directory ``batch_id=<id>-<random>``."""
    try:
        return int(name.removeprefix("batch_id=").partition("-")[0])
    except ValueError:
        return -1


_SHUFFLE = re.compile(r"(?<!Broadcast)Exchange (\S+)|^\W*(Coalesce \d+)", re.MULTILINE)


def shuffle_in(df: Any) -> str | None:
    """The first operator of ``df``'s physical plan that moves rows between partitions."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    m = _SHUFFLE.search(plan)
    return None if m is None else (m.group(1) or m.group(2))


def _on_task_partitions(df: Any, tasks: int) -> bool:
    """Whether partition ``i`` of ``df`` is task ``i``'s (no shuffle, as many partitions)."""
    return shuffle_in(df) is None and bool(df.rdd.getNumPartitions() == tasks)


class Batch:
    """What a pipeline function gets for one micro-batch."""

    def __init__(
        self, spark: Any, df: Any, batch_id: int, plans: Sequence[TaskBatchPlan], config: Config
    ) -> None:
        self.spark = spark
        self.df = df
        self.id = batch_id
        self.config = config
        self._plans = list(plans)
        self._steps: dict[str, list[str]] = {}
        self._timers: str | None = None  # the step with on_timer
        self._frames: list[StepFrame] = []
        self._cached: list[Any] = []

    def input(self, stream: str) -> Any:
        """The batch's rows of one input stream (``stream`` or ``system.stream``): with an
        intermediate stream, what earlier batches re-keyed into it (``to_stream``), each row
        in the task of its partition, so :meth:`stateful` keeps state by the new key."""
        side = self.config.side_inputs  # they fill tables: never rows of the batch
        inputs = [s for s in self.config.inputs if s not in side]
        match = [s for s in inputs if stream in (str(s), s.stream)]
        if len(match) != 1:
            raise ConfigError(
                f"batch.input({stream!r}): "
                + ("not an input of the job" if not match else "inputs of two systems")
                + f"; inputs: {', '.join(str(s) for s in inputs)}"
            )
        if len({s.stream for s in inputs}) < len(inputs):
            raise ConfigError(
                f"batch.input({stream!r}): the job reads streams of one name from two systems; "
                "the batch's rows name the stream only"
            )
        return self.df.where(F.col("stream") == match[0].stream)

    def stateful(
        self,
        df: Any,
        fn: StepFunction,
        schema: str,
        *,
        stores: Sequence[str] | None = None,
        name: str | None = None,
        pandas: bool = False,
        on_timer: TimerFunction | None = None,
    ) -> Any:
        """``fn(state, chunks)`` on each task's partition of ``df``: ``chunks`` are Arrow
        record batches (pandas DataFrames with ``pandas=True``), ``state.store(name)`` the
        task's stores (``get_all``/``put_all`` take a whole column). Returns the DataFrame of
        what ``fn`` yields, with ``schema`` (DDL), computed once per batch.

        With ``on_timer``, the step has the task's timers (``state.timers``, kept in the store
        ``task.timers.store``, which becomes one of the step's stores): after ``fn``, the
        watermark advances and ``on_timer(state, expired)`` gets the due timers (columns
        ``key``, ``timestamp_ms``, ``kind``), yielding rows of ``schema`` like ``fn``. One step
        per pipeline has timers."""
        step = str(name or getattr(fn, "__name__", "step"))
        used = list(self.config.stores) if stores is None else list(stores)
        return self._step(df, step, used, StepCode(fn, on_timer, pandas), schema)

    def window(
        self,
        df: Any,
        *,
        key: str,
        windows: WindowDef | Sequence[WindowDef],
        time: str | None = "event_time",
        value: str | None = None,
        value_type: str = "LONG",
        name: str | None = None,
    ) -> Any:
        """Keyed windows of ``df``'s rows: ``windows`` is ``tumbling_window(store,
        size_ms=...)``, ``hopping_window(...)``, ``session_window(store, gap_ms=...)`` or a
        list of them, each kept in its window store exactly as the task API's
        ``context.windows`` keeps it (a job can move between the APIs). Rows go into the
        windows of their ``key`` column at the times of the ``time`` column (event time;
        ``None``: processing time), folding the ``value`` column with each window's aggregate
        (default: count). Returns the windows that went out in this batch: ``store STRING,
        key STRING, window_start LONG, window_end LONG, value <value_type>, emission STRING``
        (a session's start and end are its first and last row's times; ``emission``:
        ``on_time``, or ``early``/``late`` with a window's ``early=``/``allowed_lateness_ms=``
        triggers). Rows for windows that closed already are late: they change nothing, and
        go to the window's ``late_stream`` when it has one. The step has the pipeline's
        timers (``task.timers.store``)."""
        defs = window_defs(windows)
        for d in defs:
            self._refuse_staged_late("batch.window", d.late_stream)
        for column in (key, time, value):
            if column is not None and column not in df.columns:
                raise ConfigError(
                    f"batch.window: no column {column!r}; columns: {', '.join(df.columns)}"
                )
        step = name or "window"
        code = WindowStep(defs, key, time, value).code()
        columns = [c for c in dict.fromkeys(["task", key, time, value]) if c is not None]
        schema = WINDOW_SCHEMA.format(value_type=value_type)
        return self._step(df.select(*columns), step, [d.store for d in defs], code, schema)

    def _refuse_staged_late(self, what: str, late_stream: str | None) -> None:
        """A step sends its late rows as it finds them, not staged with the batch's output:
        refused where the stream's output must be staged (exactly-once, an intermediate
        stream), as a replayed batch would send them again."""
        if late_stream is None or not staged_stream(self.config, SystemStream.parse(late_stream)):
            return
        raise ConfigError(
            f"{what}: late_stream {late_stream} must be staged with the batch (job.processing."
            f"guarantee=exactly-once, or an intermediate stream), and a DataFrame step sends "
            f"its late rows as it finds them, so a replayed batch would send them twice. Drop "
            f"late_stream (late rows are then dropped), or run this step as a task "
            f"(context.windows stages them)"
        )

    def join_window(
        self,
        df: Any,
        *,
        key: str,
        within_ms: int,
        left: str,
        right: str,
        left_store: str,
        right_store: str,
        side: str = "stream",
        time: str = "event_time",
        value: str | None = None,
        late_stream: str | None = None,
        name: str | None = None,
    ) -> Any:
        """A windowed stream-stream join of ``df``'s rows: those whose ``side`` column is
        ``left`` (e.g. a stream's name in ``batch.df``'s ``stream`` column) with those whose
        ``side`` is ``right``, by the ``key`` column, when their ``time`` columns (event time)
        are at most ``within_ms`` apart. Each side is buffered in its store exactly as the task
        API's ``context.windows.join`` buffers it (a job can move between the APIs). Returns
        each matching pair once, in the batch its second row arrives: ``key STRING, left_time
        LONG, left <value's type>, right_time LONG, right <value's type>`` (``value``: the
        column joined; none: null strings). A row behind the watermark is late: not joined,
        and sent to ``late_stream`` when there is one. The step has the pipeline's timers
        (``task.timers.store``)."""
        self._refuse_staged_late("batch.join_window", late_stream)
        for column in (side, key, time, value):
            if column is not None and column not in df.columns:
                raise ConfigError(
                    f"batch.join_window: no column {column!r}; columns: {', '.join(df.columns)}"
                )
        value_ddl = "STRING" if value is None else df.schema[value].dataType.simpleString()
        schema = PAIR_SCHEMA.format(t=value_ddl)
        value_type = arrow_schema(schema).field("left").type
        stores = (left_store, right_store)
        columns = (side, key, time, value)
        code = WindowJoinStep(
            stores, (left, right), columns, within_ms, value_type, late_stream
        ).code()
        selected = [c for c in dict.fromkeys(["task", side, key, time, value]) if c is not None]
        return self._step(df.select(*selected), name or "join", list(stores), code, schema)

    def join_table(
        self,
        df: Any,
        table: str,
        *,
        key: str,
        value_schema: str | None = None,
        how: str = "left",
        column: str | None = None,
        name: str | None = None,
    ) -> Any:
        """``df``'s rows joined with the table ``table`` (a store with
        ``stores.<table>.side.inputs``, filled from its compacted stream before the batch's
        rows are read; :mod:`sparkpoint.storage.tables`) on the ``key`` column: ``df``'s
        columns and ``column`` (default: the table's name), the table's value for the row's
        key, a struct of ``value_schema`` (DDL) or else the value as JSON text. ``how="left"``
        keeps a row whose key the table lacks (with a null), ``"inner"`` drops it. The task
        API does the same with ``context.get_store(table).get(key)``."""
        if table not in self.config.side_inputs.values():
            raise ConfigError(
                f"batch.join_table: store {table!r} is not a table: set "
                f"stores.{table}.side.inputs to the compacted stream that fills it"
            )
        if how not in JOIN_KINDS:
            raise ConfigError(f"batch.join_table: how={how!r}; use one of {', '.join(JOIN_KINDS)}")
        if key not in df.columns:
            raise ConfigError(
                f"batch.join_table: no column {key!r}; columns: {', '.join(df.columns)}"
            )
        into = column or re.sub(r"\W", "_", table)
        if into in df.columns:
            raise ConfigError(
                f"batch.join_table: the input has a column {into!r} already; pass column=..."
            )
        value_ddl = f"STRUCT<{value_schema}>" if value_schema else "STRING"
        fields = [f"`{f.name}` {f.dataType.simpleString()}" for f in df.schema.fields]
        schema = ", ".join([*fields, f"`{into}` {value_ddl}"])
        value_type = arrow_schema(schema).field(into).type if value_schema else None
        code = TableJoinStep(table, key, into, how, value_type).code()
        return self._step(df, name or f"join-{table}", [table], code, schema)

    def _step(self, df: Any, step: str, used: list[str], code: StepCode, schema: str) -> Any:
        if code.on_timer is not None:
            timer_store = self.config.get_str("task.timers.store")
            if not timer_store:
                raise ConfigError(
                    f"stateful step {step!r}: on_timer needs a store to keep the timers in: set "
                    "task.timers.store to one of the job's stores (stores.<name>.factory="
                    "rocksdb, with a changelog or a blob store backup)"
                )
            if timer_store not in used:
                used.append(timer_store)
            if self._timers is not None:
                raise ConfigError(
                    f"stateful steps {self._timers!r} and {step!r} both have timers (on_timer, "
                    "or a window); a pipeline's timers belong to one step"
                )
        for store in used:
            if store not in self.config.stores:
                raise ConfigError(
                    f"stateful step {step!r}: no store {store!r} (configure "
                    f"stores.{store}.factory); stores: {', '.join(self.config.stores) or 'none'}"
                )
        if step in self._steps:
            raise ConfigError(f"two stateful steps are named {step!r}: give one name=...")
        for other, theirs in self._steps.items():
            shared = sorted(set(theirs) & set(used))
            if shared:
                raise ConfigError(
                    f"stateful steps {other!r} and {step!r} both use store {shared[0]!r}; a "
                    "store belongs to one step per pipeline (pass stores=[...] to each step)"
                )
        if "task" not in df.columns:
            raise partitioning_error(step, "its input has no 'task' column")
        moved = shuffle_in(df)
        if moved is not None:
            raise partitioning_error(step, f"its input was shuffled ({moved})")
        self._steps[step] = used
        if code.on_timer is not None:
            self._timers = step
        function = StepUdf(self._plans, step, used, code, step_token(step, self.id))
        pandas = code.pandas
        out = df.mapInPandas(function, schema) if pandas else df.mapInArrow(function, schema)
        from pyspark import StorageLevel

        # cached, so that every reader gets the step's one computation; a step whose only
        # reader is a stream output runs fused with it instead (sparkpoint.runtime.dataframe.fusion)
        out = out.persist(StorageLevel.MEMORY_AND_DISK)
        self._cached.append(out)
        self._frames.append(StepFrame(function, df, out, schema))
        return out

    def to_stream(
        self, df: Any, stream: str, *, key: str | None = None, value: str | None = None
    ) -> StreamOutput:
        """Send ``df`` to ``system.stream``; partitioned by the ``key`` column."""
        target = SystemStream.parse(stream)
        if target.system not in self.config.systems:
            raise ConfigError(
                f"output stream {stream!r}: no system {target.system!r} (configure "
                f"systems.{target.system}.factory); systems: {', '.join(self.config.systems)}"
            )
        for column in (key, value):
            if column is not None and column not in df.columns:
                raise ConfigError(
                    f"output stream {stream!r}: no column {column!r}; columns: "
                    f"{', '.join(df.columns)}"
                )
        if staged_stream(self.config, target):  # refused here, before any Spark job
            staging_of(Systems(self.config), target.system)
        return StreamOutput(df, target, key, value)

    def to_sink(self, df: Any, sink: Sink | Callable[[Any, int], None]) -> SinkOutput:
        """Write ``df`` with ``sink.write(df, batch_id)``, or call ``sink(df, batch_id)`` (as
        with Spark's ``foreachBatch``); the id is durable, so a sink can skip ids it wrote."""
        if isinstance(sink, Sink):
            return SinkOutput(df, sink)
        if callable(sink):
            return SinkOutput(df, FunctionSink(sink))
        raise ConfigError(f"a sink has write(df, batch_id) or is a function; got {sink!r}")

    def release(self) -> None:
        for df in self._cached:
            df.unpersist()
        self._cached.clear()


PipelineFunction = Callable[[Batch], "Output | Iterable[Output]"]


@dataclass
class Pipeline:
    """A DataFrame job: ``build`` maps each batch to outputs; ``config`` is a job file (a
    relative path is relative to the module that creates the pipeline, like task modules next
    to a job file) or the config values themselves; ``value_schema`` decodes JSON input values
    into a struct."""

    build: PipelineFunction
    config: str | Path | Mapping[str, str]
    value_schema: str | None = None
    value_type: str = "STRING"
    overrides: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.config, (str, Path)) and not Path(self.config).is_absolute():
            creator = sys._getframe(2).f_globals.get("__file__")  # the module calling Pipeline()
            base = Path(creator).resolve().parent if creator else Path.cwd()
            self.config = base / self.config

    def load_config(self, overrides: Mapping[str, str] | None = None) -> Config:
        extra = {**self.overrides, **(overrides or {})}
        if isinstance(self.config, Mapping):
            return load_config(None, extra, base=self.config)
        return load_config(self.config, extra)


def load_pipeline(spec: str) -> tuple[Pipeline, Path]:
    """Import ``module:attr`` (the current directory is on the path); the pipeline and the
    directory its module lives in (which Python workers need on their path)."""
    module_name, _, attr = spec.partition(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    obj = load_reference(f"{module_name}:{attr or 'job'}", spec)
    module = sys.modules[module_name]
    if not isinstance(obj, Pipeline):
        kind = f"the class {obj.__name__}" if isinstance(obj, type) else type(obj).__name__
        raise ConfigError(
            f"{spec} is {kind}, not a sparkpoint Pipeline (a task class runs from a job file: "
            "task.class=module:Class, then sparkpoint run job.yaml)"
        )
    return obj, Path(module.__file__ or ".").resolve().parent


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
        self.steps: list[str] | None = None  # the stateful steps of the first batch
        self.spark = spark
        self.pipeline = pipeline
        self.config = config
        #: the job's batch log epoch, set by the driver once the log is open (sinks: begin)
        self.batch_epoch: int | None = None
        #: exactly-once: what the last batch staged, for the driver to record in its batch log
        self._staged: BatchOutputs | None = None
        self._owner = batch_owner(config) if stages_output(config) else None

    def begin_epoch(self, epoch: int) -> None:
        """The batch log's epoch, passed on to every sink before it writes (:meth:`Sink.begin`)."""
        self.batch_epoch = epoch

    @property
    def staged(self) -> BatchOutputs | None:
        return self._staged

    def executors(self) -> list[Executor] | None:
        """The live executors on a cluster (host affinity); ``None`` in local mode."""
        return cluster_executors(self.spark.sparkContext)

    def catch_up(self, plans: list[StandbyPlan]) -> list[StandbyResult]:
        """Catch the standby copies up, as the task API's runner does."""
        return catch_up_standbys(self.spark.sparkContext, plans)

    def __call__(self, batch: int, plans: list[TaskBatchPlan]) -> list[TaskBatchResult]:
        from pyspark import StorageLevel

        self._staged = None if self._owner is None else BatchOutputs()
        group = batch_job_group(self.spark.sparkContext, batch)
        source = batch_source(
            self.spark,
            plans,
            value_schema=self.pipeline.value_schema,
            value_type=self.pipeline.value_type,
            name=source_token(batch),
        )
        cached = source.df.persist(StorageLevel.MEMORY_AND_DISK)
        frame = Batch(self.spark, cached, batch, plans, self.config)
        frame._cached.append(cached)
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
                outputs = _outputs(self.pipeline.build(frame))
                if exactly_once(self.config):
                    _check_sinks_stage(outputs)
                steps = sorted(frame._steps)
                if self.steps is not None and steps != self.steps:
                    raise ConfigError(
                        f"batch {batch}: the pipeline's stateful steps changed from "
                        f"{self.steps} to {steps}; build the same steps for every batch (a step "
                        "may get no rows, but it must be there), or state would miss messages"
                    )
                self.steps = steps
                timer_store = self.config.get_str("task.timers.store")
                if timer_store and frame._timers is None:
                    raise ConfigError(
                        f"task.timers.store={timer_store!r} is set, but no stateful step has "
                        "on_timer=...: give the step that registers timers an on_timer (or unset "
                        "task.timers.store), or the watermark never advances"
                    )
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
        by_task = {r.task: r for r in results}
        for task, n in sent.items():
            target = by_task.get(task) or (results[0] if results else None)
            if target is not None:
                target.sent += n
        return results

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
        self.fused = fusable(spark, frame._frames, pairs)
        self.projections: dict[str, Any] = {}
        for step in {id(step): step for step, _ in self.fused.values()}.values():
            step.output.unpersist()  # its one job computes it
            projection = source_projection(spark, step.input, source.name)
            if projection is not None:
                self.projections[step.udf.name] = projection
        last = outputs[-1] if outputs else None
        tasks = len(frame._plans)
        self.folded = bool(outputs) and (
            len(outputs) - 1 in self.fused
            or (isinstance(last, StreamOutput) and _on_task_partitions(last.df, tasks))
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


__all__ = [
    "Batch",
    "DataFrameRunner",
    "FunctionSink",
    "Output",
    "ParquetSink",
    "Pipeline",
    "Sink",
    "SinkOutput",
    "StagingSink",
    "StepState",
    "StreamOutput",
    "load_pipeline",
]

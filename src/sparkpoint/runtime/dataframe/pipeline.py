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

import logging
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError
from sparkpoint.model import SystemStream
from sparkpoint.refs import load_reference
from sparkpoint.runtime.dataframe.fusion import (
    StepFrame,
    step_token,
)
from sparkpoint.runtime.dataframe.joins import (
    JOIN_KINDS,
    PAIR_SCHEMA,
    TableJoinStep,
    WindowJoinStep,
)
from sparkpoint.runtime.dataframe.sinks import FunctionSink, Sink
from sparkpoint.runtime.dataframe.source import arrow_schema
from sparkpoint.runtime.dataframe.task import StepCode
from sparkpoint.runtime.dataframe.udfs import (
    StepFunction,
    StepUdf,
    TimerFunction,
    partitioning_error,
)
from sparkpoint.runtime.dataframe.windows import SCHEMA as WINDOW_SCHEMA
from sparkpoint.runtime.dataframe.windows import WindowDef, WindowStep, window_defs
from sparkpoint.runtime.plan import (
    TaskBatchPlan,
)
from sparkpoint.storage.outputs import (
    staged_stream,
    staging_of,
)
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)


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


_SHUFFLE = re.compile(r"(?<!Broadcast)Exchange (\S+)|^\W*(Coalesce \d+)", re.MULTILINE)


def shuffle_in(df: Any) -> str | None:
    """The first operator of ``df``'s physical plan that moves rows between partitions."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    m = _SHUFFLE.search(plan)
    return None if m is None else (m.group(1) or m.group(2))


def on_task_partitions(df: Any, tasks: int) -> bool:
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

    # what the runner reads of the batch once the pipeline built it
    @property
    def plans(self) -> list[TaskBatchPlan]:
        """The tasks' plans of this batch, one per task."""
        return list(self._plans)

    @property
    def step_names(self) -> list[str]:
        """The stateful steps the pipeline built, sorted."""
        return sorted(self._steps)

    @property
    def timer_step(self) -> str | None:
        """The stateful step with ``on_timer``, if any."""
        return self._timers

    @property
    def frames(self) -> list[StepFrame]:
        """Each stateful step's frames (what output fusion looks at)."""
        return list(self._frames)

    def table(self, name: str) -> Any:
        """The global table ``tables.<name>`` as a Spark DataFrame, at the version this batch
        sees (a replayed batch: the one it first saw). Join it with ``F.broadcast(...)``: every
        row of it meets every task's rows, with no co-partitioning."""
        from sparkpoint.system.tables.global_tables import snapshot_path

        versions = self._plans[0].global_tables if self._plans else {}
        if name not in versions:
            known = ", ".join(sorted(versions)) or "none"
            raise ConfigError(
                f"batch.table({name!r}): no global table {name!r} (configure "
                f"tables.{name}.source); global tables: {known}"
            )
        return self.spark.read.parquet(str(snapshot_path(self.config, name, versions[name])))

    def keep_cached(self, df: Any) -> None:
        """Unpersist ``df`` when the batch is released."""
        self._cached.append(df)

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

    def _check_timers(self, step: str, used: list[str]) -> None:
        """A step with ``on_timer``: the timer store is configured and becomes one of the
        step's stores; one step per pipeline has timers."""
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

    def _check_stores(self, step: str, used: list[str]) -> None:
        """Every store the step uses is configured and is the step's alone; its name is new."""
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

    def _step(self, df: Any, step: str, used: list[str], code: StepCode, schema: str) -> Any:
        if code.on_timer is not None:
            self._check_timers(step, used)
        self._check_stores(step, used)
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

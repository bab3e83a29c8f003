"""Run a job in a test: :class:`JobTestDriver` (Samza's TestRunner, Kafka Streams'
TopologyTestDriver).

A task class runs in this process with the runtime's exact semantics: the same batches,
commits, checkpoints, restores and startpoints as on Spark, one task after another. A DataFrame
:class:`~sparkpoint.Pipeline` runs on a local Spark session (yours, or one the driver starts).
Every system of the job becomes the embedded filelog under the driver's own directory, so a
job written for Kafka tests with no broker::

    from sparkpoint.testing import JobTestDriver, Message

    def test_counts(tmp_path):
        with JobTestDriver("job.yaml", tmp_path) as job:
            job.send("pageviews", [{"user": "a"}, {"user": "b"}, Message({"user": "a"}, key="a")])
            job.run()
            assert job.store("user-counts") == {"a": 2, "b": 1}
            assert [m.value["count"] for m in job.output("user-counts")] == [1, 1, 2]

``run()`` processes everything sent so far and commits; ``run(commit=False)`` processes one
batch without committing, and ``restart()`` then starts over from the last commit, as a crashed
job would (``lose_local_state=True``: on a new host, restoring from the state backends).

Processing time is the driver's own clock (``clock_ms``, the wall clock when the driver was
made): it stands still until :meth:`JobTestDriver.advance_time` moves it, so timers and store
TTLs are tested in milliseconds, without sleeping; a DataFrame pipeline's steps, in Spark's
workers, get it with each batch's plan.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkpoint.config import Config, load_config
from sparkpoint.errors import UserError
from sparkpoint.model import SystemStream
from sparkpoint.model.clock import use_clock, wall_ms
from sparkpoint.runtime.api.task import StreamTask
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.runtime.driver.reports import RunSummary
from sparkpoint.runtime.runner import BatchRunner
from sparkpoint.storage import task_storage
from sparkpoint.storage.kv import ttl
from sparkpoint.storage.kv.store import store_serdes
from sparkpoint.system.registry import Systems
from sparkpoint.tools.state import committed_entries
from sparkpoint.tools.streams import Message, read_json_lines, resolve_stream, send_messages

if TYPE_CHECKING:
    from sparkpoint.runtime.dataframe.pipeline import Pipeline

__all__ = ["JobTestDriver", "Message", "OutputMessage"]

#: the module task classes given as objects are registered in (``task.class`` names a module)
_TASKS = types.ModuleType("sparkpoint_test_tasks")
sys.modules[_TASKS.__name__] = _TASKS


@dataclass(frozen=True)
class OutputMessage:
    """A message a job wrote, decoded by the stream's serdes."""

    value: Any
    key: Any
    partition: int
    offset: str
    timestamp: int


class JobTestDriver:
    """A job, its inputs and its outputs in a temporary directory (or ``directory``).

    ``job`` is a job file, a dict of config values, or a :class:`~sparkpoint.Pipeline`;
    ``task`` a :class:`~sparkpoint.StreamTask` class to run instead of the config's
    ``task.class`` (a class defined in a test works); ``config`` overrides any key.
    """

    def __init__(
        self,
        job: str | Path | Mapping[str, str] | Pipeline,
        directory: str | Path | None = None,
        *,
        task: type[StreamTask] | None = None,
        config: Mapping[str, str] | None = None,
        spark: Any = None,
        clock_ms: int | None = None,
    ) -> None:
        from sparkpoint.runtime.dataframe.pipeline import Pipeline
        from sparkpoint.runtime.driver.job_path import with_dir_on_path

        self._owned = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="sparkpoint-test-"))
        self.pipeline = job if isinstance(job, Pipeline) else None
        overrides = {"job.data.dir": str(self.directory / "data"), **(config or {})}
        if task is not None:
            overrides["task.class"] = _register(task)
        base = self._load(job, overrides)
        self.config = load_config(None, {**_on_filelog(base), **overrides})
        if isinstance(job, (str, Path)) and task is None:
            # the job's modules are importable as `sparkpoint run` makes them, from any cwd
            self.config = with_dir_on_path(self.config, Path(job).resolve().parent)
        if not self.config.inputs:
            raise UserError("the job has no task.inputs: list its input streams")
        self._spark = spark
        self._own_spark = False
        self._coordinator: JobCoordinator | None = None
        #: the processing time the job sees (ms since the epoch); :meth:`advance_time` moves it
        self.clock_ms = wall_ms() if clock_ms is None else clock_ms

    def advance_time(self, ms: int) -> None:
        """Move processing time forward by ``ms``: timers due by then fire in the next
        :meth:`run`, and store entries older than their TTL are gone."""
        if ms < 0:
            raise UserError(f"advance_time({ms}): processing time never goes back")
        self.clock_ms += ms

    @staticmethod
    def _load(job: Any, overrides: Mapping[str, str]) -> Config:
        from sparkpoint.runtime.dataframe.pipeline import Pipeline

        if isinstance(job, Pipeline):
            return job.load_config(overrides)
        if isinstance(job, Mapping):
            return load_config(None, overrides, base=job)
        return load_config(job, overrides)

    # -- input and running

    def send(self, stream: str, messages: Iterable[Any], *, partition: int | None = None) -> int:
        """Append ``messages`` to ``stream`` (``name`` or ``system.name``): each a value, or a
        :class:`Message` with a key, partition and timestamp. Without a partition a message
        goes where its key hashes (keyless: partition 0, or ``partition``)."""
        items = (m if isinstance(m, Message) else Message(m, partition=partition) for m in messages)
        systems = Systems(self.config)
        try:
            ss = resolve_stream(self.config, stream)
            return send_messages(self.config, systems, ss, items)
        finally:
            systems.close()

    def run(self, *, commit: bool = True, final_watermark: bool = False) -> RunSummary:
        """Process everything sent so far and commit every task; with ``commit=False``, one
        batch up to what was sent, processed but not committed (then :meth:`restart`). With
        ``final_watermark`` the input ends there (``sparkpoint run --final-watermark``): every
        event-time timer fires before the commit."""
        with use_clock(lambda: self.clock_ms):
            coordinator = self._started()
            if commit:
                try:  # a run ends the driver (it commits and releases the job): the next
                    # (run() starts a new one)
                    return coordinator.run(until_caught_up=True, final_watermark=final_watermark)
                finally:
                    self._stop()
            end = {
                s: m.upcoming
                for s, m in coordinator.partition_metadata(coordinator.all_ssps()).items()
            }
            report, _ = coordinator.run_batch(end, commit=False)
            return RunSummary(batches=1, processed=report.processed)

    def restart(self, *, lose_local_state: bool = False) -> None:
        """Stop the job as a crash would (nothing more is committed); the next :meth:`run`
        starts from the last commit. ``lose_local_state``: the stores' local files are gone
        too, so the restart restores them from the state backends."""
        self._stop()
        for key in [k for k in task_storage._MEMORY if k[1] in self.config.stores]:
            del task_storage._MEMORY[key]  # an in-memory store dies with its worker
        if lose_local_state:
            shutil.rmtree(self.config.store_base_dir, ignore_errors=True)

    def _stop(self) -> None:
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator = None

    def _started(self) -> JobCoordinator:
        if self._coordinator is None:
            coordinator = JobCoordinator(self.config, self._runner())
            try:
                coordinator.start()
            except BaseException:  # refused: the next call starts a new one
                coordinator.close()
                raise
            self._coordinator = coordinator
        return self._coordinator

    def _runner(self) -> BatchRunner:
        if self.pipeline is None:
            return InlineRunner()
        from sparkpoint.runtime.dataframe.runner import DataFrameRunner
        from sparkpoint.runtime.spark.session import spark_session

        if self._spark is None:
            self._spark = spark_session(self.config, "local[2]")
            self._own_spark = True
        return DataFrameRunner(self._spark, self.pipeline, self.config)

    # -- results

    def store(self, name: str) -> dict[Any, Any]:
        """A store's contents as of the last commit, over every task, decoded by its serdes
        (after :meth:`run`, which commits, that is the live state)."""
        with use_clock(lambda: self.clock_ms):
            if self.config.get_str(f"stores.{name}.factory") != "in-memory":
                return {key: value for _task, key, value in committed_entries(self.config, name)}
            key_serde, msg_serde = store_serdes(self.config, name)
            out: dict[Any, Any] = {}
            for (_task, store), (_state, engine) in task_storage._MEMORY.items():
                if store == name:
                    view = ttl.readable(engine, ttl.ttl_of(self.config, name))
                    out.update(
                        (key_serde.from_bytes(k), msg_serde.from_bytes(v)) for k, v in view.all()
                    )
            return out

    def output(self, stream: str) -> list[OutputMessage]:
        """Every message on ``stream``, in partition then offset order."""
        systems = Systems(self.config)
        try:
            ss: SystemStream = resolve_stream(self.config, stream)
            if ss.stream not in systems.admin(ss.system).list_streams():
                return []
            return [
                OutputMessage(r["value"], r["key"], r["partition"], r["offset"], r["timestamp"])
                for r in read_json_lines(self.config, systems, ss)
            ]
        finally:
            systems.close()

    # -- clean-up

    def close(self) -> None:
        """Stop the job (without a commit) and remove the driver's own directory."""
        self.restart()
        if self._own_spark and self._spark is not None:
            self._spark.stop()
            self._spark = None
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> JobTestDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _register(task: type[StreamTask]) -> str:
    """``task.class`` for a class object: registered in a module of its own (tasks run in
    this process, so a class defined inside a test function works too)."""
    if not (isinstance(task, type) and issubclass(task, StreamTask)):
        raise UserError(f"task={task!r} is not a subclass of sparkpoint StreamTask")
    name = f"{task.__qualname__.replace('.', '_').replace('<', '_').replace('>', '_')}_{id(task)}"
    setattr(_TASKS, name, task)
    return f"{_TASKS.__name__}:{name}"


def _on_filelog(config: Config) -> dict[str, str]:
    """The config with every system replaced by the embedded filelog (its stream settings
    kept): a test needs no broker."""
    values = config.to_dict()
    for system in config.systems:
        prefix = f"systems.{system}."
        for key in [k for k in values if k.startswith(prefix)]:
            if not key.startswith(f"{prefix}default.stream."):  # partitions, samza.* stay
                del values[key]
        values[f"{prefix}factory"] = "filelog"
    return values

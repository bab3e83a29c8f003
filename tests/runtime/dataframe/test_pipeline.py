"""The DataFrame API on the shared runtime: same state and output as the task API."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pageviews_pipeline import count_views
from pageviews_pipeline import job as example_pipeline

from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError, TaskError
from sparkpoint.model import SystemStream
from sparkpoint.runtime.dataframe.pipeline import Batch, Output, Pipeline
from sparkpoint.runtime.dataframe.runner import DataFrameRunner
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.streams import read_json_lines
from tests.conftest import pageviews_config
from tests.helpers import (
    assert_committed_state_matches_its_offsets,
    committed_counts,
    generate,
    run_until_caught_up,
)


def _run(config: Config, runner: Any) -> None:
    run_until_caught_up(JobCoordinator(config, runner))


def _output(config: Config) -> Counter[tuple[str, str, int]]:
    rows = read_json_lines(config, Systems(config), SystemStream("filelog", "user-counts"))
    return Counter((str(r["key"]), r["value"]["user"], int(r["value"]["count"])) for r in rows)


def _counts_only(batch: Batch) -> Output:
    """The example's counts alone: its one stream output also finishes the batch's tasks."""
    views = batch.df.select("task", "value.user")
    counts = batch.stateful(views, count_views, "user STRING, count LONG")
    return batch.to_stream(counts, "filelog.user-counts", key="user")


def test_dataframe_example_equals_the_task_example(tmp_path: Path, spark: Any) -> None:
    outputs = {}
    states = {}
    stream_only = Pipeline(_counts_only, example_pipeline.config, example_pipeline.value_schema)
    pipelines = {"frame": example_pipeline, "stream-only": stream_only, "small-reads": stream_only}
    for name in ("task", "frame", "stream-only", "small-reads"):
        overrides = {"task.batch.max.messages": "700", "task.commit.ms": "0"}
        if name == "small-reads":  # about 20 views a read: a task reads its batch in chunks
            overrides["systems.filelog.read.max.bytes"] = "2000"
        values = pageviews_config(tmp_path / name, **overrides)
        config = load_config(None, values)
        Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
        expected = generate(config, tmp_path / name / "job.yaml", 3000, seed=5, users=40)
        runner = (
            InlineRunner() if name == "task" else DataFrameRunner(spark, pipelines[name], config)
        )
        _run(config, runner)
        states[name] = committed_counts(config)
        assert states[name] == dict(expected)
        assert_committed_state_matches_its_offsets(config)
        outputs[name] = _output(config)
    assert states["task"] == states["frame"] == states["stream-only"] == states["small-reads"]
    assert outputs["task"] == outputs["frame"] == outputs["stream-only"] == outputs["small-reads"]
    assert sum(outputs["frame"].values()) == 3000
    enriched = spark.read.parquet(str(tmp_path / "frame" / "data" / "enriched-views"))
    assert enriched.count() == 3000
    assert enriched.filter("page = '/docs'").select("title").distinct().collect()[0][0] == (
        "Documentation"
    )
    assert enriched.filter("page = '/careers'").select("title").distinct().collect()[0][0] is None


def _passthrough(state: Any, chunks: Any) -> Any:
    state.store("user-counts")
    yield from chunks


def _small_job(tmp_path: Path, **overrides: str) -> Config:
    config = load_config(None, pageviews_config(tmp_path, **overrides))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(config, tmp_path / "job.yaml", 200, seed=9, users=10)
    return config


def _run_pipeline(spark: Any, config: Config, build: Any) -> None:
    pipeline = Pipeline(build, config=config.to_dict(), value_schema="user STRING")
    _run(config, DataFrameRunner(spark, pipeline, config))


def test_stateful_step_after_repartition_fails_saying_how_to_fix_it(
    tmp_path: Path, spark: Any
) -> None:
    def build(batch: Batch) -> Output:
        shuffled = batch.df.select("task", "value.user").repartition(3)
        out = batch.stateful(shuffled, _passthrough, "task STRING, user STRING")
        return batch.to_stream(out, "filelog.copy", key="user")

    with pytest.raises(ConfigError) as err:
        _run_pipeline(spark, _small_job(tmp_path), build)
    message = str(err.value)
    assert "stateful step '_passthrough' needs its input partitioned by task" in message
    assert "RoundRobinPartitioning" in message
    assert "before any repartition()" in message


def test_partitioning_is_also_checked_where_the_plan_does_not_show_it(
    tmp_path: Path, spark: Any
) -> None:
    def build(batch: Batch) -> Output:
        doubled = batch.df.union(batch.df).select("task", "value.user")
        out = batch.stateful(doubled, _passthrough, "task STRING, user STRING")
        return batch.to_stream(out, "filelog.copy", key="user")

    with pytest.raises(ConfigError, match="more partitions than the job's 4 tasks"):
        _run_pipeline(spark, _small_job(tmp_path), build)


def test_store_misuse_is_reported_before_anything_runs(tmp_path: Path, spark: Any) -> None:
    def two_steps(batch: Batch) -> Output:
        views = batch.df.select("task", "value.user")
        batch.stateful(views, _passthrough, "task STRING, user STRING", name="a")
        out = batch.stateful(views, _passthrough, "task STRING, user STRING", name="b")
        return batch.to_stream(out, "filelog.copy", key="user")

    with pytest.raises(ConfigError, match="steps 'a' and 'b' both use store 'user-counts'"):
        _run_pipeline(spark, _small_job(tmp_path / "a"), two_steps)

    def no_task(batch: Batch) -> Output:
        out = batch.stateful(batch.df.select("key"), _passthrough, "key STRING")
        return batch.to_stream(out, "filelog.copy")

    with pytest.raises(ConfigError, match="its input has no 'task' column"):
        _run_pipeline(spark, _small_job(tmp_path / "b"), no_task)

    memory = _small_job(tmp_path / "c", **{"stores.user-counts.factory": "in-memory"})
    with pytest.raises(ConfigError, match="DataFrame pipelines need persistent stores"):
        _run_pipeline(spark, memory, no_task)


def _count_with_pandas(state: Any, frames: Any) -> Any:
    counts = state.store("user-counts")
    for frame in frames:
        per_user = frame.groupby("user", sort=False).size()
        users = [str(u) for u in per_user.index]
        new = [(c or 0) + int(n) for c, n in zip(counts.get_all(users), per_user, strict=True)]
        counts.put_all(zip(users, new, strict=True))
        yield frame.assign(n=1).groupby("user", as_index=False)["n"].sum()


def test_a_pandas_step_keeps_the_same_state(tmp_path: Path, spark: Any) -> None:
    config = _small_job(tmp_path, **{"task.batch.max.messages": "30", "task.commit.ms": "0"})

    def build(batch: Batch) -> Output:
        views = batch.df.select("task", "value.user")
        out = batch.stateful(views, _count_with_pandas, "user STRING, n LONG", pandas=True)
        return batch.to_stream(out, "filelog.per-batch", key="user")

    _run_pipeline(spark, config, build)
    assert_committed_state_matches_its_offsets(config)
    assert sum(committed_counts(config).values()) == 200
    sent = read_json_lines(config, Systems(config), SystemStream("filelog", "per-batch"))
    assert sum(int(r["value"]["n"]) for r in sent) == 200


def _report_heap(state: Any, chunks: Any) -> Any:
    """Per row: whether this worker had frozen its imports when the step began, and whether
    the step had run in this process before. Each run then marks the process unfrozen, so a
    later run here is frozen only if ``run_step`` froze it again: a worker Spark reuses, frozen
    by whatever ran in it first, cannot pass for one the step froze."""
    import pyarrow as pa

    from sparkpoint.runtime.executor import worker_heap

    frozen = worker_heap.FROZEN.done
    ran_here_before = getattr(worker_heap, "_test_step_ran_here", False)
    worker_heap.FROZEN.done = False
    setattr(worker_heap, "_test_step_ran_here", True)  # noqa: B010 - not an attribute it has
    state.store("user-counts")
    for chunk in chunks:
        n = chunk.num_rows
        columns = [chunk.column("user"), pa.array([frozen] * n), pa.array([ran_here_before] * n)]
        yield pa.RecordBatch.from_arrays(columns, names=["user", "frozen", "again"])


def test_a_step_runs_with_its_workers_imports_frozen(tmp_path: Path, spark: Any) -> None:
    """As a task's batch does (tests/runtime/executor/test_worker_heap.py): the step's worker
    has frozen what it imported (``gc.freeze``) before the step runs."""
    config = _small_job(tmp_path, **{"task.batch.max.messages": "10", "task.commit.ms": "0"})

    def build(batch: Batch) -> Output:
        views = batch.df.select("task", "value.user")
        out = batch.stateful(views, _report_heap, "user STRING, frozen BOOLEAN, again BOOLEAN")
        return batch.to_stream(out, "filelog.heap", key="user")

    _run_pipeline(spark, config, build)
    heap = SystemStream("filelog", "heap")
    sent = [r["value"] for r in read_json_lines(config, Systems(config), heap)]
    assert len(sent) == 200
    assert all(r["frozen"] is True for r in sent)
    # 20 batches of 10 views over Spark's few local workers: steps ran again in a worker the
    # step before had marked unfrozen, and those were frozen by run_step itself
    assert sum(r["again"] is True for r in sent) >= 10


def test_a_step_computed_twice_in_a_batch_fails_instead_of_counting_twice(
    tmp_path: Path, spark: Any
) -> None:
    config = _small_job(tmp_path)

    def build(batch: Batch) -> list[Output]:
        views = batch.df.select("task", "value.user")
        out = batch.stateful(views, _count_with_pandas, "user STRING, n LONG", pandas=True)
        out.unpersist()  # defeat the cache: the second output recomputes the step
        return [batch.to_stream(out, "filelog.a", key="user"), batch.to_stream(out, "filelog.b")]

    with pytest.raises(TaskError, match="stateful step '_count_with_pandas' was computed twice"):
        _run_pipeline(spark, config, build)

    def fixed(batch: Batch) -> Output:
        views = batch.df.select("task", "value.user")
        out = batch.stateful(views, _count_with_pandas, "user STRING, n LONG", pandas=True)
        return batch.to_stream(out, "filelog.a", key="user")

    _run_pipeline(spark, config, fixed)  # the restart resumes from the last checkpoint
    assert sum(committed_counts(config).values()) == 200
    assert_committed_state_matches_its_offsets(config)


def _explode(state: Any, chunks: Any) -> Any:
    for chunk in chunks:
        if chunk.num_rows:
            raise ValueError(f"bad view of {chunk.column('user')[0]}")
        yield chunk


def test_an_error_in_a_step_names_the_task_and_the_step(tmp_path: Path, spark: Any) -> None:
    def build(batch: Batch) -> Output:
        views = batch.df.select("task", "value.user")
        out = batch.stateful(views, _explode, "task STRING, user STRING")
        return batch.to_stream(out, "filelog.copy", key="user")

    with pytest.raises(TaskError, match=r"task Partition \d: stateful step '_explode' failed: "):
        _run_pipeline(spark, _small_job(tmp_path), build)


def test_an_output_to_an_unknown_system_or_column_is_a_config_error(
    tmp_path: Path, spark: Any
) -> None:
    def to(stream: str, key: str) -> Any:
        def build(batch: Batch) -> Output:
            return batch.to_stream(batch.df.select("task", "value.user"), stream, key=key)

        return build

    with pytest.raises(ConfigError, match="output stream 'kafka.copy': no system 'kafka'"):
        _run_pipeline(spark, _small_job(tmp_path / "a"), to("kafka.copy", "user"))
    with pytest.raises(ConfigError, match="no column 'usr'; columns: task, user"):
        _run_pipeline(spark, _small_job(tmp_path / "b"), to("filelog.copy", "usr"))


def test_a_function_sink_gets_every_batch_once_with_growing_ids(tmp_path: Path, spark: Any) -> None:
    seen: list[tuple[int, int]] = []
    config = _small_job(tmp_path, **{"task.batch.max.messages": "40"})

    def build(batch: Batch) -> Output:
        views = batch.df.select("task", "value.user")
        return batch.to_sink(views, lambda df, batch_id: seen.append((batch_id, df.count())))

    _run_pipeline(spark, config, build)
    assert sum(n for _, n in seen) == 200
    ids = [b for b, _ in seen]
    assert ids == sorted(set(ids)) and len(ids) >= 3


def test_a_pipeline_must_build_the_same_steps_every_batch(tmp_path: Path, spark: Any) -> None:
    def build(batch: Batch) -> Output:
        views = batch.df.select("task", "value.user")
        if batch.id % 2 == 0:
            views = batch.stateful(views, _passthrough, "task STRING, user STRING")
        return batch.to_stream(views, "filelog.copy", key="user")

    config = _small_job(tmp_path, **{"task.batch.max.messages": "30"})
    changed = r"stateful steps changed from \[\] to \['_passthrough'\]"
    with pytest.raises(ConfigError, match=changed):
        _run_pipeline(spark, config, build)


def test_a_pipelines_relative_job_file_is_next_to_its_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    (tmp_path / "mine").mkdir()
    module_file = tmp_path / "mine" / "my_pipeline.py"
    module_file.write_text(
        "from sparkpoint import Pipeline\njob = Pipeline(lambda batch: [], config='job.yaml')\n"
    )
    monkeypatch.chdir(tmp_path)  # not the module's directory
    spec = importlib.util.spec_from_file_location("my_pipeline", module_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.job.config == tmp_path / "mine" / "job.yaml"


def test_a_relative_parquet_sink_path_is_relative_to_the_module_creating_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: `ParquetSink("out/views")` wrote relative to the current directory, unlike
    every other path (relative to the job file's directory)."""
    from sparkpoint.runtime.dataframe.sinks import ParquetSink

    monkeypatch.chdir(tmp_path)
    sink = ParquetSink("out/views")
    assert sink.path == Path(__file__).resolve().parent / "out" / "views"
    assert ParquetSink(tmp_path / "abs").path == tmp_path / "abs"


def test_a_value_that_does_not_fit_the_value_schema_names_its_offset(
    tmp_path: Path, spark: Any
) -> None:
    """A value Arrow cannot read as ``value_schema`` (a LONG field sent as text: a re-keying
    stage 1 can write one into the job's own intermediate stream) names the task, SSP, offset,
    schema and value, and the way past it; it was a bare pyarrow error."""
    from sparkpoint.errors import SparkpointError
    from sparkpoint.tools.streams import Message, send_messages

    config = load_config(None, pageviews_config(tmp_path))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    systems = Systems(config)
    bad = {"user": "x", "page": "/", "ts": "soon"}
    send_messages(config, systems, SystemStream("filelog", "pageviews"), [Message(bad, "x")])
    systems.close()
    error = (
        r"task Partition \d: message at filelog.pageviews.\d offset 0 does not fit the "
        r"pipeline's value_schema \(struct<user: string, page: string, ts: int64>\): .*"
        r"value '\{.*\"ts\":\"soon\".*sparkpoint startpoint set JOB --stream pageviews"
    )
    with pytest.raises(SparkpointError, match=error):
        _run(config, DataFrameRunner(spark, example_pipeline, config))

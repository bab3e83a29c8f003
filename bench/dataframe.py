"""Benchmark: the stateful page-view count with the DataFrame API, the task API and Spark's own
stateful streaming (``applyInPandasWithState`` with the RocksDB state store), side by side in
one run on the same events and the same local Spark session.

Variants (each reads every event once and keeps a count per user in RocksDB):

* ``dataframe-latest``: a stateful step (``mapInArrow``) that counts each Arrow batch with
  ``value_counts``, one ``get_all`` and one ``put_all``, and writes the latest count per user
  and batch to a Parquet sink: the same output as the Spark baseline;
* ``dataframe-per-view``: the example's step, one ``{user, count}`` message per view to a
  sparkpoint stream (the example's output);
* ``task-api``: the example's low-level task (one ``process`` call per view, same output);
* ``spark-applyInPandasWithState``: ``bench/sss_baseline.py`` (Parquet sink, availableNow).

Each variant's time runs from start to caught up and includes start-up; batches are 50k events
(12.5k per partition for sparkpoint, one 50k-event file per trigger for Spark). Final counts
are checked against the input. Usage: ``make bench-dataframe`` or
``.venv/bin/python bench/dataframe.py [--events N] [--users U]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "examples" / "pageviews", ROOT / "bench"):
    sys.path.insert(0, str(extra))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "examples" / "pageviews"), str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")]
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from generate import events, write  # noqa: E402
from pageviews_pipeline import count_views  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from sss_baseline import run_sss_pageviews  # noqa: E402

from sparkpoint.config import Config, load_config, read_job_file  # noqa: E402
from sparkpoint.runtime.dataframe.pipeline import Batch, Output, Pipeline  # noqa: E402
from sparkpoint.runtime.dataframe.runner import DataFrameRunner  # noqa: E402
from sparkpoint.runtime.dataframe.sinks import ParquetSink  # noqa: E402
from sparkpoint.runtime.dataframe.task import StepState  # noqa: E402
from sparkpoint.runtime.driver.coordinator import JobCoordinator  # noqa: E402
from sparkpoint.runtime.spark.session import SparkRunner, spark_session  # noqa: E402
from sparkpoint.system.base import StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402
from sparkpoint.tools.state import committed_entries  # noqa: E402

SCHEMA = "user STRING, page STRING, ts LONG"


def latest_counts(state: StepState, chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Per Arrow batch: counts by user (vectorised), one get_all, one put_all, one row per user."""
    counts = state.store("user-counts")
    for chunk in chunks:
        if chunk.num_rows == 0:
            continue
        seen = pc.value_counts(chunk.column("user"))
        users = seen.field("values").to_pylist()
        added = seen.field("counts").to_pylist()
        new = [(c or 0) + n for c, n in zip(counts.get_all(users), added, strict=True)]
        counts.put_all(zip(users, new, strict=True))
        yield pa.RecordBatch.from_arrays(
            [pa.array(users, pa.string()), pa.array(new, pa.int64())], names=["user", "count"]
        )


def latest_to_parquet(batch: Batch) -> Output:
    views = batch.df.select("task", F.col("value.user").alias("user"))
    counts = batch.stateful(views, latest_counts, "user STRING, count LONG")
    return batch.to_sink(counts, ParquetSink(Path(batch.config.require("job.data.dir")) / "out"))


def per_view_to_stream(batch: Batch) -> Output:
    views = batch.df.select("task", F.col("value.user").alias("user"))
    counts = batch.stateful(views, count_views, "user STRING, count LONG")
    return batch.to_stream(counts, "filelog.user-counts", key="user")


def _config(tmp: Path, name: str, per_partition: int) -> Config:
    values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
    values.update(
        {
            "job.data.dir": str(tmp / name),
            "task.batch.max.messages": str(per_partition),
            "task.commit.ms": "10000",
        }
    )
    return load_config(None, values)


def _sparkpoint(
    spark: Any, tmp: Path, name: str, args: argparse.Namespace, expected: Counter[str]
) -> float:
    config = _config(tmp, name, args.batch // 4)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    job_file = tmp / f"{name}.yaml"
    job_file.write_text(json.dumps(dict(config.items())))
    write(str(job_file), args.events, args.seed, args.users)
    if name == "task-api":
        runner: Any = SparkRunner(spark.sparkContext)
    else:
        build = latest_to_parquet if name == "dataframe-latest" else per_view_to_stream
        runner = DataFrameRunner(spark, Pipeline(build, config.to_dict(), SCHEMA), config)
    started = time.perf_counter()
    coordinator = JobCoordinator(config, runner)
    try:
        coordinator.run(until_caught_up=True)
    finally:
        coordinator.close()
    seconds = time.perf_counter() - started
    counts = {k: v for _t, k, v in committed_entries(config, "user-counts")}
    if counts != dict(expected):
        raise SystemExit(f"{name}: final counts differ from the input")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=50_000, help="events per batch")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    data = list(events(args.events, args.seed, args.users))
    expected = Counter(str(e["user"]) for e in data)
    spark = spark_session(Config({"job.name": "bench"}), "local[2]")
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-df-") as tmp_name:
        tmp = Path(tmp_name)
        # warm up the JVM, Python workers and the data source once, untimed
        (tmp / "warm-up").mkdir()
        warm = argparse.Namespace(**{**vars(args), "events": 4000})
        _sparkpoint(
            spark,
            tmp / "warm-up",
            "dataframe-latest",
            warm,
            Counter(str(e["user"]) for e in events(4000, args.seed, args.users)),
        )
        for name in ("dataframe-latest", "dataframe-per-view", "task-api"):
            results[name] = _sparkpoint(spark, tmp, name, args, expected)
            print(f"{name:<30} {results[name]:7.1f} s", flush=True)
        sss = run_sss_pageviews(
            spark, data, str(tmp / "sss"), partitions=4, max_per_trigger=args.batch
        )
        if sss["counts"] != dict(expected):
            raise SystemExit("spark-applyInPandasWithState: final counts differ from the input")
        sss_seconds = float(str(sss["seconds"]))
        results["spark-applyInPandasWithState"] = sss_seconds
        print(f"{'spark-applyInPandasWithState':<30} {sss_seconds:7.1f} s")
    spark.stop()
    base = results["spark-applyInPandasWithState"]
    print(f"\n{args.events:,} events, {args.users} users, batches of {args.batch:,}, local[2]")
    print(f"{'variant':<30} {'events/s':>10} {'vs Spark':>9}")
    for name, seconds in results.items():
        print(f"{name:<30} {args.events / seconds:>10,.0f} {base / seconds:>8.2f}x")


if __name__ == "__main__":
    main()

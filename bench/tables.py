"""Benchmark: rows/s into Delta, Iceberg and PostgreSQL tables, side by side in one run.

1. **Sinks** (no Spark): the same Arrow batches of page views (``--rows`` rows in batches of
   ``--batch``) written to each kind three ways: straight with the library (deltalake's
   ``write_deltalake``, pyiceberg's ``Table.append``, psycopg's COPY of Arrow-written CSV:
   the fastest way each library offers), through sparkpoint's table producer (at-least-once:
   one table commit per batch) and through its exactly-once staging (each batch staged as an
   Arrow file, then published under a commit key that the table records with the rows).
   Issue 67's target: sparkpoint at least 0.8x the library.
2. **Pipelines** (local Spark, Delta): the same views read and appended to a Delta table by
   sparkpoint's DataFrame pipeline (from the embedded log, ``batch.to_stream(df,
   "lake.views")``, exactly-once) and by Spark Structured Streaming (from Parquet files, in
   ``foreachBatch`` with ``write_deltalake`` of ``df.toArrow()``), in batches of the same size.

Each figure is the median of ``--rounds`` rounds run alternately (these machines are noisy).
PostgreSQL is a server from the OS package started for the run on loopback. Usage:
``make bench-tables`` or ``.venv/bin/python bench/tables.py [--rows N] [--batch B]
[--rounds R] [--skip-pipelines]``.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "pageviews"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from generate import PAGES  # noqa: E402

from sparkpoint.system.registry import Systems  # noqa: E402
from sparkpoint.system.tables.system import TableAdmin  # noqa: E402
from sparkpoint.testing.services import PostgresServer  # noqa: E402

KINDS = ("delta", "iceberg", "postgres")
WAYS = ("library", "sparkpoint", "exactly-once")


def views(rows: int, batch: int) -> list[pa.RecordBatch]:
    """``rows`` page views as Arrow batches of ``batch`` rows: user, page, ts."""
    out = []
    for start in range(0, rows, batch):
        n = min(batch, rows - start)
        ids = range(start, start + n)
        out.append(
            pa.record_batch(
                {
                    "user": [f"user-{i % 997:05d}" for i in ids],
                    "page": [PAGES[i % len(PAGES)] for i in ids],
                    "ts": pa.array([1_700_000_000_000 + i for i in ids], pa.int64()),
                }
            )
        )
    return out


def library_writer(kind: str, root: Path, dsn: str) -> Callable[[pa.RecordBatch], None]:
    """Writes one batch straight with the library (a commit each)."""
    if kind == "delta":
        from deltalake import write_deltalake

        path = str(root / "direct")
        return lambda b: write_deltalake(path, pa.Table.from_batches([b]), mode="append")
    if kind == "iceberg":
        from pyiceberg.catalog import load_catalog

        (root / "wh").mkdir(parents=True, exist_ok=True)
        catalog = load_catalog(
            "bench",
            type="sql",
            uri=f"sqlite:///{root / 'catalog.db'}",
            warehouse=(root / "wh").as_uri(),
        )
        catalog.create_namespace_if_not_exists("bench")
        holder: dict[str, Any] = {}

        def append(b: pa.RecordBatch) -> None:
            table = pa.Table.from_batches([b])
            if "t" not in holder:
                holder["t"] = catalog.create_table(("bench", "direct"), schema=table.schema)
            holder["t"].append(table)

        return append
    import psycopg
    import pyarrow.csv as pacsv

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute('CREATE TABLE direct ("user" text, page text, ts bigint)')

    def copy(b: pa.RecordBatch) -> None:
        buffer = io.BytesIO()
        pacsv.write_csv(b, buffer, pacsv.WriteOptions(include_header=False))
        with (
            conn.transaction(),
            conn.cursor().copy('COPY direct ("user", page, ts) FROM STDIN (FORMAT csv)') as c,
        ):
            c.write(buffer.getvalue())

    return copy


def sparkpoint_writer(
    kind: str, root: Path, dsn: str, exactly_once: bool
) -> Callable[[pa.RecordBatch], None]:
    """Writes one batch through sparkpoint's table system (a commit each)."""
    config = {"job.name": "bench", "job.data.dir": str(root), "systems.t.factory": kind}
    if kind == "postgres":
        config["systems.t.postgres.dsn"] = dsn
    systems = Systems(config)
    if not exactly_once:
        producer = systems.producer("t")

        def send(b: pa.RecordBatch) -> None:
            producer.send_batch("views", b)
            producer.flush()

        return send
    admin = systems.admin("t")
    assert isinstance(admin, TableAdmin)
    staging = admin.output_staging()
    key = [0]

    def stage_and_publish(b: pa.RecordBatch) -> None:
        key[0] += 1
        part = f"r-{key[0]}"
        producer = staging.producer("bench-1.Partition_0", part)
        producer.send_batch("views", b)
        producer.stage()
        staging.publish("views", 0, "bench-1.Partition_0", key[0], [part])

    return stage_and_publish


def sink_round(kind: str, way: str, batches: list[pa.RecordBatch], dsn: str) -> float:
    """Rows/s of one way into a new table of ``kind``."""
    root = Path(tempfile.mkdtemp(prefix=f"bench-tables-{kind}-"))
    try:
        write = (
            library_writer(kind, root, dsn)
            if way == "library"
            else sparkpoint_writer(kind, root, dsn, way == "exactly-once")
        )
        t0 = time.perf_counter()
        for b in batches:
            write(b)
        return sum(b.num_rows for b in batches) / (time.perf_counter() - t0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_sinks(args: argparse.Namespace, postgres: PostgresServer) -> dict[str, dict[str, float]]:
    batches = views(args.rows, args.batch)
    rates: dict[str, dict[str, list[float]]] = {k: {w: [] for w in WAYS} for k in KINDS}
    for r in range(args.rounds):
        for kind in KINDS:
            for way in WAYS if r % 2 == 0 else reversed(WAYS):
                dsn = postgres.new_database(f"b_{kind}_{way.replace('-', '_')}_{r}")
                rates[kind][way].append(sink_round(kind, way, batches, dsn))
    return {k: {w: statistics.median(v) for w, v in ways.items()} for k, ways in rates.items()}


def bench_pipelines(args: argparse.Namespace) -> dict[str, float]:
    """Rows/s of sparkpoint's pipeline and of Structured Streaming's foreachBatch, into Delta."""
    from pyspark.sql import SparkSession

    from sparkpoint.config import Config
    from sparkpoint.runtime.spark.session import spark_session

    spark: SparkSession = spark_session(Config({"job.name": "bench-tables"}), "local[2]")
    rates: dict[str, list[float]] = {"sparkpoint pipeline": [], "foreachBatch": []}
    try:
        for r in range(args.rounds):
            order = ["sparkpoint pipeline", "foreachBatch"]
            for name in order if r % 2 == 0 else reversed(order):
                run = pipeline_round if name == "sparkpoint pipeline" else foreach_round
                rates[name].append(run(spark, args))
    finally:
        spark.stop()
    return {n: statistics.median(v) for n, v in rates.items()}


def pipeline_round(spark: Any, args: argparse.Namespace) -> float:
    from generate import write as write_views

    from sparkpoint import Batch, Pipeline
    from sparkpoint.config import load_config
    from sparkpoint.runtime.dataframe.runner import DataFrameRunner
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.system.base import StreamSpec

    root = Path(tempfile.mkdtemp(prefix="bench-tables-pipeline-"))
    try:
        values = {
            "job.name": "bench-tables",
            "job.data.dir": str(root),
            "job.processing.guarantee": "exactly-once",
            "systems.filelog.factory": "filelog",
            "systems.lake.factory": "delta",
            "task.inputs": "filelog.pageviews",
            "task.batch.max.messages": str(args.batch // 4),
            "task.commit.ms": "0",
        }
        config = load_config(None, values)
        Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
        job_file = root / "gen.yaml"
        job_file.write_text("\n".join(f"{k}: {v}" for k, v in config.items()))
        write_views(str(job_file), args.rows, 1, 997)

        def build(batch: Batch) -> Any:
            return batch.to_stream(
                batch.df.select("value.user", "value.page", "value.ts"), "lake.views"
            )

        pipeline = Pipeline(build, values, value_schema="user STRING, page STRING, ts LONG")
        coordinator = JobCoordinator(config, DataFrameRunner(spark, pipeline, config))
        t0 = time.perf_counter()
        coordinator.run(until_caught_up=True)
        seconds = time.perf_counter() - t0
        coordinator.close()
        return args.rows / seconds
    finally:
        shutil.rmtree(root, ignore_errors=True)


def foreach_round(spark: Any, args: argparse.Namespace) -> float:
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    root = Path(tempfile.mkdtemp(prefix="bench-tables-sss-"))
    try:
        source = root / "views"
        source.mkdir()
        for i, b in enumerate(views(args.rows, args.batch)):
            pq.write_table(pa.Table.from_batches([b]), source / f"part-{i:05d}.parquet")
        target = str(root / "delta")

        def write(df: Any, batch_id: int) -> None:
            write_deltalake(target, df.toArrow(), mode="append")

        stream = (
            spark.readStream.schema("user STRING, page STRING, ts LONG")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(source))
        )
        t0 = time.perf_counter()
        query = (
            stream.writeStream.foreachBatch(write)
            .option("checkpointLocation", str(root / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return args.rows / (time.perf_counter() - t0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-pipelines", action="store_true")
    args = parser.parse_args()
    with PostgresServer(Path(tempfile.mkdtemp(prefix="bench-tables-pg-"))) as postgres:
        sinks = bench_sinks(args, postgres)
    print(f"{args.rows} rows in batches of {args.batch}, median of {args.rounds} rounds (rows/s)")
    print(
        f"{'table':<10}{'library':>12}{'sparkpoint':>12}{'ratio':>8}{'exactly-once':>14}{'ratio':>8}"
    )
    for kind, r in sinks.items():
        lib = r["library"]
        print(
            f"{kind:<10}{lib:>12,.0f}{r['sparkpoint']:>12,.0f}{r['sparkpoint'] / lib:>7.2f}x"
            f"{r['exactly-once']:>14,.0f}{r['exactly-once'] / lib:>7.2f}x"
        )
    if args.skip_pipelines:
        return
    pipes = bench_pipelines(args)
    ours, theirs = pipes["sparkpoint pipeline"], pipes["foreachBatch"]
    print(
        f"\ninto Delta, end to end on local[2]: sparkpoint pipeline (exactly-once) "
        f"{ours:,.0f} rows/s, Structured Streaming foreachBatch {theirs:,.0f} rows/s: "
        f"{ours / theirs:.2f}x"
    )


if __name__ == "__main__":
    main()

"""Baseline: page views per user with Spark Structured Streaming's own stateful operator.

Runs ``groupBy("user").applyInPandasWithState(...)`` over JSON-lines files with the RocksDB state
store provider and a parquet sink, triggered with ``availableNow``, and reports events/s. This is
the reference point for ``bench/run.py`` (the same workload on sparkpoint).

Usage: ``.venv/bin/python bench/sss_baseline.py [--events N] [--users U] [--cores C]``.

Note: the parquet (file) sink only supports the Append query output mode, and Spark requires the
operator's output mode of ``applyInPandasWithState`` to match the query's, so the operator runs in
``"append"`` mode. The function still emits one row per user per micro-batch with the user's
running count, exactly as it would in ``"update"`` mode; the final count is the max per user.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.state import GroupState

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
PARTITIONS_KEY = "spark.sql.shuffle.partitions"
NO_DATA_KEY = "spark.sql.streaming.noDataMicroBatches.enabled"
INPUT_SCHEMA = "user STRING, page STRING, ts LONG"
OUTPUT_SCHEMA = "user STRING, count LONG"
STATE_SCHEMA = "count LONG"
PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/login", "/about", "/careers"]


def write_input(events: list[dict[str, object]], input_dir: Path, per_file: int) -> int:
    """Write ``events`` as JSON-lines files of about ``per_file`` events; return the file count.

    File names sort in event order, and modification times are set strictly increasing in the
    same order, since the file source orders new files by modification time.
    """
    input_dir.mkdir(parents=True, exist_ok=True)
    per_file = max(1, per_file)
    chunks = [events[i : i + per_file] for i in range(0, len(events), per_file)]
    base_ns = time.time_ns() - len(chunks) * 10_000_000
    for n, chunk in enumerate(chunks):
        path = input_dir / f"part-{n:06d}.json"
        with path.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in chunk)
        mtime_ns = base_ns + n * 10_000_000
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return len(chunks)


def _batch_count(progress: list[Any], last: Any) -> int:
    """Number of micro-batches: the highest batchId seen in the query's progress, plus one."""
    ids = [int(p.batchId) for p in progress]
    if last is not None:
        ids.append(int(last.batchId))
    return max(ids) + 1 if ids else 0


def run_sss_pageviews(
    spark: SparkSession,
    events: list[dict[str, object]],
    workdir: str,
    *,
    partitions: int = 4,
    max_per_trigger: int = 50_000,
) -> dict[str, object]:
    """Count page views per user with ``applyInPandasWithState`` on the RocksDB state store.

    Writes ``events`` under ``workdir/input`` (untimed), then times one ``availableNow`` query
    from ``start()`` to the end of ``awaitTermination()``. Returns the elapsed seconds, the event
    count, events/s, the final count per user (read back from the parquet output) and the number
    of micro-batches.
    """
    root = Path(workdir)
    write_input(events, root / "input", max_per_trigger)
    result = run_query(spark, root, partitions=partitions)
    seconds = float(str(result["seconds"]))
    return {
        **result,
        "events": len(events),
        "events_per_s": len(events) / seconds if seconds > 0 else float("inf"),
    }


def run_query(
    spark: SparkSession, root: Path, *, partitions: int = 4, api: str = "applyInPandas"
) -> dict[str, object]:
    """The ``availableNow`` query over the JSON files in ``root/input`` (one file per trigger),
    counting with ``applyInPandasWithState`` or (``api="transform"``)
    ``transformWithStateInPandas``, both on the RocksDB state store, into Parquet under
    ``root/out``; ``api="transform-idle"`` also moves an idle timer per user in each batch
    (processing time, an hour ahead: the idle-session pattern of ``bench/timers.py``). Returns
    the query's seconds, micro-batches and the final count per user."""
    from pyspark.sql import functions as F

    keys = (PROVIDER_KEY, PARTITIONS_KEY, NO_DATA_KEY)
    saved = {key: spark.conf.get(key, None) for key in keys}
    spark.conf.set(PROVIDER_KEY, ROCKSDB_PROVIDER)
    spark.conf.set(PARTITIONS_KEY, str(partitions))
    # with processing-time timers an availableNow query would otherwise run empty batches
    # for ever (each may fire timers); no timer is due here
    spark.conf.set(NO_DATA_KEY, "false")
    try:
        source = (
            spark.readStream.schema(INPUT_SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .json(str(root / "input"))
        )
        grouped = source.groupBy("user")
        if api.startswith("transform"):
            counted = _transform(grouped, idle_timer=api == "transform-idle")
        else:
            counted = _apply_in_pandas(grouped)
        writer = (
            counted.writeStream.format("parquet")
            .option("path", str(root / "out"))
            .option("checkpointLocation", str(root / "ckpt"))
            .queryName("sss_pageviews_baseline")
            .trigger(availableNow=True)
        )
        t0 = time.perf_counter()
        query = writer.start()
        try:
            query.awaitTermination()
            seconds = time.perf_counter() - t0
        finally:
            if query.isActive:
                query.stop()
        error = query.exception()
        if error is not None:
            raise RuntimeError(f"streaming query failed: {error}")
        batches = _batch_count(list(query.recentProgress), query.lastProgress)
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)

    rows = (
        spark.read.parquet(str(root / "out"))
        .groupBy("user")
        .agg(F.max("count").alias("count"))
        .collect()
    )
    counts = {str(row["user"]): int(row["count"]) for row in rows}
    return {"seconds": seconds, "counts": counts, "batches": batches}


def _apply_in_pandas(grouped: Any) -> Any:
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    def count_views(
        key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        seen = sum(len(pdf) for pdf in pdfs)
        total = seen + (int(state.get[0]) if state.exists else 0)
        state.update((total,))
        yield pd.DataFrame({"user": [key[0]], "count": [total]})

    return grouped.applyInPandasWithState(
        count_views,
        outputStructType=OUTPUT_SCHEMA,
        stateStructType=STATE_SCHEMA,
        outputMode="append",  # the file sink allows Append only; see the module docstring
        timeoutConf=GroupStateTimeout.NoTimeout,
    )


def _transform(grouped: Any, *, idle_timer: bool = False) -> Any:
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

    class CountViews(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.handle = handle
            self.count = handle.getValueState("count", STATE_SCHEMA)

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            seen = sum(len(pdf) for pdf in rows)
            total = seen + (int(self.count.get()[0]) if self.count.exists() else 0)
            self.count.update((total,))
            if idle_timer:  # the key's one timer, moved: Spark has no call for it in one step
                for at in list(self.handle.listTimers()):
                    self.handle.deleteTimer(at)
                self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 3_600_000)
            yield pd.DataFrame({"user": [key[0]], "count": [total]})

        def handleExpiredTimer(
            self, key: Any, timerValues: Any, expiredTimerInfo: Any
        ) -> Iterator[pd.DataFrame]:
            yield from ()  # an hour ahead: none is due in the run

        def close(self) -> None:
            pass

    return grouped.transformWithStateInPandas(
        statefulProcessor=CountViews(),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Append",
        timeMode="ProcessingTime" if idle_timer else "None",
    )


def generate_events(n: int, users: int, seed: int = 7) -> list[dict[str, object]]:
    """Deterministic page views: Zipf-like user skew (weight ``1/(i+1)**0.8``), uniform pages."""
    rng = random.Random(seed)
    names = [f"user-{i:05d}" for i in range(users)]
    cum_weights = list(itertools.accumulate(1.0 / (i + 1) ** 0.8 for i in range(users)))
    ts = 1_700_000_000_000
    events: list[dict[str, object]] = []
    for _ in range(n):
        user = rng.choices(names, cum_weights=cum_weights)[0]
        page = rng.choice(PAGES)
        ts += rng.randint(0, 50)
        events.append({"user": user, "page": page, "ts": ts})
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    events = generate_events(args.events, args.users)
    spark = (
        SparkSession.builder.master(f"local[{args.cores}]")
        .appName("sss-pageviews-baseline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    try:
        with tempfile.TemporaryDirectory(prefix="sss-baseline-") as tmp:
            result = run_sss_pageviews(spark, events, tmp)
    finally:
        spark.stop()

    counts, seconds, rate = result["counts"], result["seconds"], result["events_per_s"]
    assert isinstance(counts, dict) and isinstance(seconds, float) and isinstance(rate, float)
    total = sum(counts.values())
    if total != args.events:
        raise SystemExit(
            f"count check failed: final per-user counts sum to {total}, expected {args.events}"
        )
    print(
        f"SSS applyInPandasWithState + RocksDB: {args.events} events, {len(counts)} users, "
        f"{result['batches']} batches, {seconds:.2f}s, {rate:,.0f} events/s "
        f"({rate / args.cores:,.0f} events/s per core, local[{args.cores}])"
    )


if __name__ == "__main__":
    main()

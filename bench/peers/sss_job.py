"""Spark Structured Streaming's variants for ``bench/peers.py``: ``applyInPandasWithState`` or
``transformWithStateInPandas`` with the RocksDB state store, on ``local[2]`` (the query of
``bench/sss_baseline.py``). ``prepare`` lays the views out as JSON files of ``--per-trigger``
views (untimed); ``run`` starts Spark and runs an ``availableNow`` query to the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

from common import arguments, mark_first, partitions, write_result  # noqa: E402
from sss_baseline import run_query, write_input  # noqa: E402


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("step", choices=["prepare", "run"])
    parser.add_argument("--api", choices=["applyInPandas", "transform"], required=True)
    parser.add_argument("--per-trigger", type=int, default=50_000)
    args = parser.parse_args()
    if args.step == "prepare":
        views: list[dict[str, object]] = []
        for path in partitions(args.data):
            views.extend(json.loads(line) for line in path.open())
        views.sort(key=lambda v: int(str(v["ts"])))
        write_input(views, args.work / "input", args.per_trigger)
        return
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-peers-sss")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    mark_first(args.work)  # Spark is up; its first batch starts now
    result = run_query(spark, args.work, api=args.api)
    finished = time.time()
    write_result(args, result["counts"], finished=finished, batches=result["batches"])  # type: ignore[arg-type]
    spark.stop()


if __name__ == "__main__":
    main()

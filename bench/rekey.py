"""Benchmark: counting views per user through a re-key (issue 33) against the same count on
input already partitioned by user, side by side, in both APIs.

The same events run on one local Spark session, alternately, ``--rounds`` times each: the
re-key example (``examples/rekey``: views keyed by page, sent on to the intermediate stream
``pageviews-by-user``, staged until each commit, then counted) and the page-view example
(``examples/pageviews``: views keyed by user, counted where they are), as tasks and as
DataFrame pipelines (``--api``). Both run to the end of their input (the re-key job also to
the end of its intermediate stream) with the same batch size and commit interval, and the same
store (``user-counts``, backed by the changelog ``user-counts-changelog``, as in the re-key
example; the page-view example alone keeps no changelog); events/s is
input views over the run's time, and the median round of each counts (these machines are
noisy). Prints both and the ratio (issue 33's target: at least 0.5x).

The example's views are of 8 pages, and 4 of them hash to one partition: the re-keyed job's
input is skewed where the job keyed by user is not, so one task re-keys half the views.
``--pages N`` spreads the views over N pages instead, to see the re-key apart from that skew.
Usage: ``make bench-rekey`` or
``.venv/bin/python bench/rekey.py [--events N] [--batch M] [--rounds R] [--api A,B] [--pages N]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXTRA = [str(ROOT / "examples" / "pageviews"), str(ROOT / "examples" / "rekey")]
sys.path[:0] = EXTRA
os.environ["PYTHONPATH"] = os.pathsep.join([*EXTRA, os.environ.get("PYTHONPATH", "")])
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from generate import PAGES, write  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from sparkpoint.config import load_config, read_job_file  # noqa: E402
from sparkpoint.runtime.dataframe.runner import DataFrameRunner  # noqa: E402
from sparkpoint.runtime.driver.coordinator import JobCoordinator  # noqa: E402
from sparkpoint.runtime.spark.session import SparkRunner, spark_session  # noqa: E402
from sparkpoint.system.base import StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402

#: job: (example, input stream, the key its views are partitioned by, its pipeline)
JOBS = {
    "re-keyed": ("rekey", "pageviews-by-page", "page", "rekey_pipeline"),
    "by user": ("pageviews", "pageviews", "user", "pageviews_pipeline"),
}


def one_run(
    spark: SparkSession | None, tmp: Path, api: str, job: str, args: argparse.Namespace
) -> tuple[float, int, SparkSession]:
    """One job on ``args.events`` events in a new data directory: (events/s, sent)."""
    example, stream, key, module = JOBS[job]
    values = read_job_file(ROOT / "examples" / example / "job.yaml")
    values.update(
        {
            "job.data.dir": str(tmp),
            "task.batch.max.messages": str(args.batch),
            "task.commit.ms": str(args.commit_ms),
            # the same store in both jobs: the re-key example's count is backed by a changelog
            "stores.user-counts.changelog": "filelog.user-counts-changelog",
        }
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec(stream, 4))
    job_file = tmp / "job.json"
    job_file.write_text(json.dumps(config.to_dict()))
    pages = [f"/page-{i}" for i in range(args.pages)] if args.pages else PAGES
    write(str(job_file), args.events, 1, 10_000, stream, key_field=key, pages=pages)
    spark = spark or spark_session(config, f"local[{args.cores}]")
    runner: Any = SparkRunner(spark.sparkContext)
    if api == "dataframe":
        pipeline = importlib.import_module(module).job
        runner = DataFrameRunner(spark, pipeline, config)
    coordinator = JobCoordinator(config, runner)
    coordinator.start()
    summary = coordinator.run(until_caught_up=True)
    coordinator.close()
    return args.events / summary.seconds, summary.sent, spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50_000, help="messages per partition")
    parser.add_argument("--commit-ms", type=int, default=5_000)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--api", default="task,dataframe", help="task, dataframe or both")
    parser.add_argument(
        "--pages",
        type=int,
        default=0,
        help="views spread over this many pages (default: the example's 8, of which 4 hash "
        "to one partition, so one input partition holds half the views)",
    )
    args = parser.parse_args()
    apis = args.api.split(",")
    rates: dict[tuple[str, str], list[float]] = {(a, j): [] for a in apis for j in JOBS}
    spark = None
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-rekey-") as top:
        for r in range(args.rounds):
            for api, job in rates:
                tmp = Path(top) / f"{api}-{job.replace(' ', '-')}-{r}"
                tmp.mkdir()
                rate, sent, spark = one_run(spark, tmp, api, job, args)
                print(
                    f"round {r + 1} {api:>9} {job:>8}: {rate:,.0f} events/s ({sent:,} sent)",
                    flush=True,
                )
                rates[(api, job)].append(rate)
    if spark is not None:
        spark.stop()
    for api in apis:
        rekeyed = statistics.median(rates[(api, "re-keyed")])
        direct = statistics.median(rates[(api, "by user")])
        print(
            f"{api}: re-keyed / partitioned by user (medians): {rekeyed:,.0f} / {direct:,.0f} "
            f"events/s = {rekeyed / direct:.2f}x (target >= 0.5x)"
        )


if __name__ == "__main__":
    main()

"""Benchmark: the example job with exactly-once output against at-least-once, side by side.

Both run the same events on one local Spark session, alternately, ``--rounds`` times each,
as the task API job and as the DataFrame pipeline (``--api``; the pipeline also writes each
view to Parquet, staged and renamed at the batch's commit with exactly-once);
the median round of each counts (these machines are noisy: one round can be 1.5x another).
Exactly-once stages every output record beside its partition and publishes it once the
checkpoint covering its input is written, so each output record is written twice on the
filelog. Prints events/s of each and the ratio
(issue 34's target: at least 0.8x). With ``--system kafka`` every stream is on Kafka (a Tansu
broker started per run, on loopback): output is staged in a topic and published in a Kafka
transaction; the figure is printed with Tansu's caveat (it takes one record per produce
request, so writes cost what they would not on Kafka). Usage: ``make bench-exactly-once`` or
``.venv/bin/python bench/exactly_once.py [--events N] [--batch M] [--rounds R] [--api A,B]
[--system filelog|kafka] [--changelog STORE]`` (``--changelog user-counts --api task``: with
exactly-once, its changelog records are held back until their checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "pageviews"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "examples" / "pageviews"), os.environ.get("PYTHONPATH", "")]
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from generate import write  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from sparkpoint.config import load_config, read_job_file  # noqa: E402
from sparkpoint.runtime.dataframe.runner import DataFrameRunner  # noqa: E402
from sparkpoint.runtime.driver.coordinator import JobCoordinator  # noqa: E402
from sparkpoint.runtime.spark.session import SparkRunner, spark_session  # noqa: E402
from sparkpoint.system.base import StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402
from sparkpoint.testing.services import TansuKafka  # noqa: E402

GUARANTEES = ("at-least-once", "exactly-once")


def one_run(
    spark: SparkSession | None, tmp: Path, api: str, guarantee: str, args: argparse.Namespace
) -> tuple[float, int, SparkSession]:
    """The example (``api``: task or dataframe) on ``args.events`` events in a new data
    directory: (events/s, sent)."""
    values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
    with ExitStack() as services:
        if args.system == "kafka":  # every stream on a broker of this run's own
            broker = services.enter_context(TansuKafka(tmp / "tansu"))
            values = {
                k: "kafka." + v.removeprefix("filelog.") if v.startswith("filelog.") else v
                for k, v in values.items()
                if not k.startswith("systems.filelog.")
            }
            values.update(broker.config("kafka"))
        values.update(
            {
                "job.data.dir": str(tmp),
                "task.batch.max.messages": str(args.batch),
                "task.commit.ms": "10000",
                "job.processing.guarantee": guarantee,
            }
        )
        if args.changelog:  # state backed by a changelog, which exactly-once holds back
            values[f"stores.{args.changelog}.changelog"] = f"{args.system}.{args.changelog}-log"
        config = load_config(None, values)
        Systems(config).admin(args.system).create_stream(StreamSpec("pageviews", 4))
        job_file = tmp / "job.json"
        job_file.write_text(json.dumps(config.to_dict()))
        write(str(job_file), args.events, seed=1, users=10_000)
        spark = spark or spark_session(config, f"local[{args.cores}]")
        if api == "dataframe":
            from pageviews_pipeline import job as pipeline

            runner: Any = DataFrameRunner(spark, pipeline, config)
        else:
            runner = SparkRunner(spark.sparkContext)
        coordinator = JobCoordinator(config, runner)
        coordinator.start()
        summary = coordinator.run(until_caught_up=True)
        coordinator.close()
    return summary.processed / summary.seconds, summary.sent, spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, help="default 1,000,000 (kafka: 20,000)")
    parser.add_argument("--system", default="filelog", choices=("filelog", "kafka"))
    parser.add_argument("--batch", type=int, default=50_000, help="messages per partition")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--api", default="task,dataframe", help="task, dataframe or both")
    parser.add_argument(
        "--changelog",
        metavar="STORE",
        help="back this store with a changelog (the task API's is user-counts)",
    )
    args = parser.parse_args()
    if args.events is None:
        args.events = 20_000 if args.system == "kafka" else 1_000_000
    apis = args.api.split(",")
    rates: dict[tuple[str, str], list[float]] = {(a, g): [] for a in apis for g in GUARANTEES}
    spark = None
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-eo-") as top:
        for r in range(args.rounds):
            for api, guarantee in rates:
                tmp = Path(top) / f"{api}-{guarantee}-{r}"
                tmp.mkdir()
                rate, sent, spark = one_run(spark, tmp, api, guarantee, args)
                print(
                    f"round {r + 1} {api:>9} {guarantee:>14}: {rate:,.0f} events/s ({sent:,} sent)"
                )
                rates[(api, guarantee)].append(rate)
    if spark is not None:
        spark.stop()
    for api in apis:
        eo = statistics.median(rates[(api, "exactly-once")])
        alo = statistics.median(rates[(api, "at-least-once")])
        caveat = " (Tansu: one record per produce request)" if args.system == "kafka" else ""
        print(
            f"{api} on {args.system}: exactly-once / at-least-once (medians): {eo:,.0f} / "
            f"{alo:,.0f} events/s = {eo / alo:.2f}x (target >= 0.8x){caveat}"
        )


if __name__ == "__main__":
    main()

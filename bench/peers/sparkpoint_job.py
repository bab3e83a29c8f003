"""sparkpoint's variants for ``bench/peers.py``: the example's task API job or its DataFrame step,
on local Spark (``local[2]``), reading the views from the embedded log.

``prepare`` loads ``--data`` into the job's ``pageviews`` stream (untimed, as a peer's input is
produced to its broker beforehand); ``run`` is the timed part: the job from a cold start (Spark
session included) until caught up, then the final counts from the committed store.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PATHS = [str(HERE), str(ROOT / "examples" / "pageviews")]
sys.path[:0] = PATHS
os.environ["PYTHONPATH"] = os.pathsep.join([*PATHS, os.environ.get("PYTHONPATH", "")])
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from common import arguments, partitions, write_result  # noqa: E402

from sparkpoint.config import Config, load_config, read_job_file  # noqa: E402
from sparkpoint.system.base import Record, StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402


def job_config(args: object, extra: dict[str, str]) -> Config:
    work: Path = args.work
    values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
    values.update(
        {
            "job.data.dir": str(work / "job"),
            "task.class": "sparkpoint_tasks:MarkedCounter",
            "task.commit.ms": str(args.checkpoint_ms),
            "bench.work": str(work),
            **extra,
        }
    )
    return load_config(None, values)


def prepare(config: Config, data: Path) -> None:
    systems = Systems(config)
    files = partitions(data)
    systems.admin("filelog").create_stream(StreamSpec("pageviews", len(files)))
    producer = systems.producer("filelog")
    for p, path in enumerate(files):
        with path.open("rb") as f:
            for line in f:
                value = line.rstrip(b"\n")
                user = json.loads(value)["user"].encode()
                producer.send("pageviews", p, Record("", user, value, 0))
    producer.flush()
    producer.close()


def run(config: Config, api: str) -> None:
    from sparkpoint.runtime.coordinator import JobCoordinator
    from sparkpoint.runtime.pipeline import DataFrameRunner, Pipeline
    from sparkpoint.runtime.spark import SparkRunner, spark_session

    spark = spark_session(config, "local[2]")
    if api == "task":
        runner: object = SparkRunner(spark)
    else:
        from sparkpoint_tasks import per_view

        pipeline = Pipeline(per_view, config.to_dict(), "user STRING, page STRING, ts LONG")
        runner = DataFrameRunner(spark, pipeline, config)
    coordinator = JobCoordinator(config, runner)  # type: ignore[arg-type]
    try:
        coordinator.run(until_caught_up=True)
    finally:
        coordinator.close()


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("step", choices=["prepare", "run"])
    parser.add_argument("--api", choices=["task", "dataframe"], default="task")
    parser.add_argument("--set", action="append", default=[], help="extra config key=value")
    args = parser.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.set)
    config = job_config(args, extra)
    if args.step == "prepare":
        prepare(config, args.data)
        return
    run(config, args.api)
    finished = time.time()
    from sparkpoint.tools.state import committed_entries

    counts = {str(k): int(v) for _t, k, v in committed_entries(config, "user-counts")}
    write_result(args, counts, finished=finished)


if __name__ == "__main__":
    main()

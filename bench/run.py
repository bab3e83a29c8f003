"""Benchmark: the example page-view job on N events (default 1M) on local Spark.

Prints events/s per core, and the per-batch overhead of Spark scheduling as a share of batch time
(batch wall time on the driver minus the slowest task's own time, over the batch wall time).
Usage: ``make bench`` or ``.venv/bin/python bench/run.py [--events N] [--batch M] [--cores C]
[--partitions P]`` (P tasks).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "pageviews"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "examples" / "pageviews"), os.environ.get("PYTHONPATH", "")]
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from generate import write  # noqa: E402

from sparkpoint.config import load_config, read_job_file  # noqa: E402
from sparkpoint.runtime.driver.coordinator import JobCoordinator  # noqa: E402
from sparkpoint.runtime.spark.session import SparkRunner, spark_session  # noqa: E402
from sparkpoint.system.base import StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--batch", type=int, default=50_000, help="messages per partition per batch"
    )
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=4, help="input partitions = tasks")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-") as tmp:
        values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
        values.update(
            {
                "job.data.dir": tmp,
                "task.batch.max.messages": str(args.batch),
                "task.commit.ms": "10000",
            }
        )
        config = load_config(None, values)
        Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", args.partitions))
        job_file = Path(tmp) / "job.json"
        job_file.write_text(__import__("json").dumps(config.to_dict()))
        t0 = time.perf_counter()
        write(str(job_file), args.events, seed=1, users=10_000)
        gen = time.perf_counter() - t0
        spark = spark_session(config, f"local[{args.cores}]")
        coordinator = JobCoordinator(config, SparkRunner(spark.sparkContext))
        coordinator.start()
        summary = coordinator.run(until_caught_up=True)
        coordinator.close()
        spark.stop()
    rate = summary.processed / summary.seconds
    # executor time the tasks themselves took, spread over the cores, versus the batch wall time
    busy = summary.task_seconds / args.cores
    overhead = 1 - busy / summary.batch_seconds if summary.batch_seconds else 0.0
    print(f"events:                 {summary.processed:,} (generated in {gen:.1f}s)")
    print(
        f"batches:                {summary.batches} ({args.batch:,} msgs/partition max), "
        f"commits {summary.commits}"
    )
    print(f"wall time:              {summary.seconds:.1f}s on local[{args.cores}]")
    print(
        f"throughput:             {rate:,.0f} events/s = {rate / args.cores:,.0f} events/s per core"
    )
    print(
        f"scheduling overhead:    {overhead:.1%} of batch time "
        f"(batch {summary.batch_seconds / summary.batches:.2f}s avg wall, "
        f"task work {busy / summary.batches:.2f}s avg per core)"
    )


if __name__ == "__main__":
    main()

"""Benchmark: cost as the task count grows (issue 35), side by side in one run.

The example page-view job on the same ``--events`` page views (default 1M) with 4, 16, 64 and
256 tasks (input partitions), on local Spark (``local[2]``) and on a standalone cluster of two
workers of one core each (loopback), one Spark session per mode, warmed up by a short run
first. A batch reads up to ``--batch`` views per partition (``task.batch.max.messages``, 50,000
as ``bench/run.py``): the views are keyed by user and a few users view a lot, so a smaller
limit would give many tasks' runs many more batches (the hot partition's), and measure that.

Printed per mode and task count: events/s, batches, the per-batch driver overhead (a batch's
wall time minus its tasks' own work spread over the cores) and events/s as a ratio of the same
mode's 4-task run (the target: 256 tasks at 0.8x or more). ``--plot FILE`` also writes the
events/s per task count as a PNG (matplotlib, when installed).

Usage: ``make bench-scale`` or
``.venv/bin/python bench/scale.py [--events N] [--tasks 4,16,64,256] [--modes local,cluster]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from plots import figure  # bench/plots.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "pageviews"
CORES = 2  # local[2], or two workers of one core


def run_mode(mode: str, tasks: list[int], events: int, batch: int) -> None:
    """One mode's runs, in this process (one Spark session): a JSON line per task count."""
    sys.path.insert(0, str(EXAMPLE))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(EXAMPLE), os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from generate import write

    from sparkpoint.config import load_config, read_job_file
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.runtime.spark.locality import live_executors
    from sparkpoint.runtime.spark.session import SparkRunner, spark_session
    from sparkpoint.system.base import StreamSpec
    from sparkpoint.system.registry import Systems
    from sparkpoint.testing.spark_cluster import StandaloneCluster

    with tempfile.TemporaryDirectory(prefix="sparkpoint-scale-") as tmp:
        cluster = None
        if mode == "cluster":
            cluster = StandaloneCluster(Path(tmp) / "cluster", workers=CORES, cores=1)
            cluster.__enter__()
        try:
            master = cluster.master_url if cluster else f"local[{CORES}]"
            spark = None
            # a warm-up run first (not printed): the first run of a session pays for
            # starting the executors' Python workers and the JVM's JIT
            for i, n in enumerate([tasks[0], *tasks]):
                values = read_job_file(EXAMPLE / "job.yaml")
                values.update(
                    {
                        "job.data.dir": f"{tmp}/job-{i}-{n}",
                        "task.batch.max.messages": str(batch),
                        "task.commit.ms": "10000",
                        "spark.cores.max": str(CORES),
                        "spark.executor.memory": "1g",
                    }
                )
                config = load_config(None, values)
                Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", n))
                job_file = Path(tmp) / f"job-{i}-{n}.json"
                job_file.write_text(json.dumps(config.to_dict()))
                write(str(job_file), events if i else events // 10, seed=1, users=10_000)
                # the input on disk before the run: else the job's first fsync (ext4 commits
                # its journal with the data written before) waits for the generator's 100 MB,
                # and each run's figure depends on how much of it the kernel wrote back
                os.sync()
                if spark is None:
                    spark = spark_session(config, master)
                    if cluster is not None:  # both executors up before the first run
                        deadline = time.monotonic() + 120
                        while len(live_executors(spark.sparkContext)) < CORES:
                            if time.monotonic() > deadline:
                                raise SystemExit("the cluster's executors did not register")
                            time.sleep(0.5)
                coordinator = JobCoordinator(config, SparkRunner(spark.sparkContext))
                coordinator.start()
                summary = coordinator.run(until_caught_up=True)
                coordinator.close()
                if i == 0:
                    continue
                busy = summary.task_seconds / CORES
                overhead = (summary.batch_seconds - busy) / max(1, summary.batches)
                line = {
                    "mode": mode,
                    "tasks": n,
                    "events": summary.processed,
                    "seconds": summary.seconds,
                    "batches": summary.batches,
                    "overhead": overhead,
                }
                print(json.dumps(line), flush=True)
            if spark is not None:
                spark.stop()
        finally:
            if cluster is not None:
                cluster.__exit__(None, None, None)


def plot(rows: list[dict[str, float]], path: str) -> None:
    with figure(path) as ax:
        if ax is None:
            return
        for mode in sorted({str(r["mode"]) for r in rows}):
            mine = [r for r in rows if r["mode"] == mode]
            ax.plot([r["tasks"] for r in mine], [r["events"] / r["seconds"] for r in mine], "o-")
            ax.lines[-1].set_label(mode)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tasks")
        ax.set_ylabel("events/s")
        ax.legend()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50_000, help="views per partition per batch")
    parser.add_argument("--tasks", default="4,16,64,256")
    parser.add_argument("--modes", default="local,cluster")
    parser.add_argument("--plot", default="")
    parser.add_argument("--mode", help=argparse.SUPPRESS)  # a child process: one mode
    args = parser.parse_args()
    tasks = [int(t) for t in args.tasks.split(",")]
    if args.mode:
        run_mode(args.mode, tasks, args.events, args.batch)
        return
    rows: list[dict[str, float]] = []
    for mode in args.modes.split(","):
        child = [sys.executable, __file__, "--mode", mode, "--tasks", args.tasks]
        child += ["--events", str(args.events), "--batch", str(args.batch)]
        proc = subprocess.run(child, capture_output=True, text=True)
        found = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        if proc.returncode != 0 or len(found) != len(tasks):
            sys.exit(f"{mode} runs failed:\n{proc.stderr[-3000:]}")
        rows += found
    print(
        f"{args.events:,} page views, up to {args.batch:,} per partition per batch, {CORES} cores"
    )
    print(f"{'mode':8} {'tasks':>5} {'events/s':>10} {'batches':>7} {'overhead/batch':>14} ratio")
    for mode in args.modes.split(","):
        mine = [r for r in rows if r["mode"] == mode]
        base = mine[0]["events"] / mine[0]["seconds"]
        for r in mine:
            rate = r["events"] / r["seconds"]
            print(
                f"{mode:8} {r['tasks']:>5} {rate:>10,.0f} {r['batches']:>7} "
                f"{r['overhead']:>13.2f}s {rate / base:.2f}x"
            )
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()

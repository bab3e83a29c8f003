"""Benchmark: durable timers in the task API, against the same job without them, side by side.

The same events (N views over K users) run through three tasks in one Spark session, each
keeping a count per user in RocksDB:

* ``count``: the count alone (the example's work, without its output);
* ``count + timer``: and one processing-time timer per view (key ``user@offset``, due at once),
  which fires at the end of its batch: N timers registered, fired and deleted, all logged to
  the timer store's changelog and committed;
* ``count + idle timer``: and one idle timer per user, moved on every view (a list, a delete
  and a register per view: the idle-session pattern of docs/time.md).

Printed: events/s and timers fired per second of each, and the ratio to ``count``. Usage:
``make bench-timers`` or ``.venv/bin/python bench/timers.py [--events N] [--users K]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "examples" / "pageviews", ROOT / "bench"):
    sys.path.insert(0, str(extra))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "examples" / "pageviews"), str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")]
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from generate import write  # noqa: E402

from sparkpoint.config import Config, load_config, read_job_file  # noqa: E402
from sparkpoint.runtime.driver.coordinator import JobCoordinator  # noqa: E402
from sparkpoint.runtime.spark.session import SparkRunner, spark_session  # noqa: E402
from sparkpoint.system.base import StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402
from sparkpoint.tools.state import committed_entries  # noqa: E402

VARIANTS = {
    "count": "timer_tasks:Count",
    "count + timer": "timer_tasks:CountAndFire",
    "count + idle timer": "timer_tasks:CountAndIdle",
}


def run(spark: Any, tmp: Path, name: str, task: str, args: argparse.Namespace) -> dict[str, float]:
    values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
    slug = name.replace(" ", "").replace("+", "-")
    values.update(
        {
            "job.name": f"timers-{slug}",
            "job.data.dir": str(tmp / slug),
            "task.class": task,
            "task.batch.max.messages": "25000",
            "task.commit.ms": "5000",
            "stores.timers.factory": "rocksdb",
            "stores.timers.changelog": "filelog.timers-changelog",
            "stores.fired.factory": "rocksdb",
            "stores.fired.msg.serde": "integer",
            "task.timers.store": "timers",
        }
    )
    config: Config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    job_file = tmp / f"{slug}.json"
    job_file.write_text(json.dumps(config.to_dict()))
    write(str(job_file), args.events, seed=5, users=args.users)
    coordinator = JobCoordinator(config, SparkRunner(spark.sparkContext))
    coordinator.start()
    started = time.perf_counter()
    summary = coordinator.run(until_caught_up=True)
    seconds = time.perf_counter() - started
    coordinator.close()
    fired = sum(int(v) for _t, _k, v in committed_entries(config, "fired"))
    return {"rate": summary.processed / seconds, "fired": fired / seconds, "count": fired}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=10_000)
    args = parser.parse_args()
    spark = spark_session(Config({"job.name": "bench-timers"}), "local[2]")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-timers-") as tmp_name:
        tmp = Path(tmp_name)
        warm = argparse.Namespace(**{**vars(args), "events": 20_000})
        (tmp / "warm").mkdir()
        run(spark, tmp / "warm", "count + timer", VARIANTS["count + timer"], warm)
        for name, task in VARIANTS.items():
            results[name] = run(spark, tmp, name, task, args)
            print(f"{name:<20} {results[name]['rate']:>10,.0f} events/s", flush=True)
    spark.stop()
    base = results["count"]["rate"]
    print(f"\n{args.events:,} views over {args.users:,} users, local[2]")
    print(f"{'variant':<20} {'events/s':>10} {'timers fired/s':>15} {'vs count':>9}")
    for name, r in results.items():
        print(f"{name:<20} {r['rate']:>10,.0f} {r['fired']:>15,.0f} {r['rate'] / base:>8.2f}x")
    if results["count + timer"]["count"] != args.events:
        raise SystemExit(f"{results['count + timer']['count']:,} timers fired, not {args.events:,}")


if __name__ == "__main__":
    main()

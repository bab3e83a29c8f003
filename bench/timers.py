"""Benchmark: durable timers in the task API, against the same job without them, side by side.

The same events (N views over K users) run through three tasks in one Spark session, each
keeping a count per user in RocksDB:

* ``count``: the count alone (the example's work, without its output);
* ``count + timer``: and one processing-time timer per view (key ``user@offset``, due at once),
  which fires at the end of its batch: N timers registered, fired and deleted, all logged to
  the timer store's changelog and committed;
* ``count + idle timer``: and one idle timer per user, moved on every view (a list, a delete
  and a register per view);
* ``count + idle replace``: the same idle timer moved by ``timers.replace`` (one read and one
  write per view: the idle-session pattern of docs/time.md).

Then Spark's own ``transformWithStateInPandas`` (RocksDB state store, ``bench/sss_baseline.py``)
does the same work on the same events in the same session, in batches of the same size: the
count alone, and the count with the idle timer moved on each batch of a user's views
(``listTimers``, ``deleteTimer``, ``registerTimer``: Spark calls timers per key and batch, not
per view).

Printed: events/s and timers fired per second of each, the ratio to ``count``, and sparkpoint's
idle timer against Spark's (target: at least 2x). Usage: ``make bench-timers`` or
``.venv/bin/python bench/timers.py [--events N] [--users K] [--no-spark]``.
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

from generate import events, write  # noqa: E402
from sss_baseline import run_query, write_input  # noqa: E402

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
    "count + idle replace": "timer_tasks:CountAndReplace",
}
BATCH_PER_TASK = 25_000  # task.batch.max.messages; a batch of the 4 tasks reads 100,000
SPARK = {"spark tWS count": "transform", "spark tWS + idle timer": "transform-idle"}


def run_spark(spark: Any, tmp: Path, name: str, api: str, args: argparse.Namespace) -> float:
    """Spark's ``transformWithStateInPandas`` on the same events (checked); its events/s."""
    root = tmp / api
    views = list(events(args.events, 5, args.users))
    write_input(views, root / "input", 4 * BATCH_PER_TASK)  # one file per batch
    result = run_query(spark, root, partitions=4, api=api)
    counts = result["counts"]
    assert isinstance(counts, dict)
    if sum(counts.values()) != args.events:
        raise SystemExit(f"{name}: the counts sum to {sum(counts.values()):,}")
    return args.events / float(str(result["seconds"]))


def run(spark: Any, tmp: Path, name: str, task: str, args: argparse.Namespace) -> dict[str, float]:
    values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
    slug = name.replace(" ", "").replace("+", "-")
    values.update(
        {
            "job.name": f"timers-{slug}",
            "job.data.dir": str(tmp / slug),
            "task.class": task,
            "task.batch.max.messages": str(BATCH_PER_TASK),
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
    parser.add_argument(
        "--no-spark", action="store_true", help="skip Spark's transformWithStateInPandas"
    )
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
            print(f"{name:<22} {results[name]['rate']:>10,.0f} events/s", flush=True)
        for name, api in {} if args.no_spark else SPARK.items():
            rate = run_spark(spark, tmp, name, api, args)
            results[name] = {"rate": rate, "fired": 0.0, "count": 0}
            print(f"{name:<22} {rate:>10,.0f} events/s", flush=True)
    spark.stop()
    base = results["count"]["rate"]
    print(f"\n{args.events:,} views over {args.users:,} users, local[2]")
    print(f"{'variant':<22} {'events/s':>10} {'timers fired/s':>15} {'vs count':>9}")
    for name, r in results.items():
        print(f"{name:<22} {r['rate']:>10,.0f} {r['fired']:>15,.0f} {r['rate'] / base:>8.2f}x")
    if not args.no_spark:
        ours, theirs = results["count + idle replace"]["rate"], results["spark tWS + idle timer"]
        print(
            f"idle timer, sparkpoint / Spark transformWithStateInPandas: "
            f"{ours / theirs['rate']:.2f}x (target >= 2x); the count alone: "
            f"{base / results['spark tWS count']['rate']:.2f}x"
        )
    if results["count + timer"]["count"] != args.events:
        raise SystemExit(f"{results['count + timer']['count']:,} timers fired, not {args.events:,}")


if __name__ == "__main__":
    main()

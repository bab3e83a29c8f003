"""Benchmark: the example page-view count with and without a store TTL, side by side.

The same job (task API, RocksDB, local Spark) runs twice in one Spark session on the same
events: once as it is, once with ``stores.user-counts.rocksdb.ttl.ms``. The events mix 90% of
keys viewed all through the run with 10% viewed only in its first tenth; the TTL (default 4 s,
far longer than the gap between two views of a steady key) expires those 10% during the run,
and commits every second sweep them. Printed: events/s of each and their ratio (target: TTL at
least 0.8x), the store's visible keys at the end (checked: exactly the steady ones with the
TTL), and the store's size on disk. Usage: ``make bench-ttl`` or
``.venv/bin/python bench/ttl.py [--events N] [--keys K] [--ttl-ms T]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "pageviews"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "examples" / "pageviews"), os.environ.get("PYTHONPATH", "")]
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from generate import write  # noqa: E402

from sparkpoint.config import Config, load_config, read_job_file  # noqa: E402
from sparkpoint.runtime.driver.coordinator import JobCoordinator  # noqa: E402
from sparkpoint.runtime.spark.session import SparkRunner, spark_session  # noqa: E402
from sparkpoint.system.base import StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402
from sparkpoint.tools.state import committed_entries  # noqa: E402


def views(n: int, keys: int, seed: int) -> Iterator[dict[str, object]]:
    """``n`` views: 90% of ``keys`` all through, 10% only in the first tenth of the views."""
    rng = random.Random(seed)
    steady, brief = int(keys * 0.9), keys - int(keys * 0.9)
    for i in range(n):
        if i < n // 10 and i % 2 == 0:
            user = f"brief-{rng.randrange(brief):06d}"
        else:
            user = f"steady-{rng.randrange(steady):06d}"
        yield {"user": user, "page": "/", "ts": 1_700_000_000_000 + i}


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(
    spark: Any, tmp: Path, name: str, args: argparse.Namespace, ttl: int | None
) -> dict[str, Any]:
    values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
    values.update(
        {
            "job.name": f"ttl-{name}",
            "job.data.dir": str(tmp / name),
            "task.batch.max.messages": "25000",
            "task.commit.ms": "1000",
        }
    )
    if ttl is not None:
        values["stores.user-counts.rocksdb.ttl.ms"] = str(ttl)
    config: Config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    job_file = tmp / f"{name}.json"
    job_file.write_text(json.dumps(config.to_dict()))
    write(str(job_file), args.events, 0, 0, source=views(args.events, args.keys, args.seed))
    coordinator = JobCoordinator(config, SparkRunner(spark.sparkContext))
    coordinator.start()
    started = time.perf_counter()
    summary = coordinator.run(until_caught_up=True)
    seconds = time.perf_counter() - started
    coordinator.close()
    visible = [str(key) for _task, key, _count in committed_entries(config, "user-counts")]
    return {
        "rate": summary.processed / seconds,
        "visible": len(visible),
        "brief": sum(1 for k in visible if k.startswith("brief-")),
        "disk": disk_bytes(config.store_base_dir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--ttl-ms", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    spark = spark_session(Config({"job.name": "bench-ttl"}), "local[2]")
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-ttl-") as tmp_name:
        tmp = Path(tmp_name)
        warm = argparse.Namespace(**{**vars(args), "events": 20_000})
        run(spark, tmp, "warm-up", warm, None)  # JVM, Python workers, imports: untimed
        plain = run(spark, tmp, "no-ttl", args, None)
        with_ttl = run(spark, tmp, "ttl", args, args.ttl_ms)
    spark.stop()
    print(
        f"\n{args.events:,} views over {args.keys:,} keys (10% only in the first tenth), local[2]"
    )
    print(
        f"{'variant':<16} {'events/s':>10} {'visible keys':>13} {'of them brief':>14} {'disk':>10}"
    )
    for name, r in (("no TTL", plain), (f"TTL {args.ttl_ms} ms", with_ttl)):
        print(
            f"{name:<16} {r['rate']:>10,.0f} {r['visible']:>13,} {r['brief']:>14,} "
            f"{r['disk'] / 2**20:>6.1f} MiB"
        )
    print(f"TTL / no TTL events/s: {with_ttl['rate'] / plain['rate']:.2f}x (target >= 0.8x)")
    if with_ttl["brief"] or not plain["brief"]:
        raise SystemExit("the brief keys must be visible without the TTL and expired with it")


if __name__ == "__main__":
    main()

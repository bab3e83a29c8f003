"""Benchmark: commits and restores (issue 4), all measured side by side in one run.

1. Processing throughput of the page-view job on local Spark with no backup, with a backend
   whose upload takes 500 ms committed asynchronously, and the same committed synchronously.
2. The processing pause of a commit (its synchronous phase: flush, RocksDB checkpoint, changelog
   snapshot) for stores of about 100 MB and 1 GB.
3. Changelog restore time for the same stores.

Usage: ``make bench-commit`` or ``.venv/bin/python bench/commit.py [--sizes-mb 100,1000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
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

from sparkpoint.checkpoint.checkpoint import CheckpointV2  # noqa: E402
from sparkpoint.checkpoint.id import CheckpointId  # noqa: E402
from sparkpoint.config import Config, load_config, read_job_file  # noqa: E402
from sparkpoint.model import SystemStreamPartition, TaskModel, TaskName  # noqa: E402
from sparkpoint.runtime.driver.coordinator import JobCoordinator  # noqa: E402
from sparkpoint.runtime.spark.session import SparkRunner, spark_session  # noqa: E402
from sparkpoint.storage.backend import BackendContext  # noqa: E402
from sparkpoint.storage.changelog.backend import (  # noqa: E402
    ChangelogBackupManager,
    ChangelogRestoreManager,
)
from sparkpoint.storage.kv.rocksdb import RocksDBEngine  # noqa: E402
from sparkpoint.storage.local import LocalTaskState  # noqa: E402
from sparkpoint.system.base import StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402
from sparkpoint.testing.backends import NAME as COPY  # noqa: E402


def job_config(tmp: str, **extra: str) -> Config:
    values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
    values.update({"job.data.dir": tmp, "task.batch.max.messages": "10000", **extra})
    return load_config(None, values)


CHANGELOG = "s-changelog"


def store_job(tmp: str) -> tuple[Config, TaskModel]:
    """A job with one RocksDB store ``s`` logged to ``filelog.s-changelog`` (created), and the
    task whose store the benchmarks fill and restore."""
    config = job_config(
        tmp, **{"stores.s.factory": "rocksdb", "stores.s.changelog": f"filelog.{CHANGELOG}"}
    )
    Systems(config).admin("filelog").create_stream(StreamSpec(CHANGELOG, 1, compacted=True))
    return config, TaskModel(TaskName("Partition 0"), frozenset(), 0)


def throughput(spark: object, events: int) -> dict[str, float]:
    modes = {
        "no backup": {},
        "500 ms upload, async": {"task.commit.async.enabled": "true"},
        "500 ms upload, sync": {"task.commit.async.enabled": "false"},
    }
    rates = {}
    for name, extra in modes.items():
        with tempfile.TemporaryDirectory(prefix="sp-bench-") as tmp:
            backend = (
                {
                    "stores.user-counts.backup.factories": COPY,
                    "testing.copy.dir": f"{tmp}/copies",
                    "testing.copy.delay.ms": "500",
                }
                if extra
                else {}
            )
            config = job_config(tmp, **{"task.commit.ms": "500", **backend, **extra})
            Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
            job_file = Path(tmp) / "job.json"
            job_file.write_text(json.dumps(config.to_dict()))
            write(str(job_file), events, seed=1, users=10_000)
            coordinator = JobCoordinator(config, SparkRunner(spark.sparkContext))
            summary = coordinator.run(until_caught_up=True)
            coordinator.close()
            rates[name] = summary.processed / summary.seconds
            print(f"  {name:<24} {rates[name]:>10,.0f} events/s  ({summary.commits} commits)")
    return rates


def fill_store(
    config: Config, task: TaskModel, size_mb: int, value_bytes: int = 1000
) -> tuple[LocalTaskState, int]:
    """A RocksDB store of about ``size_mb`` MB written through the changelog backend, compacted
    (a settled LSM tree, as a store is after running a while)."""
    local = LocalTaskState(config.store_base_dir, task.name)
    engine = RocksDBEngine("s", local.store_dir("s"))
    ctx = BackendContext(config, task, ["s"], Systems(config), local, {"s": engine})
    backup = ChangelogBackupManager(ctx)
    logged = backup.wrap_engine("s", engine)
    vb = value_bytes
    value = os.urandom(vb)
    n = size_mb * 1_000_000 // vb
    for start in range(0, n, 5000):
        # incompressible values, so the store really is about size_mb on disk
        block = os.urandom(vb * 5000)
        logged.write_batch(
            (f"key-{i:09d}".encode(), block[(i - start) * vb : (i - start + 1) * vb])
            for i in range(start, min(n, start + 5000))
        )
    backup.snapshot(CheckpointId.create())
    engine.flush()
    engine.compact()
    # the pause a commit makes: flush + local RocksDB checkpoint + changelog snapshot
    pauses = []
    for _ in range(5):
        logged.put(b"key-extra", value)
        t0 = time.perf_counter()
        engine.flush()
        cid = CheckpointId.create()
        engine.checkpoint(local.checkpoint_dir("s", str(cid)))
        backup.snapshot(cid)
        pauses.append(time.perf_counter() - t0)
    backup.close()
    engine.close()
    pause_ms = sorted(pauses)[len(pauses) // 2] * 1000
    return local, int(pause_ms * 1000)


def change_one_percent(local: LocalTaskState, entries: int, value_bytes: int) -> CheckpointId:
    """New values for 1% of the ``entries`` keys a :func:`fill_store` store holds, flushed and
    checkpointed locally (as a commit would): the new checkpoint's id."""
    engine = RocksDBEngine("s", local.store_dir("s"))
    keys = random.Random(1).sample(range(entries), max(1, entries // 100))
    engine.write_batch((f"key-{i:09d}".encode(), os.urandom(value_bytes)) for i in keys)
    engine.flush()
    cid = CheckpointId.create()
    engine.checkpoint(local.checkpoint_dir("s", str(cid)))
    engine.close()
    return cid


def restore(config: Config, task: TaskModel, local: LocalTaskState) -> tuple[float, int]:
    shutil.rmtree(local.store_dir("s"))
    ctx = BackendContext(
        config,
        task,
        ["s"],
        Systems(config),
        local,
        openers={"s": lambda: RocksDBEngine("s", local.store_dir("s"))},
    )
    manager = ChangelogRestoreManager(ctx)
    ssp = SystemStreamPartition("filelog", CHANGELOG, 0)
    meta = Systems(config).admin("filelog").get_metadata([ssp])[ssp]
    from sparkpoint.storage.changelog.marker import ChangelogMarker

    marker = ChangelogMarker(ssp, meta.newest).dumps()
    manager.init(CheckpointV2(CheckpointId.create(), {}, {"changelog": {"s": marker}}))
    t0 = time.perf_counter()
    stats = manager.restore()
    seconds = time.perf_counter() - t0
    ctx.engine("s").close()
    return seconds, stats[0].entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--sizes-mb", default="100,1000")
    args = parser.parse_args()
    print(f"1. throughput, page-view job on {args.events:,} events, local[2], commit every 500 ms")
    with tempfile.TemporaryDirectory(prefix="sp-bench-") as tmp:
        spark = spark_session(job_config(tmp), "local[2]")
        rates = throughput(spark, args.events)
        spark.stop()
    base = rates["no backup"]
    print(
        f"  async / no backup = {rates['500 ms upload, async'] / base:.2f}   "
        f"sync / no backup = {rates['500 ms upload, sync'] / base:.2f}"
    )
    print("2-3. commit pause and changelog restore by store size")
    for size in (int(s) for s in args.sizes_mb.split(",")):
        with tempfile.TemporaryDirectory(prefix="sp-bench-") as tmp:
            config, task = store_job(tmp)
            t0 = time.perf_counter()
            local, pause_us = fill_store(config, task, size)
            fill = time.perf_counter() - t0
            on_disk = sum(f.stat().st_size for f in local.store_dir("s").rglob("*") if f.is_file())
            seconds, entries = restore(config, task, local)
            print(
                f"  {size:>5} MB of values ({on_disk / 1e6:,.0f} MB on disk, "
                f"{entries:,} entries): "
                f"commit pause {pause_us / 1000:.1f} ms (median of 5); "
                f"changelog restore {seconds:.1f}s ({entries / seconds:,.0f} entries/s); "
                f"fill {fill:.0f}s"
            )


if __name__ == "__main__":
    main()

"""Benchmark: host affinity on a 2-worker Spark standalone cluster, placement on and off, side
by side in one run (issue 12).

The example job (page views per user) with ballast: its first batch writes about
``--state-mb`` MB of random values per task into a second RocksDB store, backed up to a
changelog like ``user-counts``; the following batches count page views. Every executor keeps
its stores in its own working directory (``job.logged.store.base.dir={cwd}/state``), as on a
cluster without shared disks. A task that runs where its state is not restores it from the
changelog. Printed per mode: batches, task restores after the first batch, restore seconds and
bytes, events/s after the first batch, and the ratio of the two modes' events/s.

Usage: ``make bench-affinity`` or
``.venv/bin/python bench/host_affinity.py [--state-mb 250] [--batches 20]``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sparkpoint.config import load_config
from sparkpoint.model import SystemStream
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import ensure_stream
from sparkpoint.testing.spark_cluster import StandaloneCluster

HERE = Path(__file__).resolve().parent
JOB = HERE / "affinity" / "job.yaml"  # the example's job with a ballast store
PARTITIONS = 4
VALUE_BYTES = 10_000  # as in affinity/ballast_task.py
FILL_PER_MESSAGE = 1_000  # ballast values written per fill message


def job_sets(data: Path, per_batch: int, placement: bool) -> list[str]:
    return [
        f"job.data.dir={data}",
        "job.logged.store.base.dir={cwd}/state",
        f"task.batch.max.messages={per_batch}",
        "task.commit.ms=0",
        "stores.user-counts.changelog=filelog.user-counts-changelog",
        "stores.ballast.changelog=filelog.ballast-changelog",
        f"job.host-affinity.enabled={str(placement).lower()}",
        "spark.executor.memory=2g",
        "spark.executor.cores=1",
    ]


def write_input(sets: list[str], fills: int, per_batch: int, batches: int) -> int:
    """Per partition: ``fills`` fill messages, then page views for the remaining batches."""
    config = load_config(JOB, dict(s.split("=", 1) for s in sets))
    systems = Systems(config)
    ss = SystemStream("filelog", "pageviews")
    ensure_stream(config, systems, ss)
    producer = systems.producer("filelog")
    total = 0
    for p in range(PARTITIONS):
        views = per_batch * batches - fills
        records = [
            Record("", b"fill", json.dumps({"fill": FILL_PER_MESSAGE}).encode(), 0)
            for _ in range(fills)
        ]
        records += [
            Record("", f"u{i % 500}".encode(), json.dumps({"user": f"u{i % 500}"}).encode(), i)
            for i in range(views)
        ]
        producer.send_many(ss.stream, p, records)
        total += len(records)
    producer.close()
    systems.close()
    return total


def run_mode(cluster: StandaloneCluster, work: Path, args: argparse.Namespace, on: bool) -> dict:
    data = work / ("on" if on else "off")
    fills = max(1, args.state_mb * 1_000_000 // (VALUE_BYTES * FILL_PER_MESSAGE))
    per_batch = max(args.per_batch, fills)
    sets = job_sets(data, per_batch, on)
    events = write_input(sets, fills, per_batch, args.batches)
    cmd = [str(Path(sys.executable).parent / "sparkpoint"), "run", str(JOB)]
    cmd += ["--until-caught-up", "--master", cluster.master_url]
    cmd += [a for s in sets for a in ("--set", s)]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE / "affinity")
    wall = time.monotonic() - t0
    if out.returncode != 0:
        raise SystemExit(f"run failed ({'on' if on else 'off'}):\n{out.stderr[-4000:]}")
    text = out.stderr
    (args.logs / f"{'on' if on else 'off'}.log").write_text(text)
    lines = re.findall(r"^batch (\d+): (\d+) msgs in ([\d.]+)s(.*)$", text, re.M)
    later = [(int(n), int(m), float(s), rest) for n, m, s, rest in lines if int(n) > 1]
    restores_later = sum(
        int(m.group(1)) for *_, r in later if (m := re.search(r"(\d+) restored", r))
    )
    summary = re.search(r"(\d+) task restores \(([\d,]+) bytes, ([\d.]+)s\)", text)
    assert summary, text[-3000:]
    msgs = sum(m for _, m, _, _ in later)
    secs = sum(s for _, _, s, _ in later)
    return {
        "mode": "placement on" if on else "placement off",
        "events": events,
        "batches": len(lines),
        "restores after batch 1": restores_later,
        "restore seconds": float(summary.group(3)),
        "restored MB": int(summary.group(2).replace(",", "")) / 1e6,
        "events/s after batch 1": msgs / secs if secs else 0.0,
        "wall seconds": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-mb", type=int, default=250, help="ballast per task")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--per-batch", type=int, default=2_000, help="messages per partition")
    parser.add_argument("--logs", type=Path, default=Path("bench-affinity-logs"))
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sp-bench-affinity-") as tmp:
        work = Path(tmp)
        with StandaloneCluster(work / "cluster", workers=2, cores=1, memory="3g") as cluster:
            results = [run_mode(cluster, work, args, on) for on in (True, False)]
    keys = list(results[0])
    print(f"(each run's output: {args.logs}/on.log, off.log)")
    print(f"host affinity, {PARTITIONS} tasks x {args.state_mb} MB state, 2 workers x 1 core:")
    for key in keys[1:]:
        row = [r[key] for r in results]
        print(
            f"  {key:24s} "
            + "  ".join(f"{v:>14,.2f}" if isinstance(v, float) else f"{v:>14,}" for v in row)
        )
    on, off = results
    if off["events/s after batch 1"]:
        ratio = on["events/s after batch 1"] / off["events/s after batch 1"]
        print(
            f"  events/s on/off: {ratio:.1f}x (target >= 3x); restores after batch 1 with "
            f"placement on: {on['restores after batch 1']} (target 0)"
        )


if __name__ == "__main__":
    main()

"""Benchmark: a long run of the example job, sampled every minute (not in CI).

A real driver (``sparkpoint run``, ``local[2]``, the changelog and a local blob store as
backends) counts page views that a feeder in this process appends at ``--rate`` views a second
for ``--minutes`` minutes. The input and output streams have a retention of ``--retention``
minutes. Every ``--interval`` seconds it samples: the driver's RSS (its Python process), the
JVM's, the Python workers' (summed), the open files of the driver's processes, and the disk
used by streams, checkpoints and metadata, and state (with its blob store). At the end the
driver is stopped (SIGINT: it commits), the committed counts are checked against the views
written, and it prints the samples and the RSS growth after the first 5 minutes (target under
10%). Linux only (it reads ``/proc``). Usage: ``make bench-long`` or ``.venv/bin/python
bench/long.py [--minutes 30]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "pageviews"
sys.path.insert(0, str(EXAMPLE))

from generate import events  # noqa: E402

from sparkpoint.checkpoint.manager import CheckpointManager  # noqa: E402
from sparkpoint.config import Config, load_config  # noqa: E402
from sparkpoint.model import SystemStream  # noqa: E402
from sparkpoint.system.base import Record  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402
from sparkpoint.system.streams import ensure_stream  # noqa: E402

SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")


def settings(data: Path, retention_minutes: int) -> list[str]:
    keep = str(retention_minutes * 60_000)
    return [
        f"job.data.dir={data}",
        "stores.user-counts.changelog=filelog.user-counts-changelog",
        "stores.user-counts.backup.factories=changelog,blobstore",
        "task.commit.ms=10000",
        f"streams.pageviews.retention.ms={keep}",
        f"streams.user-counts.retention.ms={keep}",
    ]


class Feeder(threading.Thread):
    """Appends ``rate`` views a second until stopped; counts what it wrote per user."""

    def __init__(self, job: Path, sets: list[str], rate: int) -> None:
        super().__init__(daemon=True)
        overrides = dict(s.split("=", 1) for s in sets)
        self.config = load_config(job, overrides)
        self.rate = rate
        self.counts: Counter[str] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        systems = Systems(self.config)
        stream = SystemStream("filelog", "pageviews")
        partitions = ensure_stream(self.config, systems, stream)
        admin, producer = systems.admin("filelog"), systems.producer("filelog")
        second = 0
        while not self.stop.is_set():
            started = time.monotonic()
            for view in events(self.rate, second, 10_000):
                key = str(view["user"]).encode()
                value = json.dumps(view, separators=(",", ":")).encode()
                partition = admin.partition_for_key(key, partitions)
                producer.send(
                    "pageviews", partition, Record("", key, value, int(time.time() * 1000))
                )
                self.counts[str(view["user"])] += 1
            producer.flush()
            second += 1
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))
        producer.close()
        systems.close()


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                children = Path(f"/proc/{p}/task/{task}/children").read_text().split()
                todo.extend(int(c) for c in children)
        except OSError:
            continue
    return out


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def open_files(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return total


def disk_mb(path: Path) -> float:
    if not path.exists():
        return 0.0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def sample(driver: int, data: Path) -> dict[str, float]:
    pids = descendants(driver)
    cmd = {p: _cmdline(p) for p in pids}
    jvm = [p for p in pids if "java" in cmd[p].split(" ")[0]]
    workers = [p for p in pids if p != driver and p not in jvm and "python" in cmd[p]]
    state_dirs = [data / "state", data / "blobs"]
    return {
        "driver MB": rss_mb(driver),
        "JVM MB": sum(rss_mb(p) for p in jvm),
        "workers MB": sum(rss_mb(p) for p in workers),
        "workers": len(workers),
        "open files": open_files(pids),
        "streams MB": disk_mb(data / "streams"),
        "state MB": sum(disk_mb(d) for d in state_dirs),
        "all MB": disk_mb(data),
    }


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def caught_up(config: Config, driver: subprocess.Popen[bytes], timeout: float = 300) -> None:
    """Wait until every task's checkpoint covers its input's end (or the driver exits)."""
    systems = Systems(config)
    manager = CheckpointManager(config, systems)
    admin = systems.admin("filelog")
    deadline = time.monotonic() + timeout
    while driver.poll() is None and time.monotonic() < deadline:
        offsets = {s: o for c in manager.read_all().values() for s, o in c.input_offsets.items()}
        ends = admin.get_metadata(list(offsets))
        if offsets and all(int(o) + 1 >= int(ends[s].upcoming) for s, o in offsets.items()):
            return
        time.sleep(1)


def committed(job: Path, sets: list[str]) -> dict[str, int]:
    args = [a for s in sets for a in ("--set", s)]
    out = subprocess.run(
        [SPARKPOINT, "state", "dump", str(job), "--store", "user-counts", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {str(r["key"]): int(r["value"]) for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=int, default=2000, help="views a second (default 2000)")
    parser.add_argument("--interval", type=float, default=60, help="seconds between samples")
    parser.add_argument("--retention", type=int, default=5, help="stream retention, minutes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sp-long-") as tmp:
        data = Path(tmp) / "data"
        job = EXAMPLE / "job.yaml"
        sets = settings(data, args.retention)
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
        env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLE), env.get("PYTHONPATH", "")])
        feeder = Feeder(job, sets, args.rate)
        feeder.start()
        log = open(Path(tmp) / "driver.log", "wb")  # noqa: SIM115 - closed below
        run = [SPARKPOINT, "run", str(job), *[a for s in sets for a in ("--set", s)]]
        driver = subprocess.Popen(run, stdout=log, stderr=subprocess.STDOUT, env=env)
        samples: list[tuple[float, dict[str, float]]] = []
        started = time.monotonic()
        end = started + args.minutes * 60
        try:
            while time.monotonic() < end and driver.poll() is None:
                time.sleep(min(args.interval, max(0.0, end - time.monotonic())))
                row = sample(driver.pid, data)
                samples.append(((time.monotonic() - started) / 60, row))
                print(
                    f"{samples[-1][0]:5.1f} min "
                    + ", ".join(f"{k} {v:,.0f}" for k, v in row.items()),
                    flush=True,
                )
        finally:
            feeder.stop.set()
            feeder.join()
            caught_up(feeder.config, driver)
            driver.send_signal(signal.SIGINT)
            code = driver.wait(300)
            log.close()
        text = (Path(tmp) / "driver.log").read_text(errors="replace")
        if code != 0:
            print(text[-3000:])
            raise SystemExit(f"the driver exited {code}")
        got = committed(job, sets)
        wrong = sum(1 for u, n in feeder.counts.items() if got.get(u) != n)
        views = sum(feeder.counts.values())
    print(f"{views:,} views in {args.minutes:g} min; users whose count is wrong: {wrong}")
    late = [(m, s) for m, s in samples if m >= 5]
    if len(late) >= 2:
        for key in ("driver MB", "JVM MB", "workers MB", "open files"):
            first, last = late[0][1][key], late[-1][1][key]
            growth = (last - first) / first if first else 0.0
            print(
                f"{key}: {first:,.0f} at {late[0][0]:.0f} min -> {last:,.0f} at "
                f"{late[-1][0]:.0f} min ({growth:+.1%}; target under +10%)"
            )
    if wrong:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

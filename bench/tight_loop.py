"""Benchmark: the physical limit of the page-view count in one Python process (issue 15's
reference row), next to sparkpoint's task API on the same events, in one run.

Variants, each on the same JSON-encoded page views, one core, RocksDB state:

* ``loop-per-message``: decode, RocksDB get, +1, RocksDB put, encode the ``{user, count}``
  output, per message: what the task API does per view, with nothing around it;
* ``loop-serde``: ``loop-per-message`` with sparkpoint's JSON serde, whose C encoder and
  scanner are built once (``json.dumps`` builds an encoder per call): what is left is the
  framework's own overhead;
* ``loop-batched``: the same work per batch of 12,500 views, with counts cached per batch and
  written in one ``WriteBatch`` (what a DataFrame step can do);
* ``task-api-inline``: the example's task through sparkpoint's runtime in this process
  (``InlineRunner``: batches, stores, output, commits and checkpoints; no Spark scheduling).

Prints events/s per variant (median of ``--runs``) and the ratios to the loops.
Usage: ``make bench-loop`` or ``.venv/bin/python bench/tight_loop.py [--events N] [--runs R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "pageviews"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from generate import events, write  # noqa: E402
from rocksdict import Options, Rdict, WriteBatch  # noqa: E402

from sparkpoint.config import load_config, read_job_file  # noqa: E402
from sparkpoint.runtime.driver.coordinator import JobCoordinator  # noqa: E402
from sparkpoint.runtime.driver.inline import InlineRunner  # noqa: E402
from sparkpoint.serde import JsonSerde  # noqa: E402
from sparkpoint.system.base import StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402

BATCH = 12_500


def encoded(n: int) -> list[bytes]:
    return [json.dumps(e, separators=(",", ":")).encode() for e in events(n, 3, 10_000)]


def db(path: Path) -> Rdict:
    return Rdict(str(path), Options(raw_mode=True))


def per_message(values: list[bytes], tmp: Path) -> int:
    store, out = db(tmp / "per-message"), []
    for raw in values:
        user = json.loads(raw)["user"].encode()
        old = store.get(user)
        count = (int.from_bytes(old, "big") if old else 0) + 1
        store.put(user, count.to_bytes(8, "big"))
        out.append(json.dumps({"user": user.decode(), "count": count}).encode())
    store.close()
    return len(out)


def per_message_serde(values: list[bytes], tmp: Path) -> int:
    """``per_message`` with sparkpoint's JSON serde (the C encoder and scanner built once) in
    place of ``json.loads``/``json.dumps``: the framework's overhead alone."""
    serde = JsonSerde()
    loads, dumps = serde.from_bytes, serde.to_bytes
    store, out = db(tmp / "per-message-serde"), []
    for raw in values:
        user = loads(raw)["user"].encode()
        old = store.get(user)
        count = (int.from_bytes(old, "big") if old else 0) + 1
        store.put(user, count.to_bytes(8, "big"))
        out.append(dumps({"user": user.decode(), "count": count}))
    store.close()
    return len(out)


def batched(values: list[bytes], tmp: Path) -> int:
    store, sent = db(tmp / "batched"), 0
    for i in range(0, len(values), BATCH):
        users = [json.loads(raw)["user"].encode() for raw in values[i : i + BATCH]]
        distinct = list(dict.fromkeys(users))
        counts = {
            u: int.from_bytes(v, "big") if v else 0
            for u, v in zip(distinct, store.get(distinct), strict=True)
        }
        out = []
        for user in users:
            counts[user] += 1
            out.append(json.dumps({"user": user.decode(), "count": counts[user]}).encode())
        wb = WriteBatch(raw_mode=True)
        for user, count in counts.items():
            wb.put(user, count.to_bytes(8, "big"))
        store.write(wb)
        sent += len(out)
    store.close()
    return sent


def task_api(n: int, tmp: Path) -> tuple[int, float]:
    """(events, seconds) of the example task through the runtime, input written beforehand."""
    values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
    values.update(
        {
            "job.data.dir": str(tmp / "job"),
            "task.batch.max.messages": str(BATCH),
            "task.commit.ms": "1000",
        }
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    job_file = tmp / "job.json"
    job_file.write_text(json.dumps(config.to_dict()))
    write(str(job_file), n, seed=3, users=10_000)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    t0 = time.perf_counter()
    summary = coordinator.run(until_caught_up=True)
    seconds = time.perf_counter() - t0
    coordinator.close()
    return summary.processed, seconds


def timed(fn: Callable[[list[bytes], Path], int], values: list[bytes], tmp: Path) -> float:
    t0 = time.perf_counter()
    n = fn(values, tmp)
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    values = encoded(args.events)
    rates: dict[str, list[float]] = {
        "loop-per-message": [],
        "loop-serde": [],
        "loop-batched": [],
        "task-api": [],
    }
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-loop-") as t:
            tmp = Path(t)
            rates["loop-per-message"].append(timed(per_message, values, tmp))
            rates["loop-serde"].append(timed(per_message_serde, values, tmp))
            rates["loop-batched"].append(timed(batched, values, tmp))
            n, seconds = task_api(args.events, tmp)
            if n != args.events:
                raise SystemExit(f"task API processed {n} events, not {args.events}")
            rates["task-api"].append(n / seconds)
    median = {k: statistics.median(v) for k, v in rates.items()}
    print(f"{'variant':18s} {'events/s (1 core)':>18s} {'range':>22s}")
    for name, r in rates.items():
        print(f"{name:18s} {median[name]:18,.0f} {min(r):10,.0f} - {max(r):,.0f}")
    print(
        f"\ntask API (inline) / per-message loop: "
        f"{median['task-api'] / median['loop-per-message']:.2f}x (issue 15 target: 0.8x per core)"
    )
    print(
        f"task API (inline) / per-message loop with sparkpoint's JSON serde: "
        f"{median['task-api'] / median['loop-serde']:.2f}x (the framework's own overhead)"
    )
    speedup = median["loop-batched"] / median["loop-per-message"]
    print(f"batched loop / per-message loop: {speedup:.2f}x")


if __name__ == "__main__":
    main()

"""Benchmark: per-user 1-minute tumbling counts and 30 s sessions (the windows example), on
sparkpoint's task API and DataFrame API and on Spark Structured Streaming, side by side in one
Spark session on the same events.

* ``task API``: ``examples/windows`` (both windows in one job, watermark lateness 5 s);
* ``DataFrame API``: ``examples/windows/windows_pipeline.py`` (the same, one window step);
* ``Spark SS``: ``groupBy(window(event_time, "1 minute"), user).count()`` and
  ``groupBy(session_window(event_time, "30 seconds"), user)`` with
  ``withWatermark(event_time, "5 seconds")``, two ``availableNow`` queries to Parquet
  (append), RocksDB state store; its time is the two queries' sum;
* ``Bytewax`` (``bench/peers/bytewax_windows.py``): ``fold_window`` over a tumbling and a
  session windower, event-time clock of 5 s lateness, SQLite recovery every second, 2
  processes; timed from its first view to its end;
* ``PyFlink`` (``bench/peers/flink_windows.py``): Flink SQL ``TUMBLE`` and ``SESSION`` window
  counts in one job, watermark 5 s, RocksDB with incremental checkpoints every second,
  parallelism 4; timed from the job's submission to its end.

The peers run in their own virtual envs under ``bench/out/venvs`` (installed on first use, as
``make bench-peers`` does; ``--peers ""`` leaves them out) on the same views as JSON lines, one
file per partition. They close every window at the end of their bounded input, so they are
checked against every window of the reference. Issue 32's target: sparkpoint at 1.5x the
fastest of the others.

Each variant's windows are checked against a plain Python reference
(``examples/windows/windows_reference.py``): every window it emitted has the reference's value,
and it emitted every window its watermark closed (sparkpoint's per task, Spark's global, so
the sets differ at the end only). Batches are 100,000 events. Usage: ``make bench-windows`` or
``.venv/bin/python bench/windows.py [--events N] [--users U] [--peers bytewax,pyflink]``.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WINDOWS = ROOT / "examples" / "windows"
for extra in (ROOT / "examples" / "pageviews", WINDOWS, ROOT / "bench"):
    sys.path.insert(0, str(extra))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [
        str(ROOT / "examples" / "pageviews"),
        str(WINDOWS),
        str(ROOT / "bench"),
        os.environ.get("PYTHONPATH", ""),
    ]
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from generate import events, write  # noqa: E402
from sss_baseline import (  # noqa: E402
    NO_DATA_KEY,
    PARTITIONS_KEY,
    PROVIDER_KEY,
    ROCKSDB_PROVIDER,
    write_input,
)
from windows_pipeline import build  # noqa: E402
from windows_reference import Closed, closed_windows  # noqa: E402

from sparkpoint.config import Config, load_config, read_job_file  # noqa: E402
from sparkpoint.model import SystemStream  # noqa: E402
from sparkpoint.runtime.dataframe.pipeline import Pipeline  # noqa: E402
from sparkpoint.runtime.dataframe.runner import DataFrameRunner  # noqa: E402
from sparkpoint.runtime.driver.coordinator import JobCoordinator  # noqa: E402
from sparkpoint.runtime.spark.session import SparkRunner, spark_session  # noqa: E402
from sparkpoint.system.base import StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402
from sparkpoint.tools.streams import read_json_lines  # noqa: E402

BATCH_PER_TASK = 25_000
#: a peer's name -> (its env in bench/peers/run.py, its script in bench/peers)
PEERS = {"bytewax": ("bytewax", "bytewax_windows.py"), "pyflink": ("flink", "flink_windows.py")}
PEER_NAMES = {"bytewax": "Bytewax", "pyflink": "PyFlink"}
MINUTE = ("user", "window_start", "window_end", "count")
SESSION = ("user", "session_start", "session_end", "views")


def check(name: str, got: set[Closed], want: set[Closed], what: str) -> str:
    """Every emitted window exact, every closed one emitted: or exit naming the difference."""
    wrong, missing = got - want, want - got
    if wrong or missing:
        raise SystemExit(
            f"{name}: {what}: {len(wrong)} emitted windows differ from the reference "
            f"(e.g. {sorted(wrong)[:2]}), {len(missing)} closed ones missing "
            f"(e.g. {sorted(missing)[:2]})"
        )
    return f"{len(got):,} {what}"


def run_sparkpoint(spark: Any, tmp: Path, api: str, args: argparse.Namespace) -> tuple[float, str]:
    values = read_job_file(WINDOWS / "job.yaml")
    values.update(
        {
            "job.name": f"windows-{api}",
            "job.data.dir": str(tmp / api / "data"),
            "task.batch.max.messages": str(BATCH_PER_TASK),
        }
    )
    config: Config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    job_file = tmp / f"{api}.json"
    job_file.write_text(json.dumps(config.to_dict()))
    write(str(job_file), args.events, seed=5, users=args.users)
    if api == "task":
        runner: Any = SparkRunner(spark.sparkContext)
    else:
        pipeline = Pipeline(build, config.to_dict(), "user STRING, page STRING, ts LONG")
        runner = DataFrameRunner(spark, pipeline, config)
    coordinator = JobCoordinator(config, runner)
    coordinator.start()
    started = time.perf_counter()
    coordinator.run(until_caught_up=True)
    seconds = time.perf_counter() - started
    coordinator.close()
    admin = Systems(config).admin("filelog")
    views = [(str(e["user"]), int(str(e["ts"]))) for e in events(args.events, 5, args.users)]
    minutes, sessions, _ = closed_windows(views, lambda u: admin.partition_for_key(u.encode(), 4))
    systems = Systems(config)
    out = []
    for stream, fields, want in (
        ("user-minute-counts", MINUTE, minutes),
        ("user-sessions", SESSION, sessions),
    ):
        rows = read_json_lines(config, systems, SystemStream("filelog", stream))
        got = {tuple(r["value"][f] for f in fields) for r in rows}
        out.append(check(api, got, want, stream))  # type: ignore[arg-type]
    return seconds, ", ".join(out)


def run_spark(spark: Any, tmp: Path, args: argparse.Namespace) -> tuple[float, str]:
    from pyspark.sql import functions as F

    views = list(events(args.events, 5, args.users))
    write_input(views, tmp / "sss" / "input", 4 * BATCH_PER_TASK)
    saved = {k: spark.conf.get(k, None) for k in (PROVIDER_KEY, PARTITIONS_KEY, NO_DATA_KEY)}
    spark.conf.set(PROVIDER_KEY, ROCKSDB_PROVIDER)
    spark.conf.set(PARTITIONS_KEY, "4")
    spark.conf.set(NO_DATA_KEY, "true")  # the last windows close in a batch without data
    seconds = 0.0
    results = {}
    try:
        for kind in ("minutes", "sessions"):
            source = (
                spark.readStream.schema("user STRING, page STRING, ts LONG")
                .option("maxFilesPerTrigger", 1)
                .json(str(tmp / "sss" / "input"))
                .withColumn("event_time", F.timestamp_millis("ts"))
                .withWatermark("event_time", "5 seconds")
            )
            if kind == "minutes":
                grouped = source.groupBy(F.window("event_time", "1 minute"), "user").agg(
                    F.count("*").alias("n")
                )
                out = grouped.select(
                    "user",
                    F.unix_millis(F.col("window.start")).alias("start"),
                    F.unix_millis(F.col("window.end")).alias("end"),
                    "n",
                )
            else:
                grouped = source.groupBy(F.session_window("event_time", "30 seconds"), "user").agg(
                    F.count("*").alias("n"), F.min("ts").alias("start"), F.max("ts").alias("end")
                )
                out = grouped.select("user", "start", "end", "n")
            path = tmp / "sss" / kind
            query = (
                out.writeStream.format("parquet")
                .option("path", str(path))
                .option("checkpointLocation", str(tmp / "sss" / f"{kind}-ckpt"))
                .outputMode("append")
                .trigger(availableNow=True)
            )
            t0 = time.perf_counter()
            running = query.start()
            running.awaitTermination()
            seconds += time.perf_counter() - t0
            if running.exception() is not None:
                raise SystemExit(f"Spark SS {kind}: {running.exception()}")
            rows = spark.read.parquet(str(path)).collect()
            results[kind] = {(r["user"], int(r["start"]), int(r["end"]), int(r["n"])) for r in rows}
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    pairs = [(str(e["user"]), int(str(e["ts"]))) for e in views]
    minutes, sessions, _ = closed_windows(pairs, lambda _u: 0)  # Spark's watermark is global
    out = [
        check("Spark SS", results["minutes"], minutes, "minutes"),
        check("Spark SS", results["sessions"], sessions, "sessions"),
    ]
    return seconds, ", ".join(out)


def windows_of(rows: list[list[Any]]) -> set[Closed]:
    """A peer's ``[user, start, end, count]`` rows as the reference's windows."""
    return {(str(user), int(start), int(end), int(n)) for user, start, end, n in rows}


def run_peer(peer: str, tmp: Path, args: argparse.Namespace) -> tuple[float, str]:
    """A peer's windows on the same views (its env installed first, untimed); seconds, check."""
    from peers.run import ensure_env, python_of, write_input  # bench/peers/run.py

    env, script = PEERS[peer]
    ensure_env(env)
    data = tmp / "peers-input"
    if not data.exists():
        write_input(data, args.events, args.users, 5)
    work = tmp / peer
    work.mkdir()
    result = work / "result.json"
    cmd = [python_of(env), str(ROOT / "bench" / "peers" / script), "--data", str(data)]
    cmd += ["--work", str(work), "--result", str(result), "--events", str(args.events)]
    with (work / "log.txt").open("w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=log)
    if proc.returncode != 0:
        tail = (work / "log.txt").read_text()[-2000:]
        raise SystemExit(f"{peer} exited {proc.returncode}; its log ends:\n{tail}")
    out = json.loads(result.read_text())
    views = [(str(e["user"]), int(str(e["ts"]))) for e in events(args.events, 5, args.users)]
    minutes, sessions, _ = closed_windows(views, lambda _u: 0, at_end=True)
    name = PEER_NAMES[peer]
    checked = [
        check(name, windows_of(out["minutes"]), minutes, "minutes"),
        check(name, windows_of(out["sessions"]), sessions, "sessions"),
    ]
    return float(out["seconds"]), ", ".join(checked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--peers", default="bytewax,pyflink", help='"" for none')
    args = parser.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - PEERS.keys()
    if unknown:
        parser.error(f"--peers: unknown {sorted(unknown)}; known: {', '.join(PEERS)}")
    spark = spark_session(Config({"job.name": "bench-windows"}), "local[2]")
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-windows-") as tmp_name:
        tmp = Path(tmp_name)
        warm = argparse.Namespace(events=20_000, users=args.users)
        run_sparkpoint(spark, tmp / "warm", "task", warm)
        for name, runner in (
            ("task API", lambda: run_sparkpoint(spark, tmp, "task", args)),
            ("DataFrame API", lambda: run_sparkpoint(spark, tmp, "frame", args)),
            ("Spark SS", lambda: run_spark(spark, tmp, args)),
            *((PEER_NAMES[p], lambda p=p: run_peer(p, tmp, args)) for p in peers),
        ):
            seconds, checked = runner()
            rates[name] = args.events / seconds
            print(
                f"{name:<14} {rates[name]:>10,.0f} events/s  ({seconds:.1f} s; {checked})",
                flush=True,
            )
    spark.stop()
    print(f"\n{args.events:,} views over {args.users:,} users, local[2]")
    for name, rate in rates.items():
        print(f"{name:<14} {rate:>10,.0f} events/s  {rate / rates['Spark SS']:>6.2f}x Spark SS")
    others = {n: r for n, r in rates.items() if n not in ("task API", "DataFrame API")}
    fastest = max(others, key=others.__getitem__)
    print(
        f"target: sparkpoint at 1.5x the fastest of the others ({fastest}, "
        f"{others[fastest]:,.0f} events/s): task API {rates['task API'] / others[fastest]:.2f}x, "
        f"DataFrame API {rates['DataFrame API'] / others[fastest]:.2f}x"
    )


if __name__ == "__main__":
    main()

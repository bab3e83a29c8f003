"""Benchmark: sparkpoint against its peers on the same page-view count, side by side in one run.

Every variant counts views per user with durable state and ~1 s checkpoints, emits
``{user, count}`` per view, and its final counts are checked against the input (a wrong count
fails the command). The variants:

* ``sparkpoint-task`` / ``sparkpoint-dataframe``: the example job (task API) and its DataFrame
  step, on local Spark (``local[2]``), input in the embedded log;
* ``spark-applyInPandasWithState`` / ``spark-transformWithStateInPandas``: Spark Structured
  Streaming with its RocksDB state store (``local[2]``, JSON files, Parquet sink);
* ``pyflink``: PyFlink, keyed ``ValueState`` in embedded RocksDB with incremental checkpoints;
* ``bytewax``: Bytewax with SQLite recovery, 2 processes;
* ``quixstreams``: Quix Streams with its RocksDB state, over the Kafka-protocol broker the tests
  use (Tansu, started per run on loopback).

Peers are installed by this command into their own virtual envs under ``bench/out/venvs``, never
into the project's (Spark's variants get sparkpoint's pyspark version in an env of their own,
with the protobuf that ``transformWithStateInPandas`` needs). Input loading (the log, the broker
topic, the files) is untimed; a variant's time runs from its process start (Spark
session or framework start-up included) to the end of its last view. Each variant runs
``--runs`` times, interleaved in rotating order; the median and range are reported with the
machine's load average around each run. Outputs: ``bench/out/peers.md`` (a markdown table),
``bench/out/peers.json``, ``bench/out/peers-throughput.png`` and, with the recovery figure
(``recovery.py``), ``bench/out/peers-recovery.png``.

Usage: ``make bench-peers`` or ``.venv/bin/python bench/peers/run.py [--events N] [--runs R]
[--only a,b] [--skip a,b]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = ROOT / "bench" / "out"
VENVS = OUT / "venvs"
sys.path.insert(0, str(ROOT / "examples" / "pageviews"))

from generate import events  # noqa: E402

PARTITIONS = 4
PEER_PACKAGES = {
    # transformWithStateInPandas needs protobuf, which sparkpoint itself does not
    "spark": ["pyspark==4.3.0", "pandas", "pyarrow", "protobuf"],
    "bytewax": ["bytewax==0.21.1"],
    "quix": ["quixstreams==3.28.1"],
    # its Avro serializer through a Schema Registry (bench/schemas.py, bench/peers/quix_avro.py)
    "quix-avro": ["quixstreams[avro,schema_registry]==3.28.1"],
    "flink": ["apache-flink==2.3.0"],
}


@dataclass(frozen=True)
class Variant:
    name: str
    env: str  # "project" or a key of PEER_PACKAGES
    script: str
    args: tuple[str, ...] = ()
    prepare: bool = False  # the script has a untimed "prepare" step
    broker: bool = False  # needs a Kafka-protocol broker (--broker)


VARIANTS = [
    Variant("sparkpoint-task", "project", "sparkpoint_job.py", ("--api", "task"), prepare=True),
    Variant("sparkpoint-dataframe", "project", "sparkpoint_job.py", ("--api", "dataframe"), True),
    Variant(
        "spark-applyInPandasWithState", "spark", "sss_job.py", ("--api", "applyInPandas"), True
    ),
    Variant(
        "spark-transformWithStateInPandas", "spark", "sss_job.py", ("--api", "transform"), True
    ),
    Variant("pyflink", "flink", "flink_job.py"),
    Variant("bytewax", "bytewax", "bytewax_job.py"),
    Variant("quixstreams", "quix", "quix_job.py", prepare=True, broker=True),
]


@dataclass
class Runs:
    seconds: list[float] = field(default_factory=list)  # process start to last view
    steady: list[float] = field(default_factory=list)  # first view to last view
    load: list[float] = field(default_factory=list)  # 1-min load average before each run
    errors: list[str] = field(default_factory=list)


def python_of(env: str) -> str:
    return sys.executable if env == "project" else str(VENVS / env / "bin" / "python")


def ensure_env(env: str) -> None:
    """A peer's own virtual env with its pinned packages (made once, reused after)."""
    if env == "project":
        return
    venv, wanted = VENVS / env, PEER_PACKAGES[env]
    marker = venv / "sparkpoint-bench-packages.txt"
    if marker.exists() and marker.read_text().split() == wanted:
        return
    print(f"installing {' '.join(wanted)} into {venv} ...", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--disable-pip-version-check", *wanted], check=True)
    marker.write_text("\n".join(wanted))


def write_input(data: Path, n: int, users: int, seed: int) -> Counter[str]:
    """The views as JSON lines in ``part-<p>.jsonl``, p = crc32(user) % 4 (sparkpoint's own
    placement of a key, used for everyone); returns the expected count per user."""
    data.mkdir(parents=True, exist_ok=True)
    files = [(data / f"part-{p}.jsonl").open("w") for p in range(PARTITIONS)]
    expected: Counter[str] = Counter()
    for event in events(n, seed, users):
        user = str(event["user"])
        expected[user] += 1
        line = json.dumps(event, separators=(",", ":"), sort_keys=True)
        files[zlib.crc32(user.encode()) % PARTITIONS].write(line + "\n")
    for f in files:
        f.close()
    return expected


def run_variant(
    variant: Variant, data: Path, work: Path, args: argparse.Namespace, expected: Counter[str]
) -> tuple[float, float]:
    """One run: (seconds from process start to the last view, seconds from the first view)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    result = work / "result.json"
    common = [
        "--data",
        str(data),
        "--work",
        str(work),
        "--result",
        str(result),
        "--checkpoint-ms",
        str(args.checkpoint_ms),
        "--events",
        str(args.events),
        *variant.args,
    ]
    env = {**os.environ, "PYSPARK_PYTHON": python_of(variant.env)}
    broker = None
    if variant.broker:
        from sparkpoint.testing.services import TansuKafka

        broker = TansuKafka(work / "tansu").__enter__()
        common += ["--broker", broker.bootstrap]
    try:
        cmd = [python_of(variant.env), str(HERE / variant.script)]
        log = (work / "log.txt").open("w")
        if variant.prepare:
            subprocess.run([*cmd, "prepare", *common], check=True, stdout=log, stderr=log, env=env)
        started = time.time()
        step = ["run"] if variant.prepare else []
        proc = subprocess.run([*cmd, *step, *common], stdout=log, stderr=log, env=env)
        ended = time.time()
        if proc.returncode != 0:
            tail = (work / "log.txt").read_text()[-1500:]
            raise RuntimeError(f"exit {proc.returncode}; log tail:\n{tail}")
    finally:
        if broker is not None:
            broker.__exit__(None, None, None)
    out = json.loads(result.read_text())
    counts = Counter({str(k): int(v) for k, v in out["counts"].items()})
    if counts != expected:
        wrong = sum(1 for u in expected.keys() | counts.keys() if counts[u] != expected[u])
        raise CountError(
            f"{variant.name}: {wrong} users have wrong final counts "
            f"({sum(counts.values())} views counted, {sum(expected.values())} in the input)"
        )
    finished = float(out.get("finished") or ended)
    first = out.get("first_output")
    steady = finished - float(first) if first else float("nan")
    return finished - started, steady


class CountError(Exception):
    """A variant's final counts differ from the input: the benchmark fails."""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3, help="0: the recovery figure only")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--checkpoint-ms", type=int, default=1000)
    parser.add_argument("--only", default="", help="comma-separated variant names")
    parser.add_argument("--skip", default="", help="comma-separated variant names")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--recovery-users", type=int, default=1_000_000, help="recovery state: users (0: skip)"
    )
    parser.add_argument("--pad", type=int, default=1000, help="recovery state: bytes per user")
    args = parser.parse_args()
    chosen = [v for v in VARIANTS if not args.only or v.name in args.only.split(",")]
    chosen = [v for v in chosen if v.name not in args.skip.split(",")]
    if not chosen:
        raise SystemExit(f"no variant chosen; variants: {', '.join(v.name for v in VARIANTS)}")
    for env in sorted({v.env for v in chosen}):
        ensure_env(env)
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = args.out / "peers-work"
    shutil.rmtree(scratch, ignore_errors=True)
    data = scratch / "data"
    expected: Counter[str] = Counter()
    if args.runs:
        print(f"writing {args.events:,} views over {args.users:,} users ...", flush=True)
        expected = write_input(data, args.events, args.users, args.seed)
    runs = {v.name: Runs() for v in chosen}
    failed = False
    for r in range(args.runs):
        order = chosen[r % len(chosen) :] + chosen[: r % len(chosen)]  # interleaved, rotating
        for variant in order:
            record = runs[variant.name]
            record.load.append(os.getloadavg()[0])
            try:
                seconds, steady = run_variant(variant, data, scratch / variant.name, args, expected)
            except CountError as exc:
                failed = True
                record.errors.append(str(exc))
                print(f"run {r + 1}: {exc}", flush=True)
                continue
            except Exception as exc:  # a peer that fails to run is reported, not hidden
                record.errors.append(f"{type(exc).__name__}: {exc}")
                print(f"run {r + 1}: {variant.name} failed: {exc}", flush=True)
                continue
            record.seconds.append(seconds)
            record.steady.append(steady)
            print(
                f"run {r + 1}: {variant.name:34s} {args.events / seconds:9,.0f} events/s "
                f"({seconds:.1f} s; {args.events / steady:,.0f}/s from the first view)",
                flush=True,
            )
    recovery_rows = []
    fatal = False
    if args.recovery_users:
        import recovery

        pythons = {v.name: python_of(v.env) for v in chosen if v.name in recovery.PEERS}
        recovery_rows = recovery.run_all(args, scratch, PARTITIONS, pythons)
        fatal = any(r["variant"] == "failed" and r["fatal"] for r in recovery_rows)
    report(args, chosen, runs, recovery_rows)
    if failed:
        raise SystemExit("final counts were wrong (see above)")
    if fatal:
        raise SystemExit("a recovery run restored wrong counts, or sparkpoint's failed (see above)")
    if any(r.errors for r in runs.values()):
        raise SystemExit("some variants failed to run (see above)")


def report(
    args: argparse.Namespace,
    chosen: list[Variant],
    runs: dict[str, Runs],
    recovery_rows: list[dict[str, Any]],
) -> None:
    rows: list[dict[str, Any]] = []
    for v in chosen:
        r = runs[v.name]
        rates = [args.events / s for s in r.seconds]
        steady = [args.events / s for s in r.steady if s == s and s > 0]
        rows.append(
            {
                "variant": v.name,
                "runs": len(rates),
                "median": statistics.median(rates) if rates else None,
                "min": min(rates, default=None),
                "max": max(rates, default=None),
                "steady_median": statistics.median(steady) if steady else None,
                "load": [round(x, 2) for x in r.load],
                "errors": r.errors,
            }
        )
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    lines = [
        f"# Peers: page views per user, {args.events:,} views, {args.users:,} users, "
        f"{PARTITIONS} partitions, checkpoints every {args.checkpoint_ms} ms",
        "",
        f"Taken {when} on {machine}; {args.runs} runs per variant, interleaved.",
        "",
        "| variant | end to end, events/s (median) | range | from first view, events/s "
        "| load avg before runs |",
        "|---|---:|---|---:|---|",
    ]
    for row in rows:
        if row["median"] is None and not row["errors"]:
            continue  # not run (--runs 0: the recovery figure only)
        if row["median"] is None:
            lines.append(f"| {row['variant']} | failed: {'; '.join(row['errors'])[:200]} | | | |")
            continue
        lines.append(
            f"| {row['variant']} | {row['median']:,.0f} | {row['min']:,.0f} - {row['max']:,.0f} "
            f"| {row['steady_median'] or 0:,.0f} | {', '.join(map(str, row['load']))} |"
        )
    peers = [r for r in rows if r["median"] and not r["variant"].startswith("sparkpoint")]
    ours = {r["variant"]: r for r in rows if r["median"] and r["variant"].startswith("sparkpoint")}
    if peers and ours:
        best = max(peers, key=lambda r: r["median"])
        lines += ["", f"Fastest peer end to end: {best['variant']} ({best['median']:,.0f}/s)."]
        for name, row in ours.items():
            lines.append(
                f"- {name} / {best['variant']}: {row['median'] / best['median']:.2f}x "
                "(issue 15's target: 1.5x)"
            )
    if recovery_rows:
        lines += recovery_table(recovery_rows, args)
    text = "\n".join(lines) + "\n"
    (args.out / "peers.md").write_text(text)
    everything = {"taken": when, "rows": rows, "recovery": recovery_rows}
    (args.out / "peers.json").write_text(json.dumps(everything, indent=2))
    print("\n" + text)
    if args.runs:
        plot(args.out / "peers-throughput.png", rows, f"{args.events:,} page views, {when}")
    done = [r for r in recovery_rows if "first_output_s" in r]  # not failures, not references
    if done:
        title = f"{args.recovery_users:,} users' state lost, 10,000 new views; {when}"
        plot_recovery(args.out / "peers-recovery.png", done, title)


def recovery_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    done = [r for r in rows if r["variant"] != "failed" and "first_output_s" in r]
    floor = next((r["caught_up_s"] for r in rows if r["variant"].startswith("reference")), None)
    size = max((r.get("state_bytes", 0) for r in done), default=0) / 1e9
    lines = [
        "",
        f"## Recovery: {args.recovery_users:,} users x {args.pad} B ({size:.2f} GB of RocksDB "
        "state in sparkpoint), SIGKILL, local state lost, 10,000 new views (1% of the keys)",
        "",
        "| variant | kept over the loss | to first new output | to caught up "
        "| restore (sum over tasks) | plain copy of the state | restore / copy "
        "| commit pause | longest gap between outputs | bytes checkpoints wrote |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def secs(x: float | None, unit: str = "s") -> str:
        if x is None:
            return "n/a"
        return f"{x * 1000:.0f} ms" if unit == "ms" else f"{x:.1f} s"

    for r in done:
        copy = r.get("plain_copy_s")
        ratio = f"{r['restore_s'] / copy:.2f}x" if r["restore_s"] and copy else ""
        lines.append(
            f"| {r['variant']} | {r['kept']} | {secs(r['first_output_s'])} "
            f"| {secs(r['caught_up_s'])} | {secs(r['restore_s']) if r['restore_s'] else ''} "
            f"| {secs(copy) if copy else ''} | {ratio} | {secs(r['checkpoint_pause_s'], 'ms')} "
            f"| {secs(r['longest_stall_s'], 'ms')} | {r['checkpoint_bytes'] / 1e6:.1f} MB |"
        )
    for r in rows:
        if r["variant"] == "failed":
            lines += ["", *[f"- failed: {e[:300]}" for e in r["errors"]]]
    ours = [r for r in done if r["variant"] == "sparkpoint-task (blobstore)"]
    peers = [r for r in done if not r["variant"].startswith("sparkpoint")]
    if ours and peers:
        best = min(peers, key=lambda r: r["caught_up_s"])
        ratio = best["caught_up_s"] / ours[0]["caught_up_s"]
        lines += [
            "",
            f"Fastest peer back and caught up: {best['variant']} ({best['caught_up_s']:.1f} s); "
            f"sparkpoint from the blob store is {ratio:.2f}x faster (issue 15's target: 5x).",
        ]
        if floor is not None:
            lines += [
                "",
                f"Spark's floor here (a task job's local SparkContext started and a first "
                f"Python job run, no state, no input): {floor:.1f} s; 5x the fastest peer needs "
                f"{best['caught_up_s'] / 5:.1f} s from restart to caught up.",
            ]
    return lines


def plot(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["median"]]
    if not done:
        return
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(done) + 1.5))
    names = [r["variant"] for r in done]
    med = [r["median"] for r in done]
    err = [[r["median"] - r["min"] for r in done], [r["max"] - r["median"] for r in done]]
    colors = ["#d9480f" if n.startswith("sparkpoint") else "#868e96" for n in names]
    ax.barh(names, med, xerr=err, color=colors, capsize=3)
    ax.invert_yaxis()
    ax.set_xlabel("events/s end to end (median of runs, range as error bar)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")


def plot_recovery(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    """Seconds from the restart to the first new output and to caught up, per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.5))
    names = [r["variant"] for r in rows]
    ax.barh(names, [r["caught_up_s"] for r in rows], color="#adb5bd", label="caught up")
    colors = ["#d9480f" if n.startswith("sparkpoint") else "#495057" for n in names]
    ax.barh(names, [r["first_output_s"] for r in rows], color=colors, label="first new output")
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(left=1)
    ax.set_xlabel("seconds from the restart (log scale)")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()

"""The recovery figure of ``bench/peers/run.py``: how fast a job is back after losing its host.

Workload: ``--recovery-users`` users (1,000,000 by default) each view a page once with a
``--pad``-byte payload (1,000): per user the job keeps the count and the last view, about 1 GB of
state. Each variant runs on that input (untimed: the build) until a durable checkpoint covers
all of it, and is then killed with SIGKILL (its whole process group: driver, JVM, workers). Its
local state directory is deleted (the host is gone), 10,000 more views arrive (``"phase": 2``,
1% of the users), and the job starts again. Measured from that start: the first output for a new
view and the moment every new view's count is out (caught up), both from the lines each variant
appends per new view (``common.Progress``, which also proves the restored counts right); the
bytes the checkpoints wrote while it caught up (1% key churn), and the pause: sparkpoint's
measured synchronous commit time, and for every variant the longest gap between two outputs
while catching up.

What "local state" is, and what is kept, per variant:

* sparkpoint: the task's RocksDB stores are deleted; the state comes back from the blob store or
  the changelog; the ``local`` row keeps them (a restart on the same host);
* PyFlink: the RocksDB working directories are deleted; the job starts from its last retained
  checkpoint (``execution.state-recovery.path``, claim mode, so checkpoints stay incremental);
* Bytewax: its recovery store (SQLite) *is* its only durable state, kept as a durable volume
  would be; its input is a bounded file source, so it stops by itself at the end of the files
  instead of being killed;
* Quix Streams: its RocksDB state directory is deleted; the state comes back from its changelog
  topics on the broker.

The reference is a plain copy (``shutil.copytree``) of sparkpoint's state directory on the same
disk, the physical limit of bringing the state back; and Spark's own floor: a process that only
starts the local SparkContext a task API job runs on (sparkpoint's settings) and runs one Python
job, with no state and no input, which any restart of a job on Spark pays before its first
output.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODES = ("blobstore", "changelog", "local")
PEERS = ("pyflink", "bytewax", "quixstreams")
NEW_VIEWS = 10_000
BUILD_TIMEOUT_S = 3600.0
RESUME_TIMEOUT_S = 900.0


class RecoveryError(Exception):
    """A recovery run failed: reported; the benchmark fails when it is sparkpoint's."""


class WrongCounts(RecoveryError):
    """A variant restored wrong counts: the benchmark fails, whoever it is."""


def write_views(data: Path, users: int, pad: int, seed: int, partitions: int) -> Counter[str]:
    """Phase 1 (every user once, with its pad) in ``data/1``, phase 2 in ``data/2``; returns
    the expected final count per user."""
    rng = random.Random(seed)
    expected: Counter[str] = Counter()
    for phase, n in ((1, users), (2, NEW_VIEWS)):
        folder = data / str(phase)
        folder.mkdir(parents=True, exist_ok=True)
        files = [(folder / f"part-{p}.jsonl").open("w") for p in range(partitions)]
        for i in range(n):
            user = f"user-{i if phase == 1 else rng.randrange(users):07d}"
            expected[user] += 1
            view = {
                "user": user,
                "page": "/",
                "ts": i,
                "phase": phase,
                "pad": rng.randbytes(pad // 2).hex(),
            }
            files[zlib.crc32(user.encode()) % partitions].write(json.dumps(view) + "\n")
        for f in files:
            f.close()
    return expected


def dir_bytes(path: Path, since: float = 0.0) -> int:
    """Bytes of the files under ``path`` (modified at or after ``since``)."""
    total = 0
    for f in path.rglob("*"):
        try:
            st = f.stat()
        except FileNotFoundError:  # deleted while we walked
            continue
        if f.is_file() and st.st_mtime >= since:
            total += st.st_size
    return total


def read_progress(work: Path) -> list[tuple[float, str, int]]:
    """Every complete ``time user count`` line the variant wrote for a new view."""
    rows = []
    for path in (work / "progress").glob("*.tsv"):
        for line in path.read_text().splitlines(keepends=True):
            if line.endswith("\n"):
                ts, user, count = line.split("\t")
                rows.append((float(ts), user, int(count)))
    return rows


def timings(rows: list[tuple[float, str, int]], wanted: Counter[str]) -> dict[str, float] | None:
    """From the progress lines: the first new output, when every new view's count was out
    (each phase-2 user reached its final count), and the longest gap between outputs; None
    while some user has not reached its count yet."""
    reached: dict[str, float] = {}
    for ts, user, count in rows:
        if user not in wanted:
            raise WrongCounts(f"an output for {user}, which no new view names")
        if count > wanted[user]:
            raise WrongCounts(f"{user} counted {count}, expected {wanted[user]}: not restored")
        if count == wanted[user]:
            reached[user] = min(reached.get(user, ts), ts)
    if len(reached) < len(wanted):
        return None
    times = sorted(ts for ts, _u, _c in rows)
    return {
        "first": times[0],
        "caught_up": max(reached.values()),
        "stall": max((b - a for a, b in itertools.pairwise(times)), default=0.0),
    }


class Job:
    """One variant's process (group), its log, and a poll for a condition with a deadline."""

    def __init__(self, cmd: list[str], work: Path, env: dict[str, str] | None = None) -> None:
        self.log = work / "log.txt"
        with self.log.open("a") as log:
            log.write(f"\n$ {' '.join(cmd)}\n")
            log.flush()
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=log, env=env, start_new_session=True
            )

    def wait_for(self, what: str, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            code = self.proc.poll()
            if code is not None and not done():
                raise RecoveryError(f"exited with {code} before {what}; {self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RecoveryError(f"no {what} after {timeout:.0f} s; {self.tail()}")
            time.sleep(0.25)

    def finish(self, timeout: float) -> None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RecoveryError(f"did not stop within {timeout:.0f} s; {self.tail()}") from None
        if code != 0:
            raise RecoveryError(f"exited with {code}; {self.tail()}")

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown hook, no last commit."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def tail(self) -> str:
        return "log tail:\n" + self.log.read_text()[-2000:]


def _expected_new(expected: Counter[str], data: Path) -> Counter[str]:
    """The final count of every user a new (phase 2) view names."""
    users = {json.loads(line)["user"] for f in (data / "2").glob("*.jsonl") for line in f.open()}
    return Counter({u: expected[u] for u in users})


def _catch_up(job: Job, work: Path, wanted: Counter[str], started: float) -> dict[str, float]:
    found: dict[str, float] = {}

    def done() -> bool:
        t = timings(read_progress(work), wanted)
        if t is not None:
            found.update(t)
        return t is not None

    job.wait_for("catching up with the new views", done, RESUME_TIMEOUT_S)
    return {
        "first_output_s": found["first"] - started,
        "caught_up_s": found["caught_up"] - started,
        "longest_stall_s": found["stall"],
    }


def _fresh(work: Path) -> Path:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def _common(data: Path, work: Path, args: argparse.Namespace, events: int) -> list[str]:
    return [
        "--data",
        str(data),
        "--work",
        str(work),
        "--result",
        str(work / "result.json"),
        "--checkpoint-ms",
        str(args.checkpoint_ms),
        "--events",
        str(events),
        "--recovery",
    ]


def sparkpoint_recovery(
    mode: str, data: Path, work: Path, args: argparse.Namespace, wanted: Counter[str]
) -> dict[str, Any]:
    import sparkpoint_job

    _fresh(work)
    script = [sys.executable, str(HERE / "sparkpoint_job.py")]
    config = sparkpoint_job.job_config(
        argparse.Namespace(
            work=work, checkpoint_ms=args.checkpoint_ms, recovery=True, backend=mode
        ),
        {},
    )

    def step(name: str, phase: str, *extra: str) -> Job:
        cmd = [*script, name, *_common(data / phase, work, args, 0), "--backend", mode, *extra]
        return Job(cmd, work)

    step("prepare", "1").finish(600)
    t0 = time.time()
    build = step("run", "1", "--forever")
    build.wait_for(
        "a checkpoint covering the input",
        lambda: sparkpoint_job.checkpointed(config) >= args.recovery_users,
        BUILD_TIMEOUT_S,
    )
    build.kill()
    build_s = time.time() - t0
    state = work / "job" / "state"
    stores = sorted(state.glob("*/user-views"))  # every task's live store (no checkpoints)
    size = sum(dir_bytes(s) for s in stores)
    os.sync()
    t0 = time.perf_counter()
    for store in stores:
        shutil.copytree(store, work / "copy-of-state" / store.parent.name)
    copy = time.perf_counter() - t0
    shutil.rmtree(work / "copy-of-state")
    if mode != "local":
        shutil.rmtree(state)  # the host and its disk are gone
    step("prepare", "2").finish(600)
    changelog = work / "job" / "streams" / "filelog" / "user-views-changelog"
    logged = dir_bytes(changelog) if changelog.exists() else 0
    started = time.time()
    resume = step("run", "2")
    row = _catch_up(resume, work, wanted, started)
    resume.finish(RESUME_TIMEOUT_S)
    out = json.loads((work / "result.json").read_text())
    # the blobs its commits wrote (as for PyFlink's checkpoint files; the upload metrics of the
    # commits that finish in the run's last pass reach no listener), or what the changelog grew
    if mode == "changelog":
        written = dir_bytes(changelog) - logged
    else:
        written = dir_bytes(work / "job" / "blobs", since=started)
    restores = [r for r in out.get("restores", []) if r["source"] != "local-checkpoint"]
    return {
        "variant": f"sparkpoint-task ({mode})",
        "kept": "local state" if mode == "local" else f"nothing local: restored from {mode}",
        "restore_s": sum(float(r["seconds"]) for r in restores),
        "restored_bytes": sum(int(r["bytes"]) for r in restores),
        "state_bytes": size,
        "build_s": build_s,
        **row,
        "plain_copy_s": copy,
        # the run after the loss touched 10,000 of the users: its commits at 1% key churn
        "checkpoint_bytes": written,
        "checkpoint_pause_s": max(out["pauses"], default=0.0),
    }


def _copy_phase(data: Path, phase: str, into: Path, prefix: str) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for f in (data / phase).glob("part-*.jsonl"):
        shutil.copy(f, into / f"{prefix}{f.name}")


def _file_job(
    python: str, script: str, data: Path, work: Path, args: argparse.Namespace
) -> tuple[Path, list[str]]:
    """A fresh ``work`` whose ``input`` folder holds the first phase's files, for a peer that
    reads files; the folder and the command that runs the peer on it."""
    _fresh(work)
    inbox = work / "input"
    _copy_phase(data, "1", inbox, "")
    return inbox, [python, str(HERE / script), *_common(inbox, work, args, 0)]


def _peer_row(
    name: str, kept: str, build_s: float, row: dict[str, float], written: int
) -> dict[str, Any]:
    return {
        "variant": name,
        "kept": kept,
        "restore_s": None,
        "build_s": build_s,
        **row,
        "checkpoint_bytes": written,
        "checkpoint_pause_s": None,
    }


def flink_recovery(
    python: str, data: Path, work: Path, args: argparse.Namespace, wanted: Counter[str]
) -> dict[str, Any]:
    inbox, cmd = _file_job(python, "flink_job.py", data, work, args)
    out, checkpoints = work / "out", work / "checkpoints"
    committed: dict[Path, int] = {}

    def covered() -> bool:  # the FileSink commits a part file when a checkpoint completes
        for f in out.rglob("counts*"):
            if not f.name.startswith(".") and f not in committed:
                committed[f] = sum(1 for _ in f.open("rb"))
        return sum(committed.values()) >= args.recovery_users

    t0 = time.time()
    build = Job(cmd, work)
    build.wait_for("a checkpoint covering the input", covered, BUILD_TIMEOUT_S)
    build.kill()
    build_s = time.time() - t0
    retained = [c for c in checkpoints.glob("*/chk-*") if (c / "_metadata").exists()]
    if not retained:
        raise RecoveryError(f"pyflink: no completed checkpoint under {checkpoints}")
    latest = max(retained, key=lambda c: int(c.name.split("-")[1]))
    shutil.rmtree(work / "tmp")  # the RocksDB working directories: the host is gone
    _copy_phase(data, "2", inbox, "phase2-")
    started = time.time()
    resume = Job([*cmd, "--restore", str(latest)], work)
    row = _catch_up(resume, work, wanted, started)

    def checkpointed_again() -> bool:
        caught_up = row["caught_up_s"] + started
        marks = [c / "_metadata" for c in checkpoints.glob("*/chk-*")]
        return any(m.exists() and m.stat().st_mtime > caught_up for m in marks)

    resume.wait_for("a checkpoint after catching up", checkpointed_again, 120)
    resume.kill()
    written = dir_bytes(checkpoints, since=started)
    return _peer_row("pyflink", "retained checkpoints", build_s, row, written)


def bytewax_recovery(
    python: str, data: Path, work: Path, args: argparse.Namespace, wanted: Counter[str]
) -> dict[str, Any]:
    inbox, cmd = _file_job(python, "bytewax_job.py", data, work, args)
    t0 = time.time()
    Job(cmd, work).finish(BUILD_TIMEOUT_S)  # a bounded source: it stops at the end of the files
    build_s = time.time() - t0
    store = work / "recovery"
    before = dir_bytes(store)
    _copy_phase(data, "2", inbox, "phase2-")
    started = time.time()
    resume = Job(cmd, work)
    row = _catch_up(resume, work, wanted, started)
    resume.finish(RESUME_TIMEOUT_S)
    written = dir_bytes(store) - before
    return _peer_row("bytewax", "its SQLite recovery store", build_s, row, written)


def _changelog_bytes(bootstrap: str, since: dict[tuple[str, int], int] | None = None) -> Any:
    """Bytes of key and value in Quix's changelog topics after the offsets ``since`` (each
    partition's end, when None: nothing is read), and the ends now."""
    from confluent_kafka import Consumer, TopicPartition

    settings = {"bootstrap.servers": bootstrap, "group.id": "size", "enable.auto.commit": False}
    consumer = Consumer(settings)
    try:
        ends, total = {}, 0
        topics = [t for t in consumer.list_topics(timeout=30).topics if t.startswith("changelog")]
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=30).topics[topic]
            for p in meta.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                ends[(topic, p)] = high
                seen = high if since is None else max(low, since.get((topic, p), low))
                consumer.assign([TopicPartition(topic, p, seen)])
                while seen < high:
                    batch = consumer.consume(1000, timeout=5)
                    if not batch:
                        raise RecoveryError(f"{topic}[{p}]: no record after {seen} (end {high})")
                    for msg in batch:
                        if msg.error() is None:
                            total += len(msg.key() or b"") + len(msg.value() or b"")
                            seen = msg.offset() + 1
        return total, ends
    finally:
        consumer.close()


def quix_recovery(
    python: str, data: Path, work: Path, args: argparse.Namespace, wanted: Counter[str]
) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    from sparkpoint.testing.services import TansuKafka

    _fresh(work)
    with TansuKafka(work / "tansu") as broker:
        script = [python, str(HERE / "quix_job.py")]

        def step(name: str, phase: str, events: int) -> Job:
            extra = ["--broker", broker.bootstrap]
            return Job([*script, name, *_common(data / phase, work, args, events), *extra], work)

        step("prepare", "1", 0).finish(1800)
        group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench-peers"})
        views = [TopicPartition("pageviews", p) for p in range(4)]

        def covered() -> bool:  # Quix flushes its changelogs before it commits the offsets
            offsets = group.committed(views, timeout=10)
            return sum(max(tp.offset, 0) for tp in offsets) >= args.recovery_users

        t0 = time.time()
        build = step("run", "1", 0)
        try:
            build.wait_for("a commit covering the input", covered, BUILD_TIMEOUT_S)
        finally:
            group.close()
        build.kill()
        build_s = time.time() - t0
        _, ends = _changelog_bytes(broker.bootstrap)
        shutil.rmtree(work / "state")  # the host is gone; the changelog topics are not
        step("prepare", "2", 0).finish(600)
        started = time.time()
        resume = step("run", "2", NEW_VIEWS)
        row = _catch_up(resume, work, wanted, started)
        resume.finish(RESUME_TIMEOUT_S)
        written, _ = _changelog_bytes(broker.bootstrap, since=ends)
    return _peer_row("quixstreams", "changelog topics", build_s, row, written)


PEER_RUNS = {"pyflink": flink_recovery, "bytewax": bytewax_recovery, "quixstreams": quix_recovery}


_FLOOR = """
import sys, time
from sparkpoint.config import Config
from sparkpoint.runtime.spark.session import spark_context
sc = spark_context(Config({"job.name": "floor"}), "local[2]")
sc.parallelize(range(2), 2).mapPartitions(lambda it: [sum(it)]).collect()
print(time.time(), flush=True)
sc.stop()
"""


def spark_floor(runs: int = 3) -> float:
    """Median seconds from process start to the end of a first Python job on the local
    SparkContext a task API job starts (``local[2]``, sparkpoint's settings), with no state and
    no input."""
    times = []
    for _ in range(runs):
        started = time.time()
        out = subprocess.run(
            [sys.executable, "-c", _FLOOR], capture_output=True, text=True, check=True
        )
        times.append(float(out.stdout.split()[0]) - started)
    return statistics.median(times)


def run_all(
    args: argparse.Namespace, scratch: Path, partitions: int, pythons: dict[str, str]
) -> list[dict[str, Any]]:
    """Every sparkpoint mode, then every peer in ``pythons`` (variant name -> interpreter)."""
    data = scratch / "recovery-data"
    print(
        f"recovery: writing {args.recovery_users:,} users x {args.pad} B of state ...", flush=True
    )
    expected = write_views(data, args.recovery_users, args.pad, args.seed, partitions)
    wanted = _expected_new(expected, data)
    rows = []
    failures: list[str] = []
    fatal = False
    runs: list[tuple[str, Path, Callable[[Path], dict[str, Any]]]] = [
        (
            f"sparkpoint ({m})",
            scratch / f"recovery-{m}",
            lambda work, m=m: sparkpoint_recovery(m, data, work, args, wanted),
        )
        for m in MODES
    ]
    for name, python in pythons.items():
        runner = PEER_RUNS[name]
        runs.append(
            (
                name,
                scratch / f"recovery-{name}",
                lambda work, r=runner, p=python: r(p, data, work, args, wanted),
            )
        )
    for name, work, run in runs:
        try:
            row = run(work)
        except RecoveryError as exc:  # its work directory (and log) stays for a look
            # a peer that cannot recover here is a finding (reported); wrong counts, or
            # sparkpoint failing, fail the benchmark
            fatal = fatal or isinstance(exc, WrongCounts) or name.startswith("sparkpoint")
            failures.append(f"{name}: {exc}")
            print(f"recovery: {name} failed: {exc}", flush=True)
            continue
        shutil.rmtree(work, ignore_errors=True)  # gigabytes per variant: gone once measured
        print(
            f"recovery: {row['variant']:28s} first new output {row['first_output_s']:6.1f} s, "
            f"caught up {row['caught_up_s']:6.1f} s (build {row['build_s']:.0f} s)",
            flush=True,
        )
        rows.append(row)
        # kept as it goes: a later variant that hangs or fails loses none of the rows before it
        (args.out / "peers-recovery.json").write_text(json.dumps(rows, indent=2))
    shutil.rmtree(data, ignore_errors=True)
    os.sync()
    floor = spark_floor()
    print(f"recovery: Spark's floor (a SparkContext, a first Python job) {floor:.1f} s", flush=True)
    rows.append({"variant": "reference: Spark's floor", "caught_up_s": floor})
    if failures:
        rows.append({"variant": "failed", "errors": failures, "fatal": fatal})
    return rows

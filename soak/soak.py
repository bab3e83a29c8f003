"""The soak: run jobs, kill them with SIGKILL at random moments, restart, and prove nothing is lost.

Usage: ``python soak/soak.py [--kills N] [--seed S] [--variants a,b] [--events MIN,MAX]
[--dir D] [--keep]``
(``make soak`` runs 100 kills; CI runs a short soak from ``tests/e2e/test_soak.py``).

Variants (kills are spread over them, round robin):

* ``example``: the example job with a changelog, on local Spark;
* ``dual``: two stores, both backed up to a changelog and the blob store (dual commit), the
  blob store failing 10% of its operations and stopping 5% of uploads half-way;
* ``cluster``: ``dual`` on a standalone master with two workers and private store directories;
* ``time``: ``dual``'s backups for a job with time in its state (``soak_task.TimedCounter``): a
  store with a TTL and event-time timers in a timer store;
* ``windows``: the windows example (``examples/windows``: minute counts and sessions per user),
  each round's views later in event time than the last round's;
* ``windows-df``: the same windows from the example's DataFrame pipeline
  (``windows_pipeline.py``), on the same stores and streams;
* ``exactly``: the example with ``job.processing.guarantee: exactly-once``: its duplicate bound
  is 0 (each user's counts 1..N go out once, whatever is killed when);
* ``joins``: both joins (``soak_task.JoiningViews``), with exactly-once output: each view
  enriched from a table of profiles (a compacted stream read first), and pairs of one user's
  views at most 2 s apart from a windowed stream-stream join; each round later in event time
  than the last. Every view and every pair of the reference must go out once, none else;
* ``exactly-kafka``: ``exactly`` with every stream on Kafka (a Tansu broker the soak starts on
  loopback): output staged in a topic, published in Kafka transactions. Tansu takes one record
  per produce request, and a fetch from far into a partition stalls there (docs/kafka.md), so
  give it small rounds (``--events 1000,2000``). Its aborted records, visible to
  read-committed readers, can show as duplicates only if a kill lands inside a publish, between
  its first record and its published-through mark.

Each kill is a SIGKILL of the driver, of a Python worker (Spark retries its task) or, on the
cluster, of a worker (its executors go; the job goes on elsewhere), at a random moment; new input
is appended between runs. At the end each job runs to the end of its input and the soak checks:

* ``mismatches``: store entries that differ from an independent count of the whole input (for
  ``exactly``, also: keys whose changelog, read committed, showed a count that went back or
  ends elsewhere than the store; for ``time``, also: each user's last page, visible now and
  expired once past its TTL, and the views per user and event-time minute, in ``closed`` plus
  ``pending``);
* ``lost``: views whose effect never reached the output (for a user, a count in 1..final missing;
  for ``windows``, a closed window of the reference that never went out);
* ``duplicates``: output messages beyond one per view (at-least-once replays), which must stay
  within what the uncommitted batches of each kill can replay;
* ``dangling``: blobs a checkpoint references that are missing or corrupt, plus blobs no
  checkpoint references that have no expiry left (leaked), plus files outside the job's
  directories.

It prints one line ``kills=K mismatches=M lost=L duplicates=D dangling=X`` and exits 1 if M, L or
X is not zero or the duplicates exceed their bound.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "pageviews"
WINDOWS = ROOT / "examples" / "windows"
sys.path[:0] = [str(EXAMPLE), str(WINDOWS), str(Path(__file__).resolve().parent)]

from generate import events, write  # noqa: E402
from windows_reference import closed_windows  # noqa: E402

from sparkpoint.config import Config, load_config, read_job_file  # noqa: E402
from sparkpoint.model import SystemStream  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402
from sparkpoint.testing.services import TansuKafka  # noqa: E402
from sparkpoint.testing.spark_cluster import StandaloneCluster  # noqa: E402
from sparkpoint.tools.state import check_blobs, committed_entries  # noqa: E402
from sparkpoint.tools.streams import read_json_lines  # noqa: E402

SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")
BATCH = 600  # task.batch.max.messages: bounds what one kill can replay
TASKS = 4
USERS = 60

BASE = {
    "task.commit.ms": "0",
    "task.commit.max.delay.ms": "0",
    "task.batch.max.messages": str(BATCH),
    "task.poll.interval.ms": "100",
    "stores.user-counts.changelog": "filelog.user-counts-changelog",
}
DUAL = {
    "task.class": "soak_task:TwoStoreCounter",
    "stores.page-counts.factory": "rocksdb",
    "stores.page-counts.key.serde": "string",
    "stores.page-counts.msg.serde": "integer",
    "stores.page-counts.changelog": "filelog.page-counts-changelog",
    "stores.user-counts.backup.factories": "changelog,blobstore",
    "stores.page-counts.backup.factories": "changelog,blobstore",
    "stores.user-counts.restore.factories": "blobstore,changelog",
    "stores.page-counts.restore.factories": "blobstore,changelog",
    "blob.store.manager.factory": "sparkpoint.testing.faults:flaky_blob_store",
    "blob.store.retry.backoff.ms": "5",
    "blob.store.ttl.ms": "3000",
    "testing.blob.fail.ratio": "0.1",
    "testing.blob.partial.ratio": "0.05",
}

EXACTLY = {"job.processing.guarantee": "exactly-once"}

JOINS = {
    **EXACTLY,
    "task.class": "soak_task:JoiningViews",
    "task.timers.store": "timers",
    "stores.profiles.side.inputs": "filelog.profiles",
    **{
        f"stores.{store}.{key}": value
        for store in ("profiles", "left-buffer", "right-buffer", "timers")
        for key, value in (
            ("factory", "rocksdb"),
            ("changelog", f"filelog.{store}-changelog"),
        )
    },
    "stores.profiles.key.serde": "string",
    "stores.profiles.msg.serde": "json",
    "stores.timers.key.serde": "string",
    "stores.timers.msg.serde": "string",
}
#: the ``joins`` variant's table: each user's country
COUNTRIES = ("fr", "de", "us", "jp", "br", "in", "ng")

DAY_MS = 24 * 3600 * 1000
TIME = {
    **{k: v for k, v in DUAL.items() if not k.startswith("stores.")},
    "task.class": "soak_task:TimedCounter",
    "task.timers.store": "timers",
    "streams.pageviews.event.time.field": "ts",
    "stores.last-page.rocksdb.ttl.ms": str(DAY_MS),
    **{
        f"stores.{store}.{key}": value
        for store, serde in (
            ("user-counts", "integer"),
            ("last-page", "string"),
            ("pending", "integer"),
            ("closed", "integer"),
            ("timers", "string"),
        )
        for key, value in (
            ("factory", "rocksdb"),
            ("key.serde", "string"),
            ("msg.serde", serde),
            ("changelog", f"filelog.{store}-changelog"),
            ("backup.factories", "changelog,blobstore"),
            ("restore.factories", "blobstore,changelog"),
        )
    },
}


#: the event-time distance between two rounds of the ``windows`` variant (more than a round
#: spans: 40,000 views 2.5 s apart on average)
ROUND_MS = 1_000_000_000


@dataclass
class Variant:
    name: str
    root: Path
    overrides: dict[str, str]
    base: Path = EXAMPLE / "job.yaml"
    master: str | None = None
    kills: int = 0
    generated: int = 0
    seeds: list[int] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    #: a DataFrame pipeline's module:attribute to run instead of the job file's task class
    pipeline: str | None = None
    #: the config of a Kafka system every stream goes to (instead of the filelog)
    kafka: dict[str, str] | None = None

    @property
    def job(self) -> Path:
        return self.root / "job.yaml"

    @property
    def windows(self) -> bool:
        return self.name.startswith("windows")

    @property
    def joins(self) -> bool:
        return self.name.startswith("joins")

    @property
    def pipeline_file(self) -> Path | None:
        """The module the pipeline variant writes beside its job file."""
        if self.pipeline is None:
            return None
        return self.root / f"{self.pipeline.partition(':')[0]}.py"

    @property
    def target(self) -> str:
        """What ``sparkpoint run`` runs: the job file, or the pipeline."""
        return self.pipeline or str(self.job)

    @property
    def config(self) -> Config:
        return load_config(self.job)

    @property
    def reader(self) -> Config:
        """The config for checking results: the real blob store, without injected faults."""
        return load_config(self.job, {"blob.store.manager.factory": "fsspec"})


def _descendants(pid: int) -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process below ``pid``."""
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        info[int(entry.name)] = (ppid, cmd)
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append((child, *info[child]))
            todo.append(child)
    return out


def _batches_done(log: Path, start: int) -> int:
    """Batches the run whose output starts at byte ``start`` of ``log`` has reported."""
    return len(re.findall(rb"batch \d+: ", log.read_bytes()[start:]))


#: the modules Spark's Python daemon runs as (a worker kill finds its children)
DAEMONS = ("sparkpoint.runtime.spark.pydaemon", "pyspark.daemon")


def _python_workers(pid: int) -> list[int]:
    """Spark's Python workers below ``pid``: the processes a Python daemon forked (sparkpoint's
    own, ``spark.python.daemon.module``, or ``pyspark.daemon``)."""
    below = _descendants(pid)
    daemons = {p for p, _, c in below if any(d in c for d in DAEMONS)}
    return [p for p, parent, _ in below if parent in daemons]


def prepare(variant: Variant) -> None:
    """The variant's job file: the example's keys and the variant's, flat, in its own dir."""
    (variant.root / "cwd").mkdir(parents=True)
    for module in MODULES:
        shutil.copy(module, variant.root / module.name)
    values = {**read_job_file(variant.base), **variant.overrides}
    if variant.kafka is not None:  # every stream of the job on Kafka
        values = {
            k: "kafka." + v.removeprefix("filelog.") if v.startswith("filelog.") else v
            for k, v in values.items()
            if not k.startswith("systems.filelog.")
        }
        values.update(variant.kafka)
    values["job.data.dir"] = str(variant.root / "data")
    variant.job.write_text(json.dumps(values, indent=1) + "\n")  # JSON is YAML
    if variant.pipeline_file is not None:  # the example's pipeline, on the variant's job file
        variant.pipeline_file.write_text(
            "from windows_pipeline import build\n\nfrom sparkpoint import Pipeline\n\n"
            f"job = Pipeline(build, config={str(variant.job)!r}, "
            'value_schema="user STRING, page STRING, ts LONG")\n'
        )
    sp(variant, "stream", "create", str(variant.job), "pageviews", "--partitions", str(TASKS))
    if variant.joins:  # the table, written once: each user's profile
        job = str(variant.job)
        sp(variant, "stream", "create", job, "profiles", "--partitions", str(TASKS), "--compacted")
        profiles = [{"user": u, "country": c, "ts": 0} for u, c in _countries().items()]
        write(job, len(profiles), 0, USERS, stream="profiles", source=profiles)


def _countries() -> dict[str, str]:
    """The ``joins`` variant's table: a country per user (``generate.events``' names)."""
    return {f"user-{i:05d}": COUNTRIES[i % len(COUNTRIES)] for i in range(USERS)}


#: the task modules a variant's job may name (copied next to its job file)
MODULES = (
    EXAMPLE / "pageviews_task.py",
    Path(__file__).parent / "soak_task.py",
    WINDOWS / "windows_task.py",
)


def sp(variant: Variant, *args: str) -> None:
    subprocess.run([SPARKPOINT, *args], check=True, capture_output=True, cwd=variant.root / "cwd")


def round_views(variant: Variant, n: int, seed: int, round_: int) -> list[dict[str, object]]:
    """A round's views: the seed's; for ``windows`` 100 times as far apart in event time (a
    user's views are minutes apart, so sessions end within a round), each round later than
    the last."""
    views = list(events(n, seed, USERS))
    if not variant.windows and not variant.joins:
        return views
    first = int(str(views[0]["ts"])) if views else 0
    stretch = 100 if variant.windows else 1  # joins: a user's views seconds apart, some pairs
    return [{**e, "ts": round_ * ROUND_MS + (int(str(e["ts"])) - first) * stretch} for e in views]


def append_input(variant: Variant, n: int, seed: int) -> None:
    spec = variant.root / f"gen-{seed}.yaml"
    spec.write_text(json.dumps(dict(variant.config.items())))
    write(str(spec), n, seed, USERS, source=round_views(variant, n, seed, len(variant.seeds)))
    spec.unlink()
    variant.seeds.append(seed)
    variant.generated += n


def run(
    variant: Variant,
    kill: str | None,
    rng: random.Random,
    log: Path,
    cluster: StandaloneCluster | None = None,
    *,
    pending: int = 0,
) -> None:
    """One run: to the end of the input, or killed with ``kill`` at a random moment while it
    reads its ``pending`` views."""
    args = [SPARKPOINT, "run", variant.target, "--until-caught-up"]
    if variant.master:
        args += ["--master", variant.master]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    if variant.pipeline is not None:  # its module, and the example's pipeline it imports
        path = [str(variant.root), str(WINDOWS), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    with log.open("ab") as out:
        driver = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, cwd=variant.root / "cwd", env=env
        )
        if kill is None:
            if driver.wait(900) != 0:
                raise SystemExit(f"{variant.name}: the final run failed; see {log}")
            return
        started = log.stat().st_size
        # The kill lands after a random batch of the run, short of its last, and up to half a
        # second into the next one: a moment picked in seconds missed every batch of a short
        # run once the job got faster.
        target = rng.randint(1, max(1, -(-pending // (BATCH * TASKS)) - 1))
        while driver.poll() is None and _batches_done(log, started) < target:
            time.sleep(0.02)  # Spark is starting, or the run has not reached its kill yet
        deadline = time.monotonic() + rng.uniform(0, 0.5)
        while time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.02)
        if driver.poll() is not None:
            return  # it finished first: nothing to kill this time
        if kill in ("python-worker", "worker"):
            if kill == "worker" and cluster is not None:
                cluster.kill_worker(rng.randrange(cluster.workers))
                variant.kinds[kill] += 1
                variant.kills += 1
            elif workers := _python_workers(driver.pid):
                os.kill(rng.choice(workers), signal.SIGKILL)
                variant.kinds[kill] += 1
                variant.kills += 1
            time.sleep(rng.uniform(1, 4))  # the job goes on (Spark retries), then dies too
        below = _descendants(driver.pid)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        for pid, _, _ in below:  # the driver's host is gone: its Spark JVM and workers too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        variant.kinds["driver"] += 1
        variant.kills += 1
    if cluster is not None:
        for i, proc in enumerate(cluster.worker_procs):
            if proc.poll() is not None:
                cluster.restart_worker(i)


def verify(variant: Variant) -> dict[str, int]:
    config = variant.reader
    rounds = zip(variant.seeds, _sizes(variant), strict=True)
    views = [e for i, (s, n) in enumerate(rounds) for e in round_views(variant, n, s, i)]
    if variant.windows:
        return _verify_windows(variant, config, views)
    if variant.joins:
        return _verify_joins(variant, config, views)
    by_user = Counter(str(e["user"]) for e in views)
    by_page = Counter(str(e["page"]) for e in views)
    mismatches = _diff(dict(by_user), _store(config, "user-counts"))
    if "page-counts" in config.stores:
        mismatches += _diff(dict(by_page), _store(config, "page-counts"))
    if "last-page" in config.stores:
        mismatches += _time_mismatches(config, views)
    if variant.overrides.get("job.processing.guarantee") == "exactly-once":
        mismatches += _changelog_taken_back(config, "user-counts")
    emitted: dict[str, set[int]] = {}
    total = 0
    output = SystemStream(config.inputs[0].system, "user-counts")  # the example's output
    for row in read_json_lines(config, Systems(config), output):
        value = row["value"]
        emitted.setdefault(value["user"], set()).add(int(value["count"]))
        total += 1
    lost = sum(len(set(range(1, n + 1)) - emitted.get(u, set())) for u, n in by_user.items())
    blob_dir = config.data_dir / "blobs" / "blobs"
    dangling = len(check_blobs(config)) + _leaked_blobs(config) if blob_dir.is_dir() else 0
    dangling += _outside(variant)
    return {
        "mismatches": mismatches,
        "lost": lost,
        "duplicates": total - len(views),
        "dangling": dangling,
    }


def _verify_windows(
    variant: Variant, config: Config, views: list[dict[str, object]]
) -> dict[str, int]:
    """The windows that went out against the reference's closed windows: each once at least,
    always with its one value, none that should not be there."""
    systems = Systems(config)
    admin = systems.admin("filelog")
    minutes, sessions, _open = closed_windows(
        [(str(e["user"]), int(str(e["ts"]))) for e in views],
        lambda user: admin.partition_for_key(user.encode(), TASKS),
    )
    systems.close()
    if not minutes or not sessions:
        print("windows: the input closed no window", file=sys.stderr)
    return _against(
        variant,
        config,
        [
            (
                "user-minute-counts",
                ("user", "window_start", "window_end", "count"),
                Counter(minutes),
            ),
            ("user-sessions", ("user", "session_start", "session_end", "views"), Counter(sessions)),
        ],
        empty=not minutes or not sessions,
    )


Wanted = tuple[str, tuple[str, ...], Mapping[tuple[object, ...], int]]


def _against(variant: Variant, config: Config, wanted: list[Wanted], empty: bool) -> dict[str, int]:
    """The messages of each output stream (their ``fields``) against what a reference wants,
    each as many times as it wants it (two views of one user at the same time and page are
    two messages alike): none missing (``lost``), none else (``mismatches``), and
    ``duplicates``, the messages beyond those; ``empty``: the reference wants nothing, which
    the input was made to avoid (a mismatch)."""
    systems = Systems(config)
    streams = systems.admin("filelog").list_streams()
    mismatches, lost, duplicates = int(empty), 0, 0
    for stream, fields, want in wanted:
        rows = []  # a stream the job never sent to does not exist
        if stream in streams:
            rows = list(read_json_lines(config, systems, SystemStream("filelog", stream)))
        got = Counter(tuple(r["value"][f] for f in fields) for r in rows)
        mismatches += sum(n for k, n in got.items() if k not in want)
        lost += sum(max(0, n - got[k]) for k, n in want.items())
        duplicates += sum(max(0, n - want[k]) for k, n in got.items() if k in want)
    systems.close()
    return {
        "mismatches": mismatches,
        "lost": lost,
        "duplicates": duplicates,
        "dangling": _outside(variant),
    }


def _verify_joins(
    variant: Variant, config: Config, views: list[dict[str, object]]
) -> dict[str, int]:
    """What the joins sent against the reference: every view once with its user's country
    (``enriched-views``), and every pair of one user's left and right views at most
    ``JOIN_MS`` apart once (``joined-views``); nothing else."""
    from soak_task import JOIN_MS, LEFT_PAGES

    countries = _countries()
    enriched: Counter[tuple[object, ...]] = Counter(
        (str(e["user"]), int(str(e["ts"])), str(e["page"]), countries[str(e["user"])])
        for e in views
    )
    by_user: dict[str, tuple[list[int], list[int]]] = {}
    for e in views:
        left, right = by_user.setdefault(str(e["user"]), ([], []))
        (left if e["page"] in LEFT_PAGES else right).append(int(str(e["ts"])))
    pairs: Counter[tuple[object, ...]] = Counter(
        (user, lt, rt)
        for user, (left, right) in by_user.items()
        for lt in left
        for rt in right
        if abs(lt - rt) <= JOIN_MS
    )
    if not pairs:
        print("joins: the input made no pair", file=sys.stderr)
    return _against(
        variant,
        config,
        [
            ("enriched-views", ("user", "ts", "page", "country"), enriched),
            ("joined-views", ("user", "left_ts", "right_ts"), pairs),
        ],
        empty=not pairs,
    )


def _time_mismatches(config: Config, views: list[dict[str, object]]) -> int:
    """The ``time`` variant's stores against the input: each user's last page (and none once
    a day, the store's TTL, has passed), and the views per user and minute in ``closed`` plus
    ``pending``; timers must have fired (``closed`` is not empty)."""
    from soak_task import BUCKET_MS

    from sparkpoint.model.clock import use_clock, wall_ms

    last = {str(e["user"]): str(e["page"]) for e in views}  # a user's views keep their order
    got = {k: v for _t, k, v in committed_entries(config, "last-page")}
    bad = _diff(last, got)
    with use_clock(lambda: wall_ms() + DAY_MS + 1):
        bad += sum(1 for _ in committed_entries(config, "last-page"))
    by_minute = Counter(f"{e['user']}|{int(str(e['ts'])) // BUCKET_MS}" for e in views)
    closed = _store(config, "closed")
    both = Counter(closed) + Counter(_store(config, "pending"))
    if not closed:
        print("time: no timer fired (closed is empty)", file=sys.stderr)
        bad += 1
    return bad + _diff(dict(by_minute), dict(both))


def _changelog_taken_back(config: Config, store: str) -> int:
    """Exactly-once, on a system that holds changelog records back: keys whose changelog, read
    committed, shows a count that went back (a committed write a restore then undid: its undo
    record stays) or ends elsewhere than the store. Only what compaction kept is read, so this
    catches a count taken back since the last compaction (the job's start)."""
    changelog = SystemStream.parse(config.require(f"stores.{store}.changelog"))
    if not Systems(config).admin(changelog.system).transactional_records:
        return 0  # Kafka: changelog records are not held back (docs/exactly-once.md)
    seen: dict[str, list[int]] = {}
    for row in read_json_lines(config, Systems(config), changelog):
        if row["value"] is not None:  # (the example never deletes a count)
            seen.setdefault(str(row["key"]), []).append(int(row["value"]))
    final = _store(config, store)
    bad = [k for k, counts in seen.items() if counts != sorted(counts) or counts[-1] != final[k]]
    for key in bad[:5]:
        print(f"{changelog}: {key} read committed as {seen[key][-8:]}", file=sys.stderr)
    return len(bad) + len(set(final) - set(seen))


def _replay_bound(variant: Variant) -> int:
    """The most output the kills and task moves could replay: each kill the uncommitted
    batches of every task (at most two: one in flight, one finished but unwritten), each
    restore of one task (a task that moved executors) two batches of that task; none at all
    with exactly-once output."""
    if variant.overrides.get("job.processing.guarantee") == "exactly-once":
        return 0
    log = (variant.root / "run.log").read_text(errors="replace")
    restores = sum(
        1
        for line in log.splitlines()
        if line.startswith("restore Partition") and " store user-counts: " in line
    )
    return variant.kills * 2 * BATCH * TASKS + restores * 2 * BATCH


def _sizes(variant: Variant) -> list[int]:
    return [int(s) for s in (variant.root / "sizes").read_text().split()]


def _store(config: Config, store: str) -> dict[str, int]:
    out: Counter[str] = Counter()
    for _task, key, value in committed_entries(config, store):
        out[str(key)] += int(value)
    return dict(out)


def _diff(expected: Mapping[str, object], got: Mapping[str, object]) -> int:
    return sum(1 for k in set(expected) | set(got) if expected.get(k) != got.get(k))


def _leaked_blobs(config: Config) -> int:
    """Blobs no checkpoint references and with no expiry left (a sweep would never free them)."""
    from sparkpoint.checkpoint.manager import CheckpointManager
    from sparkpoint.storage.blobstore.backend import blob_manager, load_index

    blobs = blob_manager(config)
    referenced: set[str] = set()
    for task, checkpoint in CheckpointManager(config).read_version(2).items():
        for store, index_id in checkpoint.state_checkpoint_markers.get("blobstore", {}).items():
            index = load_index(blobs, index_id, f"{task} {store}")
            referenced.add(index_id)
            referenced.update(index.blobs_used())
    present = {p.name for p in (config.data_dir / "blobs" / "blobs").iterdir()}
    return sum(1 for b in present - referenced if not blobs.has_ttl(b))


def _outside(variant: Variant) -> int:
    """Files the job wrote outside its directories (its data dir; logs and inputs are ours)."""
    allowed = {"data", "cwd", "job.yaml", "sizes", "run.log", *(m.name for m in MODULES)}
    if variant.pipeline_file is not None:
        allowed.add(variant.pipeline_file.name)
    extra = [p for p in variant.root.iterdir() if p.name not in allowed and p.name != "__pycache__"]
    # executors of a cluster keep private state in their working dirs ({cwd}/state): allowed
    extra += [p for p in (variant.root / "cwd").iterdir() if p.name != "state"]
    for p in extra:
        print(f"{variant.name}: written outside the job's directories: {p}", file=sys.stderr)
    return len(extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--variants", default="example,dual")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the soak's directory")
    parser.add_argument(
        "--events", default="15000,40000", help="new input per round: MIN,MAX page views"
    )
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    top = args.dir or Path(tempfile.mkdtemp(prefix="sparkpoint-soak-"))
    started = time.monotonic()
    cluster = None
    services = contextlib.ExitStack()
    variants = []
    for name in args.variants.split(","):
        extra = {
            "dual": DUAL,
            "cluster": DUAL,
            "time": TIME,
            "exactly": EXACTLY,
            "joins": JOINS,
        }.get(name.removesuffix("-kafka"), {})
        overrides = {**BASE, **extra}
        variant = Variant(name, top / name, overrides)
        if variant.windows:  # the example's own stores (window stores with changelogs)
            variant.base = WINDOWS / "job.yaml"
            variant.overrides = {k: v for k, v in BASE.items() if not k.startswith("stores.")}
        if name == "windows-df":
            variant.pipeline = "soak_windows_pipeline:job"
        if name.endswith("-kafka"):
            broker = services.enter_context(TansuKafka(top / f"tansu-{name}"))
            variant.kafka = broker.config("kafka")
        if name == "cluster":
            cluster = StandaloneCluster(top / "spark-cluster", workers=2).start()
            variant.master = cluster.master_url
            variant.overrides["job.logged.store.base.dir"] = "{cwd}/state"
            variant.overrides["spark.task.maxFailures"] = "4"
        prepare(variant)
        variants.append(variant)
    try:
        for i in range(args.kills):
            variant = variants[i % len(variants)]
            low, high = (int(x) for x in args.events.split(","))
            n = rng.randint(low, high)
            append_input(variant, n, seed=args.seed * 1000 + i)
            with (variant.root / "sizes").open("a") as f:
                f.write(f"{n}\n")
            kinds = ["driver", "python-worker"] + (["worker"] if variant.master else [])
            kind = rng.choice(kinds)
            on = cluster if variant.master else None
            run(variant, kind, rng, variant.root / "run.log", on, pending=n)
            print(f"kill {i + 1}/{args.kills}: {variant.name} ({kind})", file=sys.stderr)
        totals: Counter[str] = Counter()
        bound = 0
        over = 0  # duplicates past a variant's own bound of 0 (exactly-once)
        for variant in variants:
            if "blob.store.ttl.ms" in variant.overrides:  # the next start sweeps uploads that
                time.sleep(3.5)  # no checkpoint adopted, once they are past their TTL
            on = cluster if variant.master else None
            run(variant, None, rng, variant.root / "run.log", on)
            if not variant.windows:  # (no blob store, no staged output: nothing to sweep)
                run(variant, None, rng, variant.root / "run.log", on)  # a start that sweeps
            result = verify(variant)
            print(
                f"{variant.name}: {result} kills={variant.kills} {dict(variant.kinds)}",
                file=sys.stderr,
            )
            totals.update(result)
            totals["kills"] += variant.kills
            own = _replay_bound(variant)
            bound += own
            if own == 0:
                over += result["duplicates"]
    finally:
        if cluster is not None:
            cluster.stop()
        services.close()
    print(
        f"kills={totals['kills']} mismatches={totals['mismatches']} lost={totals['lost']} "
        f"duplicates={totals['duplicates']} dangling={totals['dangling']}"
        f" (duplicate bound {bound}; {time.monotonic() - started:.0f} s; in {top})"
    )
    if not args.keep and args.dir is None:
        shutil.rmtree(top, ignore_errors=True)
    bad = totals["mismatches"] or totals["lost"] or totals["dangling"]
    return 1 if bad or over or totals["duplicates"] > bound else 0


if __name__ == "__main__":
    sys.exit(main())

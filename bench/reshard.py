"""Benchmark: ``sparkpoint state reshard`` of a store from 4 to 8 partitions, against a plain
copy of the same state, side by side (issue 33's target: the reshard within 3x the copy).

The state is seeded as the page-view job would leave it: ``--entries`` users (keys
``user-NNNNNNNNN``, ``--value-bytes`` values) in the store ``user-counts``, each in the task its
key maps to among 4 partitions, committed through the changelog backend with a checkpoint per
task. The input then grows to 8 partitions.

* **copy**: every entry read from the 4 tasks' stores and written, in write batches, to fresh
  RocksDB stores (the least a copy of the state in Python over RocksDB does: no changelog, no
  commit); **copy with changelog**: the same, each write also appended to a new changelog
  stream, as a changelog-backed store's writes are (the state's backup copied too);
* **reshard**: ``state reshard`` (restore, check every key, move half of them with their
  changelog puts and tombstones, commit every task, adopt).

Each runs ``--rounds`` times on a fresh copy of the seeded job (median); the file-system copy of
the stores (``cp -r``) is printed for scale. Usage: ``make bench-reshard`` or
``.venv/bin/python bench/reshard.py [--entries N] [--value-bytes B] [--rounds R]``; the
default, 4,800,000 entries of 200 bytes, is about 1 GB of keys and values.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "pageviews"))

from sparkpoint.checkpoint.manager import CheckpointManager  # noqa: E402
from sparkpoint.config import Config, load_config, read_job_file  # noqa: E402
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore  # noqa: E402
from sparkpoint.metadata.job_state import INPUT_PARTITIONS  # noqa: E402
from sparkpoint.model import SystemStreamPartition, TaskModel, TaskName  # noqa: E402
from sparkpoint.storage.changelog.logged import LoggedEngine  # noqa: E402
from sparkpoint.storage.kv.base import KeyValueEngine  # noqa: E402
from sparkpoint.storage.kv.rocksdb import RocksDBEngine  # noqa: E402
from sparkpoint.storage.local import LocalTaskState  # noqa: E402
from sparkpoint.storage.state_id import CleanStart  # noqa: E402
from sparkpoint.storage.task_storage import TaskStorage  # noqa: E402
from sparkpoint.system.base import StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402
from sparkpoint.tools.reshard import commit_unwritten, reshard  # noqa: E402
from sparkpoint.tools.streams import add_partitions  # noqa: E402

STORE = "user-counts"
CHUNK = 50_000


def job_config(data: Path) -> Config:
    values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
    values["job.data.dir"] = str(data)
    values["stores.user-counts.changelog"] = "filelog.user-counts-changelog"
    return load_config(None, values)


def seed(config: Config, entries: int, value_bytes: int) -> int:
    """The store's state as 4 tasks committed it; its bytes of keys and values."""
    systems = Systems(config)
    systems.admin("filelog").create_stream(StreamSpec("pageviews", 4))
    systems.admin("filelog").create_stream(StreamSpec("user-counts-changelog", 4, True))
    value = b"v" * value_bytes
    size = 0
    checkpoints = CheckpointManager(config, systems)
    checkpoints.create_resources()
    storages, engines = [], []
    for partition in range(4):
        ssp = SystemStreamPartition("filelog", "pageviews", partition)
        task = TaskModel(TaskName.for_partition(partition), frozenset({ssp}), partition)
        storage = TaskStorage(config, systems, task, run_id="seed")
        storage.open(CleanStart("seed"))
        storages.append(storage)
        engines.append(storage.logged_engines()[STORE])
    batches: list[list[tuple[bytes, bytes | None]]] = [[] for _ in range(4)]
    for i in range(entries):
        key = b"user-%09d" % i
        partition = zlib.crc32(key) % 4
        batches[partition].append((key, value))
        size += len(key) + len(value)
        if len(batches[partition]) >= CHUNK:
            engines[partition].write_batch(batches[partition])
            batches[partition] = []
    for partition, storage in enumerate(storages):
        engines[partition].write_batch(batches[partition])
        checkpoints.write_checkpoint(storage.task.name, commit_unwritten(storage))
    metadata = CoordinatorStreamStore(config, systems, source="bench")
    metadata.put(INPUT_PARTITIONS, "filelog.pageviews", "4")
    metadata.close()
    add_partitions(config, systems, config.inputs[0], 8)
    systems.close()
    return size


def copy(config: Config, out: Path, *, changelog: str | None = None) -> float:
    """Every entry of the 4 tasks' committed stores into fresh stores, in write batches; with
    ``changelog``, also appended to that new changelog stream (as the stores' writes are)."""
    systems = Systems(config)
    producer = None
    if changelog is not None:
        systems.admin("filelog").create_stream(StreamSpec(changelog, 4, True))
        producer = systems.producer("filelog")
    batch_size = config.get_int(f"stores.{STORE}.write.batch.size")
    started = time.perf_counter()
    for partition in range(4):
        local = LocalTaskState(config.store_base_dir, TaskName.for_partition(partition))
        source = RocksDBEngine(STORE, local.store_dir(STORE), read_only=True)
        target: KeyValueEngine = RocksDBEngine(STORE, out / str(partition))
        if producer is not None and changelog is not None:
            ssp = SystemStreamPartition("filelog", changelog, partition)
            target = LoggedEngine(target, producer, ssp, batch_size)
        start = b""
        while chunk := source.entries_from(start, CHUNK):
            target.write_batch(chunk)
            start = chunk[-1][0] + b"\x00"
        if isinstance(target, LoggedEngine):
            target.drain()
        target.flush()
        source.close()
        target.close()
    if producer is not None:
        producer.flush()
        producer.close()
    seconds = time.perf_counter() - started
    systems.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=4_800_000)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-reshard-") as tmp:
        base = Path(tmp) / "seeded"
        started = time.perf_counter()
        size = seed(job_config(base), args.entries, args.value_bytes)
        print(
            f"seeded {args.entries:,} entries, {size / 2**20:,.0f} MiB of keys and values, "
            f"in {time.perf_counter() - started:.0f} s"
        )
        copies, logged, reshards, fs = [], [], [], []
        for r in range(args.rounds):
            work = Path(tmp) / f"round-{r}"
            shutil.copytree(base, work)
            config = job_config(work)
            started = time.perf_counter()
            shutil.copytree(config.store_base_dir, Path(tmp) / f"cp-{r}")
            fs.append(time.perf_counter() - started)
            copies.append(copy(config, Path(tmp) / f"copy-{r}"))
            logged.append(copy(config, Path(tmp) / f"logged-{r}", changelog=f"copy-{r}"))
            started = time.perf_counter()
            result = reshard(config)
            reshards.append(time.perf_counter() - started)
            moved = result.moved[STORE]
            assert moved.entries == args.entries, (moved.entries, args.entries)
            print(
                f"round {r + 1}: cp -r {fs[-1]:.1f} s, copy {copies[-1]:.1f} s, copy with "
                f"changelog {logged[-1]:.1f} s, reshard "
                f"{reshards[-1]:.1f} s (moved {moved.keys:,} entries, "
                f"{moved.bytes / 2**20:,.0f} MiB)"
            )
            shutil.rmtree(work)
        c, s = statistics.median(copies), statistics.median(reshards)
        w = statistics.median(logged)
        mib = size / 2**20
        print(f"copy:                 {c:6.1f} s  ({mib / c:,.0f} MiB/s)")
        print(f"copy with changelog:  {w:6.1f} s  ({mib / w:,.0f} MiB/s)")
        print(f"reshard:              {s:6.1f} s  ({mib / s:,.0f} MiB/s)")
        print(f"reshard / copy: {s / c:.2f}x (target: at most 3x)")
        print(f"reshard / copy with changelog: {s / w:.2f}x")
        print(f"(cp -r of the stores: {statistics.median(fs):.1f} s)")


if __name__ == "__main__":
    main()

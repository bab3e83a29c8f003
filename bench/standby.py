"""Benchmark: promoting a standby copy vs restoring from the changelog, side by side.

One task's store of ``--mb`` MB (``--value-kb`` KB values, one key each) is written through its
changelog and checkpointed; a standby copy is seeded from the changelog at that checkpoint. Then
``--tail`` more records are written and checkpointed, the task's executor is "lost" (its live
state deleted), and the task's state is brought to the second checkpoint twice: by a changelog
restore (the default without standbys), and by promoting the copy (replaying the tail only).
Prints the state's size, a plain copy of it and the same copy made durable (fsync), both
times and their ratios (a restore's target: 0.5x a copy). Target: a promotion
of a 1 GB task under 2 s. Usage: ``make bench-standby`` or ``.venv/bin/python
bench/standby.py [--mb 1024]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from commit import CHANGELOG, store_job  # bench/commit.py

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import Config
from sparkpoint.model import SystemStreamPartition, TaskModel
from sparkpoint.storage.changelog.marker import ChangelogMarker
from sparkpoint.storage.local import LocalTaskState, StandbyCopy
from sparkpoint.storage.restore import PROMOTED
from sparkpoint.storage.standby import catch_up
from sparkpoint.storage.state_id import EMPTY
from sparkpoint.storage.task_storage import TaskStorage
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems

EXECUTOR = "1"


def write(systems: Systems, first: int, count: int, value_bytes: int) -> CheckpointV2:
    """``count`` records of new keys from ``first`` (random values: the store's size on disk
    is the values' size, as RocksDB compresses nothing); a checkpoint at the changelog's end."""
    producer = systems.producer("filelog")
    block = os.urandom(value_bytes * 1024)
    for i in range(first, first + count):
        if i % 1024 == 0:
            block = os.urandom(value_bytes * 1024)
        at = (i % 1024) * value_bytes
        value = block[at : at + value_bytes]
        producer.send(CHANGELOG, 0, Record("", f"key-{i:012d}".encode(), value, 0))
    producer.flush()
    ssp = SystemStreamPartition("filelog", CHANGELOG, 0)
    newest = systems.admin("filelog").get_metadata([ssp])[ssp].newest
    marker = ChangelogMarker(ssp, newest).dumps()
    return CheckpointV2(CheckpointId.create(), {}, {"changelog": {"s": marker}})


def bring_back(
    config: Config, task: TaskModel, checkpoint: CheckpointV2, standbys: list[tuple[str, str]]
) -> tuple[float, str, int]:
    """The task's state brought to ``checkpoint`` on an empty executor: seconds, how, records."""
    shutil.rmtree(LocalTaskState(config.store_base_dir, task.name).dir, ignore_errors=True)
    storage = TaskStorage(config, Systems(config), task, run_id="bench", last_checkpoint=checkpoint)
    t0 = time.perf_counter()
    storage.open(EMPTY, standbys)
    seconds = time.perf_counter() - t0
    (stats,) = [s for s in storage.restored if s.store == "s"]
    storage.close(EMPTY)
    return seconds, stats.source, stats.entries


def durable_copy(source: Path, destination: Path) -> None:
    """A copy of ``source`` whose files are on disk when it returns, as a restored store's
    are (a restore ends with RocksDB's flush): the plain copy leaves them in the page cache,
    where its time depends on how much the kernel writes back meanwhile (0.4 to 2.4 s at 1 GB
    on this machine)."""
    shutil.copytree(source, destination)
    for path in destination.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=1024, help="state size (default 1024)")
    parser.add_argument("--value-kb", type=int, default=16, help="value size (default 16)")
    parser.add_argument("--tail", type=int, default=1000, help="records after the copy's")
    args = parser.parse_args()
    value_bytes = args.value_kb * 1024
    records = args.mb * 1024 * 1024 // value_bytes
    with tempfile.TemporaryDirectory(prefix="sp-bench-") as tmp:
        config, task = store_job(tmp)
        systems = Systems(config)
        t0 = time.perf_counter()
        first = write(systems, 0, records, value_bytes)
        print(f"wrote {records:,} changelog records in {time.perf_counter() - t0:.1f}s")
        seeded = catch_up(config, systems, task, EXECUTOR, first, None)
        copy = StandbyCopy(config.store_base_dir, EXECUTOR, task.name)
        size = directory_bytes(copy.store_dir("s"))
        print(f"standby copy seeded from the changelog: {size:,} bytes in {seeded.seconds:.2f}s")
        second = write(systems, records, args.tail, value_bytes)
        t0 = time.perf_counter()
        shutil.copytree(copy.store_dir("s"), Path(tmp) / "plain-copy")
        plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        durable_copy(copy.store_dir("s"), Path(tmp) / "durable-copy")
        durable = time.perf_counter() - t0
        restored, how, entries = bring_back(config, task, second, [])
        assert how == "changelog", how
        # the restore used the copy's directory of another executor: seed it again
        seeded = catch_up(config, systems, task, EXECUTOR, first, None)
        promoted, how, tail = bring_back(
            config, task, second, [(EXECUTOR, str(first.checkpoint_id))]
        )
        assert how == PROMOTED, how
    print(f"plain copy of the state ({size / 1e6:,.0f} MB):  {plain:6.2f}s")
    print(f"the same copy made durable (fsync):  {durable:6.2f}s")
    print(
        f"changelog restore ({entries:,} records):   {restored:6.2f}s  "
        f"({plain / restored:.2f}x a plain copy, {durable / restored:.2f}x a durable one; "
        f"target 0.5x)"
    )
    print(
        f"standby promotion ({tail:,} records replayed): {promoted:6.2f}s  "
        f"({restored / promoted:.0f}x faster than the restore; target under 2 s at 1 GB)"
    )


if __name__ == "__main__":
    main()

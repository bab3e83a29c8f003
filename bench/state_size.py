"""Benchmark: what one task's state costs as it grows (issue 35: the state-size part of
``make bench-scale``), every figure measured side by side in one run.

For each size of ``--sizes-mb`` (default 100, 1000 and 5000 MB of ``--value-bytes`` values, one
key each, incompressible), one task's RocksDB store is written through the changelog backend
and compacted (a settled LSM tree), then measured one step after the other:

1. **sync commit pause**: what a commit stops processing for (flush, local RocksDB checkpoint,
   changelog snapshot), the median of 5 commits; the blob-store upload runs after it, off the
   processing path. Target: under 50 ms at 5 GB.
2. **upload** to the blob store (a local directory): the first one (the whole store), then the
   next one after 1% of the keys changed (only the new files).
3. **restore** of the committed state on an executor that has none of it: from the blob store
   and from the changelog, against a plain copy of the same files (``copytree``, left in the
   page cache) and the same copy made durable (``fsync``, as a restore's files are).
   Target: the changelog restore at 0.5x a copy or more.
4. **standby promotion**: a standby copy caught up to the checkpoint, 1,000 more records
   written and committed, the task brought back on the copy's executor (replaying those only).
   Target: under 2 s at 1 GB.

``--plot FILE`` writes the times per size as a PNG (matplotlib, when installed). Needs about 7x
the largest size free on the temporary directory's disk.

Usage: ``make bench-scale`` (after the task-count part) or
``.venv/bin/python bench/state_size.py [--sizes-mb 100,1000,5000] [--plot FILE]``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from commit import (  # bench/commit.py, beside this
    CHANGELOG,
    change_one_percent,
    fill_store,
    restore,
    store_job,
)
from plots import figure  # bench/plots.py
from standby import EXECUTOR, bring_back, directory_bytes, durable_copy, write  # bench/standby.py

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import Config
from sparkpoint.model import SystemStreamPartition, TaskModel
from sparkpoint.storage.backend import BackendContext
from sparkpoint.storage.blobstore.backend import BlobStoreBackupManager, BlobStoreRestoreManager
from sparkpoint.storage.changelog.marker import ChangelogMarker
from sparkpoint.storage.local import LocalTaskState
from sparkpoint.storage.restore import PROMOTED
from sparkpoint.storage.standby import catch_up
from sparkpoint.system.registry import Systems

TAIL = 1_000


@dataclass
class Row:
    """One size's figures (seconds unless named otherwise)."""

    size_mb: int
    on_disk: int = 0
    entries: int = 0
    pause_ms: float = 0.0
    upload: float = 0.0
    upload_mb: float = 0.0
    next_upload: float = 0.0
    next_upload_mb: float = 0.0
    blob_restore: float = 0.0
    changelog_restore: float = 0.0
    plain_copy: float = 0.0
    durable_copy: float = 0.0
    promotion: float = 0.0


def timed(step: str, fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` took (printed, so a long size shows where it is)."""
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    print(f"    {step}: {seconds:.2f}s", flush=True)
    return seconds


def changelog_checkpoint(systems: Systems, cid: CheckpointId) -> CheckpointV2:
    """A checkpoint ``cid`` whose changelog marker is the changelog's newest offset."""
    ssp = SystemStreamPartition("filelog", CHANGELOG, 0)
    newest = systems.admin("filelog").get_metadata([ssp])[ssp].newest
    return CheckpointV2(cid, {}, {"changelog": {"s": ChangelogMarker(ssp, newest).dumps()}})


def uploads(
    config: Config,
    task: TaskModel,
    local: LocalTaskState,
    cid: CheckpointId,
    row: Row,
    value_bytes: int,
) -> CheckpointV2:
    """The first upload of checkpoint ``cid``, then one after 1% of the keys changed; the
    checkpoint naming the first."""
    systems = Systems(config)
    ctx = BackendContext(config, task, ["s"], systems, local)
    backup = BlobStoreBackupManager(ctx)
    backup.init(None)
    markers: dict[str, str] = {}
    row.upload = timed("first upload", lambda: markers.update(backup.upload(cid, {}).result()))
    row.upload_mb = backup.stats()["bytes-uploaded"] / 1e6
    first = CheckpointV2(cid, {}, {"blobstore": markers})
    backup.clean_up(cid, markers)

    cid2 = change_one_percent(local, row.entries, value_bytes)
    backup = BlobStoreBackupManager(ctx)
    backup.init(first)
    row.next_upload = timed("next upload", lambda: backup.upload(cid2, {}).result())
    row.next_upload_mb = backup.stats()["bytes-uploaded"] / 1e6
    return first


def measure(size_mb: int, value_bytes: int) -> Row:
    row = Row(size_mb)
    with tempfile.TemporaryDirectory(prefix="sp-bench-") as tmp:
        config, task = store_job(tmp)
        systems = Systems(config)
        t0 = time.perf_counter()
        local, pause_us = fill_store(config, task, size_mb, value_bytes)
        row.pause_ms = pause_us / 1000
        cid = CheckpointId.parse(max(p.name for p in local.checkpoints_dir("s").iterdir()))
        committed = local.checkpoint_dir("s", str(cid))
        row.on_disk = directory_bytes(committed)
        row.entries = size_mb * 1_000_000 // value_bytes
        print(
            f"  {size_mb:,} MB: {row.entries:,} entries, {row.on_disk / 1e6:,.0f} MB on disk, "
            f"written and compacted in {time.perf_counter() - t0:.0f}s; "
            f"sync commit pause {row.pause_ms:.1f} ms",
            flush=True,
        )
        blob_checkpoint = uploads(config, task, local, cid, row, value_bytes)
        logged_checkpoint = changelog_checkpoint(systems, cid)

        elsewhere = LocalTaskState(Path(tmp) / "new-executor", task.name)
        manager = BlobStoreRestoreManager(BackendContext(config, task, ["s"], systems, elsewhere))
        manager.init(blob_checkpoint)
        row.blob_restore = timed("restore from the blob store", manager.restore)
        shutil.rmtree(Path(tmp) / "new-executor")
        copies = Path(tmp) / "copies"
        row.plain_copy = timed("plain copy", lambda: shutil.copytree(committed, copies / "plain"))
        row.durable_copy = timed(
            "durable copy", lambda: durable_copy(committed, copies / "durable")
        )
        shutil.rmtree(copies)
        seconds, restored = restore(config, task, local)
        print(f"    restore from the changelog ({restored:,} records): {seconds:.2f}s")
        row.changelog_restore = seconds

        catch_up(config, systems, task, EXECUTOR, logged_checkpoint, None)  # seeded
        tail = write(systems, 10**11, TAIL, value_bytes)
        promoted, how, replayed = bring_back(
            config, task, tail, [(EXECUTOR, str(logged_checkpoint.checkpoint_id))]
        )
        assert how == PROMOTED and replayed == TAIL, (how, replayed)
        print(f"    standby promotion ({replayed:,} records replayed): {promoted:.2f}s")
        row.promotion = promoted
    return row


def table(rows: list[Row], value_bytes: int) -> None:
    print()
    print(f"one task's store, {value_bytes:,}-byte values; restores on an empty executor")
    head = (
        f"{'state':>7} {'pause':>8} {'upload':>15} {'1% upload':>15} {'blob restore':>19} "
        f"{'changelog restore':>24} {'copy':>6} {'durable':>8} {'promotion':>9}"
    )
    print(head)
    for r in rows:
        durable = r.durable_copy
        print(
            f"{r.size_mb:>5}MB {r.pause_ms:>6.1f}ms "
            f"{r.upload:>6.1f}s {r.upload_mb:>6,.0f}MB "
            f"{r.next_upload:>6.1f}s {r.next_upload_mb:>6,.0f}MB "
            f"{r.blob_restore:>6.1f}s {durable / r.blob_restore:>5.2f}x dur "
            f"{r.changelog_restore:>6.1f}s {durable / r.changelog_restore:>4.2f}x dur "
            f"{r.plain_copy / r.changelog_restore:>4.2f}x pl "
            f"{r.plain_copy:>5.1f}s {durable:>7.1f}s {r.promotion:>8.2f}s"
        )
    print("(x dur / x pl: the copy's time over the restore's, durable or plain; 1.0x = as fast)")
    largest = rows[-1]
    gb = [r for r in rows if r.size_mb == 1000]
    print(
        f"targets: sync commit pause under 50 ms at {largest.size_mb:,} MB: "
        f"{largest.pause_ms:.1f} ms; changelog restore at 0.5x a copy or more: "
        f"{min(r.durable_copy / r.changelog_restore for r in rows):.2f}x durable, "
        f"{min(r.plain_copy / r.changelog_restore for r in rows):.2f}x plain (lowest)"
        + (f"; promotion of 1 GB under 2 s: {gb[0].promotion:.2f}s" if gb else "")
    )


def plot(rows: list[Row], path: str) -> None:
    with figure(path) as ax:
        if ax is None:
            return
        sizes = [r.size_mb / 1000 for r in rows]
        for label, values in {
            "restore from the changelog": [r.changelog_restore for r in rows],
            "restore from the blob store": [r.blob_restore for r in rows],
            "durable copy": [r.durable_copy for r in rows],
            "first upload": [r.upload for r in rows],
            "standby promotion": [r.promotion for r in rows],
            "sync commit pause": [r.pause_ms / 1000 for r in rows],
        }.items():
            ax.plot(sizes, values, "o-", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("state (GB)")
        ax.set_ylabel("seconds")
        ax.legend(fontsize="small")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes-mb", default="100,1000,5000")
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--plot", default="")
    args = parser.parse_args()
    rows = []
    for size in (int(s) for s in args.sizes_mb.split(",")):
        rows.append(measure(size, args.value_bytes))
    table(rows, args.value_bytes)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()

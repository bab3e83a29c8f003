"""Benchmark: the blob store backend (issue 5), measured side by side in one run.

For a RocksDB store of about 1 GB (``--size-mb``): restore time from the blob store (a local
directory) versus changelog replay versus a plain copy of the same files on the same disk (the
physical limit); and the bytes a commit uploads after updating 1% of the keys, as a share of
the store's size.

Usage: ``make bench-blobstore`` or ``.venv/bin/python bench/blobstore.py [--size-mb 1000]``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from commit import (  # bench/commit.py, beside this file
    change_one_percent,
    fill_store,
    restore,
    store_job,
)

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.storage.backend import BackendContext
from sparkpoint.storage.blobstore.backend import BlobStoreBackupManager, BlobStoreRestoreManager
from sparkpoint.storage.local import LocalTaskState
from sparkpoint.system.registry import Systems


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=1000)
    parser.add_argument("--value-bytes", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sp-bench-") as tmp:
        config, task = store_job(tmp)
        systems = Systems(config)
        local, _ = fill_store(config, task, args.size_mb, args.value_bytes)
        cid = max(p.name for p in local.checkpoints_dir("s").iterdir())
        size = dir_bytes(local.checkpoint_dir("s", cid))
        print(
            f"store: {size / 1e6:,.0f} MB in "
            f"{len(list(local.checkpoint_dir('s', cid).iterdir()))} files"
        )

        ctx = BackendContext(config, task, ["s"], systems, local)
        backup = BlobStoreBackupManager(ctx)
        backup.init(None)
        t0 = time.perf_counter()
        markers = backup.upload(CheckpointId.parse(cid), {}).result()
        print(
            f"first upload: {backup.stats()['bytes-uploaded'] / 1e6:,.0f} MB "
            f"in {time.perf_counter() - t0:.1f}s"
        )
        first = CheckpointV2(CheckpointId.parse(cid), {}, {"blobstore": markers})
        backup.clean_up(first.checkpoint_id, markers)

        # 1. update 1% of the keys, commit, and see what the upload sends
        n = args.size_mb * 1_000_000 // args.value_bytes
        cid2 = change_one_percent(local, n, args.value_bytes)
        backup = BlobStoreBackupManager(ctx)
        backup.init(first)
        backup.upload(cid2, {}).result()
        sent = backup.stats()["bytes-uploaded"]
        total = dir_bytes(local.checkpoint_dir("s", str(cid2)))
        print(
            f"after updating 1% of keys: uploaded {sent / 1e6:,.1f} MB of {total / 1e6:,.0f} MB "
            f"= {sent / total:.1%} of the store (target < 10%)"
        )

        # 2. restore on a "new host": nothing of the store on local disk
        fresh = LocalTaskState(Path(tmp) / "newhost", task.name)
        rctx = BackendContext(config, task, ["s"], systems, fresh)
        manager = BlobStoreRestoreManager(rctx)
        manager.init(first)
        t0 = time.perf_counter()
        manager.restore()
        blob_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        shutil.copytree(local.checkpoint_dir("s", cid), Path(tmp) / "plain-copy")
        copy_s = time.perf_counter() - t0
        changelog_s, entries = restore(config, task, local)
        print(
            f"restore: blob store {blob_s:.1f}s, changelog replay {changelog_s:.1f}s "
            f"({entries:,} entries), plain copy {copy_s:.1f}s"
        )
        print(
            f"  changelog / blob = {changelog_s / blob_s:.1f}x (target >= 20)   "
            f"blob / plain copy = {blob_s / copy_s:.2f}x (target <= 2)"
        )


if __name__ == "__main__":
    main()

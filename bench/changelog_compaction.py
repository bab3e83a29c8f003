"""Benchmark: changelog restore before and after the job-start compaction, side by side.

A store of ``--keys`` keys, each updated ``--updates`` times through the changelog (values of
100 bytes), is restored by replaying its changelog; then the changelog is compacted up to its
checkpointed offset (what the driver does at job start) and the store restored again. Prints
both restore times, their ratio and the compaction's own time. Usage:
``make bench-changelog`` or ``.venv/bin/python bench/changelog_compaction.py``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from commit import CHANGELOG, restore, store_job  # bench/commit.py

from sparkpoint.storage.local import LocalTaskState
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sp-bench-") as tmp:
        config, task = store_job(tmp)
        systems = Systems(config)
        admin = systems.admin("filelog")
        producer = systems.producer("filelog")
        value = os.urandom(100)
        for _ in range(args.updates):
            for i in range(args.keys):
                producer.send(CHANGELOG, 0, Record("", f"key-{i:09d}".encode(), value, 0))
        producer.flush()
        local = LocalTaskState(config.store_base_dir, task.name)
        local.store_dir("s").mkdir(parents=True)
        before, entries_before = restore(config, task, local)
        t0 = time.perf_counter()
        upcoming = str(args.keys * args.updates)
        counts = admin.compact(CHANGELOG, 0, upcoming)
        compaction = time.perf_counter() - t0
        after, entries_after = restore(config, task, local)
    print(
        f"{args.keys:,} keys x {args.updates} updates: changelog {entries_before:,} -> "
        f"{entries_after:,} entries (compacted {counts}) in {compaction:.1f}s"
    )
    print(
        f"restore: uncompacted {before:.2f}s, compacted {after:.2f}s, "
        f"speed-up {before / after:.1f}x"
    )


if __name__ == "__main__":
    main()

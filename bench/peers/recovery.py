"""The recovery figure of ``bench/peers/run.py``: how fast a job is back after losing its host.

Workload: ``--recovery-users`` users (1,000,000 by default) each view a page once with a
``--pad``-byte payload (1,000): per user the job keeps the count and the last view, about 1 GB of
state. The job runs until caught up (untimed: the build), then loses its local state directory
(the host is gone; the ``local`` mode keeps it, as a restart on the same host), 10,000 more
views arrive (``"phase": 2``), and the job starts again. Measured: the time from that start to
its first output for a new view (state restored and Spark up) and to caught up; the final
counts are checked. The reference is a plain copy (``shutil.copytree``) of the same state
directory on the same disk, the physical limit of bringing the state back.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODES = ("blobstore", "changelog", "local")
NEW_VIEWS = 10_000


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


def _job(work: Path, data: Path, step: str, mode: str, args: argparse.Namespace) -> float:
    """One step of sparkpoint_job.py; returns its wall seconds."""
    cmd = [
        sys.executable,
        str(HERE / "sparkpoint_job.py"),
        step,
        "--data",
        str(data),
        "--work",
        str(work),
        "--result",
        str(work / "result.json"),
        "--checkpoint-ms",
        str(args.checkpoint_ms),
        "--events",
        "0",
        "--recovery",
        mode,
    ]
    t0 = time.time()
    with (work / "log.txt").open("a") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=log)
    if proc.returncode != 0:
        tail = (work / "log.txt").read_text()[-1500:]
        raise RuntimeError(f"sparkpoint {mode} {step}: exit {proc.returncode}\n{tail}")
    return time.time() - t0


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def sparkpoint_recovery(
    mode: str, data: Path, work: Path, args: argparse.Namespace, expected: Counter[str]
) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    _job(work, data / "1", "prepare", mode, args)
    build = _job(work, data / "1", "run", mode, args)
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
    _job(work, data / "2", "prepare", mode, args)
    (work / "first-output").unlink(missing_ok=True)
    changelog = work / "job" / "streams" / "filelog" / "user-views-changelog"
    logged = dir_bytes(changelog) if changelog.exists() else 0
    started = time.time()
    _job(work, data / "2", "run", mode, args)
    out = json.loads((work / "result.json").read_text())
    written = int(out["uploaded"]) if mode != "changelog" else dir_bytes(changelog) - logged
    counts = Counter({str(k): int(v) for k, v in out["counts"].items()})
    if counts != expected:
        wrong = sum(1 for u in expected.keys() | counts.keys() if counts[u] != expected[u])
        raise RuntimeError(f"sparkpoint recovery ({mode}): {wrong} users have wrong counts")
    restores = [r for r in out.get("restores", []) if r["source"] != "local-checkpoint"]
    return {
        "variant": f"sparkpoint-task ({mode})",
        "restore_s": sum(float(r["seconds"]) for r in restores),
        "restored_bytes": sum(int(r["bytes"]) for r in restores),
        "state_bytes": size,
        "build_s": build,
        "first_output_s": float(out["first_output"]) - started,
        "caught_up_s": float(out["finished"]) - started,
        "plain_copy_s": copy,
        # the run after the loss touched 10,000 of the users: a commit at 1% key churn
        "checkpoint_bytes": written,
        "checkpoint_pause_s": max(out["pauses"], default=0.0),
    }


def run_all(args: argparse.Namespace, scratch: Path, partitions: int) -> list[dict[str, Any]]:
    data = scratch / "recovery-data"
    print(
        f"recovery: writing {args.recovery_users:,} users x {args.pad} B of state ...", flush=True
    )
    expected = write_views(data, args.recovery_users, args.pad, args.seed, partitions)
    rows = []
    for mode in MODES:
        row = sparkpoint_recovery(mode, data, scratch / f"recovery-{mode}", args, expected)
        print(
            f"recovery: {row['variant']:28s} first new output {row['first_output_s']:6.1f} s, "
            f"caught up {row['caught_up_s']:6.1f} s, restores {row['restore_s']:.1f} s in all; "
            f"plain copy of {row['state_bytes'] / 1e9:.2f}"
            f" GB {row['plain_copy_s']:.1f} s",
            flush=True,
        )
        rows.append(row)
    shutil.rmtree(data, ignore_errors=True)
    os.sync()
    return rows

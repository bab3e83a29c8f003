"""What every variant of ``bench/peers.py`` shares, standard library only: each variant runs in
its own framework's virtual env and imports this file by path.

A variant is a script run as ``python <script> --data D --work W --result R [options]``. It reads
the page views in ``D/part-<p>.jsonl`` (partition ``p`` = crc32(user) % partitions, the same
for every framework), keeps a durable count per user with its framework's state and
checkpoints, emits ``{user, count}`` per view, and writes ``R``: the final count per user and
when it processed its first view (:func:`mark_first`, in this process or any child).

The recovery figure (``recovery.py``) runs a variant with ``--recovery``: per user it keeps the
count and the last view (about 1 KB), and for every view of the input added after the state was
lost (``"phase": 2``) it appends ``time user count`` with :class:`Progress`, from which the
orchestrator reads the first new output, the time it caught up, and the restored counts.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def arguments(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", type=Path, required=True, help="the part-<p>.jsonl files")
    parser.add_argument("--work", type=Path, required=True, help="state, checkpoints, output")
    parser.add_argument("--result", type=Path, required=True, help="where the result JSON goes")
    parser.add_argument("--checkpoint-ms", type=int, default=1000)
    parser.add_argument("--events", type=int, required=True, help="views in --data")
    parser.add_argument(
        "--recovery", action="store_true", help="the recovery workload (see recovery.py)"
    )
    return parser


def partitions(data: Path) -> list[Path]:
    return sorted(data.glob("part-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))


_marked = False


def mark_first(work: Path) -> None:
    """Record, once per run, the wall time at which the first view was processed (cheap to
    call per view: one flag test after the first call in a process)."""
    global _marked
    if _marked:
        return
    _marked = True
    path = work / "first-output"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(repr(time.time()))


def first_output(work: Path) -> float | None:
    path = work / "first-output"
    return float(path.read_text()) if path.exists() else None


class Progress:
    """Appends a line per phase-2 view to a file of its own (one per process and instance, so
    writers never interleave); line-buffered, so a SIGKILL loses no line already written."""

    def __init__(self, work: Path) -> None:
        self.folder = work / "progress"
        self.file: Any = None

    def __call__(self, user: str, count: int) -> None:
        if self.file is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            name = f"{os.getpid()}-{id(self):x}.tsv"
            self.file = (self.folder / name).open("a", buffering=1)
        self.file.write(f"{time.time()!r}\t{user}\t{count}\n")


def write_result(args: argparse.Namespace, counts: dict[str, int], **extra: Any) -> None:
    result = {"counts": counts, "first_output": first_output(args.work), **extra}
    args.result.write_text(json.dumps(result))


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports free now (a Bytewax cluster's addresses)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_bytewax(
    flow: str, work: Path, checkpoint_ms: int, env: dict[str, str], processes: int
) -> float:
    """Run the Bytewax dataflow ``flow`` (``module:attribute`` in this folder) as
    ``processes`` processes of one worker each on loopback, with SQLite recovery under
    ``work/recovery`` (made on first use, kept across runs) snapshotting every
    ``checkpoint_ms`` (whole seconds); ``env`` is added to the processes' environment.
    Returns the wall time at which the last one ended."""
    recovery = work / "recovery"
    py = sys.executable
    if not recovery.exists():
        recovery.mkdir(parents=True)
        subprocess.run([py, "-m", "bytewax.recovery", str(recovery), "4"], check=True)
    here = str(Path(__file__).resolve().parent)
    full = {**os.environ, "PYTHONPATH": here, **env}
    addresses = ";".join(f"127.0.0.1:{p}" for p in free_ports(processes))
    snapshot_s = str(max(checkpoint_ms // 1000, 1))
    run = [py, "-m", "bytewax.run", flow, "-a", addresses, "-r", str(recovery), "-s", snapshot_s]
    procs = [
        subprocess.Popen([*run, "-i", str(i), "-b", "0"], env=full, cwd=here)
        for i in range(processes)
    ]
    codes = [p.wait() for p in procs]
    finished = time.time()
    if any(codes):
        raise SystemExit(f"bytewax processes exited with {codes}")
    return finished


def flink_settings(args: argparse.Namespace, tmp: Path, parallelism: int) -> dict[str, str]:
    """The Flink configuration both PyFlink variants share: embedded RocksDB state with
    incremental checkpoints every ``--checkpoint-ms`` under ``--work``, no restarts."""
    return {
        "parallelism.default": str(parallelism),
        "state.backend.type": "rocksdb",
        "execution.checkpointing.incremental": "true",
        "execution.checkpointing.interval": f"{args.checkpoint_ms}ms",
        "execution.checkpointing.dir": (args.work / "checkpoints").as_uri(),
        "io.tmp.dirs": str(tmp),
        "restart-strategy.type": "none",  # fail, rather than retry for ever
    }

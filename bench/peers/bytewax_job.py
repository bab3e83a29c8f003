"""Bytewax's variant for ``bench/peers.py`` (Bytewax 0.21, in its own env): a dataflow reading
the partition files (``DirSource``: one partition per file, resumable), counting per user with
``stateful_map``, writing ``{user, count}`` lines (``DirSink``), with SQLite recovery
snapshotting every ``--checkpoint-ms``. Run as 2 processes of 1 worker each, as Bytewax scales
on one machine. The final counts are read back from the output files.

With ``--recovery`` (see ``recovery.py``) it keeps the count and the last view per user and
reads every ``*part-*.jsonl`` file in ``--data``: run again with the same recovery directory
(Bytewax's only durable state), it resumes each file where its last snapshot left it and reads
new files from the start.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import Progress, arguments, mark_first, write_result  # noqa: E402

PROCESSES = 2


def build_flow() -> object:
    """The dataflow, configured by BENCH_DATA / BENCH_WORK (set by main for each process)."""
    import bytewax.operators as op
    from bytewax.connectors.files import DirSink, DirSource
    from bytewax.dataflow import Dataflow

    data, work = Path(os.environ["BENCH_DATA"]), Path(os.environ["BENCH_WORK"])
    flow = Dataflow("pageviews")
    lines = op.input("in", flow, DirSource(data, glob_pat="*part-*.jsonl", batch_size=1000))
    views = op.map("parse", lines, json.loads)
    keyed = op.key_on("user", views, lambda v: v["user"])

    def count(state: int | None, _view: object) -> tuple[int, int]:
        mark_first(work)
        n = (state or 0) + 1
        return n, n

    progress = Progress(work)

    def last_view(state: tuple[int, dict[str, object]] | None, view: dict[str, object]) -> object:
        n = (state[0] if state else 0) + 1
        if view["phase"] == 2:
            progress(str(view["user"]), n)
        return (n, view), n

    recovery = os.environ.get("BENCH_RECOVERY") == "1"
    counts = op.stateful_map("count", keyed, last_view if recovery else count)
    out = op.map("json", counts, lambda kv: (kv[0], json.dumps({"user": kv[0], "count": kv[1]})))
    op.output("out", out, DirSink(work / "out", 4))
    return flow


if os.environ.get("BENCH_WORK"):
    flow = build_flow()


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main() -> None:
    args = arguments(__doc__).parse_args()
    recovery = args.work / "recovery"
    py = sys.executable
    if not recovery.exists():
        recovery.mkdir(parents=True)
        subprocess.run([py, "-m", "bytewax.recovery", str(recovery), "4"], check=True)
    (args.work / "out").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "BENCH_DATA": str(args.data),
        "BENCH_WORK": str(args.work),
        "PYTHONPATH": str(HERE),
        "BENCH_RECOVERY": "1" if args.recovery else "0",
    }
    addresses = ";".join(f"127.0.0.1:{p}" for p in free_ports(PROCESSES))
    snapshot_s = str(max(args.checkpoint_ms // 1000, 1))  # whole seconds only
    run = [py, "-m", "bytewax.run", "bytewax_job:flow"]
    procs = [
        subprocess.Popen(
            [*run, "-i", str(i), "-a", addresses, "-r", str(recovery), "-s", snapshot_s, "-b", "0"],
            env=env,
            cwd=HERE,
        )
        for i in range(PROCESSES)
    ]
    codes = [p.wait() for p in procs]
    finished = time.time()
    if any(codes):
        raise SystemExit(f"bytewax processes exited with {codes}")
    counts: dict[str, int] = {}
    for path in (args.work / "out").glob("part_*"):
        for line in path.open():
            row = json.loads(line)
            counts[row["user"]] = max(counts.get(row["user"], 0), int(row["count"]))
    write_result(args, counts, finished=finished)


if __name__ == "__main__":
    main()

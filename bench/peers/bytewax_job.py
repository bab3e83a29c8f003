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
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import Progress, arguments, mark_first, run_bytewax, write_result  # noqa: E402

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


def main() -> None:
    args = arguments(__doc__).parse_args()
    (args.work / "out").mkdir(parents=True, exist_ok=True)
    env = {
        "BENCH_DATA": str(args.data),
        "BENCH_WORK": str(args.work),
        "BENCH_RECOVERY": "1" if args.recovery else "0",
    }
    finished = run_bytewax("bytewax_job:flow", args.work, args.checkpoint_ms, env, PROCESSES)
    counts: dict[str, int] = {}
    for path in (args.work / "out").glob("part_*"):
        for line in path.open():
            row = json.loads(line)
            counts[row["user"]] = max(counts.get(row["user"], 0), int(row["count"]))
    write_result(args, counts, finished=finished)


if __name__ == "__main__":
    main()

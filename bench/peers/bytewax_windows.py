"""Bytewax's windows for ``bench/windows.py`` (Bytewax 0.21, in its own env): the page views of
``--data`` (``part-<p>.jsonl``, one partition per file), keyed by user, counted per 1-minute
tumbling window and per 30 s session (``fold_window``; an ``EventClock`` of ``--lateness-ms``
moved by event time alone; windows aligned to the epoch), with SQLite recovery snapshotting
every ``--checkpoint-ms``; 2 processes of 1 worker each, as Bytewax scales on one machine. Each
window's count and its metadata (start and end; a session's first and last view) go to files
(``DirSink``) and are joined here once the flow ends.

Writes ``--result``: ``{"minutes": [[user, start, end, count]...], "sessions": [[user, first
view, last view, views]...], "seconds": S}``, S from the first view processed to the end.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import arguments, first_output, mark_first, run_bytewax  # noqa: E402

MINUTE_MS = 60_000
SESSION_GAP_MS = 30_000
PROCESSES = 2


def build_flow() -> object:
    """The dataflow, configured by BENCH_DATA / BENCH_WORK / BENCH_LATENESS_MS."""
    from datetime import UTC, datetime, timedelta

    import bytewax.operators as op
    from bytewax.connectors.files import DirSink, DirSource
    from bytewax.dataflow import Dataflow
    from bytewax.operators import windowing as win

    data, work = Path(os.environ["BENCH_DATA"]), Path(os.environ["BENCH_WORK"])
    lateness = timedelta(milliseconds=int(os.environ["BENCH_LATENESS_MS"]))
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    flow = Dataflow("windows")
    lines = op.input("in", flow, DirSource(data, glob_pat="part-*.jsonl", batch_size=1000))

    def parse(line: str) -> tuple[str, int]:
        mark_first(work)
        view = json.loads(line)
        return str(view["user"]), int(view["ts"])

    keyed = op.key_on("user", op.map("parse", lines, parse), lambda v: v[0])
    # the watermark moves with event time only (the largest seen minus the lateness), as in
    # Spark, Flink and sparkpoint: Bytewax's default also moves it with the system clock,
    # which makes a replay's views late by the time the replay takes
    clock = win.EventClock(
        lambda v: epoch + timedelta(milliseconds=v[1]),
        wait_for_system_duration=lateness,
        now_getter=lambda: epoch,
        to_system_utc=lambda _t: None,  # windows close on views and at the end, not on a timer
    )
    kinds = {
        "minutes": win.TumblingWindower(length=timedelta(milliseconds=MINUTE_MS), align_to=epoch),
        "sessions": win.SessionWindower(gap=timedelta(milliseconds=SESSION_GAP_MS)),
    }
    for kind, windower in kinds.items():
        out = win.fold_window(
            kind, keyed, clock, windower, lambda: 0, lambda n, _v: n + 1, lambda a, b: a + b
        )

        def count_line(kv: tuple[str, tuple[int, int]]) -> tuple[str, str]:
            user, (window, n) = kv
            return user, json.dumps([user, window, n])

        def meta_line(kv: tuple[str, tuple[int, win.WindowMetadata]]) -> tuple[str, str]:
            user, (window, meta) = kv
            millis = [
                int((t - epoch) / timedelta(milliseconds=1))
                for t in (meta.open_time, meta.close_time)
            ]
            return user, json.dumps([user, window, *millis])

        op.output(
            f"{kind}-counts",
            op.map(f"{kind}-c", out.down, count_line),
            DirSink(work / f"{kind}-counts", 2),
        )
        op.output(
            f"{kind}-meta",
            op.map(f"{kind}-m", out.meta, meta_line),
            DirSink(work / f"{kind}-meta", 2),
        )
    return flow


if os.environ.get("BENCH_WORK"):
    flow = build_flow()


def joined(work: Path, kind: str) -> list[list[object]]:
    """``[user, start, end, count]`` per window: its count joined to its metadata."""
    counts, metas = {}, {}
    for folder, into in ((f"{kind}-counts", counts), (f"{kind}-meta", metas)):
        for path in (work / folder).glob("part_*"):
            for line in path.open():
                row = json.loads(line)
                into[(row[0], row[1])] = row[2:]
    if counts.keys() != metas.keys():
        raise SystemExit(f"bytewax {kind}: counts and metadata name different windows")
    return [[user, *metas[(user, w)], n[0]] for (user, w), n in counts.items()]


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--lateness-ms", type=int, default=5_000)
    args = parser.parse_args()
    for kind in ("minutes", "sessions"):
        for what in ("counts", "meta"):
            (args.work / f"{kind}-{what}").mkdir(parents=True)
    env = {
        "BENCH_DATA": str(args.data),
        "BENCH_WORK": str(args.work),
        "BENCH_LATENESS_MS": str(args.lateness_ms),
    }
    finished = run_bytewax("bytewax_windows:flow", args.work, args.checkpoint_ms, env, PROCESSES)
    first = first_output(args.work)
    result = {
        "minutes": joined(args.work, "minutes"),
        "sessions": joined(args.work, "sessions"),
        "seconds": finished - (first or finished),
    }
    args.result.write_text(json.dumps(result))


if __name__ == "__main__":
    main()

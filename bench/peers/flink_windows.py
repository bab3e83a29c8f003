"""PyFlink's windows for ``bench/windows.py`` (PyFlink 2.3, in its own env): Flink SQL over the
page views of ``--data`` (``part-<p>.jsonl``, a filesystem table read as a bounded stream), a
watermark of ``--lateness-ms`` on the event time, and two window queries in one job: a count
per user per 1-minute ``TUMBLE`` and per 30 s ``SESSION``, each to CSV files. Embedded RocksDB
state with incremental checkpoints every ``--checkpoint-ms``, parallelism 4. No Python runs in
the job (the queries run in the JVM). A view at most 30 s after a session's last one joins
it, as in the reference (Flink's session windows merge when they touch).

Writes ``--result``: ``{"minutes": [[user, start, end, count]...], "sessions": [[user, first
view, last view, views]...], "seconds": S}``, S from the job's submission (the local cluster's
start included, the JVM's not) to its end.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import arguments, flink_settings  # noqa: E402

PARALLELISM = 4


def rows(folder: Path) -> list[list[object]]:
    """The committed CSV rows under ``folder`` (in-progress files start with a dot)."""
    out: list[list[object]] = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.name.startswith("."):
            with path.open() as f:
                out += [[r[0], *(int(x) for x in r[1:])] for r in csv.reader(f)]
    return out


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--lateness-ms", type=int, default=5_000)
    args = parser.parse_args()
    tmp = args.work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ["JVM_ARGS"] = f"-Djava.io.tmpdir={tmp}"
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    conf = Configuration()
    for key, value in {
        **flink_settings(args, tmp, PARALLELISM),
        "table.local-time-zone": "UTC",
    }.items():
        conf.set_string(key, value)
    builder = EnvironmentSettings.new_instance().in_streaming_mode()
    settings = builder.with_configuration(conf).build()
    t_env = TableEnvironment.create(settings)
    lateness = f"INTERVAL '{args.lateness_ms / 1000:.3f}' SECOND"
    t_env.execute_sql(
        f"""CREATE TABLE pageviews (`user` STRING, page STRING, ts BIGINT,
            et AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR et AS et - {lateness})
            WITH ('connector' = 'filesystem', 'path' = '{args.data}', 'format' = 'json')"""
    )
    for kind in ("minute", "session"):
        t_env.execute_sql(
            f"""CREATE TABLE {kind}_counts (`user` STRING, a BIGINT, b BIGINT, n BIGINT)
                WITH ('connector' = 'filesystem', 'path' = '{args.work / kind}',
                      'format' = 'csv')"""
        )
    statements = t_env.create_statement_set()
    statements.add_insert_sql(
        """INSERT INTO minute_counts
           SELECT `user`, UNIX_TIMESTAMP(DATE_FORMAT(window_start, 'yyyy-MM-dd HH:mm:ss')) * 1000,
                  UNIX_TIMESTAMP(DATE_FORMAT(window_end, 'yyyy-MM-dd HH:mm:ss')) * 1000, COUNT(*)
           FROM TABLE(TUMBLE(TABLE pageviews, DESCRIPTOR(et), INTERVAL '1' MINUTE))
           GROUP BY `user`, window_start, window_end"""
    )
    statements.add_insert_sql(
        """INSERT INTO session_counts
           SELECT `user`, MIN(ts), MAX(ts), COUNT(*)
           FROM TABLE(SESSION(TABLE pageviews PARTITION BY `user`, DESCRIPTOR(et),
                              INTERVAL '30' SECOND))
           GROUP BY `user`, window_start, window_end"""
    )
    started = time.time()
    statements.execute().wait()
    seconds = time.time() - started
    result = {
        "minutes": rows(args.work / "minute"),
        "sessions": rows(args.work / "session"),
        "seconds": seconds,
    }
    args.result.write_text(json.dumps(result))


if __name__ == "__main__":
    main()

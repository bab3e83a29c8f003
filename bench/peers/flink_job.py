"""PyFlink's variant for ``bench/peers.py`` (PyFlink 2.3, in its own env): the partition files
as a bounded ``FileSource``, keyed by user, a ``KeyedProcessFunction`` counting in
``ValueState`` on the embedded RocksDB state backend with incremental checkpoints every
``--checkpoint-ms`` (file:// storage), ``user,count`` lines to a ``FileSink`` that commits on
checkpoints. Parallelism 4 (one per input partition), Python in thread mode (the UDFs run
inside the JVM; several times faster here than process mode). The final counts are read back
from the committed output files.

With ``--recovery`` (see ``recovery.py``) the job keeps the count and the last view per user,
watches ``--data`` for new files instead of reading a fixed set (so it runs until killed),
retains its checkpoints when killed, and with ``--restore CHK`` starts from a retained
``chk-N`` directory (``execution.state-recovery.path``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import Progress, arguments, flink_settings, write_result  # noqa: E402

PARALLELISM = 4


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--restore", help="a retained chk-N directory to start from")
    args = parser.parse_args()
    tmp = args.work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    # thread mode's embedded interpreter sees neither the venv nor this folder by itself
    site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(site)])
    os.environ["JVM_ARGS"] = f"-Djava.io.tmpdir={tmp}"
    from pyflink.common import Configuration, Duration, Encoder, Types, WatermarkStrategy
    from pyflink.datastream import KeyedProcessFunction, RuntimeContext
    from pyflink.datastream import StreamExecutionEnvironment as Env
    from pyflink.datastream.connectors.file_system import (
        FileSink,
        FileSource,
        OutputFileConfig,
        RollingPolicy,
        StreamFormat,
    )
    from pyflink.datastream.state import ValueStateDescriptor

    conf = Configuration()
    for key, value in {
        **flink_settings(args, tmp, PARALLELISM),
        "python.execution-mode": "thread",
        "python.executable": sys.executable,  # the default, "python", is not this venv's
        "python.client.executable": sys.executable,
    }.items():
        conf.set_string(key, value)
    if args.recovery:
        retention = "execution.checkpointing.externalized-checkpoint-retention"
        conf.set_string(retention, "RETAIN_ON_CANCELLATION")
    if args.restore:
        conf.set_string("execution.state-recovery.path", args.restore)
        # claim the restored checkpoint, so the next ones stay incremental (the default,
        # NO_CLAIM, makes the first checkpoint after a restore a full one)
        conf.set_string("execution.state-recovery.claim-mode", "CLAIM")
    env = Env.get_execution_environment(conf)
    env.set_parallelism(PARALLELISM)
    files = FileSource.for_record_stream_format(StreamFormat.text_line_format(), str(args.data))
    if args.recovery:
        files = files.monitor_continuously(Duration.of_millis(200))
    else:
        files = files.process_static_file_set()
    lines = env.from_source(files.build(), WatermarkStrategy.no_watermarks(), "views")
    work = str(args.work)

    def user_of(line: str) -> str:
        import json

        return str(json.loads(line)["user"])

    class CountPerUser(KeyedProcessFunction):  # type: ignore[misc]
        def open(self, ctx: RuntimeContext) -> None:
            self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))

        def process_element(self, user: str, ctx: object) -> object:
            from common import mark_first

            mark_first(Path(work))
            n = (self.count.value() or 0) + 1
            self.count.update(n)
            yield f"{user},{n}"

    class LastViewPerUser(KeyedProcessFunction):  # type: ignore[misc]
        """The recovery workload: the count and the last view (its JSON line) per user."""

        def open(self, ctx: RuntimeContext) -> None:
            self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
            self.last = ctx.get_state(ValueStateDescriptor("last", Types.STRING()))
            self.progress = Progress(Path(work))

        def process_element(self, line: str, ctx: object) -> object:
            import json

            view = json.loads(line)
            user = str(view["user"])
            n = (self.count.value() or 0) + 1
            self.count.update(n)
            self.last.update(line)
            if view["phase"] == 2:
                self.progress(user, n)
            yield f"{user},{n}"

    if args.recovery:
        counts = lines.key_by(user_of, key_type=Types.STRING()).process(
            LastViewPerUser(), output_type=Types.STRING()
        )
    else:
        counts = (
            lines.map(user_of, output_type=Types.STRING())
            .key_by(lambda u: u, key_type=Types.STRING())
            .process(CountPerUser(), output_type=Types.STRING())
        )
    sink = (
        FileSink.for_row_format(str(args.work / "out"), Encoder.simple_string_encoder())
        .with_output_file_config(OutputFileConfig.builder().with_part_prefix("counts").build())
        .with_rolling_policy(RollingPolicy.on_checkpoint_rolling_policy())
        .build()
    )
    counts.sink_to(sink)
    env.execute("bench-peers-pageviews")
    finished = time.time()
    final: dict[str, int] = {}
    for path in (args.work / "out").rglob("counts*"):
        if path.name.startswith("."):
            continue  # an in-progress file: not committed
        for line in path.open():
            user, n = line.rstrip("\n").rsplit(",", 1)
            final[user] = max(final.get(user, 0), int(n))
    write_result(args, final, finished=finished)


if __name__ == "__main__":
    main()

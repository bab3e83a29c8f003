"""PyFlink's variant for ``bench/peers.py`` (PyFlink 2.3, in its own env): the partition files
as a bounded ``FileSource``, keyed by user, a ``KeyedProcessFunction`` counting in
``ValueState`` on the embedded RocksDB state backend with incremental checkpoints every
``--checkpoint-ms`` (file:// storage), ``user,count`` lines to a ``FileSink`` that commits on
checkpoints. Parallelism 4 (one per input partition), Python in thread mode (the UDFs run
inside the JVM; several times faster here than process mode). The final counts are read back
from the committed output files.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import arguments, write_result  # noqa: E402

PARALLELISM = 4


def main() -> None:
    args = arguments(__doc__).parse_args()
    tmp = args.work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    # thread mode's embedded interpreter sees neither the venv nor this folder by itself
    site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(site)])
    os.environ["JVM_ARGS"] = f"-Djava.io.tmpdir={tmp}"
    from pyflink.common import Configuration, Encoder, Types, WatermarkStrategy
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
        "parallelism.default": str(PARALLELISM),
        "state.backend.type": "rocksdb",
        "execution.checkpointing.incremental": "true",
        "execution.checkpointing.interval": f"{args.checkpoint_ms}ms",
        "execution.checkpointing.dir": (args.work / "checkpoints").as_uri(),
        "python.execution-mode": "thread",
        "python.executable": sys.executable,  # the default, "python", is not this venv's
        "python.client.executable": sys.executable,
        "io.tmp.dirs": str(tmp),
        "restart-strategy.type": "none",  # fail, rather than retry for ever
    }.items():
        conf.set_string(key, value)
    env = Env.get_execution_environment(conf)
    env.set_parallelism(PARALLELISM)
    source = (
        FileSource.for_record_stream_format(StreamFormat.text_line_format(), str(args.data))
        .process_static_file_set()
        .build()
    )
    lines = env.from_source(source, WatermarkStrategy.no_watermarks(), "views")
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

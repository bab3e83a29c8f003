"""sparkpoint's variants for ``bench/peers.py``: the example's task API job or its DataFrame step,
on local Spark (``local[2]``), reading the views from the embedded log.

``prepare`` loads ``--data`` into the job's ``pageviews`` stream (untimed, as a peer's input is
produced to its broker beforehand); ``run`` is the timed part: the job from a cold start (Spark
session included) until caught up, then the final counts from the committed store.

With ``--recovery`` (see ``recovery.py``) the job keeps the count and the last view per user in
its ``user-views`` store, backed up to ``--backend``; ``--forever`` runs it until killed, and
:func:`checkpointed` tells how many views its checkpoints cover.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PATHS = [str(HERE), str(ROOT / "examples" / "pageviews")]
sys.path[:0] = PATHS
os.environ["PYTHONPATH"] = os.pathsep.join([*PATHS, os.environ.get("PYTHONPATH", "")])
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from common import arguments, partitions, write_result  # noqa: E402

from sparkpoint.config import Config, load_config, read_job_file  # noqa: E402
from sparkpoint.runtime.driver.reports import BatchReport  # noqa: E402
from sparkpoint.system.base import Record, StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402

RECOVERY = {  # the recovery workload's store, backed up as --backend says
    "task.class": "sparkpoint_tasks:LastViewCounter",
    "stores.user-views.factory": "rocksdb",
    "stores.user-views.msg.serde": "json",
    "stores.user-views.changelog": "filelog.user-views-changelog",
}
BACKENDS = {"blobstore": "blobstore", "changelog": "changelog", "local": "blobstore"}


def job_config(args: argparse.Namespace, extra: dict[str, str]) -> Config:
    work: Path = args.work
    values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
    values.update(
        {
            "job.data.dir": str(work / "job"),
            "task.class": "sparkpoint_tasks:MarkedCounter",
            "task.commit.ms": str(args.checkpoint_ms),
            "bench.work": str(work),
            **extra,
        }
    )
    if args.recovery:
        values = {k: v for k, v in values.items() if not k.startswith("stores.user-counts.")}
        values.update(RECOVERY)
        backend = BACKENDS[args.backend]
        values["stores.user-views.backup.factories"] = backend
        values["stores.user-views.restore.factories"] = backend
    return load_config(None, values)


def prepare(config: Config, data: Path) -> None:
    systems = Systems(config)
    files = partitions(data)
    systems.admin("filelog").create_stream(StreamSpec("pageviews", len(files)))
    producer = systems.producer("filelog")
    for p, path in enumerate(files):
        with path.open("rb") as f:
            for line in f:
                value = line.rstrip(b"\n")
                user = json.loads(value)["user"].encode()
                producer.send("pageviews", p, Record("", user, value, 0))
    producer.flush()
    producer.close()


class Recorder:
    """A coordinator listener keeping what the benchmark reports: each task's restore, and
    each commit's synchronous pause."""

    def __init__(self) -> None:
        self.restores: list[dict[str, object]] = []
        self.pauses: list[float] = []
        self.uploaded = 0

    def on_start(self, model: object) -> None:
        pass

    def on_startpoint(self, *args: object) -> None:
        pass

    def on_batch(self, report: BatchReport) -> None:
        for task, stats in report.restored:
            self.restores.append(
                {
                    "task": task,
                    "source": stats.source,
                    "bytes": stats.bytes,
                    "seconds": stats.seconds,
                }
            )
        self.pauses += [r.commit_seconds for r in report.tasks if r.commit_started]
        self.uploaded += report.uploads.get("bytes-uploaded", 0)

    def on_end(self, summary: object) -> None:
        pass


def checkpointed(config: Config) -> int:
    """Views covered by the job's checkpoints: what a restart after a SIGKILL starts from."""
    from sparkpoint.checkpoint.manager import CheckpointManager

    systems = Systems(config)
    try:
        checkpoints = CheckpointManager(config, systems).read_all().values()
        return sum(int(o) + 1 for c in checkpoints for o in c.input_offsets.values())
    finally:
        systems.close()


def run(config: Config, api: str, recorder: Recorder, *, forever: bool = False) -> None:
    from sparkpoint.runtime.driver.launch import start_job
    from sparkpoint.runtime.spark.session import SparkRunner

    def make_runner(spark: object) -> object:
        if api == "task":
            return SparkRunner(spark)  # the SparkContext (sql=False)
        from sparkpoint_steps import per_view

        from sparkpoint.runtime.dataframe.pipeline import Pipeline
        from sparkpoint.runtime.dataframe.runner import DataFrameRunner

        pipeline = Pipeline(per_view, config.to_dict(), "user STRING, page STRING, ts LONG")
        return DataFrameRunner(spark, pipeline, config)

    coordinator, spark = start_job(
        config,
        "local[2]",
        make_runner,  # type: ignore[arg-type]
        exact_batches=api != "task",
        listener=recorder,  # type: ignore[arg-type]
        sql=api != "task",
    )
    if api != "task":  # the DataFrame side's modules, imported while Spark is still starting
        import sparkpoint_steps  # noqa: F401

        import sparkpoint.runtime.dataframe.pipeline  # noqa: F401
    try:
        coordinator.run(until_caught_up=not forever)
    finally:
        coordinator.close()
        spark.stop(wait=False)  # the process exits next


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("step", choices=["prepare", "run"])
    parser.add_argument("--api", choices=["task", "dataframe"], default="task")
    parser.add_argument("--set", action="append", default=[], help="extra config key=value")
    parser.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="blobstore",
        help="with --recovery: the user-views store's backup (local: blob store, state kept)",
    )
    parser.add_argument("--forever", action="store_true", help="run until killed")
    args = parser.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.set)
    config = job_config(args, extra)
    if args.step == "prepare":
        prepare(config, args.data)
        return
    recorder = Recorder()
    run(config, args.api, recorder, forever=args.forever)
    finished = time.time()
    from sparkpoint.tools.state import committed_entries

    if args.recovery:
        entries = committed_entries(config, "user-views")
        counts = {str(k): int(v["count"]) for _t, k, v in entries}
    else:
        counts = {str(k): int(v) for _t, k, v in committed_entries(config, "user-counts")}
    write_result(
        args,
        counts,
        finished=finished,
        restores=recorder.restores,
        pauses=recorder.pauses,
        uploaded=recorder.uploaded,
    )


if __name__ == "__main__":
    main()

"""Benchmark: the page-view count with its input and output in Avro through a Schema Registry
against the same job on JSON, in both APIs, side by side in one run on local Spark.

Variants (each counts every view per user in RocksDB and sends each new count):

* ``task-json`` / ``task-avro``: the example's task (one ``process`` call per view), its views
  and counts in JSON, or in Avro (confluent-kafka's AvroSerializer wrote the views; the counts
  go out with a named avro serde);
* ``dataframe-json`` / ``dataframe-avro``: tests/jobs' counts pipeline, its value struct from
  a value_schema (JSON) or from the registry schema (Avro).

The registry is sparkpoint.testing.schema_registry's, on loopback. Each variant's time runs from
start to caught up, start-up included; the counts are checked against the input. Prints events/s
and the Avro/JSON ratio per API (issue 66's targets: >= 1.0x in the task API, >= 0.9x in the
DataFrame API). Usage: ``make bench-schemas`` or
``.venv/bin/python bench/schemas.py [--events N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXTRA = [ROOT / "examples" / "pageviews", ROOT / "tests" / "jobs"]
for extra in EXTRA:
    sys.path.insert(0, str(extra))
os.environ["PYTHONPATH"] = os.pathsep.join([*map(str, EXTRA), os.environ.get("PYTHONPATH", "")])
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402
from generate import events  # noqa: E402

from sparkpoint.config import Config, load_config, read_job_file  # noqa: E402
from sparkpoint.runtime.dataframe.pipeline import Pipeline  # noqa: E402
from sparkpoint.runtime.dataframe.runner import DataFrameRunner  # noqa: E402
from sparkpoint.runtime.driver.coordinator import JobCoordinator  # noqa: E402
from sparkpoint.runtime.spark.session import SparkRunner, spark_session  # noqa: E402
from sparkpoint.serde import JsonSerde  # noqa: E402
from sparkpoint.system.base import StreamSpec  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402
from sparkpoint.testing.schema_registry import TestSchemaRegistry  # noqa: E402
from sparkpoint.tools.state import committed_entries  # noqa: E402

SCHEMAS = ROOT / "examples" / "avro"  # a page view, a user's count
VIEW = json.loads((SCHEMAS / "page-view.avsc").read_text())
PARTITIONS = 4


def job(tmp: Path, name: str, registry: str | None) -> Config:
    values = read_job_file(ROOT / "examples" / "pageviews" / "job.yaml")
    values.update(
        {
            "job.data.dir": str(tmp / name),
            "task.batch.max.messages": "25000",
            "task.commit.ms": "10000",
        }
    )
    if registry is not None:
        avsc = SCHEMAS / "user-count.avsc"
        values.update(
            {
                "systems.filelog.schema.registry.url": registry,
                "streams.pageviews.samza.msg.serde": "avro",
                "streams.user-counts.samza.msg.serde": "counts",
                "serializers.registry.counts.type": "avro",
                "serializers.registry.counts.schema.file": str(avsc),
            }
        )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", PARTITIONS))
    return config


def write_views(config: Config, views: list[dict[str, Any]], registry: str | None) -> None:
    if registry is None:
        encode = JsonSerde().to_bytes
    else:
        serializer = AvroSerializer(SchemaRegistryClient({"url": registry}), json.dumps(VIEW))
        ctx = SerializationContext("pageviews", MessageField.VALUE)

        def encode(view: Any) -> bytes:
            return serializer(view, ctx)  # type: ignore[no-any-return]

    producer = Systems(config).producer("filelog")
    parts: list[list[Any]] = [[] for _ in range(PARTITIONS)]
    for view in views:
        user = str(view["user"])
        parts[hash(user) % PARTITIONS].append(("", user.encode(), encode(view), 0))
    for p, records in enumerate(parts):
        producer.send_fields_many("pageviews", p, records)
    producer.flush()


def run(spark: Any, config: Config, pipeline: Pipeline | None) -> float:
    runner: Any = (
        SparkRunner(spark.sparkContext)
        if pipeline is None
        else DataFrameRunner(spark, pipeline, config)
    )
    coordinator = JobCoordinator(config, runner)
    try:
        summary = coordinator.run(until_caught_up=True)
    finally:
        coordinator.close()
    return summary.processed / summary.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each variant, interleaved")
    args = parser.parse_args()
    views = [
        {"user": str(e["user"]), "page": str(e["page"]), "ts": int(e["ts"])}
        for e in events(args.events, 1, 10_000)
    ]
    expected = Counter(v["user"] for v in views)
    from avro_counts_pipeline import build
    from counts_pipeline import job as json_pipeline

    runs: dict[str, list[float]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="sparkpoint-bench-") as tmp_dir,
        TestSchemaRegistry() as reg,
    ):
        tmp = Path(tmp_dir)
        spark = spark_session(job(tmp, "warm", None), "local[2]")
        avro_pipeline = Pipeline(lambda b: build(b, "filelog.user-counts"), config={})
        pipelines = {"json": json_pipeline, "avro": avro_pipeline}
        # a warm-up of each API on 20k views (Python workers, the JVM's JIT), then the rounds
        # in ABBA order, so that neither kind always runs first
        order = [
            (api, kind)
            for r in range(args.rounds)
            for api in ("task", "dataframe")
            for kind in (("json", "avro") if r % 2 == 0 else ("avro", "json"))
        ]
        for n, (api, kind) in enumerate([("task", "avro"), ("dataframe", "avro"), *order]):
            registry = reg.url if kind == "avro" else None
            config = job(tmp, f"{api}-{kind}-{n}", registry)
            write_views(config, views if n >= 2 else views[:20_000], registry)
            rate = run(spark, config, None if api == "task" else pipelines[kind])
            if n < 2:
                continue  # the warm-up
            counts = {k: v for _t, k, v in committed_entries(config, "user-counts")}
            assert counts == dict(expected), f"{api}-{kind}: wrong counts"
            runs.setdefault(f"{api}-{kind}", []).append(rate)
        spark.stop()
    print(f"events: {args.events:,} per run, {PARTITIONS} tasks, local[2], {args.rounds} rounds")
    rates = {name: statistics.median(r) for name, r in runs.items()}
    for name, rate in rates.items():
        shown = " / ".join(f"{r:,.0f}" for r in runs[name])
        print(f"{name:16} {rate:10,.0f} events/s (median of {shown})")
    for api, target in (("task", 1.0), ("dataframe", 0.9)):
        ratio = rates[f"{api}-avro"] / rates[f"{api}-json"]
        print(f"{api} API: Avro/JSON = {ratio:.2f}x (target >= {target}x)")


if __name__ == "__main__":
    main()

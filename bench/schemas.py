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
DataFrame API).

Then the serializers alone, on the same views through the same registry: sparkpoint's ``avro``
serde (``to_bytes`` and ``from_bytes``, a record at a time, as a task sends and reads them)
against Quix Streams 3.28.1's ``AvroSerializer`` / ``AvroDeserializer`` (in its own virtual env,
``bench/out/venvs/quix-avro``, made on first use; ``bench/peers/quix_avro.py``), interleaved;
prints records/s encoded and decoded and the ratio (issue 66's target: >= 2x).

Usage: ``make bench-schemas`` or
``.venv/bin/python bench/schemas.py [--events N] [--rounds R] [--serializers-only]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
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
from sparkpoint.serde import JsonSerde, load_serde  # noqa: E402
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


def _peers_run() -> Any:
    """bench/peers/run.py as a module: its peers' virtual envs (ensure_env, python_of)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("peers_run", ROOT / "bench" / "peers" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers_run"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def sparkpoint_serde(views: list[dict[str, Any]], registry: str) -> tuple[float, float]:
    """Seconds to encode the views with sparkpoint's avro serde, and to decode them."""
    values = {
        "systems.log.schema.registry.url": registry,
        "serializers.registry.views.type": "avro",
        "serializers.registry.views.schema.file": str(SCHEMAS / "page-view.avsc"),
    }
    where = {"key": "streams.pageviews.samza.msg.serde", "stream": ("log", "pageviews")}
    encoder, decoder = load_serde("views", values, **where), load_serde("avro", values, **where)
    decoder.from_bytes(encoder.to_bytes(views[0]))  # the schema, fetched outside the timing
    encode, decode = encoder.to_bytes, decoder.from_bytes
    t0 = time.perf_counter()
    encoded = [encode(v) for v in views]
    t1 = time.perf_counter()
    decoded = [decode(b) for b in encoded]
    t2 = time.perf_counter()
    assert decoded == views, "sparkpoint's round trip changed the views"
    return t1 - t0, t2 - t1


def quix_serde(views_file: Path, registry: str, python: str) -> tuple[float, float]:
    """The same with Quix Streams' serializers, in its own env (bench/peers/quix_avro.py)."""
    script = ROOT / "bench" / "peers" / "quix_avro.py"
    out = subprocess.run(
        [python, str(script), str(views_file), str(SCHEMAS / "page-view.avsc"), registry],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = json.loads(out.strip().splitlines()[-1])
    return float(found["encode"]), float(found["decode"])


def serializers(views: list[dict[str, Any]], rounds: int) -> None:
    """sparkpoint's avro serde against Quix Streams' Avro serializers, interleaved rounds."""
    peers = _peers_run()
    peers.ensure_env("quix-avro")
    python = peers.python_of("quix-avro")
    times: dict[str, list[tuple[float, float]]] = {"sparkpoint": [], "quixstreams": []}
    with (
        tempfile.TemporaryDirectory(prefix="sparkpoint-bench-") as tmp_dir,
        TestSchemaRegistry() as reg,
    ):
        tmp = Path(tmp_dir)
        views_file = tmp / "views.jsonl"
        views_file.write_text("".join(json.dumps(v) + "\n" for v in views))
        for r in range(rounds):
            for who in (
                ("sparkpoint", "quixstreams") if r % 2 == 0 else ("quixstreams", "sparkpoint")
            ):
                took = (
                    sparkpoint_serde(views, reg.url)
                    if who == "sparkpoint"
                    else quix_serde(views_file, reg.url, python)
                )
                times[who].append(took)
    n = len(views)
    rates = {}
    for who, runs in times.items():
        enc = statistics.median(n / e for e, _d in runs)
        dec = statistics.median(n / d for _e, d in runs)
        both = statistics.median(n / (e + d) for e, d in runs)
        rates[who] = both
        print(
            f"{who:12} encode {enc:10,.0f}/s  decode {dec:10,.0f}/s  "
            f"both {both:10,.0f} records/s (median of {len(runs)})"
        )
    ratio = rates["sparkpoint"] / rates["quixstreams"]
    print(f"serializers: sparkpoint / Quix Streams = {ratio:.2f}x (target >= 2x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each variant, interleaved")
    parser.add_argument(
        "--serializers-only", action="store_true", help="only sparkpoint's serde against Quix's"
    )
    args = parser.parse_args()
    views = [
        {"user": str(e["user"]), "page": str(e["page"]), "ts": int(e["ts"])}
        for e in events(args.events, 1, 10_000)
    ]
    if not args.serializers_only:
        jobs(views, args.rounds)
    serializers(views[:100_000], max(3, args.rounds))


def jobs(views: list[dict[str, Any]], rounds: int) -> None:
    """The jobs in both APIs, JSON against Avro (see the module docstring)."""
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
            for r in range(rounds)
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
    print(f"events: {len(views):,} per run, {PARTITIONS} tasks, local[2], {rounds} rounds")
    rates = {name: statistics.median(r) for name, r in runs.items()}
    for name, rate in rates.items():
        shown = " / ".join(f"{r:,.0f}" for r in runs[name])
        print(f"{name:16} {rate:10,.0f} events/s (median of {shown})")
    for api, target in (("task", 1.0), ("dataframe", 0.9)):
        ratio = rates[f"{api}-avro"] / rates[f"{api}-json"]
        print(f"{api} API: Avro/JSON = {ratio:.2f}x (target >= {target}x)")


if __name__ == "__main__":
    main()

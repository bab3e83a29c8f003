"""Benchmark: the page-view example reading from and writing to Kafka vs the same job on filelog.

Both variants run in one process on one local Spark session, interleaved, ``--runs`` times each.
The Kafka variant has every stream on Kafka (input, output, changelog, checkpoints, coordinator
stream), on a Tansu broker started here on loopback (a fresh one per run). Input generation is
not timed. Each run's committed counts are checked against an independent count.

Tansu needs one record per produce request (see docs/kafka.md), so the Kafka variant is bound by
produce round trips on this broker: the job writes two records per event (output and changelog).
Usage: ``make bench-kafka`` or ``.venv/bin/python bench/kafka.py [--events N] [--runs R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "pageviews"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "examples" / "pageviews"), os.environ.get("PYTHONPATH", "")]
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from generate import events, write  # noqa: E402

from sparkpoint.config import Config, load_config, read_job_file  # noqa: E402
from sparkpoint.runtime.driver.coordinator import JobCoordinator  # noqa: E402
from sparkpoint.runtime.spark.session import SparkRunner, spark_session  # noqa: E402
from sparkpoint.testing.services import TansuKafka  # noqa: E402
from sparkpoint.tools.state import committed_entries  # noqa: E402

EXAMPLE = ROOT / "examples" / "pageviews"


def run_once(spark: object, values: dict[str, str], tmp: Path, n: int) -> tuple[float, int]:
    """(events/s of the run, events processed); fails if the committed counts are wrong."""
    config = load_config(None, values)
    job_file = tmp / "job.json"
    job_file.write_text(json.dumps(config.to_dict()))
    write(str(job_file), n, seed=7, users=1_000)
    expected = Counter(str(e["user"]) for e in events(n, 7, 1_000))
    coordinator = JobCoordinator(config, SparkRunner(spark.sparkContext))
    coordinator.start()
    summary = coordinator.run(until_caught_up=True)
    coordinator.close()
    check(config, expected)
    return summary.processed / summary.seconds, summary.processed


def check(config: Config, expected: Counter[str]) -> None:
    got = {k: v for _t, k, v in committed_entries(config, "user-counts")}
    if got != dict(expected):
        wrong = sum(1 for u in expected if got.get(u) != expected[u])
        raise SystemExit(f"wrong committed counts on {config.inputs[0]}: {wrong} users differ")


def broker_ceiling(tmp: Path, n: int) -> float:
    """Records/s a bare librdkafka producer gets from this broker with the same settings (one
    record per request on Tansu), delivered and acknowledged: the bound on a job that writes a
    record per event."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    with TansuKafka(tmp / "tansu") as broker:
        settings = {
            k.split(".producer.", 1)[1]: v for k, v in broker.config().items() if ".producer." in k
        }
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # alive until answered
        admin.create_topics([NewTopic("ceiling", 4, 1)])["ceiling"].result(30)
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, **settings}
        )
        t0 = time.perf_counter()
        for i in range(n):
            while True:
                try:
                    producer.produce("ceiling", value=b"x" * 60, key=b"%d" % i, partition=i % 4)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(120):
            raise SystemExit("the broker did not acknowledge every record")
        return n / (time.perf_counter() - t0)


def base_values(job: str, tmp: Path, batch: int) -> dict[str, str]:
    values = read_job_file(EXAMPLE / job)
    values.update(
        {
            "job.data.dir": str(tmp / "data"),
            "task.batch.max.messages": str(batch),
            "task.commit.ms": "1000",
        }
    )
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=5_000, help="messages per partition")
    args = parser.parse_args()
    warm = base_values("job.yaml", Path(tempfile.mkdtemp()), args.batch)
    spark = spark_session(load_config(None, warm), "local[2]")
    rates: dict[str, list[float]] = {"filelog": [], "kafka": []}
    try:
        for i in range(args.runs):
            for system in ("filelog", "kafka"):
                with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-kafka-") as t:
                    tmp = Path(t)
                    if system == "filelog":
                        values = base_values("job.yaml", tmp, args.batch)
                        rate, n = run_once(spark, values, tmp, args.events)
                    else:
                        with TansuKafka(tmp / "tansu") as broker:
                            values = {
                                **base_values("job-kafka.yaml", tmp, args.batch),
                                **broker.config(),
                            }
                            rate, n = run_once(spark, values, tmp, args.events)
                rates[system].append(rate)
                print(f"run {i + 1} {system:8s} {n:,} events  {rate:8,.0f} events/s", flush=True)
    finally:
        spark.stop()  # type: ignore[attr-defined]
    file_rate, kafka_rate = (statistics.median(rates[s]) for s in ("filelog", "kafka"))
    print()
    print(f"{'system':10s} {'median events/s':>16s} {'range':>20s}")
    for system, r in rates.items():
        print(f"{system:10s} {statistics.median(r):16,.0f} {min(r):9,.0f} - {max(r):,.0f}")
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-kafka-") as t:
        ceiling = broker_ceiling(Path(t), args.events)
    print(f"{'broker':10s} {ceiling:16,.0f} records/s: a bare idempotent producer, same settings")
    started = time.strftime("%Y-%m-%d")
    print(f"\nkafka / filelog: {kafka_rate / file_rate:.2f}x (target 0.7x; {started}, Tansu)")
    print(
        f"kafka job events/s / broker produce ceiling: {kafka_rate / ceiling:.2f}x (the job "
        f"writes one output record per event, and changelog records once per key per commit)"
    )


if __name__ == "__main__":
    main()

"""Quix Streams' variant for ``bench/peers.py`` (Quix Streams 3.28, in its own env), over the
Kafka-protocol broker the tests use (Tansu, started by the orchestrator). ``prepare`` creates
the ``pageviews`` topic (4 partitions) and produces the partition files into it (untimed).
``run``: an application with RocksDB state (Quix's default) and its changelog topics, committing
every ``--checkpoint-ms``, counting per user and sending ``{user, count}`` to an output topic,
until every view is processed. The final counts are the ones its stateful function emitted.

Tansu set-up (see ``docs/kafka.md``): topics are created with ``retention.ms`` given (Tansu
describes no default topic configs, which Quix reads), and the consumer's
``session.timeout.ms`` is 6 s (Tansu answers a first group join after half of it).

With ``--recovery`` (see ``recovery.py``) it keeps the count and the last view per user, runs
until killed when ``--events`` is 0, and its producer sends one record per request: a Quix
application restoring its changelog from Tansu stops with ``InvalidStoreChangelogOffset`` when
the changelog was written in batches (Tansu's high watermark after a batched produce is not what
Quix expects), so the recovery figure needs that workaround. ``prepare`` adds to an existing
topic.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import Progress, arguments, mark_first, partitions, write_result  # noqa: E402

TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1"}


def prepare(broker: str, data: Path) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    files = partitions(data)
    admin = AdminClient({"bootstrap.servers": broker})
    if "pageviews" not in admin.list_topics(timeout=30).topics:
        topic = NewTopic("pageviews", num_partitions=len(files), config=TOPIC_CONFIG)
        for future in admin.create_topics([topic]).values():
            future.result()
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 5})
    for p, path in enumerate(files):
        with path.open("rb") as f:
            for line in f:
                value = line.rstrip(b"\n")
                key = json.loads(value)["user"].encode()
                while True:
                    try:
                        producer.produce("pageviews", value, key, partition=p)
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
    if producer.flush(60) != 0:
        raise SystemExit("the input did not reach the broker")


def run(broker: str, args: object) -> tuple[dict[str, int], float]:
    from quixstreams import Application

    work: Path = args.work  # type: ignore[attr-defined]
    recovery: bool = args.recovery  # type: ignore[attr-defined]
    app = Application(
        broker_address=broker,
        consumer_group="bench-peers",
        auto_offset_reset="earliest",
        commit_interval=args.checkpoint_ms / 1000,  # type: ignore[attr-defined]
        state_dir=str(work / "state"),
        consumer_extra_config={"session.timeout.ms": 6000},
        producer_extra_config={"batch.num.messages": 1, "linger.ms": 0} if recovery else {},
        loglevel="WARNING",
    )
    views = app.topic("pageviews", value_deserializer="json", key_deserializer="str")
    output = app.topic("user-counts", value_serializer="json", key_serializer="str", config=None)
    final: dict[str, int] = {}

    def count(view: dict[str, object], state: object) -> dict[str, object]:
        mark_first(work)
        n = state.get("count", 0) + 1  # type: ignore[attr-defined]
        state.set("count", n)  # type: ignore[attr-defined]
        user = str(view["user"])
        final[user] = n
        return {"user": user, "count": n}

    progress = Progress(work)

    def last_view(view: dict[str, object], state: object) -> dict[str, object]:
        n = state.get("count", 0) + 1  # type: ignore[attr-defined]
        state.set("count", n)  # type: ignore[attr-defined]
        state.set("last", view)  # type: ignore[attr-defined]
        user = str(view["user"])
        if view["phase"] == 2:
            progress(user, n)
        final[user] = n
        return {"user": user, "count": n}

    sdf = app.dataframe(views).apply(last_view if recovery else count, stateful=True)
    sdf.to_topic(output)
    app.run(count=args.events, collect=False)  # type: ignore[attr-defined]
    return final, time.time()


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("step", choices=["prepare", "run"])
    parser.add_argument("--broker", required=True)
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.broker, args.data)
        return
    counts, finished = run(args.broker, args)
    write_result(args, counts, finished=finished)


if __name__ == "__main__":
    main()

"""Write N page views in Avro to the job's ``pageviews`` stream, framed for the Schema Registry
by confluent-kafka's own AvroSerializer (with ``page-view.avsc``), each in its user's partition;
with ``--json K``, K more views after them in plain JSON, as an old producer writes them (they
belong on ``pageviews-legacy``: on the Avro stream they cannot be decoded).
Usage: ``python write_views.py JOB N --registry URL [--json K] [--seed S] [--users U]``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "pageviews"))

from generate import events  # noqa: E402 - the example's page views

from sparkpoint.config import load_config, parse_overrides  # noqa: E402
from sparkpoint.system.registry import Systems  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("job")
    parser.add_argument("n", type=int)
    parser.add_argument("--registry", required=True, help="the Schema Registry's URL")
    parser.add_argument("--json", type=int, default=0, help="K views in JSON after them")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--users", type=int, default=200)
    args = parser.parse_args()
    sets = [f"systems.filelog.schema.registry.url={args.registry}"]
    config = load_config(args.job, parse_overrides(sets))
    schema = (HERE / "page-view.avsc").read_text()
    serialize = AvroSerializer(SchemaRegistryClient({"url": args.registry}), schema)
    ctx = SerializationContext("pageviews", MessageField.VALUE)
    systems = Systems(config)
    partitions = systems.admin("filelog").partition_count("pageviews")
    parts: list[list[tuple[str, bytes, bytes, int]]] = [[] for _ in range(partitions)]
    for i, e in enumerate(events(args.n + args.json, args.seed, args.users)):
        view = {"user": str(e["user"]), "page": str(e["page"]), "ts": int(e["ts"])}
        user = view["user"].encode()
        p = systems.admin("filelog").partition_for_key(user, partitions)
        value = serialize(view, ctx) if i < args.n else json.dumps(view).encode()
        parts[p].append(("", user, value, int(e["ts"])))
    producer = systems.producer("filelog")
    for p, records in enumerate(parts):
        producer.send_fields_many("pageviews", p, records)
    producer.flush()
    print(json.dumps({"written": args.n, "json": args.json, "partitions": partitions}))


if __name__ == "__main__":
    main()

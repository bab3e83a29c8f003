"""Run the Avro example: start a Schema Registry (the one sparkpoint's tests use; point
``SPARKPOINT_SCHEMA_REGISTRY_URL`` at a real one instead), write page views in Avro and one
view in JSON by mistake (a poisoned record), run the job to the end of its input (the JSON view
goes to the dead-letter stream), show the dead letter, replay it where JSON views belong
(``pageviews-legacy``) and run again; print the busiest users' counts from the ``user-counts``
store, and read the last counts back from the output stream with confluent-kafka's own
AvroDeserializer. Each step is a plain command, printed before it runs. Data goes to
``.sparkpoint/pageviews-avro`` next to the job file (removed first)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "job.yaml"
BIN = Path(sys.executable).parent
# the example's task (pageviews_task.py), unchanged: an Avro record reaches it as a dict
TASKS = HERE.parent / "pageviews"


def step(*args: str) -> str:
    print(f"\n$ {shlex.join(args)}", flush=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TASKS), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout


def last_counts(url: str) -> dict[str, int]:
    """Each user's last count in the output, decoded by confluent-kafka's deserializer."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from sparkpoint.config import load_config, parse_overrides
    from sparkpoint.model import SystemStreamPartition
    from sparkpoint.system.registry import Systems

    config = load_config(JOB, parse_overrides([f"systems.filelog.schema.registry.url={url}"]))
    systems = Systems(config)
    decode = AvroDeserializer(SchemaRegistryClient({"url": url}))
    ctx = SerializationContext("user-counts", MessageField.VALUE)
    admin = systems.admin("filelog")
    last: dict[str, int] = {}
    for p in range(admin.partition_count("user-counts")):
        ssp = SystemStreamPartition("filelog", "user-counts", p)
        end = admin.get_metadata([ssp])[ssp].upcoming
        for record in systems.consumer("filelog").read(ssp, "0", end):
            value = decode(record.value, ctx)
            last[value["user"]] = value["count"]
    return last


def run(url: str) -> None:
    events = os.environ.get("EVENTS", "100000")
    data = HERE / ".sparkpoint" / "pageviews-avro"
    if data.exists():
        shutil.rmtree(data)
    sp = str(BIN / "sparkpoint")
    registry = ["--set", f"systems.filelog.schema.registry.url={url}"]
    for stream in ("pageviews", "pageviews-legacy"):
        step(sp, "stream", "create", str(JOB), stream, "--partitions", "4", *registry)
    write = [sys.executable, str(HERE / "write_views.py"), str(JOB), events, "--json", "1"]
    step(*write, "--registry", url)
    step(sp, "run", str(JOB), "--until-caught-up", *registry)
    print(step(sp, "dlq", "show", str(JOB), *registry), end="")
    # the fix: the view is JSON, so it goes where JSON views are read
    replay = ["--where", "reason=decode", "--to", "filelog.pageviews-legacy"]
    print(step(sp, "dlq", "replay", str(JOB), *replay, *registry), end="")
    step(sp, "run", str(JOB), "--until-caught-up", *registry)
    out = step(sp, "state", "dump", str(JOB), "--store", "user-counts", *registry)
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    total = sum(int(r["value"]) for r in rows)
    print(f"{len(rows)} users, {total} views counted; the busiest 3:")
    for row in sorted(rows, key=lambda r: -int(r["value"]))[:3]:
        print(f"  {row['key']}: {row['value']}")
    sent = last_counts(url)
    agree = all(sent.get(str(r["key"])) == int(r["value"]) for r in rows)
    print(
        f"output: {len(sent)} users' counts in Avro, read by confluent-kafka; "
        f"{'all equal' if agree else 'NOT equal'} to the store's"
    )
    if not agree:
        sys.exit(1)


def main() -> None:
    url = os.environ.get("SPARKPOINT_SCHEMA_REGISTRY_URL")
    if url:
        run(url)
        return
    from sparkpoint.testing.schema_registry import TestSchemaRegistry

    with TestSchemaRegistry() as registry:
        print(f"a Schema Registry for the example on {registry.url}")
        run(registry.url)


if __name__ == "__main__":
    main()

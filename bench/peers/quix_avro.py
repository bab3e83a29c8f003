"""Quix Streams' Avro serializer and deserializer on page views, timed (run by
``bench/schemas.py`` in Quix's own virtual env, ``bench/out/venvs/quix``).

Usage: ``python quix_avro.py VIEWS.jsonl SCHEMA.avsc REGISTRY_URL``. Reads the views, encodes
each with ``quixstreams.models.serializers.avro.AvroSerializer`` through the Schema Registry
(the Confluent wire format, as sparkpoint's ``avro`` serde writes it), decodes each with its
``AvroDeserializer``, checks the round trip, and prints one JSON line: records, seconds to
encode, seconds to decode.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> None:
    from quixstreams.models import SchemaRegistryClientConfig
    from quixstreams.models.serializers import (
        MessageField,
        SerializationContext,
    )
    from quixstreams.models.serializers.avro import AvroDeserializer, AvroSerializer

    views_file, schema_file, url = sys.argv[1:4]
    views = [json.loads(line) for line in Path(views_file).read_text().splitlines()]
    schema = json.loads(Path(schema_file).read_text())
    client = SchemaRegistryClientConfig(url=url)
    serialize = AvroSerializer(schema, schema_registry_client_config=client)
    deserialize = AvroDeserializer(schema_registry_client_config=client)
    ctx = SerializationContext(topic="pageviews", field=MessageField.VALUE)
    serialize(views[0], ctx)  # registers the schema (outside the timing)
    t0 = time.perf_counter()
    encoded = [serialize(v, ctx) for v in views]
    t1 = time.perf_counter()
    decoded = [deserialize(b, ctx) for b in encoded]
    t2 = time.perf_counter()
    assert decoded == views, "quix's round trip changed the views"
    print(json.dumps({"records": len(views), "encode": t1 - t0, "decode": t2 - t1}))


if __name__ == "__main__":
    main()

"""The Schema Registry serdes (avro, protobuf, json-schema): bytes confluent-kafka's own
serializers wrote decode here, what sparkpoint writes decodes with their deserializers, one
registry request per schema id, and bad input named.

The registry is sparkpoint.testing.schema_registry's (no Schema Registry installs here), or a
real one when SPARKPOINT_SCHEMA_REGISTRY_URL is set."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pageview_pb import PageView

from sparkpoint.errors import ConfigError
from sparkpoint.serde import load_serde
from sparkpoint.serde.registry import SchemaRegistryUnavailable, SerdeRegistryError
from sparkpoint.testing.schema_registry import TestSchemaRegistry, schema_registry
from tests.registry import VIEW

VIEW_JSON = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "PageView",
    "type": "object",
    "properties": {
        "user": {"type": "string"},
        "page": {"type": "string"},
        "ts": {"type": "integer"},
    },
    "required": ["user", "page", "ts"],
}
VIEWS = [{"user": f"u{i % 7}", "page": f"/p/{i}", "ts": 1_700_000_000_000 + i} for i in range(50)]
TOPIC = "pageviews"
VALUE = SerializationContext(TOPIC, MessageField.VALUE)


@pytest.fixture
def registry() -> Iterator[str]:
    with schema_registry() as url:
        yield url


def config(url: str, tmp_path: Path, **named: str) -> dict[str, str]:
    """A system ``log`` on the registry, and named serdes ``views-avro`` (writes VIEW),
    ``views-json`` (VIEW_JSON) and ``views-pb`` (the PageView message)."""
    avsc = tmp_path / "view.avsc"
    avsc.write_text(json.dumps(VIEW))
    schema_json = tmp_path / "view.schema.json"
    schema_json.write_text(json.dumps(VIEW_JSON))
    return {
        "systems.log.schema.registry.url": url,
        "serializers.registry.views-avro.type": "avro",
        "serializers.registry.views-avro.schema.file": str(avsc),
        "serializers.registry.views-json.type": "json-schema",
        "serializers.registry.views-json.schema.file": str(schema_json),
        "serializers.registry.views-pb.type": "protobuf",
        "serializers.registry.views-pb.message.class": "pageview_pb:PageView",
        **named,
    }


def serde(name: str, values: dict[str, str]) -> Any:
    return load_serde(name, values, key="streams.pageviews.samza.msg.serde", stream=("log", TOPIC))


def test_avro_written_by_confluent_decodes_and_ours_decodes_with_confluent(
    registry: str, tmp_path: Path
) -> None:
    client = SchemaRegistryClient({"url": registry})
    theirs = AvroSerializer(client, json.dumps(VIEW))
    ours = serde("views-avro", config(registry, tmp_path))
    for view in VIEWS:
        assert ours.from_bytes(theirs(view, VALUE)) == view
    plain = serde("avro", config(registry, tmp_path))  # reads any schema id it is given
    assert plain.from_bytes(theirs(VIEWS[0], VALUE)) == VIEWS[0]
    decode = AvroDeserializer(client)
    for view in VIEWS:
        data = ours.to_bytes(view)
        assert data[0] == 0  # the wire format: magic byte, schema id, Avro binary
        assert decode(data, VALUE) == view
    # without a schema file an output writes with the subject's latest schema
    assert decode(plain.to_bytes(VIEWS[1]), VALUE) == VIEWS[1]
    # after the first record sparkpoint encodes with fastavro directly: the same bytes
    assert [ours.to_bytes(v) for v in VIEWS] == [theirs(v, VALUE) for v in VIEWS]
    with pytest.raises(ValueError, match="avro serde: cannot decode with schema id"):
        ours.from_bytes(theirs(VIEWS[0], VALUE)[:-3])  # a truncated record
    with pytest.raises(ValueError, match="avro serde: cannot encode"):
        ours.to_bytes({"user": "u1", "page": "/", "ts": "not a long"})


def test_reading_by_the_latest_schema_resolves_older_records_or_needs_no_subject(
    registry: str, tmp_path: Path
) -> None:
    """A pipeline's Avro struct is the subject's latest schema: records of an older version
    read by it get an added field's default; with no subject under the topic strategy (the
    producer registered by record name) records are read by their writer's schema, as before."""
    from confluent_kafka.schema_registry import record_subject_name_strategy

    client = SchemaRegistryClient({"url": registry})
    by_record = AvroSerializer(
        client, json.dumps(VIEW), conf={"subject.name.strategy": record_subject_name_strategy}
    )
    plain = serde("avro", config(registry, tmp_path))
    plain.read_by_latest()  # no pageviews-value subject: nothing to resolve to
    assert plain.from_bytes(by_record(VIEWS[0], VALUE)) == VIEWS[0]
    old = AvroSerializer(client, json.dumps(VIEW))(VIEWS[1], VALUE)
    added = {"name": "referrer", "type": "string", "default": "direct"}
    v2 = AvroSerializer(client, json.dumps({**VIEW, "fields": [*VIEW["fields"], added]}))
    v2({**VIEWS[2], "referrer": "ads"}, VALUE)  # registers version 2
    latest = serde("avro", config(registry, tmp_path))
    latest.read_by_latest()
    assert latest.from_bytes(old) == {**VIEWS[1], "referrer": "direct"}
    assert latest.from_bytes_many([old, old]) == [{**VIEWS[1], "referrer": "direct"}] * 2


def test_many_records_decode_in_blocks_as_one_by_one(registry: str, tmp_path: Path) -> None:
    """from_bytes_many decodes each run of one schema id as one fastavro block: the same
    values as from_bytes, runs of two schemas interleaved, and a bad record still named."""
    client = SchemaRegistryClient({"url": registry})
    old = AvroSerializer(client, json.dumps(VIEW))
    wider = {**VIEW, "fields": [*VIEW["fields"], {"name": "ref", "type": "string", "default": ""}]}
    new = AvroSerializer(client, json.dumps(wider))
    data = [old(v, VALUE) for v in VIEWS[:20]] + [new({**v, "ref": "/"}, VALUE) for v in VIEWS]
    data += [old(v, VALUE) for v in VIEWS[20:]]
    ours = serde("avro", config(registry, tmp_path))
    assert ours.from_bytes_many(data) == [ours.from_bytes(d) for d in data]
    assert ours.from_bytes_many(data)[20] == {**VIEWS[0], "ref": "/"}
    with pytest.raises(ValueError, match="avro serde: cannot decode with schema id"):
        ours.from_bytes_many([*data[:30], data[30][:-2], *data[31:]])
    # a record with a byte to spare must not shift the ones after it in its run
    spare = [data[0] + b"\x00", *data[1:20]]
    assert ours.from_bytes_many(spare) == [ours.from_bytes(d) for d in spare]


def test_a_bare_bytes_schema_is_framed_as_confluent_frames_it(
    registry: str, tmp_path: Path
) -> None:
    """Confluent writes a top-level bytes value unframed (no Avro length): the fast path must
    not take it."""
    client = SchemaRegistryClient({"url": registry})
    theirs = AvroSerializer(client, '"bytes"')
    avsc = tmp_path / "bytes.avsc"
    avsc.write_text('"bytes"')
    values = {**config(registry, tmp_path), "serializers.registry.b.type": "avro"}
    values["serializers.registry.b.schema.file"] = str(avsc)
    ours = serde("b", values)
    for payload in (b"hello", b"\x00\x01"):  # (confluent cannot read back an empty one)
        assert ours.to_bytes(payload) == theirs(payload, VALUE)
        assert ours.from_bytes(theirs(payload, VALUE)) == payload


def test_json_schema_both_ways(registry: str, tmp_path: Path) -> None:
    client = SchemaRegistryClient({"url": registry})
    theirs = JSONSerializer(json.dumps(VIEW_JSON), client)
    ours = serde("views-json", config(registry, tmp_path))
    for view in VIEWS[:10]:
        assert ours.from_bytes(theirs(view, VALUE)) == view
    decode = JSONDeserializer(None, schema_registry_client=client)
    for view in VIEWS[:10]:
        assert decode(ours.to_bytes(view), VALUE) == view
    with pytest.raises(ValueError, match="json-schema serde: cannot encode"):
        ours.to_bytes({"user": "u1"})  # invalid under the schema: 'page' and 'ts' missing


def test_protobuf_both_ways_as_dicts_or_messages(registry: str, tmp_path: Path) -> None:
    client = SchemaRegistryClient({"url": registry})
    theirs = ProtobufSerializer(PageView, client, {"use.deprecated.format": False})
    values = config(registry, tmp_path)
    as_dicts = serde("views-pb", values)
    as_messages = serde(
        "views-pb", {**values, "serializers.registry.views-pb.protobuf.as": "message"}
    )
    view = VIEWS[3]
    data = theirs(PageView(**view), VALUE)
    assert as_dicts.from_bytes(data) == {**view, "ts": str(view["ts"])}  # int64 as in JSON
    assert as_messages.from_bytes(data) == PageView(**view)
    decode = ProtobufDeserializer(PageView, {"use.deprecated.format": False})
    assert decode(as_dicts.to_bytes(view), VALUE) == PageView(**view)
    assert decode(as_messages.to_bytes(PageView(**view)), VALUE) == PageView(**view)
    # read as another message, Protobuf would decode it silently into nonsense: refused
    other = serde(
        "views-pb",
        {**values, "serializers.registry.views-pb.message.class": "pageview_pb:UserCount"},
    )
    with pytest.raises(
        ValueError,
        match=r"written as sparkpoint\.tests\.PageView \(schema id \d+\), not the "
        r"sparkpoint\.other\.UserCount its message\.class decodes",
    ):
        other.from_bytes(data)


def test_one_registry_request_per_schema_id_none_per_record(tmp_path: Path) -> None:
    with TestSchemaRegistry() as registry:
        client = SchemaRegistryClient({"url": registry.url})
        theirs = AvroSerializer(client, json.dumps(VIEW))
        written = [theirs(v, VALUE) for v in VIEWS]
        ours = serde("avro", config(registry.url, tmp_path))
        before = registry.state.requests
        assert [ours.from_bytes(d) for d in written] == VIEWS
        assert registry.state.requests - before == 1  # the schema, fetched once by its id


def test_bytes_without_the_wire_format_name_it(registry: str, tmp_path: Path) -> None:
    ours = serde("avro", config(registry, tmp_path))
    with pytest.raises(ValueError, match="not in the Schema Registry wire format .* 0x7b"):
        ours.from_bytes(b'{"user": "u1"}')
    with pytest.raises(ValueError, match="not in the Schema Registry wire format"):
        ours.from_bytes(b"\x00\x01")


def test_an_unknown_schema_id_is_the_record_s_error_naming_id_and_registry(
    registry: str, tmp_path: Path
) -> None:
    ours = serde("avro", config(registry, tmp_path))
    with pytest.raises(ValueError, match=rf"schema id 4242 is not in the registry at {registry}"):
        ours.from_bytes(b"\x00" + (4242).to_bytes(4, "big") + b"\x02")


def test_a_wrong_registry_path_is_not_blamed_on_the_records(tmp_path: Path) -> None:
    """Only the registry's 'schema not found' (40403) is the record's fault: a 404 of a wrong
    URL would otherwise drop every record under task.drop.deserialization.errors."""
    with TestSchemaRegistry() as registry:
        ours = serde("avro", config(registry.url + "/wrong-prefix", tmp_path))
        with pytest.raises(SerdeRegistryError, match="refused"):
            ours.from_bytes(b"\x00" + (1).to_bytes(4, "big") + b"\x02")


def test_a_registry_that_does_not_answer_fails_naming_its_url(tmp_path: Path) -> None:
    """Retried by the client (here once, 10 ms apart), then one error naming the URL: not a
    ValueError, so no policy drops the record as undecodable."""
    with TestSchemaRegistry() as gone:
        url = gone.url  # a port nothing listens on once it stops
    values = {
        **config(url, tmp_path),
        "systems.log.schema.registry.max.retries": "1",
        "systems.log.schema.registry.retries.wait.ms": "10",
    }
    ours = serde("avro", values)
    with pytest.raises(
        SchemaRegistryUnavailable, match=rf"Schema Registry at {url} did not answer"
    ):
        ours.from_bytes(b"\x00" + (1).to_bytes(4, "big") + b"\x02")


def test_an_incompatible_writer_schema_is_refused_naming_the_subject(tmp_path: Path) -> None:
    with TestSchemaRegistry() as registry:
        values = config(registry.url, tmp_path)
        assert serde("views-avro", values).to_bytes(VIEWS[0])[0] == 0
        changed = {**VIEW, "fields": [*VIEW["fields"], {"name": "referrer", "type": "string"}]}
        avsc = tmp_path / "changed.avsc"
        avsc.write_text(json.dumps(changed))
        values["serializers.registry.views-avro.schema.file"] = str(avsc)
        with pytest.raises(
            SerdeRegistryError, match=r"pageviews values: .* refused: .*incompatible"
        ):
            serde("views-avro", values).to_bytes({**VIEWS[0], "referrer": "/"})
        # a default makes it compatible (BACKWARD: the new schema reads the old data)
        changed["fields"][-1]["default"] = ""
        avsc.write_text(json.dumps(changed))
        assert serde("views-avro", values).to_bytes({**VIEWS[0], "referrer": "/"})[0] == 0


def test_settings_that_cannot_work_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"needs a Schema Registry: set systems.log.schema"):
        serde("avro", {})
    with pytest.raises(ConfigError, match="protobuf serde needs its generated message class"):
        serde("protobuf", {"systems.log.schema.registry.url": "http://127.0.0.1:1"})
    with pytest.raises(ConfigError, match=r"an avro store needs its value schema"):
        load_serde("avro", {}, key="stores.counts.msg.serde", store="counts")
    with pytest.raises(ConfigError, match=r"and the values of stores \(avro\)"):
        load_serde("protobuf", {}, key="stores.counts.msg.serde", store="counts")
    with pytest.raises(ConfigError, match="auto.register.schemas=true needs"):
        serde(
            "a",
            {
                "systems.log.schema.registry.url": "http://x",
                "serializers.registry.a.type": "avro",
                "serializers.registry.a.auto.register.schemas": "true",
            },
        )
    typo = serde(
        "avro",
        {"systems.log.schema.registry.url": "http://x", "systems.log.schema.registry.timout": "5"},
    )
    with pytest.raises(ConfigError, match="refuses its options"):
        typo.build()  # what the driver calls at start for its inputs
    bad = {"systems.log.schema.registry.url": "http://x", "serializers.registry.a.type": "avro"}
    with pytest.raises(ConfigError, match="subject.name.strategy='topics'"):
        serde("a", {**bad, "serializers.registry.a.subject.name.strategy": "topics"})

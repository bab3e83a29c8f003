"""The tests' Schema Registry (sparkpoint.testing.schema_registry) answers as the registry does,
checked through confluent-kafka's own client: ids, versions, lookups, error codes and
compatibility levels."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from sparkpoint.testing.schema_registry import TestSchemaRegistry

V1 = {"type": "record", "name": "V", "fields": [{"name": "a", "type": "int"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "b", "type": "string", "default": ""}]}
V3 = {**V1, "fields": [{"name": "a", "type": "int"}, {"name": "c", "type": "string"}]}


def avro(schema: dict[str, object]) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


@pytest.fixture
def client() -> Iterator[SchemaRegistryClient]:
    with TestSchemaRegistry() as registry:
        yield SchemaRegistryClient({"url": registry.url})


def test_ids_versions_and_lookups(client: SchemaRegistryClient) -> None:
    first = client.register_schema("views-value", avro(V1))
    assert client.register_schema("views-value", avro(V1)) == first  # the same schema, its id
    assert client.register_schema("other-value", avro(V1)) == first  # ids are global
    second = client.register_schema("views-value", avro(V2))
    assert second != first
    assert client.get_subjects() == ["other-value", "views-value"]
    assert client.get_versions("views-value") == [1, 2]
    latest = client.get_latest_version("views-value")
    assert (latest.schema_id, latest.version) == (second, 2)
    assert json.loads(client.get_schema(first).schema_str) == V1
    found = client.lookup_schema("views-value", avro(V2))
    assert (found.schema_id, found.version) == (second, 2)


def test_errors_carry_the_registry_s_codes(client: SchemaRegistryClient) -> None:
    with pytest.raises(SchemaRegistryError) as err:
        client.get_schema(99)
    assert (err.value.http_status_code, err.value.error_code) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as err:
        client.get_latest_version("nobody")
    assert err.value.error_code == 40401
    client.register_schema("v", avro(V1))
    with pytest.raises(SchemaRegistryError) as err:
        client.get_version("v", 5)
    assert err.value.error_code == 40402
    with pytest.raises(SchemaRegistryError) as err:
        client.register_schema("v", Schema("{not json", "AVRO"))
    assert err.value.error_code == 42201


def test_compatibility_levels(client: SchemaRegistryClient) -> None:
    client.register_schema("v", avro(V1))
    assert client.test_compatibility("v", avro(V2))  # BACKWARD: a field with a default
    assert not client.test_compatibility("v", avro(V3))  # a field without one
    with pytest.raises(SchemaRegistryError) as err:
        client.register_schema("v", avro(V3))
    assert err.value.http_status_code == 409
    client.set_compatibility("v", "FORWARD")  # the old schema must read the new one's data
    assert client.test_compatibility("v", avro(V3))  # it ignores the added field
    client.set_compatibility("v", "NONE")
    client.register_schema("v", avro(V3))
    assert client.get_compatibility("v") == "NONE"

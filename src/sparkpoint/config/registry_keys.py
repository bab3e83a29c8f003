"""The Schema Registry serdes' declared keys (:mod:`sparkpoint.serde.registry`). Imports the
key declarations and the serde names."""

from __future__ import annotations

from sparkpoint.config.key_spec import ConfigKey, is_bool, one_of
from sparkpoint.serde import REGISTRY_SERDES

#: the Schema Registry serdes' keys (sparkpoint.serde.registry): the system's registry and its
#: client's options (passed to confluent-kafka's SchemaRegistryClient as they are named), then
#: a named registry serde's own
REGISTRY_KEYS = (
    ConfigKey(
        "systems.<s>.schema.registry.url",
        None,
        "http(s)://host:port",
        "the Schema Registry of the avro, protobuf and json-schema serdes of this system's "
        "streams (Confluent's REST API)",
    ),
    *(
        ConfigKey(f"systems.<s>.schema.registry.{option}", None, allowed, what)
        for option, allowed, what in (
            ("basic.auth.user.info", "user:password", "basic auth for the registry"),
            ("basic.auth.credentials.source", "USER_INFO | URL", "where basic auth comes from"),
            ("ssl.ca.location", "a file", "CA certificates to trust for the registry"),
            ("ssl.certificate.location", "a file", "the client certificate (mutual TLS)"),
            ("ssl.key.location", "a file", "the client certificate's key"),
            ("ssl.key.password", "a string", "the password of that key"),
            ("timeout", "seconds", "a request's timeout"),
            ("max.retries", "an integer", "retries of a failed request (confluent-kafka: 3)"),
            ("retries.wait.ms", "milliseconds", "the first wait before a retry, doubling"),
            ("retries.max.wait.ms", "milliseconds", "the longest wait between retries"),
        )
    ),
    ConfigKey(
        "stores.<s>.schema.file",
        None,
        "an .avsc file",
        "an avro store's value schema: values are written with it, and values written with "
        "an earlier schema are read with it (Avro's resolution rules; a change that cannot "
        "read them is refused at start)",
    ),
    ConfigKey(
        "stores.<s>.schema.registry.url",
        None,
        "http(s)://host:port",
        "where an avro store registers its value schemas (else its changelog's system's)",
    ),
    ConfigKey(
        "serializers.registry.<s>.type",
        None,
        " | ".join(REGISTRY_SERDES),
        "a named registry serde of this kind, with the settings below",
        one_of(*REGISTRY_SERDES),
    ),
    ConfigKey(
        "serializers.registry.<s>.schema.registry.url",
        None,
        "http(s)://host:port",
        "the named serde's own registry (else its stream's system's)",
    ),
    ConfigKey(
        "serializers.registry.<s>.subject.name.strategy",
        "topic",
        "topic | record | topic-record",
        "the subject of a schema: <topic>-key|value, the record's full name, or both",
        one_of("topic", "record", "topic-record"),
    ),
    ConfigKey(
        "serializers.registry.<s>.auto.register.schemas",
        None,
        "true | false",
        "register the writer's schema under its subject (default: true with a schema file or "
        "a Protobuf class, else false: the subject's latest schema is written)",
        is_bool,
    ),
    ConfigKey(
        "serializers.registry.<s>.schema.file",
        None,
        "a file",
        "the writer's schema (Avro .avsc or JSON Schema); without it an output writes with "
        "its subject's latest schema",
    ),
    ConfigKey(
        "serializers.registry.<s>.message.class",
        None,
        "module:Class",
        "the generated Protobuf message class (protobuf serdes need one)",
    ),
    ConfigKey(
        "serializers.registry.<s>.protobuf.as",
        "dict",
        "dict | message",
        "what a task gets from a protobuf serde: a dict (field names as in the .proto) or the "
        "message object",
        one_of("dict", "message"),
    ),
)

"""Schema Registry serdes: ``avro``, ``protobuf`` and ``json-schema`` in the Confluent wire
format (magic byte 0, the 4-byte schema id, Protobuf's message indexes, then the payload).

Built on confluent-kafka's serializers and registry client (which use fastavro, protobuf and
jsonschema): sparkpoint adds where their settings come from, one client per registry per
process (its caches make one request per schema id, none per record), and errors that say what
to fix. A serde is bound to the stream and the field (key or value) it serves, which the
subject name strategies need.

Settings, the system's first (``systems.<s>.schema.registry.url`` and its other
``systems.<s>.schema.registry.<option>`` for the client: basic auth, TLS, retries), then a
named serde's (``serializers.registry.<name>.type = avro | protobuf | json-schema`` with its
own ``schema.registry.url``, ``subject.name.strategy``, ``auto.register.schemas``,
``schema.file``, ``message.class`` and ``protobuf.as``). Without a ``schema.file`` an output
writes with the latest schema of its subject, registering nothing.

Imports the serde base, config and errors only; confluent-kafka is imported when a serde is
first used (``pip install sparkpoint[schemas]``).
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, cast

from sparkpoint.errors import ConfigError, SparkpointError
from sparkpoint.refs import load_reference
from sparkpoint.serde.base import REGISTRY_SERDES, Serde

STRATEGIES = ("topic", "record", "topic-record")


class SchemaRegistryUnavailable(SparkpointError):
    """The registry did not answer within the client's retries: the batch fails (a record
    that cannot be decoded is the record's fault; this is not)."""


@dataclass(frozen=True)
class RegistrySettings:
    """Where a registry serde finds its registry and schemas (see the module docstring)."""

    kind: str
    url: str
    client: tuple[tuple[str, str], ...] = ()
    strategy: str = "topic"
    auto_register: bool = True
    schema_file: str | None = None
    message_class: str | None = None
    protobuf_as: str = "dict"
    #: a store's values: read with its current schema (the schema file), whatever schema
    #: each was written with, by Avro's resolution rules
    resolve: bool = False

    @classmethod
    def for_store(cls, config: Mapping[str, str], store: str, where: str) -> RegistrySettings:
        """A store's ``avro`` values: written with ``stores.<s>.schema.file``, registered under
        ``<job name>.<store>-value`` in ``stores.<s>.schema.registry.url`` (else the registry
        of the store's changelog's system), read with that schema."""
        prefix = f"stores.{store}."
        schema_file = config.get(prefix + "schema.file")
        if not schema_file:
            raise ConfigError(
                f"{where}: an avro store needs its value schema: set {prefix}schema.file "
                "(an .avsc file)"
            )
        changelog = config.get(prefix + "changelog", "")
        system = changelog.split(".", 1)[0] if changelog else ""
        url = config.get(prefix + "schema.registry.url") or ""
        options: dict[str, str] = {}
        if not url and system:  # the changelog system's registry, with its client options
            options = _system_options(config, system)
            url = options.pop("url", "")
        if not url:
            raise ConfigError(
                f"{where}: an avro store registers each schema its values are written with: "
                f"set {prefix}schema.registry.url"
                + (f" (or systems.{system}.schema.registry.url)" if system else "")
            )
        return cls(
            "avro",
            url.rstrip("/"),
            tuple(sorted(options.items())),
            "topic",
            True,
            schema_file,
            resolve=True,
        )

    @classmethod
    def of(cls, config: Mapping[str, str], name: str, system: str, where: str) -> RegistrySettings:
        """The settings of serde ``name`` (a registry kind, or a named serde of one) used by a
        stream of ``system``; ``where`` is the config key that named the serde."""
        named = f"serializers.registry.{name}."
        kind = config.get(named + "type", name)
        if kind not in REGISTRY_SERDES:
            raise ConfigError(
                f"{named}type={kind!r}: a registry serde is one of {', '.join(REGISTRY_SERDES)}"
            )
        options = _system_options(config, system)
        own_url = config.get(named + "schema.registry.url")
        url = own_url or options.pop("url", "")
        options.pop("url", None)
        if own_url:
            options = {}  # the system's credentials are its registry's, not this one's
        if not url:
            raise ConfigError(
                f"{where}: serde {name!r} needs a Schema Registry: set "
                f"systems.{system}.schema.registry.url (or {named}schema.registry.url)"
            )
        strategy = config.get(named + "subject.name.strategy", "topic")
        if strategy not in STRATEGIES:
            raise ConfigError(
                f"{named}subject.name.strategy={strategy!r}; allowed: {' | '.join(STRATEGIES)}"
            )
        schema_file = config.get(named + "schema.file") or None
        # a schema of its own (a file, a Protobuf class) is registered unless told not to;
        # without one, an output writes with its subject's latest schema
        own = schema_file is not None or kind == "protobuf"
        auto = config.get(named + "auto.register.schemas", "true" if own else "false")
        if auto.lower() == "true" and not own:
            raise ConfigError(
                f"{named}auto.register.schemas=true needs {named}schema.file: without one an "
                "output writes with its subject's latest schema, and registers nothing"
            )
        protobuf_as = config.get(named + "protobuf.as", "dict")
        if protobuf_as not in ("dict", "message"):
            raise ConfigError(f"{named}protobuf.as={protobuf_as!r}; allowed: dict | message")
        message_class = config.get(named + "message.class") or None
        if kind == "protobuf" and message_class is None:
            raise ConfigError(
                f"{where}: a protobuf serde needs its generated message class: register a "
                f"named serde with serializers.registry.<name>.type=protobuf and "
                f"serializers.registry.<name>.message.class=module:Class"
            )
        return cls(
            kind,
            url.rstrip("/"),
            tuple(sorted(options.items())),
            strategy,
            auto.lower() == "true",
            schema_file,
            message_class,
            protobuf_as,
        )


def _system_options(config: Mapping[str, str], system: str) -> dict[str, str]:
    """``systems.<system>.schema.registry.<option>``: the system's registry URL and its
    client's options, by option."""
    prefix = f"systems.{system}.schema.registry."
    return {k[len(prefix) :]: v for k, v in config.items() if k.startswith(prefix)}


Encoder = Callable[[Any, Any], bytes | None]
Decoder = Callable[[bytes, Any], Any]
_UNSEEN = object()
#: the registry client's options that are numbers (the rest, passwords included, are strings)
_INT_OPTIONS = frozenset(
    {
        "timeout",
        "max.retries",
        "retries.wait.ms",
        "retries.max.wait.ms",
        "cache.capacity",
        "cache.latest.ttl.sec",
    }
)


@functools.cache
def _fastavro() -> Any:
    """fastavro, imported at its first use (with the ``schemas`` extra)."""
    import fastavro

    return fastavro


_CLIENTS: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def registry_client(settings: RegistrySettings) -> Any:
    """This process's client of the settings' registry (one per URL and options)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    key = (settings.url, settings.client)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            conf: dict[str, Any] = {"url": settings.url}
            for option, value in settings.client:
                conf[option] = int(value) if option in _INT_OPTIONS else value
            try:
                client = _CLIENTS[key] = SchemaRegistryClient(conf)
            except (ValueError, TypeError) as exc:  # options the client refuses
                raise ConfigError(
                    f"the Schema Registry client for {settings.url} refuses its options: {exc}"
                ) from None
        return client


class RegistrySerde(Serde[Any]):
    """A registry serde of one stream's keys or values; see the module docstring."""

    def __init__(self, settings: RegistrySettings, topic: str, key: bool) -> None:
        self.name = settings.kind
        self.settings = settings
        self.topic = topic
        self.field = "key" if key else "value"
        self._encode: Encoder | None = None
        self._decode: Decoder | None = None
        self._ctx: Any = None
        #: avro: each writer schema id's fastavro schema (None: confluent's path, see _plain)
        self._readers: dict[int, Any] = {}
        #: avro: the wire header and fastavro schema every record is written with, once known
        self._writer: tuple[bytes, Any] | None = None
        self._current: Any = None  # a store's current schema, parsed (see _reader)
        self._writer_known = False  # whether the fast path of to_bytes was looked for

    @property
    def subject(self) -> str:
        """The subject of the topic strategy: ``<topic>-key`` or ``<topic>-value``."""
        return f"{self.topic}-{self.field}"

    def _context(self) -> Any:
        if self._ctx is None:
            from confluent_kafka.serialization import MessageField, SerializationContext

            field = MessageField.KEY if self.field == "key" else MessageField.VALUE
            self._ctx = SerializationContext(self.topic, field)
        return self._ctx

    def _conf(self, *, serializer: bool) -> dict[str, Any]:
        s = self.settings
        conf: dict[str, Any] = {"subject.name.strategy.type": s.strategy.replace("-", "_").upper()}
        if serializer:
            conf["auto.register.schemas"] = s.auto_register
            conf["use.latest.version"] = s.schema_file is None and s.kind != "protobuf"
        return conf

    def _schema_text(self) -> str | None:
        path = self.settings.schema_file
        if path is None:
            return None
        try:
            return Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"schema.file {path}: {exc.strerror or exc}") from None

    def _message_class(self) -> Any:
        assert self.settings.message_class is not None
        return load_reference(self.settings.message_class, "message.class")

    def _make_encoder(self) -> Encoder:
        client, kind = registry_client(self.settings), self.settings.kind
        if kind == "avro":
            from confluent_kafka.schema_registry.avro import AvroSerializer

            return cast(
                Encoder,
                AvroSerializer(client, self._schema_text(), conf=self._conf(serializer=True)),
            )
        if kind == "json-schema":
            from confluent_kafka.schema_registry.json_schema import JSONSerializer

            return cast(
                Encoder,
                JSONSerializer(self._schema_text(), client, conf=self._conf(serializer=True)),
            )
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        conf = {**self._conf(serializer=True), "use.deprecated.format": False}
        message_class = self._message_class()
        encode = ProtobufSerializer(message_class, client, conf=conf)
        if self.settings.protobuf_as == "message":
            return cast(Encoder, encode)

        def from_dict(value: Any, ctx: Any) -> bytes | None:
            from google.protobuf.json_format import ParseDict

            message = value if not isinstance(value, dict) else ParseDict(value, message_class())
            return encode(message, ctx)  # type: ignore[no-any-return]

        return from_dict

    def _make_decoder(self) -> Decoder:
        client, kind = registry_client(self.settings), self.settings.kind
        conf = self._conf(serializer=False)
        if kind == "avro":
            from confluent_kafka.schema_registry.avro import AvroDeserializer

            reader = self._schema_text() if self.settings.resolve else None
            return cast(Decoder, AvroDeserializer(client, reader, conf=conf))
        if kind == "json-schema":
            from confluent_kafka.schema_registry.json_schema import JSONDeserializer

            return cast(Decoder, JSONDeserializer(None, schema_registry_client=client, conf=conf))
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        decode = ProtobufDeserializer(self._message_class(), conf=conf)
        checked: set[bytes] = set()  # wire headers (schema id, message indexes) found right

        def checked_decode(data: bytes, ctx: Any) -> Any:
            header = self._protobuf_header(data)
            if header not in checked:
                self._check_protobuf_writer(data)
                checked.add(header)
            return decode(data, ctx)

        if self.settings.protobuf_as == "message":
            return checked_decode

        def to_dict(data: bytes, ctx: Any) -> Any:
            from google.protobuf.json_format import MessageToDict

            return MessageToDict(
                checked_decode(data, ctx),
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,  # proto3's zeros, as zeros
            )

        return to_dict

    @staticmethod
    def _protobuf_header(data: bytes) -> bytes:
        """The magic byte, schema id and message indexes of a Protobuf record."""
        from confluent_kafka.schema_registry.common.serde import SchemaId

        payload = BytesIO(data)
        SchemaId("PROTOBUF").from_bytes(payload)
        return bytes(data[: payload.tell()])

    def _check_protobuf_writer(self, data: bytes) -> None:
        """A record written as another message than the configured class decodes without
        error into nonsense (Protobuf reads unknown fields silently): compare the message the
        writer's schema and indexes name with the class's. A schema the registry keeps as
        .proto text (not the descriptor confluent-kafka registers) is not checked here."""
        import base64

        from confluent_kafka.schema_registry.common.serde import SchemaId
        from google.protobuf import descriptor_pb2

        wire = SchemaId("PROTOBUF")
        wire.from_bytes(BytesIO(data))
        client = registry_client(self.settings)
        schema = self._call(
            lambda _arg, _ctx: client.get_schema(wire.id, fmt="serialized"), data, "decode"
        )
        try:
            file = descriptor_pb2.FileDescriptorProto.FromString(
                base64.b64decode(schema.schema_str, validate=True)
            )
        except ValueError:
            return
        messages, name = file.message_type, file.package
        for index in wire.message_indexes or [0]:
            if index >= len(messages):
                return
            name = f"{name}.{messages[index].name}" if name else messages[index].name
            messages = messages[index].nested_type
        expected = self._message_class().DESCRIPTOR.full_name
        if name != expected:
            raise ValueError(
                f"protobuf serde: the record was written as {name} (schema id {wire.id}), "
                f"not the {expected} its message.class decodes"
            )

    def latest_schema(self) -> Any:
        """The parsed schema of this serde's subject's latest version (``<topic>-key`` or
        ``<topic>-value``: the topic strategy, the only one that names a subject before a
        record is seen)."""
        import json

        if self.settings.strategy != "topic":
            raise ConfigError(
                f"{self.name} serde for {self.topic} {self.field}s: its schema can be looked up "
                "before a record is read only with subject.name.strategy=topic"
            )
        subject = self.subject
        client = registry_client(self.settings)
        try:
            registered = self._call(
                lambda _arg, _ctx: client.get_latest_version(subject), None, "look up"
            )
        except SerdeRegistryError as exc:
            raise SerdeRegistryError(
                f"{exc}: register the schema of {self.topic}'s {self.field}s under {subject}, "
                "or give the pipeline a value_schema"
            ) from None
        return json.loads(registered.schema.schema_str)

    def check_evolution(self, store: str) -> None:
        """A store's current schema must read every value written before: each schema its
        subject holds, by Avro's resolution rules. Refused with the store, the field and the
        rule (before any batch: the driver checks at start)."""
        import json

        from confluent_kafka.schema_registry.error import SchemaRegistryError

        from sparkpoint.serde.avro_resolution import problems

        text = self._schema_text()
        assert text is not None
        current = json.loads(text)
        subject = self.subject
        client = registry_client(self.settings)
        try:
            versions = client.get_versions(subject)
        except SchemaRegistryError as exc:
            if exc.error_code == 40401:
                return  # no such subject: nothing written yet
            raise self._unavailable(exc) from exc
        for version in versions:
            old = client.get_version(subject, version)
            found = problems(current, json.loads(old.schema.schema_str))
            if found:
                raise ConfigError(
                    f"store {store}: its schema {self.settings.schema_file} cannot read the "
                    f"values written with version {version} of {subject}: {found[0]}"
                    + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
                    + ". Change the schema so that it can (Avro's resolution rules), or start "
                    "the store over"
                )

    # Avro's records go through fastavro directly once their schema is known: confluent's
    # serializers take 20-30 us a record around the same fastavro call (29 us against 4.3 us
    # to decode a page view here). The bytes are the same: the wire header, then fastavro's
    # schemaless encoding. A schema with data-contract rules (or references) keeps confluent's
    # path, which runs them.

    def to_bytes(self, value: Any) -> bytes:
        if self._writer is not None:
            return self._fast_encode(value, *self._writer)
        if self._encode is None:
            self._encode = self._built(self._make_encoder)
        data = self._call(self._encode, value, "encode")
        if data is None:
            raise ValueError(f"{self.name} serde: cannot encode None")
        if self.name == "avro" and not self._writer_known:
            self._writer_known = True  # one look, whatever it finds
            parsed = self._plain(int.from_bytes(data[1:5], "big"), data)
            if parsed is not None:
                self._writer = (bytes(data[:5]), parsed)
        return data  # type: ignore[no-any-return]

    def from_bytes(self, data: bytes) -> Any:
        if len(data) < 5 or data[0] != 0:
            first = f"0x{data[0]:02x}" if data else "nothing"
            raise ValueError(
                f"{self.name} serde: not in the Schema Registry wire format (magic byte 0 and "
                f"a 4-byte schema id): starts with {first}, {len(data)} bytes"
            )
        if self.name == "avro":
            schema_id = int.from_bytes(data[1:5], "big")
            parsed = self._readers.get(schema_id, _UNSEEN)
            if parsed is _UNSEEN:
                parsed = self._readers[schema_id] = self._plain(schema_id, data)
            if parsed is not None:
                return self._fast_decode(data, parsed)
        if self._decode is None:
            self._decode = self._built(self._make_decoder)
        return self._call(self._decode, bytes(data), "decode")

    def build(self) -> None:
        """Build the registry client and the decoder now (no request is made): settings they
        refuse stop the job at start (the driver calls this for its inputs)."""
        if self._decode is None:
            self._decode = self._built(self._make_decoder)

    def _built(self, make: Callable[[], Any]) -> Any:
        """``make()``, a refusal of the settings as the ConfigError it is (not a bad record)."""
        try:
            return make()
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{self.name} serde for {self.topic} {self.field}s: {exc}") from None

    def from_bytes_many(self, values: Sequence[bytes]) -> list[Any]:
        """Avro: each run of records of one schema id read from one buffer of their payloads,
        each record checked to end where its bytes end (a record with bytes to spare, or
        short of some, is decoded alone by :meth:`from_bytes`, whose error names it)."""
        if self.name != "avro":
            return [self.from_bytes(v) for v in values]
        out: list[Any] = []
        start = 0
        while start < len(values):
            head = values[start][:5]
            end = start + 1
            while end < len(values) and values[end][:5] == head:
                end += 1
            run = values[start:end]
            schema_id = int.from_bytes(head[1:5], "big") if len(head) == 5 else -1
            parsed = self._readers.get(schema_id)
            if parsed is None or head[0] != 0:
                out += [self.from_bytes(v) for v in run]  # fetches the schema if new
            else:
                out += self._run_decode(run, parsed)
            start = end
        return out

    def _run_decode(self, run: Sequence[bytes], parsed: Any) -> list[Any]:
        read, reader = _fastavro().schemaless_reader, self._reader()
        stream = BytesIO(b"".join(memoryview(v)[5:] for v in run))
        out: list[Any] = []
        end = 0
        for record in run:
            end += len(record) - 5
            try:
                value = read(stream, parsed, reader)
            except (EOFError, ValueError, IndexError, UnicodeDecodeError, OverflowError):
                value = _UNSEEN
            if value is _UNSEEN or stream.tell() != end:
                out.append(self.from_bytes(record))  # raises, naming it (or decodes it)
                stream.seek(end)
            else:
                out.append(value)
        return out

    def _plain(self, schema_id: int, data: bytes) -> Any:
        """fastavro's form of Avro schema ``schema_id`` (one registry request per id and
        process), or None when it has data-contract rules or references."""
        import json

        client = registry_client(self.settings)
        schema = self._call(lambda _arg, _ctx: client.get_schema(schema_id), data, "decode")
        parsed = json.loads(schema.schema_str)
        if (
            schema.rule_set is not None
            or schema.references
            or parsed in ("bytes", {"type": "bytes"})
        ):
            return None  # confluent's path: rules, references; a bare bytes value, unframed
        return _fastavro().parse_schema(parsed)

    def _fast_encode(self, value: Any, header: bytes, parsed: Any) -> bytes:
        out = BytesIO()
        out.write(header)
        try:
            _fastavro().schemaless_writer(out, parsed, value)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"avro serde: cannot encode {value!r:.200}: {exc}") from None
        return out.getvalue()

    def read_by_latest(self) -> None:
        """Avro: read every record by its subject's latest schema from now on (Avro's
        resolution: a field the latest added gets its default in older records), as a
        DataFrame pipeline's ``value`` struct is built from that schema. The latest is looked
        up once per process (the registry client caches it). Only with the topic strategy,
        the one that names a subject before a record is read; a subject with no version yet
        (records written under another strategy, read by a pipeline's own value_schema)
        leaves each record read by its writer's schema."""
        if self.name != "avro" or self.settings.resolve or self.settings.strategy != "topic":
            return
        try:
            latest = self.latest_schema()
        except SerdeRegistryError:  # no such subject: nothing to resolve to
            return
        self._current = _parsed_latest(json.dumps(latest, sort_keys=True))

    def _reader(self) -> Any:
        """The schema values are read with: the current one, for a store's, or the latest
        (:meth:`read_by_latest`); None: each record's own writer schema."""
        if self._current is not None or not self.settings.resolve:
            return self._current
        if self._current is None:
            import json

            text = self._schema_text()
            assert text is not None
            self._current = _fastavro().parse_schema(json.loads(text))
        return self._current

    def _fast_decode(self, data: bytes, parsed: Any) -> Any:
        stream = BytesIO(data)
        stream.seek(5)  # past the wire header, without copying the payload
        try:
            return _fastavro().schemaless_reader(stream, parsed, self._reader())
        except (EOFError, ValueError, IndexError, UnicodeDecodeError, OverflowError) as exc:
            schema_id = int.from_bytes(data[1:5], "big")
            raise ValueError(
                f"avro serde: cannot decode with schema id {schema_id}: {type(exc).__name__}: {exc}"
            ) from None

    def _call(self, fn: Callable[[Any, Any], Any], arg: Any, what: str) -> Any:
        """``fn(arg, ctx)``, its errors as sparkpoint's: the record's fault is a ValueError
        (the task names the SSP and offset), the registry's unavailability is not."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError
        from confluent_kafka.serialization import SerializationError

        try:
            return fn(arg, self._context())
        except SchemaRegistryError as exc:
            status = exc.http_status_code
            if status is None or status < 0 or status >= 500:
                raise self._unavailable(exc) from exc
            if what == "decode" and exc.error_code == 40403:  # no such schema id
                schema_id = int.from_bytes(arg[1:5], "big")
                raise ValueError(
                    f"{self.name} serde: schema id {schema_id} is not in the registry at "
                    f"{self.settings.url} (error {exc.error_code})"
                ) from None
            raise SerdeRegistryError(
                f"{self.name} serde for {self.topic} {self.field}s: the registry at "
                f"{self.settings.url} refused: {exc.error_message} (error {exc.error_code})"
            ) from exc
        except SerializationError as exc:
            raise ValueError(f"{self.name} serde: cannot {what}: {exc}") from None
        except (OSError, TimeoutError) as exc:
            raise self._unavailable(exc) from exc
        except Exception as exc:
            if _is_transport_error(exc):
                raise self._unavailable(exc) from exc
            raise

    def _unavailable(self, exc: BaseException) -> SchemaRegistryUnavailable:
        return SchemaRegistryUnavailable(
            f"{self.name} serde for {self.topic} {self.field}s: the Schema Registry at "
            f"{self.settings.url} did not answer ({type(exc).__name__}: {exc}); check the URL "
            "(systems.<s>.schema.registry.url) and that the registry is up"
        )


class SerdeRegistryError(SparkpointError):
    """The registry refused a request (an incompatible schema, a subject with no schema)."""


@functools.lru_cache(maxsize=16)
def _parsed_latest(text: str) -> Any:
    """fastavro's form of a subject's latest schema (its JSON), parsed once per process."""
    return _fastavro().parse_schema(json.loads(text))


def _is_transport_error(exc: BaseException) -> bool:
    """An HTTP client's connect or timeout error (httpx's, without importing it here)."""
    return any(
        c.__name__ in ("TransportError", "ConnectError", "TimeoutException")
        for c in type(exc).__mro__
    )

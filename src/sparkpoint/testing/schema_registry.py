"""A Confluent-compatible Schema Registry for tests, on a free loopback port.

No Schema Registry installs on these machines, so the tests start this one, as they start Tansu
for Kafka. It serves the REST subset confluent-kafka's client uses (Confluent's API reference:
docs.confluent.io/platform/current/schema-registry/develop/api.html):

- ``POST /subjects/{subject}/versions``: register (the same schema again returns its id);
- ``POST /subjects/{subject}``: look a schema up under a subject;
- ``GET /subjects``, ``GET /subjects/{subject}/versions``,
  ``GET /subjects/{subject}/versions/{version|latest}``;
- ``GET /schemas/ids/{id}`` (and ``/schemas/ids/{id}/versions``), ``GET /schemas/types``;
- ``POST /compatibility/subjects/{subject}/versions/{version|latest}``;
- ``GET|PUT /config`` and ``/config/{subject}``; ``DELETE /subjects/{subject}``.

Errors carry the registry's codes (40401 subject not found, 40402 version not found, 40403
schema not found, 409 incompatible, 42201 invalid schema). Schema ids are global and a schema
registered under two subjects keeps one id, as in the registry. Compatibility: a new Avro schema
is checked against the subject's latest (``BACKWARD``, the default, and ``FORWARD``, ``FULL``)
or every version (the ``_TRANSITIVE`` levels) by Avro's resolution rules
(:func:`sparkpoint.serde.avro_resolution.problems`); JSON Schema and Protobuf schemas are
accepted at any level (the registry's own rules for them are not reproduced here), and ``NONE``
accepts all.

Set ``SPARKPOINT_SCHEMA_REGISTRY_URL`` to run the same tests against a real registry instead
(:func:`schema_registry`).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)


class RegistryError(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class _Schema:
    id: int
    text: str
    kind: str  # AVRO, PROTOBUF or JSON
    references: list[dict[str, Any]]

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": self.text}
        if self.kind != "AVRO":
            out["schemaType"] = self.kind
        if self.references:
            out["references"] = self.references
        return out


@dataclass
class RegistryState:
    """What the registry holds; every method is one request's work, under one lock."""

    schemas: list[_Schema] = field(default_factory=list)
    subjects: dict[str, list[int]] = field(default_factory=dict)  # schema ids, oldest first
    levels: dict[str, str] = field(default_factory=dict)  # "" is the global level
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0  # requests served (tests count the client's)

    def level(self, subject: str) -> str:
        return self.levels.get(subject) or self.levels.get("", "BACKWARD")

    def schema(self, schema_id: int) -> _Schema:
        if not 1 <= schema_id <= len(self.schemas):
            raise RegistryError(404, 40403, f"Schema {schema_id} not found")
        return self.schemas[schema_id - 1]

    def versions(self, subject: str) -> list[int]:
        if not self.subjects.get(subject):
            raise RegistryError(404, 40401, f"Subject '{subject}' not found.")
        return self.subjects[subject]

    def version(self, subject: str, version: str) -> tuple[int, _Schema]:
        ids = self.versions(subject)
        number = len(ids) if version in ("latest", "-1") else int(version)
        if not 1 <= number <= len(ids):
            raise RegistryError(404, 40402, f"Version {version} not found.")
        return number, self.schema(ids[number - 1])

    def parsed(self, body: dict[str, Any]) -> _Schema:
        text = body.get("schema")
        kind = body.get("schemaType") or "AVRO"
        if not isinstance(text, str) or kind not in ("AVRO", "PROTOBUF", "JSON"):
            raise RegistryError(422, 42201, "Invalid schema")
        if kind in ("AVRO", "JSON"):
            try:
                json.loads(text)
            except ValueError as exc:
                raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None
        return _Schema(0, text, kind, list(body.get("references") or []))

    def find(self, wanted: _Schema) -> _Schema | None:
        for s in self.schemas:
            if (s.kind, _canonical(s), s.references) == (
                wanted.kind,
                _canonical(wanted),
                wanted.references,
            ):
                return s
        return None

    def compatible(self, subject: str, new: _Schema, against: list[int] | None = None) -> bool:
        level = self.level(subject)
        ids = self.subjects.get(subject, []) if against is None else against
        if level == "NONE" or not ids or new.kind != "AVRO":
            return True
        from sparkpoint.serde.avro_resolution import problems

        earlier = ids if level.endswith("_TRANSITIVE") else ids[-1:]
        new_schema = json.loads(new.text)
        for old_id in earlier:
            old = self.schema(old_id)
            if old.kind != "AVRO":
                return False
            old_schema = json.loads(old.text)
            if level.startswith(("BACKWARD", "FULL")) and problems(new_schema, old_schema):
                return False  # the new schema cannot read what the old one wrote
            if level.startswith(("FORWARD", "FULL")) and problems(old_schema, new_schema):
                return False  # nor the old one what the new one writes
        return True

    def register(self, subject: str, body: dict[str, Any]) -> int:
        new = self.parsed(body)
        known = self.find(new)
        ids = self.subjects.setdefault(subject, [])
        if known is not None and known.id in ids:
            return known.id
        if not self.compatible(subject, new):
            raise RegistryError(
                409, 409, "Schema being registered is incompatible with an earlier schema"
            )
        if known is None:
            known = _Schema(len(self.schemas) + 1, new.text, new.kind, new.references)
            self.schemas.append(known)
        ids.append(known.id)
        return known.id

    def lookup(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        ids = self.versions(subject)
        known = self.find(self.parsed(body))
        if known is None or known.id not in ids:
            raise RegistryError(404, 40403, "Schema not found")
        return {
            "subject": subject,
            "id": known.id,
            "version": ids.index(known.id) + 1,
            **known.body(),
        }


def _canonical(schema: _Schema) -> str:
    """Avro and JSON schemas compare as parsed JSON (whitespace aside); Protobuf as text."""
    if schema.kind == "PROTOBUF":
        return schema.text.strip()
    return json.dumps(json.loads(schema.text), sort_keys=True, separators=(",", ":"))


_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(p), name)
    for m, p, name in (
        ("GET", r"^/subjects/?$", "subjects"),
        ("GET", r"^/subjects/(?P<s>[^/]+)/versions/?$", "versions"),
        ("GET", r"^/subjects/(?P<s>[^/]+)/versions/(?P<v>[^/]+)/?$", "version"),
        ("POST", r"^/subjects/(?P<s>[^/]+)/versions/?$", "register"),
        ("POST", r"^/subjects/(?P<s>[^/]+)/?$", "lookup"),
        ("DELETE", r"^/subjects/(?P<s>[^/]+)/?$", "delete"),
        ("GET", r"^/schemas/ids/(?P<id>\d+)/?$", "schema"),
        ("GET", r"^/schemas/ids/(?P<id>\d+)/versions/?$", "schema_versions"),
        ("GET", r"^/schemas/types/?$", "types"),
        ("POST", r"^/compatibility/subjects/(?P<s>[^/]+)/versions/(?P<v>[^/]+)/?$", "check"),
        ("GET", r"^/config/?(?P<s>[^/]*)/?$", "get_config"),
        ("PUT", r"^/config/?(?P<s>[^/]*)/?$", "put_config"),
    )
]


def _version(state: RegistryState, subject: str, args: dict[str, str], body: Any) -> Any:
    number, schema = state.version(subject, args["v"])
    return {"subject": subject, "id": schema.id, "version": number, **schema.body()}


def _delete(state: RegistryState, subject: str, args: dict[str, str], body: Any) -> Any:
    ids = state.versions(subject)
    del state.subjects[subject]
    return list(range(1, len(ids) + 1))


def _schema_versions(state: RegistryState, subject: str, args: dict[str, str], body: Any) -> Any:
    wanted = int(args["id"])
    return [
        {"subject": s, "version": ids.index(wanted) + 1}
        for s, ids in state.subjects.items()
        if wanted in ids
    ]


def _check(state: RegistryState, subject: str, args: dict[str, str], body: Any) -> Any:
    ids = state.versions(subject)
    number, _ = state.version(subject, args["v"])
    return {"is_compatible": state.compatible(subject, state.parsed(body), ids[:number])}


def _put_config(state: RegistryState, subject: str, args: dict[str, str], body: Any) -> Any:
    level = str((body or {}).get("compatibility", "")).upper()
    if level not in LEVELS:
        raise RegistryError(422, 42203, f"Invalid compatibility level {level!r}")
    state.levels[subject] = level
    return {"compatibility": level}


Answer = Callable[[RegistryState, str, dict[str, str], Any], Any]
_ANSWERS: dict[str, Answer] = {
    "subjects": lambda st, s, a, b: sorted(n for n, ids in st.subjects.items() if ids),
    "versions": lambda st, s, a, b: list(range(1, len(st.versions(s)) + 1)),
    "version": _version,
    "register": lambda st, s, a, b: {"id": st.register(s, b)},
    "lookup": lambda st, s, a, b: st.lookup(s, b),
    "delete": _delete,
    "schema": lambda st, s, a, b: st.schema(int(a["id"])).body(),
    "schema_versions": _schema_versions,
    "types": lambda st, s, a, b: ["AVRO", "JSON", "PROTOBUF"],
    "check": _check,
    "get_config": lambda st, s, a, b: {"compatibilityLevel": st.level(s)},
    "put_config": _put_config,
}


def _answer(state: RegistryState, name: str, args: dict[str, str], body: Any) -> Any:
    return _ANSWERS[name](state, unquote(args.get("s", "")), args, body)


def _handler(state: RegistryState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet, as a test fixture should be

        def _serve(self, method: str) -> None:
            url = urlparse(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, out = 404, {"error_code": 404, "message": f"no route {method} {url.path}"}
            for m, pattern, name in _ROUTES:
                match = pattern.match(url.path)
                if m == method and match:
                    try:
                        body = json.loads(raw) if raw else None
                        with state.lock:
                            state.requests += 1
                            status, out = 200, _answer(state, name, match.groupdict(), body)
                    except RegistryError as exc:
                        status, out = exc.status, {"error_code": exc.code, "message": exc.message}
                    except ValueError as exc:
                        status, out = 422, {"error_code": 422, "message": str(exc)}
                    break
            data = json.dumps(out).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

    return Handler


class TestSchemaRegistry:
    """The registry on ``127.0.0.1`` and a free port, served from a thread; a context manager.
    ``state`` is what it holds (tests may count its requests)."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.state = RegistryState()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="test-schema-registry", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> TestSchemaRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def schema_registry() -> Iterator[str]:
    """The URL of a registry for a test: ``SPARKPOINT_SCHEMA_REGISTRY_URL`` when set (a real
    one), else a :class:`TestSchemaRegistry` started for the test."""
    real = os.environ.get("SPARKPOINT_SCHEMA_REGISTRY_URL")
    if real:
        yield real
        return
    with TestSchemaRegistry() as registry:
        yield registry.url

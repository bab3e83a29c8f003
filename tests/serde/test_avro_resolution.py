"""Avro's schema resolution rules (sparkpoint.serde.avro_resolution): what a reader schema can
read of a writer's data, each refusal naming the field and the rule; checked against fastavro,
which must read what the rules allow and fail on what they refuse."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest

from sparkpoint.serde.avro_resolution import problems


def record(*fields: dict[str, Any], name: str = "View") -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields)}


USER = {"name": "user", "type": "string"}
TS_INT = {"name": "ts", "type": "int"}
TS_LONG = {"name": "ts", "type": "long"}
COLOUR = {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}

READABLE = [
    (
        "a field added with a default",
        record(USER, {"name": "n", "type": "int", "default": 0}),
        record(USER),
    ),
    ("a field removed", record(USER), record(USER, TS_INT)),
    ("int promoted to long", record(TS_LONG), record(TS_INT)),
    ("long promoted to double", record({"name": "ts", "type": "double"}), record(TS_LONG)),
    ("string read as bytes", record({"name": "user", "type": "bytes"}), record(USER)),
    ("a type made nullable", record({"name": "user", "type": ["null", "string"]}), record(USER)),
    (
        "an enum symbol added",
        record({"name": "c", "type": {**COLOUR, "symbols": ["RED", "GREEN", "BLUE"]}}),
        record({"name": "c", "type": COLOUR}),
    ),
    (
        "a field renamed with an alias",
        record({"name": "who", "type": "string", "aliases": ["user"]}),
        record(USER),
    ),
    (
        "a record renamed, the old name an alias",
        {**record(USER, name="Visit"), "aliases": ["View"]},
        record(USER),
    ),
    (
        "arrays and maps of promoted items",
        record({"name": "a", "type": {"type": "array", "items": "long"}}),
        record({"name": "a", "type": {"type": "array", "items": "int"}}),
    ),
]
REFUSED = [
    (
        "a field added without a default",
        record(USER, {"name": "n", "type": "int"}),
        record(USER),
        "field n: the writer has no such field and the reader gives it no default",
    ),
    (
        "long narrowed to int",
        record(TS_INT),
        record(TS_LONG),
        "field ts: the writer's long cannot be read as int",
    ),
    (
        "a nullable type made required",
        record(USER),
        record({"name": "user", "type": ["null", "string"]}),
        "field user: the writer's null cannot be read as string",
    ),
    (
        "an enum symbol removed",
        record({"name": "c", "type": {**COLOUR, "symbols": ["RED"]}}),
        record({"name": "c", "type": COLOUR}),
        "enum Colour lacks symbol(s) GREEN",
    ),
    ("a record renamed", record(USER, name="Click"), record(USER), "names differ"),
]
SAMPLES = {"user": "u1", "ts": 7, "n": 1, "c": "GREEN", "a": [1, 2]}


def round_trip(reader: Any, writer: Any) -> Any:
    # a nullable field written as null: the value a reader that requires it cannot take
    datum = {
        f["name"]: None if isinstance(f["type"], list) else SAMPLES[f["name"]]
        for f in writer["fields"]
    }
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(writer), datum)
    buf.seek(0)
    return fastavro.schemaless_reader(
        buf, fastavro.parse_schema(writer), fastavro.parse_schema(reader)
    )


@pytest.mark.parametrize(("what", "reader", "writer"), READABLE, ids=[r[0] for r in READABLE])
def test_what_the_rules_let_a_reader_read(what: str, reader: Any, writer: Any) -> None:
    assert problems(reader, writer) == []
    round_trip(reader, writer)  # and fastavro does read it


@pytest.mark.parametrize(("what", "reader", "writer", "why"), REFUSED, ids=[r[0] for r in REFUSED])
def test_what_they_refuse_names_field_and_rule(
    what: str, reader: Any, writer: Any, why: str
) -> None:
    found = problems(reader, writer)
    assert len(found) == 1 and why in found[0], found
    with pytest.raises(Exception):  # noqa: B017 - fastavro fails as it likes
        round_trip(reader, writer)


def test_named_references_and_recursive_types_resolve() -> None:
    node = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "next", "type": ["null", "Node"], "default": None}, TS_INT],
    }
    wider = {
        **node,
        "fields": [{"name": "next", "type": ["null", "Node"], "default": None}, TS_LONG],
    }
    assert problems(wider, node) == []
    assert problems(node, wider) == ["field ts: the writer's long cannot be read as int"]
